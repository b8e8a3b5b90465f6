/* engine/rng.h — the project's seeded pseudo-random generators, header-only so that any
 * layer can draw the same streams: splitmix64 (seeding, random weights), xorshift64
 * (eng_sample's state) and xorshift64* (shuffles, Gumbel noise), with 53-bit uniforms and
 * a Box-Muller normal on top. Deterministic in their 64-bit state; not for secrets.
 */
#ifndef AC_ENGINE_RNG_H
#define AC_ENGINE_RNG_H

#include <math.h>
#include <stdint.h>

/* The seed every module's draws start from unless told otherwise (a job's spec `seed`
 * and evaluation.seed default to it): text packing order, DNAS samples, distillation
 * order, evaluation samples. */
#define ENG_DEFAULT_SEED 1234

/* splitmix64: advances *s by the golden-ratio increment; every state (0 too) is fine. */
static inline uint64_t eng_splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The splitmix64 state k draws after state s: a counter, so any draw of a stream is
 * reached at once (a stream filled in parallel pieces is the sequential one, bit for bit). */
static inline uint64_t eng_splitmix64_skip(uint64_t s, uint64_t k)
{
    return s + k * 0x9E3779B97F4A7C15ull;
}

/* xorshift64 (13, 7, 17): returns the new state. A zero state (never reached otherwise)
 * is replaced by the golden-ratio constant first. */
static inline uint64_t eng_xorshift64(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* xorshift64* (12, 25, 27, then the 0x2545F4914F6CDD1D multiplier on the output); zero
 * state handled as in eng_xorshift64. */
static inline uint64_t eng_xorshift64star(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* The top 53 bits of a draw as a double in [0, 1). */
static inline double eng_rng_unit(uint64_t x)
{
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* The top 53 bits of a draw as a double in (0, 1): never 0, so log() is safe. */
static inline double eng_rng_open01(uint64_t x)
{
    return ((x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* A standard normal from two splitmix64 draws (Box-Muller, cosine branch): the k-th
 * normal of a stream starts at eng_splitmix64_skip(s, 2k). */
static inline double eng_rng_normal(uint64_t *s)
{
    double u1 = eng_rng_open01(eng_splitmix64(s));
    double u2 = eng_rng_open01(eng_splitmix64(s));
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

#endif
