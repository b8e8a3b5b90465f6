/* engine/linalg.c — Gram, cross products and damped solves for least-squares refits
 * (engine/linalg.h). Products run through sgemm on blocks of LA_ROWS rows and are summed
 * into fp64, so the sums over many rows keep fp64 precision while the arithmetic runs at
 * fp32 GEMM speed; the solve is LAPACK's dposv in fp64.
 */
#include "engine/linalg.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

enum { LA_ROWS = 512 };

/* LAPACK (Fortran calling convention; the trailing length is gfortran's hidden one). */
extern void dposv_(const char *uplo, const int *n, const int *nrhs, double *a, const int *lda, double *b,
                   const int *ldb, int *info, size_t uplo_len);
extern void dpotrf_(const char *uplo, const int *n, double *a, const int *lda, int *info, size_t uplo_len);
extern void dpotri_(const char *uplo, const int *n, double *a, const int *lda, int *info, size_t uplo_len);

void eng_la_gram(double *G, const float *X, size_t n, int d)
{
    float *t = malloc(sizeof(float) * (size_t)d * d);
    if (!t) {   /* fp64 by rows: slow but exact */
        for (size_t r = 0; r < n; r++)
            for (int i = 0; i < d; i++)
                for (int j = 0; j < d; j++)
                    G[(size_t)i * d + j] += (double)X[r * d + i] * X[r * d + j];
        return;
    }
    for (size_t r0 = 0; r0 < n; r0 += LA_ROWS) {
        int nr = (int)(n - r0 < LA_ROWS ? n - r0 : LA_ROWS);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, nr, 1.0f, X + r0 * d, d, X + r0 * d, d, 0.0f,
                    t, d);
        for (size_t i = 0; i < (size_t)d * d; i++)
            G[i] += t[i];
    }
    free(t);
}

void eng_la_cross(double *R, const float *Y, int ldy, int dy, const float *X, int dx, size_t n)
{
    float *t = malloc(sizeof(float) * (size_t)dy * dx);
    if (!t) {
        for (size_t r = 0; r < n; r++)
            for (int i = 0; i < dy; i++)
                for (int j = 0; j < dx; j++)
                    R[(size_t)i * dx + j] += (double)Y[r * ldy + i] * X[r * dx + j];
        return;
    }
    for (size_t r0 = 0; r0 < n; r0 += LA_ROWS) {
        int nr = (int)(n - r0 < LA_ROWS ? n - r0 : LA_ROWS);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dy, dx, nr, 1.0f, Y + r0 * ldy, ldy, X + r0 * dx, dx,
                    0.0f, t, dx);
        for (size_t i = 0; i < (size_t)dy * dx; i++)
            R[i] += t[i];
    }
    free(t);
}

/* lambda = damp times the mean of G's diagonal (also into *out when out is set): 0, or 1
 * when the diagonal is all zero (no signal). */
static int damping(const double *G, int d, double damp, double *lam, double *out)
{
    double tr = 0;
    for (int i = 0; i < d; i++)
        tr += G[(size_t)i * d + i];
    if (!(tr > 0))
        return 1;
    *lam = damp * tr / d;
    if (out)
        *out = *lam;
    return 0;
}

int eng_la_ridge(const double *G, const double *R, const float *prior, int d, int dy, double damp, float *W,
                 double *lambda)
{
    double lam;
    if (damping(G, d, damp, &lam, lambda))
        return 1;
    double *A = malloc(sizeof(double) * (size_t)d * d), *B = malloc(sizeof(double) * (size_t)d * dy);
    if (!A || !B) {
        free(A);
        free(B);
        return -1;
    }
    memcpy(A, G, sizeof(double) * (size_t)d * d);
    for (int i = 0; i < d; i++)
        A[(size_t)i * d + i] += lam;
    /* Row-major R [dy, d] is column-major R^T [d, dy]: one right-hand side per output
     * row; the solution Z = (G + lambda I)^-1 R^T, column-major [d, dy], is W row-major. */
    memcpy(B, R, sizeof(double) * (size_t)d * dy);
    for (size_t i = 0; prior && i < (size_t)d * dy; i++)
        B[i] += lam * prior[i];
    int info = 0;
    dposv_("L", &d, &dy, A, &d, B, &d, &info, 1);
    if (info == 0)
        for (size_t i = 0; i < (size_t)d * dy; i++)
            W[i] = (float)B[i];
    free(A);
    free(B);
    return info == 0 ? 0 : 1;
}

void eng_la_matmul(const float *A, const float *B, float *C, int m, int n, int k)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, A, k, B, n, 0.0f, C, n);
}

void eng_la_apply(const float *X, size_t n, int d, const float *W, int dy, float *out)
{
    for (size_t r0 = 0; r0 < n; r0 += LA_ROWS) {
        int nr = (int)(n - r0 < LA_ROWS ? n - r0 : LA_ROWS);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, dy, d, 1.0f, X + r0 * d, d, W, d, 0.0f,
                    out + r0 * dy, dy);
    }
}

double eng_la_sq_residual(const float *X, size_t n, int d, const float *W, int dy, const float *Y, int ldy)
{
    float *t = malloc(sizeof(float) * (size_t)LA_ROWS * dy);
    if (!t)
        return -1.0;
    double s = 0;
    for (size_t r0 = 0; r0 < n; r0 += LA_ROWS) {
        int nr = (int)(n - r0 < LA_ROWS ? n - r0 : LA_ROWS);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, dy, d, 1.0f, X + r0 * d, d, W, d, 0.0f, t, dy);
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < dy; j++) {
                double e = (double)t[(size_t)r * dy + j] - Y[(r0 + r) * ldy + j];
                s += e * e;
            }
    }
    free(t);
    return s;
}

int eng_la_spd_inverse(double *A, int d, double damp, double *lambda)
{
    double lam;
    if (damping(A, d, damp, &lam, lambda))
        return 1;
    for (int i = 0; i < d; i++)
        A[(size_t)i * d + i] += lam;
    int info = 0;
    /* row-major symmetric = column-major symmetric: "L" of one is "U" of the other, and
       the result's other triangle is filled from it below */
    dpotrf_("L", &d, A, &d, &info, 1);
    if (info == 0)
        dpotri_("L", &d, A, &d, &info, 1);
    if (info != 0)
        return 1;
    for (int i = 0; i < d; i++)   /* column-major lower = row-major upper: copy it down */
        for (int j = i + 1; j < d; j++)
            A[(size_t)j * d + i] = A[(size_t)i * d + j];
    return 0;
}
