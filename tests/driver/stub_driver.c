/* A "driver" that exports only a few cu* entry points, to check that drv_load names the first
 * missing one. Never called. */
#include <cuda.h>

CUresult CUDAAPI cuInit(unsigned int Flags) { (void)Flags; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
CUresult CUDAAPI cuGetErrorName(CUresult e, const char **s) { (void)e; *s = "CUDA_ERROR_STUB"; return CUDA_SUCCESS; }
CUresult CUDAAPI cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "stub"; return CUDA_SUCCESS; }
