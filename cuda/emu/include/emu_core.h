// cuda/emu/include/emu_core.h — the device side of the SIMT emulator (cuda/emu/emu.cpp):
// thread/block indices, __syncthreads, warp shuffles, atomics. Test tool only, never in a build.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <algorithm>
#include <math.h>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef dim3 uint3;
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

void emu_syncthreads();
void emu_warp_sync();
void emu_launch(dim3 g, dim3 b, size_t shm, std::function<void()> body);
extern float sm[1 << 16];
extern void *emu_warp_slot(int lane);   // per-warp exchange slots (16 bytes each)

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __syncthreads() emu_syncthreads()
#define __syncwarp() emu_warp_sync()

template <typename T>
T emu_shfl(T v, int src)
{
    int lane = threadIdx.x & 31;
    memcpy(emu_warp_slot(lane), &v, sizeof(T));
    emu_warp_sync();
    T r;
    memcpy(&r, emu_warp_slot(src & 31), sizeof(T));
    emu_warp_sync();
    return r;
}
template <typename T> T __shfl_sync(unsigned, T v, int src) { return emu_shfl(v, src); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) { return emu_shfl(v, (int)(threadIdx.x & 31) ^ o); }
inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }
inline double atomicAdd(double *p, double v) { double o = *p; *p = o + v; return o; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
