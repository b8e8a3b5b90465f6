// cuda/emu/include/cuda_runtime.h — stand-in for the CUDA toolkit header, for the SIMT emulator only.
#pragma once
#include "emu_core.h"
typedef enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidValue = 1, cudaErrorNoDevice = 100 } cudaError_t;
typedef void *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef enum { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice } cudaMemcpyKind;
typedef enum { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75 } cudaDeviceAttr;
#define cudaStreamNonBlocking 1
struct cudaDeviceProp { char name[256]; size_t totalGlobalMem; int major, minor, multiProcessorCount; };
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t emu_malloc(void **p, size_t n);
template <typename T> cudaError_t cudaMalloc(T **p, size_t n) { return emu_malloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev);
typedef struct emu_pool *cudaMemPool_t;
typedef enum { cudaMemPoolAttrReleaseThreshold = 4, cudaMemPoolAttrReservedMemHigh = 6 } cudaMemPoolAttr;
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
template <typename T> cudaError_t cudaMallocAsync(T **p, size_t n, cudaStream_t s) { return cudaMallocAsync((void **)p, n, s); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
typedef enum { cudaMemAllocationTypePinned = 1 } cudaMemAllocationType;
typedef enum { cudaMemLocationTypeDevice = 1 } cudaMemLocationType;
typedef struct {
    cudaMemAllocationType allocType;
    struct {
        cudaMemLocationType type;
        int id;
    } location;
} cudaMemPoolProps;
cudaError_t cudaMemPoolCreate(cudaMemPool_t *p, const cudaMemPoolProps *props);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t p);
cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t s);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t p, size_t keep);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, cudaMemPoolAttr a, void *v);
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t p, cudaMemPoolAttr a, void *v);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
