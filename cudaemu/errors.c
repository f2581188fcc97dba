/* CUresult names and descriptions: cuGetErrorName / cuGetErrorString, and name lookup for
 * CUDAEMU_FAIL. The names are cuda.h's CUresult enumerators (CUDA 13.0). */
#include <stdlib.h>
#include <string.h>

#include "cudaemu/emu.h"

#define ERR_FOREACH(X) \
    X(CUDA_SUCCESS) \
    X(CUDA_ERROR_ALREADY_ACQUIRED) \
    X(CUDA_ERROR_ALREADY_MAPPED) \
    X(CUDA_ERROR_ARRAY_IS_MAPPED) \
    X(CUDA_ERROR_ASSERT) \
    X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER) \
    X(CUDA_ERROR_CAPTURED_EVENT) \
    X(CUDA_ERROR_CDP_NOT_SUPPORTED) \
    X(CUDA_ERROR_CDP_VERSION_MISMATCH) \
    X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE) \
    X(CUDA_ERROR_CONTAINED) \
    X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT) \
    X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE) \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED) \
    X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) \
    X(CUDA_ERROR_DEINITIALIZED) \
    X(CUDA_ERROR_DEVICE_NOT_LICENSED) \
    X(CUDA_ERROR_DEVICE_UNAVAILABLE) \
    X(CUDA_ERROR_ECC_UNCORRECTABLE) \
    X(CUDA_ERROR_EXTERNAL_DEVICE) \
    X(CUDA_ERROR_FILE_NOT_FOUND) \
    X(CUDA_ERROR_FUNCTION_NOT_LOADED) \
    X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) \
    X(CUDA_ERROR_HARDWARE_STACK_ERROR) \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) \
    X(CUDA_ERROR_ILLEGAL_ADDRESS) \
    X(CUDA_ERROR_ILLEGAL_INSTRUCTION) \
    X(CUDA_ERROR_ILLEGAL_STATE) \
    X(CUDA_ERROR_INVALID_ADDRESS_SPACE) \
    X(CUDA_ERROR_INVALID_CLUSTER_SIZE) \
    X(CUDA_ERROR_INVALID_CONTEXT) \
    X(CUDA_ERROR_INVALID_DEVICE) \
    X(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT) \
    X(CUDA_ERROR_INVALID_HANDLE) \
    X(CUDA_ERROR_INVALID_IMAGE) \
    X(CUDA_ERROR_INVALID_PC) \
    X(CUDA_ERROR_INVALID_PTX) \
    X(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION) \
    X(CUDA_ERROR_INVALID_RESOURCE_TYPE) \
    X(CUDA_ERROR_INVALID_SOURCE) \
    X(CUDA_ERROR_INVALID_VALUE) \
    X(CUDA_ERROR_JIT_COMPILATION_DISABLED) \
    X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND) \
    X(CUDA_ERROR_KEY_ROTATION) \
    X(CUDA_ERROR_LAUNCH_FAILED) \
    X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING) \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) \
    X(CUDA_ERROR_LAUNCH_TIMEOUT) \
    X(CUDA_ERROR_LOSSY_QUERY) \
    X(CUDA_ERROR_MAP_FAILED) \
    X(CUDA_ERROR_MISALIGNED_ADDRESS) \
    X(CUDA_ERROR_MPS_CLIENT_TERMINATED) \
    X(CUDA_ERROR_MPS_CONNECTION_FAILED) \
    X(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED) \
    X(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED) \
    X(CUDA_ERROR_MPS_RPC_FAILURE) \
    X(CUDA_ERROR_MPS_SERVER_NOT_READY) \
    X(CUDA_ERROR_NOT_FOUND) \
    X(CUDA_ERROR_NOT_INITIALIZED) \
    X(CUDA_ERROR_NOT_MAPPED) \
    X(CUDA_ERROR_NOT_MAPPED_AS_ARRAY) \
    X(CUDA_ERROR_NOT_MAPPED_AS_POINTER) \
    X(CUDA_ERROR_NOT_PERMITTED) \
    X(CUDA_ERROR_NOT_READY) \
    X(CUDA_ERROR_NOT_SUPPORTED) \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU) \
    X(CUDA_ERROR_NO_DEVICE) \
    X(CUDA_ERROR_NVLINK_UNCORRECTABLE) \
    X(CUDA_ERROR_OPERATING_SYSTEM) \
    X(CUDA_ERROR_OUT_OF_MEMORY) \
    X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) \
    X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED) \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) \
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE) \
    X(CUDA_ERROR_PROFILER_ALREADY_STARTED) \
    X(CUDA_ERROR_PROFILER_ALREADY_STOPPED) \
    X(CUDA_ERROR_PROFILER_DISABLED) \
    X(CUDA_ERROR_PROFILER_NOT_INITIALIZED) \
    X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED) \
    X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND) \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) \
    X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION) \
    X(CUDA_ERROR_STREAM_CAPTURE_MERGE) \
    X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED) \
    X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED) \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) \
    X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) \
    X(CUDA_ERROR_STUB_LIBRARY) \
    X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH) \
    X(CUDA_ERROR_SYSTEM_NOT_READY) \
    X(CUDA_ERROR_TENSOR_MEMORY_LEAK) \
    X(CUDA_ERROR_TIMEOUT) \
    X(CUDA_ERROR_TOO_MANY_PEERS) \
    X(CUDA_ERROR_UNKNOWN) \
    X(CUDA_ERROR_UNMAP_FAILED) \
    X(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC) \
    X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY) \
    X(CUDA_ERROR_UNSUPPORTED_LIMIT) \
    X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION) \


static const struct err_entry {
    CUresult res;
    const char *name;
} err_table[] = {
#define ERR_ROW(n) {n, #n},
    ERR_FOREACH(ERR_ROW)
#undef ERR_ROW
};

/* Descriptions for the codes cudaemu returns; the others read "<name> (see cuda.h)". */
static const struct err_desc {
    CUresult res;
    const char *text;
} err_descs[] = {
    {CUDA_SUCCESS, "no error"},
    {CUDA_ERROR_INVALID_VALUE, "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "the operation is not permitted in the current state"},
    {CUDA_ERROR_NOT_READY, "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"},
    {CUDA_ERROR_NOT_PERMITTED, "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not initiated in this stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_UNKNOWN, "unknown error"},
};

static const struct err_entry *err_find(CUresult res)
{
    for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++)
        if (err_table[i].res == res)
            return &err_table[i];
    return NULL;
}

int emu_result_lookup(const char *name)
{
    for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++)
        if (!strcmp(err_table[i].name, name))
            return (int)err_table[i].res;
    char *end;
    long v = strtol(name, &end, 10);
    if (*name && !*end && v >= 0 && err_find((CUresult)v))
        return (int)v;
    return -1;
}

/* Like the real driver, these two work before cuInit; an unknown code is CUDA_ERROR_INVALID_VALUE
 * with *pStr = NULL. */
CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    CUresult r = emu_enter(EMU_E_cuGetErrorName);
    if (r != CUDA_SUCCESS)
        return r;
    /* No check of pStr: a NULL string out faults the H200's driver (580.159.04), so it faults
     * here too. */
    const struct err_entry *e = err_find(error);
    *(const char *volatile *)pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    CUresult r = emu_enter(EMU_E_cuGetErrorString);
    if (r != CUDA_SUCCESS)
        return r;
    /* Like cuGetErrorName: a NULL string out faults (unmeasured for this entry). */
    const struct err_entry *e = err_find(error);
    if (!e) {
        *(const char *volatile *)pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < sizeof err_descs / sizeof err_descs[0]; i++) {
        if (err_descs[i].res == error) {
            *pStr = err_descs[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = e->name;
    return CUDA_SUCCESS;
}
