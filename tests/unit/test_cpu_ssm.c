/* tests/unit/test_cpu_ssm.c — the CPU backend's selective-state scan (ssm_scan_fwd) against
 * the recurrence of its contract (engine/backend.h) evaluated step by step in double: the
 * outputs, the state left after each row's valid steps and the checkpoints before every
 * chunk, over odd and even lengths, right padding, a state carried in, odd row counts of
 * the state (P not a multiple of 4) and several heads per group. The kernel runs steps in
 * pairs over rows in blocks of four: every edge of those is among the cases.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/backend.h"

typedef struct {
    int B, T, H, P, G, S, chunk, lens[3], carry;
} scase;

static float frand(unsigned *st)
{
    *st = *st * 1103515245u + 12345u;
    return (float)((*st >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static double softplus_d(double v) { return v > 20 ? v : log1p(exp(v)); }

/* Largest |a - b| over n, relative to the largest |b| (at least 1). */
static double rel_err(const float *a, const double *b, size_t n)
{
    double m = 1, e = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs(b[i]) > m ? fabs(b[i]) : m;
    for (size_t i = 0; i < n; i++)
        e = fabs(a[i] - b[i]) > e ? fabs(a[i] - b[i]) : e;
    return e / m;
}

static void run_case(const scase *c)
{
    int B = c->B, T = c->T, H = c->H, P = c->P, G = c->G, S = c->S, di = H * P, cd = di + 2 * G * S,
        nch = (T + c->chunk - 1) / c->chunk, hpg = H / G;
    size_t ps = (size_t)P * S, nst = (size_t)B * H * ps;
    float *xbc = malloc(sizeof(float) * B * T * cd), *dt = malloc(sizeof(float) * B * T * H);
    float *y = malloc(sizeof(float) * B * T * di), *st = malloc(sizeof(float) * nst),
          *st0 = malloc(sizeof(float) * nst);
    float *ck = malloc(sizeof(float) * B * nch * H * ps), dtb[8], alog[8], D[8];
    double *ry = calloc((size_t)B * T * di, sizeof(double)), *rs = calloc(nst, sizeof(double));
    double *rck = calloc((size_t)B * nch * H * ps, sizeof(double));
    int *lens = malloc(sizeof(int) * B);
    assert_non_null(xbc);
    assert_non_null(dt);
    assert_non_null(y);
    assert_non_null(st);
    assert_non_null(st0);
    assert_non_null(ck);
    assert_non_null(ry);
    assert_non_null(rs);
    assert_non_null(rck);
    assert_non_null(lens);
    unsigned seed = 7u + (unsigned)(T * 131 + P * 7 + H);
    for (size_t i = 0; i < (size_t)B * T * cd; i++)
        xbc[i] = 2 * frand(&seed);
    for (size_t i = 0; i < (size_t)B * T * H; i++)
        dt[i] = 2 * frand(&seed);
    for (int h = 0; h < H; h++) {
        dtb[h] = frand(&seed) - 1;
        alog[h] = logf(1.0f + (float)h);
        D[h] = 1 + frand(&seed);
    }
    for (size_t i = 0; i < nst; i++)
        rs[i] = st0[i] = st[i] = c->carry ? frand(&seed) : 0.0f;
    for (int b = 0; b < B; b++)
        lens[b] = c->lens[b];
    /* the recurrence, step by step */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / hpg;
            double A = -exp((double)alog[h]), *s = rs + ((size_t)b * H + h) * ps;
            for (int t = 0; t < T; t++) {
                if (t % c->chunk == 0)
                    memcpy(rck + (((size_t)b * nch + t / c->chunk) * H + h) * ps, s, sizeof(double) * ps);
                if (t >= lens[b])
                    continue;
                const float *row = xbc + ((size_t)b * T + t) * cd, *x = row + (size_t)h * P;
                const float *Bg = row + di + (size_t)g * S, *Cg = Bg + (size_t)G * S;
                double d = softplus_d((double)dt[((size_t)b * T + t) * H + h] + dtb[h]), da = exp(d * A);
                for (int p = 0; p < P; p++) {
                    double acc = 0;
                    for (int j = 0; j < S; j++) {
                        s[(size_t)p * S + j] = s[(size_t)p * S + j] * da + d * x[p] * Bg[j];
                        acc += s[(size_t)p * S + j] * Cg[j];
                    }
                    ry[((size_t)b * T + t) * di + (size_t)h * P + p] = acc + D[h] * x[p];
                }
            }
        }
    eng_backend *be = eng_backend_cpu_new(2);
    assert_non_null(be);
    memset(y, 0xff, sizeof(float) * B * T * di);   /* NaN: padded steps must be written */
    be->ssm_scan_fwd(be, y, ck, xbc, dt, dtb, alog, D, st, lens, B, T, H, P, G, S, c->chunk);
    double ey = rel_err(y, ry, (size_t)B * T * di), es = rel_err(st, rs, nst);
    double ec = rel_err(ck, rck, (size_t)B * nch * H * ps);
    if (ey > 1e-5 || es > 1e-5 || ec > 1e-5)
        print_error("B=%d T=%d H=%d P=%d G=%d S=%d chunk=%d: y %.3g, state %.3g, ckpt %.3g\n", B, T, H, P, G, S,
                    c->chunk, ey, es, ec);
    assert_true(ey <= 1e-5);
    assert_true(es <= 1e-5);
    assert_true(ec <= 1e-5);
    /* without checkpoints (inference): the same outputs and state */
    float *y2 = malloc(sizeof(float) * B * T * di), *st2 = malloc(sizeof(float) * nst);
    assert_non_null(y2);
    assert_non_null(st2);
    for (size_t i = 0; i < nst; i++)
        st2[i] = st0[i];
    be->ssm_scan_fwd(be, y2, NULL, xbc, dt, dtb, alog, D, st2, lens, B, T, H, P, G, S, c->chunk);
    assert_true(rel_err(y2, ry, (size_t)B * T * di) <= 1e-5);
    assert_true(rel_err(st2, rs, nst) <= 1e-5);
    be->destroy(be);
    free(y2);
    free(st2);
    free(xbc);
    free(dt);
    free(y);
    free(st);
    free(st0);
    free(ck);
    free(ry);
    free(rs);
    free(rck);
    free(lens);
}

static void test_scan_matches_recurrence(void **state)
{
    (void)state;
    static const scase cases[] = {
        {1, 9, 2, 4, 1, 8, 4, {9}, 0},             /* odd T, a chunk of 1 at the end */
        {2, 12, 4, 6, 2, 16, 4, {12, 7}, 1},       /* P % 4 = 2, padding from an odd step, state in */
        {3, 11, 6, 5, 3, 12, 3, {11, 1, 10}, 1},   /* odd chunk: pairs stop before its checkpoints */
        {1, 1, 2, 8, 2, 8, 32, {1}, 1},            /* one step: decode */
        {2, 8, 3, 7, 1, 24, 8, {0, 8}, 0},         /* an empty row; P % 4 = 3 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(&cases[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scan_matches_recurrence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
