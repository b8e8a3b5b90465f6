/* engine/cpu_ssm.h — the CPU backend's Mamba-2 ops (engine-private): the depthwise causal
 * conv, the selective-state scan (sequential over steps, with checkpoints every `chunk`
 * steps for the backward), the group-gated RMSNorm and squared ReLU. The contracts are
 * backend.h's ssm_* / gated_norm_* / relu2_* entries; engine/backend_cpu.c installs them.
 */
#ifndef AC_ENGINE_CPU_SSM_H
#define AC_ENGINE_CPU_SSM_H

#include "engine/backend.h"

/* The CPU backend's threshold (backend_cpu.c and cpu_ssm.c): loops with less work than this
 * many elements run on the calling thread, as a parallel region costs a barrier, which
 * dominates small (decode-sized) ops. */
#define PAR_MIN 32768
#define PAR_IF(work) if ((double)(work) >= PAR_MIN)

/* Point be's Mamba-2 and squared-ReLU ops at the CPU implementations. */
void cpu_ssm_install(eng_backend *be);

#endif
