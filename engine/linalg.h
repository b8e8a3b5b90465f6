/* engine/linalg.h — host linear algebra for least-squares refits of a linear layer:
 * Gram and cross products of fp32 activations accumulated in fp64, the damped normal
 * equations solved by LAPACK's Cholesky (dposv, from the OpenBLAS the engine links) in
 * fp64, and the squared residual of a weight matrix. Row-major throughout; weights are
 * [out, in] as in HF.
 */
#ifndef AC_ENGINE_LINALG_H
#define AC_ENGINE_LINALG_H

#include <stddef.h>

/* G[d,d] += X^T X for X [n, d] (ld = d). */
void eng_la_gram(double *G, const float *X, size_t n, int d);

/* R[dy,dx] += Y^T X for Y [n, dy] (rows ldy apart) and X [n, dx] (ld = dx). */
void eng_la_cross(double *R, const float *Y, int ldy, int dy, const float *X, int dx, size_t n);

/* The damped least-squares weights W [dy, d] = (R + lambda P)(G + lambda I)^-1 with
 * lambda = damp times the mean of G's diagonal (*lambda gets it; may be NULL): the
 * minimum of |X W^T - Y|^2 + lambda |W - P|^2 for G = X^T X, R = Y^T X, damped toward
 * the prior P [dy, d] (NULL: toward zero). G is not changed.
 * 0; 1 when G's diagonal is all zero (no signal) or LAPACK finds the system not
 * positive definite; -1 when out of memory. W is untouched unless 0. */
int eng_la_ridge(const double *G, const double *R, const float *prior, int d, int dy, double damp, float *W,
                 double *lambda);

/* A [d, d] (symmetric, row-major) := (A + lambda I)^-1 in place, lambda = damp times the
 * mean of A's diagonal (*lambda gets it; may be NULL), by LAPACK's Cholesky (dpotrf,
 * dpotri) in fp64. 0; 1 when the diagonal is all zero or the matrix is not positive
 * definite (A is then clobbered). */
int eng_la_spd_inverse(double *A, int d, double damp, double *lambda);

/* C [m, n] = A [m, k] B [k, n] (row-major, fp32). */
void eng_la_matmul(const float *A, const float *B, float *C, int m, int n, int k);

/* out [n, dy] = X [n, d] W^T for W [dy, d] (fp32, in blocks). */
void eng_la_apply(const float *X, size_t n, int d, const float *W, int dy, float *out);

/* Sum of squares of X W^T - Y over n rows: X [n, d], W [dy, d], Y [n, dy] (rows ldy
 * apart), in fp64 (the products in fp32 blocks). -1.0 when out of memory. */
double eng_la_sq_residual(const float *X, size_t n, int d, const float *W, int dy, const float *Y, int ldy);

#endif
