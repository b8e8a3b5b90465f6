// cuda/emu/include/cuda_bf16.h — stand-in for the CUDA toolkit header, for the SIMT emulator only.
#pragma once
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 { uint16_t b; };
inline __nv_bfloat16 __float2bfloat16_rn(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); __nv_bfloat16 r; r.b = (uint16_t)(u >> 16); return r; }
inline float emu_bf16_to_float(__nv_bfloat16 h) { uint32_t u = (uint32_t)h.b << 16; float f; memcpy(&f, &u, 4); return f; }
