// cuda/emu/include/nccl.h — stand-in for the CUDA toolkit header, for the SIMT emulator only.
#pragma once
#include "cuda_runtime.h"
typedef struct emu_nccl *ncclComm_t;
typedef enum { ncclSuccess = 0, ncclInvalidUsage = 5 } ncclResult_t;
typedef enum { ncclFloat = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
ncclResult_t ncclCommInitAll(ncclComm_t *c, int n, const int *devs);
ncclResult_t ncclCommDestroy(ncclComm_t c);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t st);
const char *ncclGetErrorString(ncclResult_t r);
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *c, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommAbort(ncclComm_t c);
