// Scaffolding (tests/torch_headers/common/README.md): the CUDA runtime names the stubs use.
#pragma once
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
typedef int cudaError_t;
