// cuda/emu/include/cublasLt.h — stand-in for the CUDA toolkit header, for the SIMT emulator only.
#pragma once
