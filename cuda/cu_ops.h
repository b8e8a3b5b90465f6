/* cuda/cu_ops.h — private to cuda/: the op installers of the kernel files. Each fills
 * its part of the backend's function table (engine/backend.h) with CUDA versions. */
#ifndef AC_CUDA_CU_OPS_H
#define AC_CUDA_CU_OPS_H

#include "engine/backend.h"

/* Install every numerical op (kernels_dense.cu calls the attention installer). */
void cu_ops_install(eng_backend *be);
/* Attention forward/backward (kernels_attn.cu). */
void cu_attn_install(eng_backend *be);
/* Mamba-2 conv, scan and gated norm, squared ReLU (kernels_ssm.cu). */
void cu_ssm_install(eng_backend *be);

#endif
