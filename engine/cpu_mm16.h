/* engine/cpu_mm16.h — 16-bit GEMMs for the CPU backend (engine-private): operands
 * rounded to bf16 (or fp16) and multiplied with fp32 accumulation into fp32 output, the
 * same contract as the CUDA backend's CU_PREC_BF16. The multiply runs in oneDNN's matmul
 * primitive, which picks its kernels from the CPU (AVX512-BF16 and AMX where present);
 * a CPU on which oneDNN has only its reference kernel for a type is refused at creation,
 * since that would be slower than fp32 and say nothing about the hardware.
 */
#ifndef AC_ENGINE_CPU_MM16_H
#define AC_ENGINE_CPU_MM16_H

#include <stddef.h>
#include <stdint.h>

enum { MM16_BF16 = 1, MM16_FP16 = 2 };

typedef struct cpu_mm16 cpu_mm16;

/* Create for `type` (MM16_BF16 / MM16_FP16): a oneDNN CPU engine and stream, probed with
 * a small matmul. Returns NULL with the reason in err when oneDNN cannot run that type
 * on this CPU with a hardware kernel, or out of memory. */
cpu_mm16 *cpu_mm16_new(int type, char *err, size_t errlen);
void cpu_mm16_free(cpu_mm16 *m);

/* C[M,N] = alpha * op(A) op(B) + beta * C with backend.h's gemm conventions (ta, tb,
 * leading dimensions; beta = 0 ignores C's old contents). A and B are rounded to the
 * type (round to nearest even; NaN stays NaN) into a private workspace that grows to the
 * largest call's operands. Returns 0, or -1 with the first failure kept for
 * cpu_mm16_error (out of memory, a oneDNN error); C is then undefined. */
int cpu_mm16_gemm(cpu_mm16 *m, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);

/* Declare [p, p+n) constant until cpu_mm16_const_end(m, p): a GEMM whose B operand lies
 * inside it rounds B once into a kept copy and reuses it (a frozen teacher's weights, a
 * student's between two optimizer steps). Nothing may write the range in between. At
 * most 64 ranges at once (beyond that, or past a quarter of the RAM (8 GiB at most) in
 * copies, B is rounded per call as before). */
void cpu_mm16_const_begin(cpu_mm16 *m, const float *p, size_t n);
void cpu_mm16_const_end(cpu_mm16 *m, const float *p);

/* The kept rounded copy of B [rows, cols] (row stride ld; compact, row stride cols) when
 * B lies in a constant range (made on first use), else NULL. */
const uint16_t *cpu_mm16_const_copy(cpu_mm16 *m, const float *B, int rows, int cols, int ld);

/* The CPU backend's decode-shape GEMM (few rows of A, weights [n, K] row-major, one
 * streaming pass over them): C[m, o] = alpha * A[m,:] . W[o,:] + beta * C[m, o] for
 * m < M <= CPU_ROWS_MAX_M, o < n. The weights are Wh (kept 16-bit, of type r16) when
 * given, else Wf: fp32, rounded to r16 as they are read when r16 is set. Every form sums
 * in the same order, so a kept copy gives the bits of rounding as it streams. */
#define CPU_ROWS_MAX_M 8
void cpu_gemm_rows(int r16, const float *Wf, const uint16_t *Wh, int ldw, const float *A, int lda, int M, float *C,
                   int ldc, int n, int K, float alpha, float beta);

/* The same at bf16 on AVX512-BF16 (vdpbf16ps, 32 products a step; products exact, sums in
 * fp32): A16 is A as bf16 rows of stride kp (cpu_impl_round_rows' rows16), the weights
 * Wh (kept) or Wf (rounded as read, by the instruction's round-to-nearest-even): both
 * forms give the same bits. Denormal inputs count as zero, as the instruction does. */
void cpu_gemm_rows_dp(const float *Wf, const uint16_t *Wh, int ldw, const uint16_t *A16, int kp, int M, float *C,
                      int ldc, int n, int K, float alpha, float beta);

/* The first failure since creation ("" when none); cpu_mm16_fail records one from a
 * caller (kept only when none is recorded yet). */
const char *cpu_mm16_error(const cpu_mm16 *m);
void cpu_mm16_fail(cpu_mm16 *m, const char *why);

/* Bytes held by the operand workspace and the constant ranges' copies (not in the
 * backend's cur_bytes/peak_bytes). */
size_t cpu_mm16_workspace_bytes(const cpu_mm16 *m);

/* The kernel oneDNN chose for the probe ("brg:avx512_core_bf16", ...). */
const char *cpu_mm16_impl(const cpu_mm16 *m);

/* x rounded to bf16 (round to nearest even; a NaN stays a quiet NaN): its 16 bits. */
static inline uint16_t mm16_bf16_bits(float x)
{
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* x rounded to the type and back to fp32: the rounding cpu_mm16_gemm applies, for paths
 * that multiply in fp32 on rounded operands. */
static inline float mm16_round1(int type, float x)
{
    if (type == MM16_FP16)
        return (float)(_Float16)x;
    uint32_t u = (uint32_t)mm16_bf16_bits(x) << 16;
    __builtin_memcpy(&x, &u, 4);
    return x;
}

/* The CPU backend's be->impl: the 16-bit GEMM state, present only while a 16-bit
 * precision is set (eng_backend_cpu_set_precision). */
typedef struct {
    int type;            /* MM16_BF16 / MM16_FP16 */
    cpu_mm16 *mm;
    float *rows;         /* decode path: the few rows of A, rounded */
    size_t rows_n;
    uint16_t *rows16;    /* the same rows as bf16 pairs for AVX512-BF16 dot products
                          * (row stride kp, zero-padded), or NULL where the CPU lacks them */
    size_t rows16_n;
    int kp;
} cpu_impl;

void cpu_impl_free(cpu_impl *ci);   /* NULL is a no-op */
/* A's M rows rounded to ci's type into ci->rows (row stride K), and at bf16 on a CPU with
 * AVX512-BF16 also packed into ci->rows16 (else that stays NULL); NULL when out of memory. */
const float *cpu_impl_round_rows(cpu_impl *ci, const float *A, int lda, int M, int K);

#endif
