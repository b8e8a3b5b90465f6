/* engine/mamba.h — the Mamba-2 mixer block (engine/mamba.c) for the model's files in engine/
 * (forward.c, backward.c); private to the engine like engine/model_internal.h.
 */
#ifndef AC_ENGINE_MAMBA_H
#define AC_ENGINE_MAMBA_H

#include <stddef.h>

#include "engine/model_internal.h"

/* Steps between the scan's checkpoints in training (the backward recomputes a chunk's states). */
#define ENG_SSM_CHUNK 32

/* The Mamba-2 mixer of layer l on normalized rows xn [N, C] of st's batch into y [N, C] (out):
 * the head masks of st->mk applied, head statistics added to st->stats, the conv and SSM
 * states of st->kv (when set) continued and updated. ws: eng_mamba_fwd_floats(.., B, T)
 * floats of scratch (NULL: allocated for the call). 0, or -1 out of memory. */
int eng_mamba_fwd(eng_model *m, fwd_state *st, int l, const float *xn, float *y, float *ws);
/* Its backward: dy [N, C] the gradient of y; dxn [N, C] out; weight grads (gw) and head-mask
 * grads (gm) accumulate. Runs the mixer again from xn (training: no cache). 0, or -1 out of
 * memory. */
int eng_mamba_bwd(eng_model *m, fwd_state *st, int l, const float *xn, const float *dy, float *dxn, int gw, int gm);
/* out_proj's input [N, di] of the last eng_mamba_fwd of layer l on st's rows (the gated norm's
 * output, head masks applied): inside st's Mamba scratch, NULL when the call had none. */
const float *eng_mamba_out_input(const eng_model *m, const fwd_state *st, int l);
/* Floats of the largest forward scratch of any Mamba layer of a for a batch B x T, and bytes
 * of the largest backward scratch (0 without Mamba layers). */
size_t eng_mamba_fwd_floats(const arch *a, int B, int T);
size_t eng_mamba_bwd_bytes(const arch *a, int B, int T);

#endif
