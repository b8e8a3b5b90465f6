/* engine/moe.h — the mixture-of-experts MLP block (engine/moe.c) for the model's files in
 * engine/ (forward.c, backward.c); private to the engine like engine/model_internal.h.
 */
#ifndef AC_ENGINE_MOE_H
#define AC_ENGINE_MOE_H

#include <stddef.h>

#include "engine/model.h"

/* The MoE of layer l on normalized rows xn [N, C] into y [N, C] (out), masks mk applied (NULL:
 * none), statistics added when stats. fws / iws: scratch of eng_moe_scratch_floats(.., 0) /
 * _ints for N rows (NULL: allocated for the call). 0, or -1 out of memory. */
int eng_moe_fwd(eng_model *m, int l, const eng_masks *mk, const float *xn, float *y, int N, eng_act_stats *stats,
                float *fws, int *iws);
/* Its backward: dy [N, C] the gradient of y; dxn [N, C] out; weight grads (gw) and expert-mask
 * grads (gm) accumulate. Routes and runs the experts again. 0, or -1 out of memory. */
int eng_moe_bwd(eng_model *m, int l, const eng_masks *mk, const float *xn, const float *dy, float *dxn, int N,
                int gw, int gm);
/* Bytes of the largest scratch a backward allocates for N rows in any layer of a (more than
 * a training forward's), and the forward's floats and ints apart (train: with the backward's
 * buffers). */
size_t eng_moe_bwd_scratch_bytes(const arch *a, int N);
size_t eng_moe_scratch_floats(const arch *a, int N, int train);
size_t eng_moe_scratch_ints(const arch *a, int N);

#endif
