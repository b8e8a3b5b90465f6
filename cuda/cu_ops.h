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
/* The scan in its chunked form (kernels_ssd.cu), engine/backend.h's ssm_scan_fwd and
 * ssm_scan_bwd contracts: 1 when it ran (or failed, the error recorded on the backend), 0
 * when the backend's scan form or the shape leaves it to the step-by-step kernels. */
int cu_ssd_scan_fwd(eng_backend *be, float *y, float *ckpt, const float *xbc, const float *dt_raw,
                    const float *dt_bias, const float *A_log, const float *Dskip, float *state, const int *lens, int B,
                    int T, int H, int P, int G, int S, int chunk);
int cu_ssd_scan_bwd(eng_backend *be, float *dxbc, float *ddt_raw, float *ddt_bias, float *dA_log, float *dD,
                    const float *dy, const float *xbc, const float *dt_raw, const float *dt_bias, const float *A_log,
                    const float *Dskip, const float *ckpt, float *scratch, int B, int T, int H, int P, int G, int S,
                    int chunk);

#endif
