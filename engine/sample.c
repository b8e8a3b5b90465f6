/* engine/sample.c — next-token choice from host logits: greedy argmax, or softmax at a
 * temperature with optional nucleus (top-p) truncation, drawn from the caller's
 * xorshift64 state (engine/rng.h). One row at a time; no top-k, no repetition penalty.
 */
#include "engine/model.h"

#include <math.h>
#include <stdlib.h>

#include "engine/rng.h"

typedef struct {
    float p;
    int i;
} prob_idx;

static int cmp_desc(const void *a, const void *b)
{
    float x = ((const prob_idx *)a)->p, y = ((const prob_idx *)b)->p;
    return x < y ? 1 : x > y ? -1 : ((const prob_idx *)a)->i - ((const prob_idx *)b)->i;
}

int eng_sample(const float *logits, int V, float temperature, float top_p, uint64_t *rng)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (!(temperature > 0))
        return best;
    prob_idx *pi = malloc(sizeof *pi * (size_t)V);
    if (!pi)
        return best;   /* out of memory: degrade to greedy rather than fail */
    double sum = 0;
    for (int i = 0; i < V; i++) {
        double e = exp(((double)logits[i] - logits[best]) / temperature);
        pi[i].p = (float)e;
        pi[i].i = i;
        sum += e;
    }
    int keep = V;
    if (top_p > 0 && top_p < 1) {
        qsort(pi, (size_t)V, sizeof *pi, cmp_desc);
        double c = 0;
        for (keep = 0; keep < V;) {
            c += pi[keep].p / sum;
            keep++;
            if (c >= top_p)
                break;
        }
        sum = 0;
        for (int i = 0; i < keep; i++)
            sum += pi[i].p;
    }
    double u = eng_rng_unit(eng_xorshift64(rng)) * sum, c = 0;
    int tok = pi[keep - 1].i;
    for (int i = 0; i < keep; i++) {
        c += pi[i].p;
        if (u < c) {
            tok = pi[i].i;
            break;
        }
    }
    free(pi);
    return tok;
}
