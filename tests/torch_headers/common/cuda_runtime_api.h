// Scaffolding (tests/torch_headers/common/README.md): the CUDA runtime names the stubs use.
#pragma once
#include <stddef.h>
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
typedef int cudaError_t;
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice = 3 };
enum { cudaSuccess = 0 };
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                cudaStream_t stream);
