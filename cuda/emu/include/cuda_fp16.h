// cuda/emu/include/cuda_fp16.h — stand-in for the CUDA toolkit header, for the SIMT emulator only.
#pragma once
struct __half { _Float16 h; };
inline __half __float2half_rn(float f) { __half r; r.h = (_Float16)f; return r; }
inline float emu_half_to_float(__half h) { return (float)h.h; }
