/* engine/optim.c — AdamW over every weight of a model, in place on its backend: first and
 * second moments (n_params floats each) on the device, global-norm gradient clipping,
 * weight decay on matrices only. Host copies of the state for checkpoints. No schedule:
 * the caller passes the learning rate of each step.
 */
#include "engine/model.h"

#include <math.h>
#include <stdlib.h>

#include "engine/model_internal.h"

struct eng_adamw {
    eng_model *m;
    float *mb, *vb;              /* device [n_params] each */
    int64_t t;
};

eng_adamw *eng_adamw_new(eng_model *m)
{
    if (!m->grads)
        return NULL;
    eng_adamw *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->m = m;
    o->mb = m->be->alloc(m->be, m->n_params * F4);
    o->vb = m->be->alloc(m->be, m->n_params * F4);
    if (!o->mb || !o->vb) {
        eng_adamw_free(o);
        return NULL;
    }
    m->be->zero(m->be, o->mb, m->n_params * F4);
    m->be->zero(m->be, o->vb, m->n_params * F4);
    return o;
}

double eng_adamw_step(eng_adamw *o, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float clip, float grad_scale)
{
    eng_model *m = o->m;
    eng_backend *be = m->be;
    model_impl *im = m->impl;
    double norm = sqrt(be->sumsq(be, m->grads, m->n_params)) * fabs((double)grad_scale);
    if (!isfinite(norm))
        return norm;   /* a NaN or infinite gradient is not applied (clipping cannot scale it) */
    float gs = grad_scale;
    if (clip > 0 && norm > clip)
        gs = (float)(grad_scale * (clip / norm));
    o->t++;
    float bc1 = (float)(1.0 - pow(beta1, (double)o->t)), bc2 = (float)(1.0 - pow(beta2, (double)o->t));
    /* Weight decay applies to matrices (2-D tensors) only, not norms or biases. */
    for (int i = 0; i < im->n_tens; i++) {
        const tensor_ent *t = &im->tens[i];
        size_t n = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        be->adamw(be, m->params + t->off, m->grads + t->off, o->mb + t->off, o->vb + t->off, n, lr, beta1,
                  beta2, eps, t->ndim == 2 ? weight_decay : 0.0f, bc1, bc2, gs);
    }
    return norm;
}

int64_t eng_adamw_t(const eng_adamw *o)
{
    return o->t;
}

int eng_adamw_state(eng_adamw *o, float *m_host, float *v_host)
{
    eng_backend *be = o->m->be;
    be->to_host(be, m_host, o->mb, o->m->n_params * F4);
    be->to_host(be, v_host, o->vb, o->m->n_params * F4);
    return 0;
}

int eng_adamw_restore(eng_adamw *o, int64_t t, const float *m_host, const float *v_host)
{
    if (t < 0)
        return -1;
    eng_backend *be = o->m->be;
    be->to_device(be, o->mb, m_host, o->m->n_params * F4);
    be->to_device(be, o->vb, v_host, o->m->n_params * F4);
    o->t = t;
    return 0;
}

void eng_adamw_free(eng_adamw *o)
{
    if (!o)
        return;
    eng_backend *be = o->m->be;
    be->free(be, o->mb, o->mb ? o->m->n_params * F4 : 0);
    be->free(be, o->vb, o->vb ? o->m->n_params * F4 : 0);
    free(o);
}
