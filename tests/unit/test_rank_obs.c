/* tests/unit/test_rank_obs.c — ZipLM's greedy OBS order (compress/rank_obs.c) against a
 * direct computation: at every step, for the units still alive A, the refit weights
 * W_A = W0 Hd[:,A] Hd[A,A]^-1 and Hd[A,A]^-1 (Hd = H + 1% of its mean diagonal), from
 * scratch by Gauss-Jordan; the unit with the least |W_A[:,j]|^2 / (Hd[A,A]^-1)_jj goes.
 * The fast path updates both by rank-1 steps instead and must remove the same units in
 * the same order. Also: with an uncorrelated Gram no update moves another column, so the
 * order is the ascending |W[:,j]|^2 (H_jj + lambda); a zero column goes first.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "compress/rank.h"

enum { C = 5, F = 12, N = 40 };

static double urand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) / 9007199254740992.0 * 2 - 1;
}

/* inverse of the n x n matrix a (row-major, in place) by Gauss-Jordan with pivoting */
static void invert(double *a, int n)
{
    double *b = calloc((size_t)n * n, sizeof *b);
    int *p = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        b[i * n + i] = 1, p[i] = i;
    for (int c = 0; c < n; c++) {
        int r = c;
        for (int i = c + 1; i < n; i++)
            if (fabs(a[i * n + c]) > fabs(a[r * n + c]))
                r = i;
        for (int j = 0; j < n; j++) {
            double t = a[c * n + j];
            a[c * n + j] = a[r * n + j], a[r * n + j] = t;
            t = b[c * n + j];
            b[c * n + j] = b[r * n + j], b[r * n + j] = t;
        }
        double d = a[c * n + c];
        for (int j = 0; j < n; j++)
            a[c * n + j] /= d, b[c * n + j] /= d;
        for (int i = 0; i < n; i++)
            if (i != c) {
                double f = a[i * n + c];
                for (int j = 0; j < n; j++)
                    a[i * n + j] -= f * a[c * n + j], b[i * n + j] -= f * b[c * n + j];
            }
    }
    memcpy(a, b, sizeof(double) * (size_t)n * n);
    free(b);
    free(p);
}

/* the removal step of every column, computed from scratch at each step */
static void direct_order(const double *G, const float *W, double *step)
{
    double Hd[F * F], tr = 0;
    memcpy(Hd, G, sizeof Hd);
    for (int i = 0; i < F; i++)
        tr += G[i * F + i];
    for (int i = 0; i < F; i++)
        Hd[i * F + i] += 0.01 * tr / F;
    int alive[F], k = F;
    for (int j = 0; j < F; j++)
        alive[j] = j;
    for (int s = 0; s < F; s++, k--) {
        double Hi[F * F], best = INFINITY;
        for (int a = 0; a < k; a++)
            for (int b = 0; b < k; b++)
                Hi[a * k + b] = Hd[alive[a] * F + alive[b]];
        invert(Hi, k);
        int bi = 0;
        for (int a = 0; a < k; a++) {   /* column a of W0 Hd[:,A] Hi, squared norm over the C rows */
            double w2 = 0;
            for (int c = 0; c < C; c++) {
                double v = 0;
                for (int b = 0; b < k; b++) {
                    double wh = 0;   /* (W0 Hd[:,A])[c, b] */
                    for (int j = 0; j < F; j++)
                        wh += W[c * F + j] * Hd[j * F + alive[b]];
                    v += wh * Hi[b * k + a];
                }
                w2 += v * v;
            }
            double sc = w2 / Hi[a * k + a];
            if (sc < best)
                best = sc, bi = a;
        }
        step[alive[bi]] = s;
        for (int a = bi; a + 1 < k; a++)
            alive[a] = alive[a + 1];
    }
}

static void test_matches_direct(void **state)
{
    (void)state;
    uint64_t seed = 7;
    for (int trial = 0; trial < 5; trial++) {
        float X[N * F], W[C * F];
        for (int i = 0; i < N * F; i++)   /* correlated inputs: a shared factor per row */
            X[i] = (float)(urand(&seed) + 0.8 * (i % F < 6 ? 1 : -0.5) * urand(&seed));
        for (int i = 0; i < C * F; i++)
            W[i] = (float)urand(&seed);
        double G[F * F] = {0};
        for (int r = 0; r < N; r++)
            for (int i = 0; i < F; i++)
                for (int j = 0; j < F; j++)
                    G[i * F + j] += (double)X[r * F + i] * X[r * F + j];
        double fast[F], want[F];
        assert_int_equal(rank_obs_order(G, W, C, F, fast), 0);
        direct_order(G, W, want);
        for (int j = 0; j < F; j++)
            if (fast[j] != want[j])
                fail_msg("trial %d: column %d removed at step %g, directly at step %g", trial, j, fast[j], want[j]);
    }
}

static void test_uncorrelated(void **state)
{
    (void)state;
    double G[F * F] = {0}, step[F];
    float W[C * F];
    for (int j = 0; j < F; j++)
        G[j * F + j] = 1 + j % 4;
    for (int c = 0; c < C; c++)
        for (int j = 0; j < F; j++)
            W[c * F + j] = j == 5 ? 0.0f : (float)(1 + ((j * 7) % F)) / F;
    assert_int_equal(rank_obs_order(G, W, C, F, step), 0);
    assert_true(step[5] == 0);   /* the zero column costs nothing */
    double tr = 0;
    for (int j = 0; j < F; j++)
        tr += G[j * F + j];
    for (int a = 0; a < F; a++)
        for (int b = 0; b < F; b++) {
            double sa = C * W[a] * W[a] * (G[a * F + a] + 0.01 * tr / F), sb = C * W[b] * W[b] * (G[b * F + b] + 0.01 * tr / F);
            if (sa < sb)
                assert_true(step[a] < step[b]);
        }
    /* every step once */
    int seen[F] = {0};
    for (int j = 0; j < F; j++)
        seen[(int)step[j]]++;
    for (int j = 0; j < F; j++)
        assert_int_equal(seen[j], 1);
}

static void test_no_signal(void **state)
{
    (void)state;
    double G[F * F] = {0}, step[F];
    float W[C * F] = {0};
    assert_int_equal(rank_obs_order(G, W, C, F, step), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_direct),
        cmocka_unit_test(test_uncorrelated),
        cmocka_unit_test(test_no_signal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
