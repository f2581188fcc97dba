/*
 * VMM conformance suite, written against the driver API only (drv_load / drv), mirroring the
 * cases of ROCm hip-tests' catch/unit/virtualMemoryManagement: success paths and each misuse with
 * the CUresult the driver documents. It runs on cudaemu in CI and, unchanged, on a real GPU
 * (-Demulator=false); emulator-only checks skip themselves there, and the whole program exits 77
 * when no driver or device is found.
 *
 * The misuse and capture tables print one line per row ("row -> got X, expected Y"), so a run on
 * a real GPU records where the emulator and the driver differ; a mismatch fails the test.
 *
 * Fault checks (touching unmapped or inaccessible memory) run in a fresh process (this binary
 * re-executed with --fault=KIND), because a CUDA context does not survive fork and a real fault
 * poisons the context: on cudaemu the child touches the memory directly and must die by SIGSEGV;
 * on a GPU it uses cuMemsetD8 + cuCtxSynchronize and must fail or crash.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/common/testutil.h"
#include "vmm/kernel.h"

static size_t G;   /* minimum granularity of device 0 */

static CUmemAllocationProp prop_dev(int dev, CUmemAllocationHandleType types)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = types;
    return p;
}

static CUdeviceptr reserve(size_t size)
{
    CUdeviceptr va = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&va, size, 0, 0, 0));
    return va;
}

static CUmemGenericAllocationHandle create(size_t size)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle h = 0;
    tu_assert_cu(drv->cuMemCreate(&h, size, &p, 0));
    return h;
}

static CUresult set_rw(CUdeviceptr va, size_t size)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return drv->cuMemSetAccess(va, size, &d, 1);
}

static size_t free_mem(void)
{
    size_t f = 0, t = 0;
    tu_assert_cu(drv->cuMemGetInfo(&f, &t));
    return f;
}

static int setup(void **state)
{
    (void)state;
    tu_ctx_set();
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Misuse table: each row sets up what it needs, makes the one bad call, cleans up, and returns
 * the bad call's result. Cleanup ignores results: on the real driver a row that unexpectedly
 * succeeded may leave a different state.
 * ------------------------------------------------------------------------------------------- */

struct misuse {
    const char *what;
    CUresult expected;      /* on cudaemu */
    CUresult real;          /* on the real driver, where measured different (see `differs`) */
    bool differs;           /* cudaemu is deliberately stricter than the driver here */
    bool emu_only;          /* undefined behaviour on the real driver (e.g. an unknown handle) */
    CUresult (*run)(void);
    bool needs_no_fabric;   /* only where the device reports no fabric handles */
    CUresult alt;           /* another documented code the real driver may answer (unmeasured) */
    bool needs_batch;       /* calls cuMemcpyBatchAsync (CUDA 12.8+, 13.0's ABI) */
};
#define ROW(what, exp, fn) {what, exp, exp, false, false, fn}
#define ROW_EMU_ONLY(what, exp, fn) {what, exp, exp, false, true, fn}
#define ROW_EMU_NO_FABRIC(what, exp, fn) {what, exp, exp, false, true, fn, true}
/* cudaemu stricter than the driver: the allocator must not rely on the driver's leniency. */
#define ROW_STRICTER(what, exp, real_res, fn) {what, exp, real_res, true, false, fn}
/* Unmeasured, and the driver documents two codes for it: cudaemu answers exp; on the real driver
 * either passes and the printed line says which (then make it a ROW). */
#define ROW_DOC(what, exp, alt_res, fn) {what, exp, exp, false, false, fn, false, alt_res}
/* cuMemcpyBatchAsync's rows: skipped, saying why, where the driver lacks the call (CUDA 13.0's
 * cuMemcpyBatchAsync_v2; vmm/driver.h's drv_memcpy_batch is NULL). */
#define ROW_BATCH(what, exp, fn) {what, exp, exp, false, false, fn, false, CUDA_SUCCESS, true}
#define ROW_BATCH_DOC(what, exp, alt_res, fn) {what, exp, exp, false, false, fn, false, alt_res, true}

static CUresult m_reserve_size0(void) { CUdeviceptr p; return drv->cuMemAddressReserve(&p, 0, 0, 0, 0); }
static CUresult m_reserve_flags(void)
{
    CUdeviceptr p = 0;
    CUresult r = drv->cuMemAddressReserve(&p, G, 0, 0, 1);
    if (r == CUDA_SUCCESS)
        drv->cuMemAddressFree(p, G);
    return r;
}
static CUresult m_reserve_align3(void)
{
    CUdeviceptr p = 0;
    CUresult r = drv->cuMemAddressReserve(&p, G, 3, 0, 0);
    if (r == CUDA_SUCCESS)
        drv->cuMemAddressFree(p, G);
    return r;
}
static CUresult m_reserve_unaligned_size(void)
{
    CUdeviceptr p = 0;
    CUresult r = drv->cuMemAddressReserve(&p, G + 4096, 0, 0, 0);
    if (r == CUDA_SUCCESS)
        drv->cuMemAddressFree(p, G + 4096);
    return r;
}
static CUresult m_create_size0(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle h;
    return drv->cuMemCreate(&h, 0, &p, 0);
}
static CUresult m_create_half(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle h;
    CUresult r = drv->cuMemCreate(&h, G / 2, &p, 0);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(h);
    return r;
}
static CUresult m_create_baddev(void)
{
    CUmemAllocationProp p = prop_dev(4242, CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle h;
    return drv->cuMemCreate(&h, G, &p, 0);
}
static CUresult m_create_flags(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle h;
    CUresult r = drv->cuMemCreate(&h, G, &p, 1);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(h);
    return r;
}
static CUresult m_create_badtype(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    p.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    CUmemGenericAllocationHandle h;
    return drv->cuMemCreate(&h, G, &p, 0);
}

/* Map rows share a fixture: 4G of VA and a 2G handle. */
static CUresult map_row(CUdeviceptr (*where)(CUdeviceptr va), size_t size, size_t offset,
                        unsigned long long flags, bool premap)
{
    CUdeviceptr va = reserve(4 * G);
    CUmemGenericAllocationHandle h = create(2 * G);
    if (premap)
        tu_assert_cu(drv->cuMemMap(va, 2 * G, 0, h, 0));
    CUdeviceptr at = where(va);
    CUresult r = drv->cuMemMap(at, size, offset, h, flags);
    if (r == CUDA_SUCCESS)
        drv->cuMemUnmap(at, size);
    if (premap)
        drv->cuMemUnmap(va, 2 * G);
    drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, 4 * G);
    return r;
}
static CUdeviceptr at_base(CUdeviceptr va) { return va; }
static CUdeviceptr at_plus_page(CUdeviceptr va) { return va + 4096; }
static CUdeviceptr at_end(CUdeviceptr va) { return va + 3 * G; }
static CUdeviceptr at_g(CUdeviceptr va) { return va + G; }
static CUdeviceptr at_outside(CUdeviceptr va) { return va + 64 * G; }

static CUresult m_map_unaligned_ptr(void) { return map_row(at_plus_page, 2 * G, 0, 0, false); }
static CUresult m_map_part(void) { return map_row(at_base, G, 0, 0, false); }
static CUresult m_map_unaligned_size(void) { return map_row(at_base, G / 2, 0, 0, false); }
static CUresult m_map_past_handle(void) { return map_row(at_base, 2 * G, G, 0, false); }
static CUresult m_map_too_big(void) { return map_row(at_base, 3 * G, 0, 0, false); }
static CUresult m_map_straddle(void) { return map_row(at_end, 2 * G, 0, 0, false); }
static CUresult m_map_outside(void) { return map_row(at_outside, 2 * G, 0, 0, false); }
static CUresult m_map_over_mapped(void) { return map_row(at_g, 2 * G, 0, 0, true); }
static CUresult m_map_flags(void) { return map_row(at_base, G, 0, 1, false); }
static CUresult m_map_offset(void) { return map_row(at_base, G, G, 0, false); }
static CUresult m_map_unknown_handle(void)
{
    CUdeviceptr va = reserve(G);
    CUresult r = drv->cuMemMap(va, G, 0, (CUmemGenericAllocationHandle)0x1234560, 0);
    if (r == CUDA_SUCCESS)
        drv->cuMemUnmap(va, G);
    drv->cuMemAddressFree(va, G);
    return r;
}

/* Unmap rows: 4G of VA, two adjacent G mappings at [0, 2G) of one 2G handle... as separate
 * mappings of two handles, so "whole mappings" are G each. */
static CUresult unmap_row(size_t off, size_t size)
{
    CUdeviceptr va = reserve(4 * G);
    CUmemGenericAllocationHandle a = create(G), b = create(G);
    tu_assert_cu(drv->cuMemMap(va, G, 0, a, 0));
    tu_assert_cu(drv->cuMemMap(va + G, G, 0, b, 0));
    CUresult r = drv->cuMemUnmap(va + off, size);
    /* Clean up whatever is still mapped. */
    drv->cuMemUnmap(va, G);
    drv->cuMemUnmap(va + G, G);
    drv->cuMemRelease(a);
    drv->cuMemRelease(b);
    drv->cuMemAddressFree(va, 4 * G);
    return r;
}
static CUresult m_unmap_partial(void) { return unmap_row(0, G / 2); }
static CUresult m_unmap_size0(void) { return unmap_row(0, 0); }
static CUresult m_unmap_unmapped(void) { return unmap_row(2 * G, G); }
static CUresult m_unmap_plus_unmapped(void) { return unmap_row(G, 2 * G); }
static CUresult m_unmap_two_whole(void) { return unmap_row(0, 2 * G); }
static CUresult m_unmap_mid_start(void) { return unmap_row(G / 2, G); }
/* A copy from the mapping queued on a held stream (still pending), then the unmap: undefined on
 * the driver (the copy may read unmapped memory or fault); cudaemu refuses it, so an allocator
 * that unmaps under its own queued copies shows (xseg's failed wake, core/services/sleep.c). */
static CUresult m_unmap_pending_copy(void)
{
    CUdeviceptr va = reserve(G);
    CUmemGenericAllocationHandle h = create(G);
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    tu_assert_cu(set_rw(va, G));
    CUstream s = NULL;
    void *host = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuMemHostAlloc(&host, 4096, 0));
    assert_true(tu_stream_hold(s));
    tu_assert_cu(drv->cuMemcpyDtoHAsync(host, va + 4096, 4096, s));
    CUresult r = drv->cuMemUnmap(va, G);
    assert_true(tu_stream_release(s)); /* the copy completes: now the unmap is legal */
    if (r != CUDA_SUCCESS)
        tu_assert_cu(drv->cuMemUnmap(va, G));
    drv->cuStreamDestroy(s);
    drv->cuMemFreeHost(host);
    drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, G);
    return r;
}

/* One handle mapped at two ranges (debug_stale_access's canary needs it): legal on the driver
 * (a handle may back several mappings); a write through one range reads back through the other,
 * and a release while both are mapped keeps the memory until the last unmap. Returns the first
 * failure, or CUDA_ERROR_UNKNOWN when the two ranges do not share the bytes. */
static CUresult m_map_twice(void)
{
    CUdeviceptr va = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(G);
    CUresult r = drv->cuMemMap(va, G, 0, h, 0);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemMap(va + G, G, 0, h, 0);
    if (r == CUDA_SUCCESS)
        r = set_rw(va, 2 * G);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemRelease(h); /* both mappings keep the memory */
    else
        drv->cuMemRelease(h);
    unsigned char back[2] = {0, 0};
    if (r == CUDA_SUCCESS)
        r = drv->cuMemsetD8(va + 4096, 0xAB, 1);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemsetD8(va + G + G - 1, 0xCD, 1);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemcpyDtoH(&back[0], va + G + 4096, 1);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemcpyDtoH(&back[1], va + G - 1, 1);
    if (r == CUDA_SUCCESS && (back[0] != 0xAB || back[1] != 0xCD))
        r = CUDA_ERROR_UNKNOWN;
    CUresult u = drv->cuMemUnmap(va, 2 * G);
    if (r == CUDA_SUCCESS)
        r = u;
    drv->cuMemAddressFree(va, 2 * G);
    return r;
}
static CUresult m_access_unmapped(void)
{
    CUdeviceptr va = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(G);
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    CUresult r = set_rw(va, 2 * G);
    drv->cuMemUnmap(va, G);
    drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, 2 * G);
    return r;
}
static CUresult access_desc_row(int dev, size_t count)
{
    CUdeviceptr va = reserve(G);
    CUmemGenericAllocationHandle h = create(G);
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = drv->cuMemSetAccess(va, G, &d, count);
    drv->cuMemUnmap(va, G);
    drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, G);
    return r;
}
static CUresult m_access_count0(void) { return access_desc_row(0, 0); }
static CUresult m_access_baddev(void) { return access_desc_row(4242, 1); }

static CUresult m_free_mapped(void)
{
    CUdeviceptr va = reserve(G);
    CUmemGenericAllocationHandle h = create(G);
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    CUresult r = drv->cuMemAddressFree(va, G);
    drv->cuMemUnmap(va, G);
    drv->cuMemRelease(h);
    if (r != CUDA_SUCCESS)
        drv->cuMemAddressFree(va, G);
    return r;
}
static CUresult m_free_wrong_size(void)
{
    CUdeviceptr va = reserve(2 * G);
    CUresult r = drv->cuMemAddressFree(va, G);
    if (r != CUDA_SUCCESS)
        drv->cuMemAddressFree(va, 2 * G);
    return r;
}
static CUresult m_free_interior(void)
{
    CUdeviceptr va = reserve(2 * G);
    CUresult r = drv->cuMemAddressFree(va + G, G);
    drv->cuMemAddressFree(va, 2 * G);
    return r;
}
static CUresult m_retain_unmapped(void)
{
    CUdeviceptr va = reserve(G);
    CUmemGenericAllocationHandle h;
    CUresult r = drv->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)va);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, G);
    return r;
}
static CUresult m_export_not_requested(void)
{
    CUmemGenericAllocationHandle h = create(G);
    int fd = -1;
    CUresult r = drv->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r == CUDA_SUCCESS)
        close(fd);
    drv->cuMemRelease(h);
    return r;
}
static CUresult m_release_twice(void)
{
    CUmemGenericAllocationHandle h = create(G);
    drv->cuMemRelease(h);
    return drv->cuMemRelease(h);
}
static CUresult m_alloc_size0(void) { CUdeviceptr p; return drv->cuMemAlloc(&p, 0); }
static CUresult m_free_interior_alloc(void)
{
    CUdeviceptr p = 0;
    tu_assert_cu(drv->cuMemAlloc(&p, 4096));
    CUresult r = drv->cuMemFree(p + 256);
    drv->cuMemFree(p);
    return r;
}
static CUresult m_free_twice(void)
{
    CUdeviceptr p = 0;
    tu_assert_cu(drv->cuMemAlloc(&p, 4096));
    drv->cuMemFree(p);
    return drv->cuMemFree(p);
}
static CUresult m_free_null(void) { return drv->cuMemFree(0); }

static void *no_ctx_thread(void *arg)
{
    CUresult *r = arg;
    CUdeviceptr p = 0;
    r[0] = drv->cuMemAlloc(&p, 4096);
    if (r[0] == CUDA_SUCCESS)
        drv->cuMemFree(p);
    size_t f, t;
    r[1] = drv->cuMemGetInfo(&f, &t);
    return NULL;
}
static CUresult m_alloc_no_ctx(void)
{
    CUresult r[2];
    pthread_t th;
    pthread_create(&th, NULL, no_ctx_thread, r);
    pthread_join(th, NULL);
    return r[0];
}
static CUresult m_meminfo_no_ctx(void)
{
    CUresult r[2];
    pthread_t th;
    pthread_create(&th, NULL, no_ctx_thread, r);
    pthread_join(th, NULL);
    return r[1];
}

/* ---- initialisation, error names, devices and the context stack ---- */
static CUresult m_init_flags(void) { return drv->cuInit(1); }
static CUresult m_version_null(void) { return drv->cuDriverGetVersion(NULL); }
/* An unknown code: the driver answers INVALID_VALUE and clears the string; a string left set is
 * reported as UNKNOWN (a caller printing it would read a stale pointer). */
static CUresult m_errname_unknown(void)
{
    const char *s = "stale";
    CUresult r = drv->cuGetErrorName((CUresult)987654, &s);
    return r != CUDA_SUCCESS && s ? CUDA_ERROR_UNKNOWN : r;
}
static CUresult m_errstring_unknown(void)
{
    const char *s = "stale";
    CUresult r = drv->cuGetErrorString((CUresult)987654, &s);
    return r != CUDA_SUCCESS && s ? CUDA_ERROR_UNKNOWN : r;
}
static CUresult m_errname_known(void)
{
    const char *s = NULL;
    CUresult r = drv->cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s);
    return r == CUDA_SUCCESS && (!s || strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY")) ? CUDA_ERROR_UNKNOWN : r;
}
static CUresult m_name_null(void) { return drv->cuDeviceGetName(NULL, 64, 0); }
static CUresult m_uuid_null(void) { return drv->cuDeviceGetUuid(NULL, 0); }
static CUresult m_uuid_baddev(void)
{
    CUuuid u;
    return drv->cuDeviceGetUuid(&u, 4242);
}
static CUresult m_totalmem_baddev(void)
{
    size_t b = 0;
    return drv->cuDeviceTotalMem(&b, 4242);
}
static CUresult m_peer_baddev(void)
{
    int can = 0;
    return drv->cuDeviceCanAccessPeer(&can, 0, 4242);
}
static CUresult m_ctx_get_null(void) { return drv->cuCtxGetCurrent(NULL); }

/* On a thread with no current context: [0] cuCtxGetDevice, [1] cuCtxPopCurrent, [2] the thread
 * still has none after the failed pop ([2] UNKNOWN otherwise). */
static void *empty_stack_thread(void *arg)
{
    CUresult *r = arg;
    CUdevice dev;
    r[0] = drv->cuCtxGetDevice(&dev);
    CUcontext popped = NULL;
    r[1] = drv->cuCtxPopCurrent(&popped);
    CUcontext cur = (CUcontext)1;
    r[2] = drv->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && !cur ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    return NULL;
}
static CUresult empty_stack_result(int i)
{
    CUresult r[3] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN};
    pthread_t th;
    if (pthread_create(&th, NULL, empty_stack_thread, r))
        return CUDA_ERROR_UNKNOWN;
    pthread_join(th, NULL);
    return r[2] != CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : r[i];
}
static CUresult m_ctx_device_no_ctx(void) { return empty_stack_result(0); }
static CUresult m_ctx_pop_empty(void) { return empty_stack_result(1); }

/* Push the current context again and pop it: the pop returns it and the stack is as before. */
static CUresult m_ctx_push_pop(void)
{
    CUcontext cur = NULL, popped = NULL, after = NULL;
    tu_assert_cu(drv->cuCtxGetCurrent(&cur));
    CUresult r = drv->cuCtxPushCurrent(cur);
    if (r != CUDA_SUCCESS)
        return r;
    r = drv->cuCtxPopCurrent(&popped);
    if (r != CUDA_SUCCESS)
        return r;
    tu_assert_cu(drv->cuCtxGetCurrent(&after));
    return popped == cur && after == cur ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

/* ---- shareable handles (fabric off: the default) ---- */
static CUresult m_create_fabric_unsupported(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_FABRIC);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = drv->cuMemCreate(&h, G, &p, 0);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(h);
    return r;
}
static CUresult m_export_fabric_unsupported(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemGenericAllocationHandle h = 0;
    if (drv->cuMemCreate(&h, G, &p, 0) != CUDA_SUCCESS)
        return CUDA_ERROR_UNKNOWN;
    CUmemFabricHandle fh;
    CUresult r = drv->cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    drv->cuMemRelease(h);
    return r;
}
static CUresult m_import_pipe_fd(void)
{
    int fds[2];
    if (pipe(fds))
        return CUDA_ERROR_UNKNOWN;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = drv->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fds[0],
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(h);
    close(fds[0]);
    close(fds[1]);
    return r;
}
static CUresult m_export_bad_type(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemGenericAllocationHandle h = 0;
    if (drv->cuMemCreate(&h, G, &p, 0) != CUDA_SUCCESS)
        return CUDA_ERROR_UNKNOWN;
    int fd = -1;
    CUresult r = drv->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_WIN32, 0);
    if (r == CUDA_SUCCESS)
        close(fd);
    drv->cuMemRelease(h);
    return r;
}

/* ---- a row for every other entry point of xseg's driver table (vmm/driver.h): each makes the
 * call as xseg makes it, then one misuse. A row whose legal call fails returns that failure (it
 * then prints as a mismatch). Where the driver documents more than one code for the misuse and
 * none was measured, ROW_DOC accepts either on the real driver and the run prints which. ---- */
static CUresult m_devcount_null(void)
{
    int n = 0;
    CUresult r = drv->cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n < 1)
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
    return drv->cuDeviceGetCount(NULL);
}
static CUresult m_devget_baddev(void)
{
    CUdevice d = -1;
    CUresult r = drv->cuDeviceGet(&d, 0);
    if (r != CUDA_SUCCESS || d < 0)
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
    return drv->cuDeviceGet(&d, 4242);
}
static CUresult m_attr_bad_attr(void)
{
    CUdevice d0;
    int v = -1;
    CUresult r = drv->cuDeviceGet(&d0, 0);
    if (r == CUDA_SUCCESS)
        r = drv->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d0);
    if (r != CUDA_SUCCESS || v != 1)
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
    return drv->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, d0);
}
static CUresult m_attr_baddev(void)
{
    int v = -1;
    return drv->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 4242);
}
static CUresult m_retain_baddev(void)
{
    CUdevice d0;
    CUcontext c = NULL, cur = NULL;
    CUresult r = drv->cuDeviceGet(&d0, 0);
    if (r == CUDA_SUCCESS)
        r = drv->cuDevicePrimaryCtxRetain(&c, d0);
    if (r != CUDA_SUCCESS)
        return r;
    r = drv->cuDevicePrimaryCtxRelease(d0);
    if (r == CUDA_SUCCESS)
        r = drv->cuCtxGetCurrent(&cur);
    if (r != CUDA_SUCCESS || c != cur) /* the primary context is the one setup() made current */
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
    return drv->cuDevicePrimaryCtxRetain(&c, 4242);
}
static CUresult m_release_baddev(void) { return drv->cuDevicePrimaryCtxRelease(4242); }
/* On a thread with no context: r[0] cuCtxSetCurrent(primary), r[1] the thread now has it, r[2]
 * cuCtxSetCurrent(NULL), r[3] it has none again, r[4] cuCtxSynchronize with none. */
struct set_cur {
    CUcontext primary;
    CUresult r[5];
};
static void *set_current_thread(void *arg)
{
    struct set_cur *a = arg;
    CUcontext cur = NULL;
    a->r[0] = drv->cuCtxSetCurrent(a->primary);
    a->r[1] = drv->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == a->primary ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    a->r[2] = drv->cuCtxSetCurrent(NULL);
    cur = (CUcontext)1;
    a->r[3] = drv->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && !cur ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    a->r[4] = drv->cuCtxSynchronize();
    return NULL;
}
/* r[i], or the first earlier step that failed. */
static CUresult set_current_result(int i)
{
    struct set_cur a = {NULL, {CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN,
                               CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN}};
    tu_assert_cu(drv->cuCtxGetCurrent(&a.primary));
    pthread_t th;
    if (pthread_create(&th, NULL, set_current_thread, &a))
        return CUDA_ERROR_UNKNOWN;
    pthread_join(th, NULL);
    for (int k = 0; k < i; k++)
        if (a.r[k] != CUDA_SUCCESS)
            return a.r[k];
    return a.r[i];
}
static CUresult m_ctx_set_unset(void) { return set_current_result(3); }
static CUresult m_ctx_sync_no_ctx(void) { return set_current_result(4); }
/* An address that names no context object: undefined on the driver, refused by cudaemu. */
static CUresult m_ctx_set_bogus(void)
{
    static char not_a_context[64];
    CUcontext cur = NULL;
    tu_assert_cu(drv->cuCtxGetCurrent(&cur));
    CUresult r = drv->cuCtxSetCurrent((CUcontext)(void *)not_a_context);
    tu_assert_cu(drv->cuCtxSetCurrent(cur));
    return r;
}
/* Synchronous copies and memset over a cuMemAlloc block, then the misuse (NULL pointers, which
 * the driver refuses before any transfer, so no context is lost if it does not). */
static CUresult sync_copy_row(int which)
{
    unsigned char in[256], out[256];
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (unsigned char)(i * 3 + 1);
    CUdeviceptr d = 0;
    CUresult r = drv->cuMemAlloc(&d, sizeof in);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = drv->cuMemcpyHtoD(d, in, sizeof in)) == CUDA_SUCCESS &&
        (r = drv->cuMemsetD8(d + 16, 0x5a, 16)) == CUDA_SUCCESS &&
        (r = drv->cuMemcpyDtoH(out, d, sizeof out)) == CUDA_SUCCESS) {
        memset(in + 16, 0x5a, 16);
        if (memcmp(in, out, sizeof in))
            r = CUDA_ERROR_UNKNOWN;
    }
    if (r == CUDA_SUCCESS) {
        if (which == 0)
            r = drv->cuMemcpyHtoD(d, NULL, sizeof in);
        else if (which == 1)
            r = drv->cuMemcpyDtoH(NULL, d, sizeof out);
        else
            r = drv->cuMemsetD8(0, 1, sizeof in);
    }
    drv->cuMemFree(d);
    return r;
}
static CUresult m_htod_null(void) { return sync_copy_row(0); }
static CUresult m_dtoh_null(void) { return sync_copy_row(1); }
static CUresult m_memset_null(void) { return sync_copy_row(2); }
static CUresult m_gran_option(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    size_t g = 0;
    CUresult r = drv->cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || g != G) /* xseg's IPC probe asks with the POSIX fd type */
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
    return drv->cuMemGetAllocationGranularity(&g, &p, (CUmemAllocationGranularity_flags)7);
}
static CUresult m_gran_null_prop(void)
{
    size_t g = 0;
    return drv->cuMemGetAllocationGranularity(&g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}
/* Mapped with READWRITE for device 0, as xseg grants; the misuse asks about reserved VA past the
 * mapping. */
static CUresult m_getaccess_unmapped(void)
{
    CUdeviceptr va = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(G);
    CUresult r = drv->cuMemMap(va, G, 0, h, 0);
    if (r == CUDA_SUCCESS)
        r = set_rw(va, G);
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    unsigned long long fl = 0;
    if (r == CUDA_SUCCESS)
        r = drv->cuMemGetAccess(&fl, &loc, va);
    if (r == CUDA_SUCCESS && fl != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        r = CUDA_ERROR_UNKNOWN;
    if (r == CUDA_SUCCESS)
        r = drv->cuMemGetAccess(&fl, &loc, va + G);
    drv->cuMemUnmap(va, G);
    drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, 2 * G);
    return r;
}
static CUresult m_stream_create_flags(void)
{
    CUstream s = NULL;
    CUresult r = drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = drv->cuStreamDestroy(s)) != CUDA_SUCCESS)
        return r;
    r = drv->cuStreamCreate(&s, 0x80u);
    if (r == CUDA_SUCCESS)
        drv->cuStreamDestroy(s);
    return r;
}
static CUresult m_stream_destroy_legacy(void) { return drv->cuStreamDestroy(NULL); }
static CUresult m_wait_flags(void)
{
    CUstream s = NULL;
    CUevent e = NULL;
    CUresult r = drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)) == CUDA_SUCCESS &&
        (r = drv->cuEventRecord(e, NULL)) == CUDA_SUCCESS &&
        (r = drv->cuStreamWaitEvent(s, e, 0)) == CUDA_SUCCESS)
        r = drv->cuStreamWaitEvent(s, e, 0x10u);
    if (e)
        drv->cuEventDestroy(e);
    drv->cuStreamDestroy(s);
    return r;
}
/* Capture misuse on a fresh non-blocking stream; the capture (if any) is ended and dropped. */
static CUresult capture_misuse(int which)
{
    CUstream s = NULL;
    CUresult r = drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), end = CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        return r;
    CUgraph g = NULL;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    switch (which) {
    case 0: /* begin on a stream already capturing */
        if ((r = drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL)) == CUDA_SUCCESS)
            r = drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
        end = drv->cuStreamEndCapture(s, &g);
        break;
    case 1: /* end on a stream not capturing */
        if ((r = drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED)) == CUDA_SUCCESS &&
            (r = drv->cuStreamEndCapture(s, &g)) == CUDA_SUCCESS && g &&
            (r = drv->cuGraphDestroy(g)) == CUDA_SUCCESS) {
            g = NULL;
            r = drv->cuStreamEndCapture(s, &g);
        }
        break;
    case 2: /* is-capturing with no status out */
        if ((r = drv->cuStreamIsCapturing(s, &st)) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE)
            r = CUDA_ERROR_UNKNOWN;
        if (r == CUDA_SUCCESS)
            r = drv->cuStreamIsCapturing(s, NULL);
        break;
    case 3: /* the legacy stream asked while a blocking stream captures (GLOBAL) */
        drv->cuStreamDestroy(s);
        s = NULL;
        if ((r = drv->cuStreamCreate(&s, 0)) != CUDA_SUCCESS)
            return r;
        if ((r = drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL)) == CUDA_SUCCESS &&
            (r = drv->cuStreamIsCapturing(s, &st)) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
            r = CUDA_ERROR_UNKNOWN;
        if (r == CUDA_SUCCESS)
            r = drv->cuStreamIsCapturing(NULL, &st);
        end = drv->cuStreamEndCapture(s, &g);
        if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT && end != CUDA_SUCCESS)
            r = end; /* documented: the capture is not invalidated */
        break;
    default: /* cuGraphDestroy(NULL) after a legal destroy */
        if ((r = drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL)) == CUDA_SUCCESS &&
            (r = drv->cuStreamEndCapture(s, &g)) == CUDA_SUCCESS && (r = drv->cuGraphDestroy(g)) == CUDA_SUCCESS)
            r = drv->cuGraphDestroy(NULL);
        g = NULL;
        break;
    }
    (void)end;
    if (g)
        drv->cuGraphDestroy(g);
    drv->cuStreamDestroy(s);
    return r;
}
static CUresult m_begin_twice(void) { return capture_misuse(0); }
static CUresult m_end_not_capturing(void) { return capture_misuse(1); }
static CUresult m_iscapturing_null(void) { return capture_misuse(2); }
static CUresult m_iscapturing_legacy(void) { return capture_misuse(3); }
static CUresult m_graph_destroy_null(void) { return capture_misuse(4); }
static CUresult m_begin_legacy(void)
{
    CUresult r = drv->cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (r == CUDA_SUCCESS) {
        CUgraph g = NULL;
        drv->cuStreamEndCapture(NULL, &g);
        if (g)
            drv->cuGraphDestroy(g);
    }
    return r;
}
static CUresult exchange_row(CUstreamCaptureMode *bad)
{
    /* As xseg: RELAXED for its own calls, then the old mode back. */
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUresult r = drv->cuThreadExchangeStreamCaptureMode(&m);
    if (r != CUDA_SUCCESS)
        return r;
    CUstreamCaptureMode old = m;
    if ((r = drv->cuThreadExchangeStreamCaptureMode(&m)) != CUDA_SUCCESS)
        return r;
    if (m != CU_STREAM_CAPTURE_MODE_RELAXED || old != CU_STREAM_CAPTURE_MODE_GLOBAL)
        return CUDA_ERROR_UNKNOWN;
    r = drv->cuThreadExchangeStreamCaptureMode(bad);
    if (r == CUDA_SUCCESS && bad)
        drv->cuThreadExchangeStreamCaptureMode(bad); /* put back whatever it set */
    return r;
}
static CUresult m_exchange_mode7(void)
{
    CUstreamCaptureMode m = (CUstreamCaptureMode)7;
    return exchange_row(&m);
}
/* Events as xseg makes them (record_stream: DISABLE_TIMING), then a misuse: [0] bad create
 * flags, [1] destroy twice, [2] record a destroyed event, [3] synchronize a destroyed event. */
static CUresult event_row(int which)
{
    CUevent e = NULL;
    CUresult r = drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = drv->cuEventRecord(e, NULL)) != CUDA_SUCCESS || (r = drv->cuEventSynchronize(e)) != CUDA_SUCCESS ||
        (r = drv->cuEventQuery(e)) != CUDA_SUCCESS || (r = drv->cuEventDestroy(e)) != CUDA_SUCCESS)
        return r;
    CUevent x = NULL;
    switch (which) {
    case 0:
        r = drv->cuEventCreate(&x, 0x80u);
        if (r == CUDA_SUCCESS)
            drv->cuEventDestroy(x);
        return r;
    case 1: return drv->cuEventDestroy(e);
    case 2: return drv->cuEventRecord(e, NULL);
    default: return drv->cuEventSynchronize(e);
    }
}
/* An event recorded on a stream, then the stream destroyed (cuStreamDestroy returns at once; the
 * driver finishes the stream's work and the event stays an independent object): the event is
 * queried as before and completes (xseg's passes that never wait query such an event, never the
 * stream: core/policy/release.h). On cudaemu the stream is held, so the work is pending at the
 * destroy; on a GPU the query is polled, bounded by tries, while the work finishes. */
static CUresult m_event_query_dead_stream(void)
{
    CUstream s;
    CUevent e;
    CUresult r = drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        drv->cuStreamDestroy(s);
        return r;
    }
    (void)tu_stream_hold(s);
    r = drv->cuEventRecord(e, s);
    CUresult d = drv->cuStreamDestroy(s);
    if (r == CUDA_SUCCESS)
        r = d;
    for (long i = 0; r == CUDA_SUCCESS && i < 100000000L; i++)
        if ((r = drv->cuEventQuery(e)) != CUDA_ERROR_NOT_READY)
            break;
    drv->cuEventDestroy(e);
    return r;
}
static CUresult m_event_create_flags(void) { return event_row(0); }
static CUresult m_event_destroy_twice(void) { return event_row(1); }
static CUresult m_event_record_destroyed(void) { return event_row(2); }
static CUresult m_event_sync_destroyed(void) { return event_row(3); }
static CUresult m_event_record_null(void) { return drv->cuEventRecord(NULL, NULL); }
static CUresult m_event_sync_null(void) { return drv->cuEventSynchronize(NULL); }
static CUresult m_event_destroy_null(void) { return drv->cuEventDestroy(NULL); }
/* Pinned host memory as the services use it, then the misuse. */
static CUresult m_hostalloc_flags(void)
{
    void *h = NULL;
    CUresult r = drv->cuMemHostAlloc(&h, 1 << 20, CU_MEMHOSTALLOC_PORTABLE);
    if (r != CUDA_SUCCESS)
        return r;
    memset(h, 7, 1 << 20);
    if ((r = drv->cuMemFreeHost(h)) != CUDA_SUCCESS)
        return r;
    h = NULL;
    r = drv->cuMemHostAlloc(&h, 1 << 20, 0x80u);
    if (r == CUDA_SUCCESS)
        drv->cuMemFreeHost(h);
    return r;
}
static CUresult m_freehost_interior(void)
{
    void *h = NULL;
    CUresult r = drv->cuMemHostAlloc(&h, 1 << 20, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = drv->cuMemFreeHost((char *)h + 4096);
    if (r != CUDA_SUCCESS)
        drv->cuMemFreeHost(h);
    return r;
}
/* [0] register with bad flags, [1] register an overlapping range, [2] unregister one not
 * registered; after a legal register/unregister of the same pages. */
static CUresult host_register_row(int which)
{
    const size_t n = 2u << 20;
    void *h = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED)
        return CUDA_ERROR_UNKNOWN;
    memset(h, 1, n);
    CUresult r = drv->cuMemHostRegister(h, n, CU_MEMHOSTREGISTER_PORTABLE);
    if (r == CUDA_SUCCESS && which == 1) {
        r = drv->cuMemHostRegister((char *)h + n / 2, n / 4, CU_MEMHOSTREGISTER_PORTABLE);
        CUresult u = drv->cuMemHostUnregister(h);
        if (r == CUDA_SUCCESS) /* registered twice: undo the second too */
            drv->cuMemHostUnregister((char *)h + n / 2);
        (void)u;
    } else if (r == CUDA_SUCCESS && (r = drv->cuMemHostUnregister(h)) == CUDA_SUCCESS) {
        if (which == 0) {
            r = drv->cuMemHostRegister(h, n, 0x80u);
            if (r == CUDA_SUCCESS)
                drv->cuMemHostUnregister(h);
        } else {
            r = drv->cuMemHostUnregister(h);
        }
    }
    munmap(h, n);
    return r;
}
static CUresult m_hostreg_flags(void) { return host_register_row(0); }
static CUresult m_hostreg_overlap(void) { return host_register_row(1); }
static CUresult m_hostunreg_not(void) { return host_register_row(2); }
/* Async copies and memset on a stream over VMM memory (sleep/wake's calls, refine's device to
 * device copy on the legacy stream), the bytes checked, then a NULL-pointer misuse. */
static CUresult async_row(int which)
{
    const size_t n = 64 * 1024;
    CUdeviceptr va = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(2 * G);
    CUstream s = NULL;
    unsigned char *in = NULL, *out = NULL;
    CUresult r = drv->cuMemMap(va, 2 * G, 0, h, 0);
    if (r == CUDA_SUCCESS)
        r = set_rw(va, 2 * G);
    if (r == CUDA_SUCCESS)
        r = drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemHostAlloc((void **)&in, n, 0);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemHostAlloc((void **)&out, n, 0);
    if (r == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++)
            in[i] = (unsigned char)(i * 13 + 5);
        if ((r = drv->cuMemcpyHtoDAsync(va, in, n, s)) == CUDA_SUCCESS &&
            (r = drv->cuMemsetD8Async(va + 100, 0xc3, 50, s)) == CUDA_SUCCESS &&
            (r = drv->cuStreamSynchronize(s)) == CUDA_SUCCESS &&
            (r = drv->cuMemcpyDtoDAsync(va + G, va, n, NULL)) == CUDA_SUCCESS &&
            (r = drv->cuMemcpyDtoHAsync(out, va + G, n, NULL)) == CUDA_SUCCESS &&
            (r = drv->cuStreamSynchronize(NULL)) == CUDA_SUCCESS) {
            memset(in + 100, 0xc3, 50);
            if (memcmp(in, out, n))
                r = CUDA_ERROR_UNKNOWN;
        }
    }
    if (r == CUDA_SUCCESS) {
        switch (which) {
        case 0: r = drv->cuMemcpyHtoDAsync(va, NULL, n, s); break;
        case 1: r = drv->cuMemcpyDtoHAsync(NULL, va, n, s); break;
        case 2: r = drv->cuMemsetD8Async(0, 1, n, s); break;
        default: r = drv->cuMemcpyDtoDAsync(va + G, 0, n, s); break;
        }
        drv->cuStreamSynchronize(s);
    }
    if (s)
        drv->cuStreamDestroy(s);
    if (in)
        drv->cuMemFreeHost(in);
    if (out)
        drv->cuMemFreeHost(out);
    drv->cuMemUnmap(va, 2 * G);
    drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, 2 * G);
    return r;
}
static CUresult m_htod_async_null(void) { return async_row(0); }
static CUresult m_dtoh_async_null(void) { return async_row(1); }
static CUresult m_memset_async_null(void) { return async_row(2); }
static CUresult m_dtod_async_null(void) { return async_row(3); }

/* cuMemcpyBatchAsync (CUDA 13.0's form, cuda.h 13.0: cuMemcpyBatchAsync_v2) over VMM memory and
 * pinned host memory on a non-blocking stream: one batch of a host-to-device, a device-to-host and a
 * device-to-device copy, the bytes checked (@p which 0), then one misuse each (1..): the rules the
 * header's comment lists (INVALID_VALUE), and a source in a reservation's unmapped VA, which fails
 * as the single async copies' device operands do (cudaemu: ILLEGAL_ADDRESS; the driver documents
 * INVALID_VALUE for the call). */
static CUresult batch_row(int which)
{
    const size_t n = 64 * 1024;
    CUdeviceptr va = reserve(4 * G);
    CUmemGenericAllocationHandle h = create(2 * G);
    CUstream s = NULL;
    unsigned char *in = NULL, *out = NULL;
    CUresult r = drv->cuMemMap(va, 2 * G, 0, h, 0);
    if (r == CUDA_SUCCESS)
        r = set_rw(va, 2 * G);
    if (r == CUDA_SUCCESS)
        r = drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemHostAlloc((void **)&in, 2 * n, 0);
    if (r == CUDA_SUCCESS)
        r = drv->cuMemHostAlloc((void **)&out, 2 * n, 0);
    if (r == CUDA_SUCCESS) {
        for (size_t i = 0; i < 2 * n; i++)
            in[i] = (unsigned char)(i * 29 + 3);
        memset(out, 0, 2 * n);
        /* Two host-to-device copies (the second n bytes land at va + G), then, after a sync, a
         * device-to-device and a device-to-host copy in a second batch with two attributes. */
        CUdeviceptr d1[2] = {va, va + G}, s1[2] = {(CUdeviceptr)(uintptr_t)in, (CUdeviceptr)(uintptr_t)(in + n)};
        size_t z1[2] = {n, n}, i1[1] = {0};
        CUmemcpyAttributes a1[2] = {{.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM},
                                    {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_ANY}};
        CUdeviceptr d2[2] = {va + G / 2, (CUdeviceptr)(uintptr_t)(out + n)}, s2[2] = {va, va + G};
        size_t z2[2] = {n, n}, i2[2] = {0, 1};
        if ((r = drv_memcpy_batch(d1, s1, z1, 2, a1, i1, 1, s)) == CUDA_SUCCESS &&
            (r = drv->cuStreamSynchronize(s)) == CUDA_SUCCESS &&
            (r = drv_memcpy_batch(d2, s2, z2, 2, a1, i2, 2, s)) == CUDA_SUCCESS &&
            (r = drv->cuMemcpyDtoHAsync(out, va + G / 2, n, s)) == CUDA_SUCCESS &&
            (r = drv->cuStreamSynchronize(s)) == CUDA_SUCCESS && memcmp(in, out, 2 * n))
            r = CUDA_ERROR_UNKNOWN;
        CUdeviceptr d[2] = {va, va + n}, src[2] = {(CUdeviceptr)(uintptr_t)in, (CUdeviceptr)(uintptr_t)in};
        size_t z[2] = {n, n}, idx[2] = {0, 1};
        CUmemcpyAttributes a[2] = {{.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM},
                                   {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM}};
        if (r == CUDA_SUCCESS) {
            switch (which) {
            case 0: break;
            case 1: r = drv_memcpy_batch(d, src, z, 0, a, idx, 1, s); break;             /* count 0 */
            case 2: r = drv_memcpy_batch(NULL, src, z, 2, a, idx, 1, s); break;          /* dsts NULL */
            case 3: r = drv_memcpy_batch(d, src, z, 2, a, idx, 0, s); break;             /* numAttrs 0 */
            case 4: r = drv_memcpy_batch(d, src, z, 1, a, idx, 2, s); break;             /* numAttrs > count */
            case 5: idx[0] = 1; r = drv_memcpy_batch(d, src, z, 2, a, idx, 1, s); break; /* idx[0] != 0 */
            case 6: idx[1] = 0; r = drv_memcpy_batch(d, src, z, 2, a, idx, 2, s); break; /* not increasing */
            case 7: idx[1] = 2; r = drv_memcpy_batch(d, src, z, 2, a, idx, 2, s); break; /* idx >= count */
            case 8: a[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID;
                    r = drv_memcpy_batch(d, src, z, 2, a, idx, 1, s); break;
            case 9: r = drv_memcpy_batch(d, src, z, 2, a, idx, 1, NULL); break;
            case 10: r = drv_memcpy_batch(d, src, z, 2, a, idx, 1, CU_STREAM_LEGACY); break;
            default: src[1] = va + 3 * G; /* a device-to-device copy from unmapped VA */
                     r = drv_memcpy_batch(d, src, z, 2, a, idx, 1, s); break;
            }
        }
        drv->cuStreamSynchronize(s);
    }
    if (s)
        drv->cuStreamDestroy(s);
    if (in)
        drv->cuMemFreeHost(in);
    if (out)
        drv->cuMemFreeHost(out);
    drv->cuMemUnmap(va, 2 * G);
    drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, 4 * G);
    return r;
}
static CUresult m_batch_ok(void) { return batch_row(0); }
static CUresult m_batch_count0(void) { return batch_row(1); }
static CUresult m_batch_dsts_null(void) { return batch_row(2); }
static CUresult m_batch_nattrs0(void) { return batch_row(3); }
static CUresult m_batch_nattrs_over(void) { return batch_row(4); }
static CUresult m_batch_idx0(void) { return batch_row(5); }
static CUresult m_batch_idx_order(void) { return batch_row(6); }
static CUresult m_batch_idx_count(void) { return batch_row(7); }
static CUresult m_batch_order(void) { return batch_row(8); }
static CUresult m_batch_null_stream(void) { return batch_row(9); }
static CUresult m_batch_legacy_stream(void) { return batch_row(10); }
static CUresult m_batch_unmapped(void) { return batch_row(11); }

/* Release and import as xseg does (an exported page imported back, both released), then a misuse
 * the driver can see without undefined behaviour: handle 0, descriptor -1. */
static CUresult import_release_row(int which)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemGenericAllocationHandle h = 0, imp = 0;
    CUresult r = drv->cuMemCreate(&h, G, &p, 0);
    if (r != CUDA_SUCCESS)
        return r;
    int fd = -1;
    if ((r = drv->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) == CUDA_SUCCESS) {
        r = drv->cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
        if (r == CUDA_SUCCESS)
            r = drv->cuMemRelease(imp);
    }
    CUresult rel = drv->cuMemRelease(h);
    if (r != CUDA_SUCCESS || rel != CUDA_SUCCESS)
        return r != CUDA_SUCCESS ? r : rel;
    if (which == 0)
        return drv->cuMemRelease(0);
    r = drv->cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)-1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(imp);
    return r;
}
static CUresult m_release_zero(void) { return import_release_row(0); }
static CUresult m_import_bad_fd(void) { return import_release_row(1); }

/* ---- entry points xseg does not load (yet), resolved from the loaded driver ---- */
static __typeof__(cuMemGetHandleForAddressRange) *get_range_handle; /* NULL: the driver lacks it */
static __typeof__(cuMemGetAllocationPropertiesFromHandle) *get_props; /* NULL: the driver lacks it */
static __typeof__(cuMemAllocManaged) *alloc_managed;                 /* NULL: the driver lacks it */
static __typeof__(cuMemPrefetchAsync) *prefetch;                     /* ABI cuMemPrefetchAsync_v2 */

static void resolve_extra(void)
{
    const char *path = getenv("XSEG_LIBCUDA");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
    if (lib) {
        *(void **)&get_range_handle = dlsym(lib, "cuMemGetHandleForAddressRange");
        *(void **)&get_props = dlsym(lib, "cuMemGetAllocationPropertiesFromHandle");
        *(void **)&alloc_managed = dlsym(lib, "cuMemAllocManaged");
        *(void **)&prefetch = dlsym(lib, "cuMemPrefetchAsync_v2"); /* CUDA 13's form (cuda.h's macro) */
    }
}

/* Managed memory as a unified-memory pool's owner uses it (Megatron's cudaMallocManaged, then
 * cudaMemPrefetchAsync to the host or the device): allocated, written by the host at its address
 * and by the device (memset), prefetched to the host and back to the device, read back by the host
 * and by a copy; then one misuse: [0] size 0, [1] flags 0, [2] flags GLOBAL | HOST (the flags
 * must be one of the two), [3] prefetch flags 1 (must be 0), [4] prefetch of cuMemAlloc memory
 * (must be managed), [5] prefetch to device 4242 (INVALID_DEVICE).
 * The codes are the documented ones (cuda.h, CUDA 13.0); not yet run on a GPU. */
static CUresult managed_row(int which)
{
    if (!alloc_managed || !prefetch)
        return CUDA_ERROR_NOT_FOUND;
    const size_t n = 1 << 20;
    CUdeviceptr m = 0, plain = 0;
    unsigned char *out = malloc(n);
    CUresult r = out ? alloc_managed(&m, n, CU_MEM_ATTACH_GLOBAL) : CUDA_ERROR_OUT_OF_MEMORY;
    CUmemLocation host = {CU_MEM_LOCATION_TYPE_HOST, 0}, dev0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    if (r == CUDA_SUCCESS) {
        unsigned char *h = (unsigned char *)(uintptr_t)m; /* managed memory is the host's too */
        for (size_t i = 0; i < n; i++)
            h[i] = (unsigned char)(i * 7 + 1);
        if ((r = drv->cuMemsetD8(m + 4096, 0x5a, 100)) == CUDA_SUCCESS &&
            (r = prefetch(m, n, host, 0, NULL)) == CUDA_SUCCESS &&
            (r = drv->cuStreamSynchronize(NULL)) == CUDA_SUCCESS) {
            for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
                if (h[i] != (i - 4096 < 100 ? 0x5a : (unsigned char)(i * 7 + 1)))
                    r = CUDA_ERROR_UNKNOWN;
        }
        if (r == CUDA_SUCCESS && (r = prefetch(m, n, dev0, 0, NULL)) == CUDA_SUCCESS &&
            (r = drv->cuStreamSynchronize(NULL)) == CUDA_SUCCESS &&
            (r = drv->cuMemcpyDtoH(out, m, n)) == CUDA_SUCCESS && memcmp(out, h, n))
            r = CUDA_ERROR_UNKNOWN;
    }
    if (r == CUDA_SUCCESS) {
        CUdeviceptr x = 0;
        switch (which) {
        case 0: r = alloc_managed(&x, 0, CU_MEM_ATTACH_GLOBAL); break;
        case 1: r = alloc_managed(&x, n, 0); break;
        case 2: r = alloc_managed(&x, n, CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST); break;
        case 3: r = prefetch(m, n, dev0, 1, NULL); break;
        case 4:
            if ((r = drv->cuMemAlloc(&plain, n)) == CUDA_SUCCESS)
                r = prefetch(plain, n, dev0, 0, NULL);
            break;
        default: dev0.id = 4242; r = prefetch(m, n, dev0, 0, NULL); break;
        }
        drv->cuStreamSynchronize(NULL);
        if (x)
            drv->cuMemFree(x);
    }
    if (plain)
        drv->cuMemFree(plain);
    if (m)
        drv->cuMemFree(m);
    free(out);
    return r;
}
static CUresult m_managed_size0(void) { return managed_row(0); }
static CUresult m_managed_flags0(void) { return managed_row(1); }
static CUresult m_managed_flags_both(void) { return managed_row(2); }
static CUresult m_prefetch_flags(void) { return managed_row(3); }
static CUresult m_prefetch_not_managed(void) { return managed_row(4); }
static CUresult m_prefetch_bad_device(void) { return managed_row(5); }

/* A mapped, device-writable range of @p n bytes (one handle of @p p) for the rows and probes
 * below; *step names the call that failed. */
struct vmm_range {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle h;
    bool mapped;
};
static CUresult range_make(struct vmm_range *r, const CUmemAllocationProp *p, size_t n, const char **step)
{
    memset(r, 0, sizeof *r);
    r->size = n;
    CUresult res;
    if ((res = drv->cuMemCreate(&r->h, n, p, 0)) != CUDA_SUCCESS) {
        *step = "cuMemCreate";
        r->h = 0;
        return res;
    }
    if ((res = drv->cuMemAddressReserve(&r->va, n, 0, 0, 0)) != CUDA_SUCCESS) {
        *step = "cuMemAddressReserve";
        r->va = 0;
        return res;
    }
    if ((res = drv->cuMemMap(r->va, n, 0, r->h, 0)) != CUDA_SUCCESS) {
        *step = "cuMemMap";
        return res;
    }
    r->mapped = true;
    if ((res = set_rw(r->va, n)) != CUDA_SUCCESS)
        *step = "cuMemSetAccess(device 0, READWRITE)";
    return res;
}
static void range_drop(struct vmm_range *r)
{
    if (r->mapped)
        drv->cuMemUnmap(r->va, r->size);
    if (r->va)
        drv->cuMemAddressFree(r->va, r->size);
    if (r->h)
        drv->cuMemRelease(r->h);
    memset(r, 0, sizeof *r);
}

static CUresult m_range_handle_type(void)
{
    if (!get_range_handle)
        return CUDA_ERROR_NOT_FOUND;
    struct vmm_range r;
    const char *step = "";
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUresult res = range_make(&r, &p, G, &step);
    int fd = -1;
    if (res == CUDA_SUCCESS)
        res = get_range_handle(&fd, r.va, G, (CUmemRangeHandleType)7, 0);
    if (res == CUDA_SUCCESS && fd >= 0)
        close(fd);
    range_drop(&r);
    return res;
}
static CUresult m_range_unaligned(void)
{
    if (!get_range_handle)
        return CUDA_ERROR_NOT_FOUND;
    struct vmm_range r;
    const char *step = "";
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUresult res = range_make(&r, &p, G, &step);
    int fd = -1;
    if (res == CUDA_SUCCESS)
        res = get_range_handle(&fd, r.va + 100, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (res == CUDA_SUCCESS && fd >= 0)
        close(fd);
    range_drop(&r);
    return res;
}
/* ---- modules and launches: the allocator's own kernels (vmm/kernel.c's PTX, JIT-compiled on a
 * GPU, run natively by cudaemu) ---- */
extern const char vkern_ptx[];
/* A kernel cudaemu does not implement (the driver runs it). */
static const char nop_ptx[] = ".version 7.0\n.target sm_75\n.address_size 64\n"
                              ".visible .entry xseg_test_nop()\n{\n    ret;\n}\n";
static CUresult m_module_null_image(void)
{
    CUmodule m = NULL;
    CUresult r = drv->cuModuleLoadData(&m, NULL);
    if (r == CUDA_SUCCESS)
        drv->cuModuleUnload(m);
    return r;
}
static CUresult m_module_load(const char *image)
{
    CUmodule m = NULL;
    CUresult r = drv->cuModuleLoadData(&m, image);
    if (r == CUDA_SUCCESS)
        drv->cuModuleUnload(m);
    return r;
}
static CUresult m_module_garbage_text(void) { return m_module_load("this is not PTX { at all\n"); }
static CUresult m_module_garbage_bytes(void) { return m_module_load("\x01\x02\x03\x04\x05 garbage"); }
static CUresult m_module_load_ok(void) { return m_module_load(vkern_ptx); }
/* cuModuleGetFunction(name) in a module of @p image. */
static CUresult m_function(const char *image, const char *name)
{
    CUmodule m = NULL;
    CUresult r = drv->cuModuleLoadData(&m, image);
    if (r != CUDA_SUCCESS)
        return r;
    CUfunction f = NULL;
    r = drv->cuModuleGetFunction(&f, m, name);
    drv->cuModuleUnload(m);
    return r;
}
static CUresult m_function_missing(void) { return m_function(vkern_ptx, "xseg_no_such_kernel"); }
static CUresult m_function_null_name(void) { return m_function(vkern_ptx, NULL); }
static CUresult m_function_unrun(void) { return m_function(nop_ptx, "xseg_test_nop"); }
static CUresult m_unload_null(void) { return drv->cuModuleUnload(NULL); }
/* A launch of xseg_fill_ranges over no range (n = 0: nothing is touched), with these dimensions. */
static CUresult m_launch(unsigned gx, unsigned gy, unsigned bx, unsigned by, unsigned bz)
{
    CUmodule m = NULL;
    CUresult r = drv->cuModuleLoadData(&m, vkern_ptx);
    if (r != CUDA_SUCCESS)
        return r;
    CUfunction f = NULL;
    r = drv->cuModuleGetFunction(&f, m, "xseg_fill_ranges");
    static uint64_t args[2056 / 8]; /* {addr[128], len[128], n = 0, value = 0} */
    void *params[] = {args};
    if (r == CUDA_SUCCESS)
        r = drv->cuLaunchKernel(f, gx, gy, 1, bx, by, bz, 0, NULL, params, NULL);
    if (r == CUDA_SUCCESS)
        r = drv->cuCtxSynchronize();
    drv->cuModuleUnload(m);
    return r;
}
static CUresult m_launch_ok(void) { return m_launch(1, 1, 256, 1, 1); }
static CUresult m_launch_block_1025(void) { return m_launch(1, 1, 1025, 1, 1); }
static CUresult m_launch_block_z65(void) { return m_launch(1, 1, 1, 1, 65); }
static CUresult m_launch_grid_y0(void) { return m_launch(1, 0, 256, 1, 1); }
static CUresult m_launch_grid_y65536(void) { return m_launch(1, 65536, 1, 1, 1); }
static CUresult m_launch_null_function(void)
{
    static uint64_t args[2056 / 8];
    void *params[] = {args};
    return drv->cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
}

static CUresult m_create_host_numa_current(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = drv->cuMemCreate(&h, G, &p, 0);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(h);
    return r;
}
/* The host NUMA node closest to the device (CUDA 12.2+; documented -1 where the system has no
 * NUMA): a node or -1, never anything else. */
static CUresult m_attr_host_numa_id(void)
{
    int v = -2;
    CUresult r = drv->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0);
    return r == CUDA_SUCCESS && v < -1 ? CUDA_ERROR_UNKNOWN : r;
}
/* HOST_NUMA memory on the device's own node (what spill asks for), and the properties the driver
 * gives back for its handle: the same location. */
static CUresult m_props_host_numa(void)
{
    if (!get_props)
        return CUDA_ERROR_NOT_FOUND;
    int node = 0;
    CUresult r = drv->cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE), got;
    p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    p.location.id = node < 0 ? 0 : node;
    CUmemGenericAllocationHandle h = 0;
    if ((r = drv->cuMemCreate(&h, G, &p, 0)) != CUDA_SUCCESS)
        return r;
    memset(&got, 0, sizeof got);
    r = get_props(&got, h);
    if (r == CUDA_SUCCESS && (got.location.type != p.location.type || got.location.id != p.location.id))
        r = CUDA_ERROR_UNKNOWN;
    drv->cuMemRelease(h);
    return r;
}
static CUresult m_props_null(void)
{
    if (!get_props)
        return CUDA_ERROR_NOT_FOUND;
    CUmemGenericAllocationHandle h = create(G);
    CUresult r = get_props(NULL, h);
    drv->cuMemRelease(h);
    return r;
}
/* HOST_NUMA on a node the host does not have. */
static CUresult m_create_host_numa_missing(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    p.location.id = 4242;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = drv->cuMemCreate(&h, G, &p, 0);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(h);
    return r;
}
/* HOST allocations are not IPC capable: requestedHandleTypes must be 0 (documented). */
static CUresult m_create_host_handle_type(void)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    p.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = drv->cuMemCreate(&h, G, &p, 0);
    if (r == CUDA_SUCCESS)
        drv->cuMemRelease(h);
    return r;
}
static CUresult m_access_host_on_device_mem(void)
{
    struct vmm_range r;
    const char *step = "";
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUresult res = range_make(&r, &p, G, &step);
    if (res == CUDA_SUCCESS) {
        CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        res = drv->cuMemSetAccess(r.va, G, &d, 1);
    }
    range_drop(&r);
    return res;
}

/* dma-buf export of a mapped range spanning several physical handles (xseg_range_dmabuf's one
 * call per block): where the device says it exports dma-bufs, a range over 3 handles mapped side
 * by side gives one fd of the range's size; what the driver refuses, and with which code: a range
 * with an unmapped hole, a range not host-page aligned, size 0. On cudaemu: CUDAEMU_DMA_BUF=1
 * (meson test driver-vmm-dmabuf); skipped with the reason where the attribute reads 0. */
static void test_dmabuf_ranges(void **state)
{
    (void)state;
    int attr = 0;
    tu_assert_cu(drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0));
    if (!get_range_handle || !attr) {
        print_message("dma-buf ranges: skipped (%s)\n", get_range_handle ? "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0"
                                                                        : "the driver has no cuMemGetHandleForAddressRange");
        skip();
    }
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h[4] = {0};
    tu_assert_cu(drv->cuMemAddressReserve(&va, 4 * G, 0, 0, 0));
    for (int i = 0; i < 4; i++) {
        tu_assert_cu(drv->cuMemCreate(&h[i], G, &p, 0));
        if (i != 3) /* the fourth granule stays unmapped: a hole after three handles */
            tu_assert_cu(drv->cuMemMap(va + i * G, G, 0, h[i], 0));
    }
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    tu_assert_cu(drv->cuMemSetAccess(va, 3 * G, &a, 1));
    int fd = -1;
    /* Three handles, one fd of the whole range. */
    tu_assert_cu(get_range_handle(&fd, va, 3 * G, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    print_message("dma-buf of 3 handles: fd size %lld of %zu\n", (long long)st.st_size, 3 * G);
    assert_int_equal((size_t)st.st_size, 3 * G);
    close(fd);
    /* Part of a handle (one host page inside the second). */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    fd = -1;
    tu_assert_cu(get_range_handle(&fd, va + G + page, page, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    close(fd);
    /* Refusals. */
    fd = -1;
    assert_int_equal(get_range_handle(&fd, va + 2 * G, 2 * G, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                     CUDA_ERROR_INVALID_VALUE); /* runs into the unmapped hole */
    assert_int_equal(get_range_handle(&fd, va + 100, page, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                     CUDA_ERROR_INVALID_VALUE); /* not host-page aligned */
    assert_int_equal(get_range_handle(&fd, va, 0, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                     CUDA_ERROR_INVALID_VALUE); /* size 0 */
    assert_int_equal(get_range_handle(&fd, va + 3 * G, G, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                     CUDA_ERROR_INVALID_VALUE); /* nothing mapped */
    tu_assert_cu(drv->cuMemUnmap(va, 3 * G));
    for (int i = 0; i < 4; i++)
        tu_assert_cu(drv->cuMemRelease(h[i]));
    tu_assert_cu(drv->cuMemAddressFree(va, 4 * G));
}

/* The RDMA allocation flag where the device says VMM memory supports GPUDirect RDMA
 * (CUDAEMU_RDMA=1 on cudaemu): cuMemCreate accepts it. Skipped where the attribute reads 0. */
static void test_rdma_flag(void **state)
{
    (void)state;
    int attr = 0;
    tu_assert_cu(drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0));
    if (!attr) {
        print_message("RDMA flag: skipped (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0)\n");
        skip();
    }
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    p.allocFlags.gpuDirectRDMACapable = 1;
    CUmemGenericAllocationHandle h = 0;
    tu_assert_cu(drv->cuMemCreate(&h, G, &p, 0));
    tu_assert_cu(drv->cuMemRelease(h));
}

/* cuPointerGetAttribute(IS_GPU_DIRECT_RDMA_CAPABLE) of one granule mapped at a fresh reservation,
 * its chunk created with the RDMA flag @p flag; *value the answer (an unsigned int, as the
 * driver writes it). Everything is given back before returning. */
static CUresult rdma_attr_of_chunk(bool flag, unsigned *value)
{
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    p.allocFlags.gpuDirectRDMACapable = flag;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = reserve(G);
    CUresult r = drv->cuMemCreate(&h, G, &p, 0);
    if (r == CUDA_SUCCESS && (r = drv->cuMemMap(va, G, 0, h, 0)) == CUDA_SUCCESS) {
        if ((r = set_rw(va, G)) == CUDA_SUCCESS)
            r = drv->cuPointerGetAttribute(value, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, va + 4096);
        drv->cuMemUnmap(va, G);
    }
    if (h)
        drv->cuMemRelease(h);
    drv->cuMemAddressFree(va, G);
    return r;
}

static bool rdma_vmm_reported(void)
{
    int attr = 0;
    return drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0) ==
               CUDA_SUCCESS &&
           attr;
}

static CUresult m_ptr_rdma_chunk(void)
{
    unsigned v = 7;
    return rdma_attr_of_chunk(rdma_vmm_reported(), &v);
}

static CUresult m_ptr_rdma_alloc(void)
{
    CUdeviceptr p = 0;
    unsigned v = 7;
    CUresult r = drv->cuMemAlloc(&p, 1 << 20);
    if (r == CUDA_SUCCESS) {
        r = drv->cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, p + 100);
        drv->cuMemFree(p);
    }
    return r;
}

static CUresult m_ptr_null_data(void)
{
    CUdeviceptr p = 0;
    CUresult r = drv->cuMemAlloc(&p, 1 << 20);
    if (r == CUDA_SUCCESS) {
        r = drv->cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, p);
        drv->cuMemFree(p);
    }
    return r;
}

static CUresult m_ptr_zero(void)
{
    unsigned v = 7;
    return drv->cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, 0);
}

/* What cuPointerGetAttribute(IS_GPU_DIRECT_RDMA_CAPABLE) answers: for a chunk created with the
 * RDMA flag on a device reporting GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 1; without the flag, 0;
 * inside a cuMemAlloc block, what GPU_DIRECT_RDMA_SUPPORTED says. Prints the answers (the GPU run
 * compares them with the driver). */
static void test_rdma_pointer_attribute(void **state)
{
    (void)state;
    bool vmm_rdma = rdma_vmm_reported();
    unsigned v = 7;
    if (vmm_rdma) {
        tu_assert_cu(rdma_attr_of_chunk(true, &v));
        print_message("RDMA attribute: chunk with the flag -> %u\n", v);
        assert_int_equal(v, 1);
    }
    v = 7;
    tu_assert_cu(rdma_attr_of_chunk(false, &v));
    print_message("RDMA attribute: chunk without the flag -> %u\n", v);
    assert_int_equal(v, 0);
    int rdma = 0;
    tu_assert_cu(drv->cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0));
    CUdeviceptr p = 0;
    tu_assert_cu(drv->cuMemAlloc(&p, 1 << 20));
    v = 7;
    tu_assert_cu(drv->cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, p));
    tu_assert_cu(drv->cuMemFree(p));
    print_message("RDMA attribute: cuMemAlloc block -> %u (GPU_DIRECT_RDMA_SUPPORTED %d)\n", v, rdma);
    assert_int_equal(v, rdma ? 1 : 0);
}

/* "misuse -> expected CUresult". Measured on an H100 80GB HBM3, driver 580.159.04 (CUDA 13.0)
 * (every row; rerun on a new driver to refresh: each run prints the answers). Where
 * cudaemu is deliberately stricter than the driver (ROW_STRICTER), the driver's answer is the
 * second code: the allocator must never depend on that leniency. */
static const struct misuse misuse_table[] = {
    ROW("reserve: size 0", CUDA_ERROR_INVALID_VALUE, m_reserve_size0),
    ROW("reserve: flags != 0", CUDA_ERROR_INVALID_VALUE, m_reserve_flags),
    ROW("reserve: alignment 3 (not a power of two)", CUDA_ERROR_INVALID_VALUE, m_reserve_align3),
    ROW("reserve: size granularity + 4 KiB", CUDA_ERROR_INVALID_VALUE, m_reserve_unaligned_size),
    ROW("create: size 0", CUDA_ERROR_INVALID_VALUE, m_create_size0),
    ROW("create: size granularity / 2", CUDA_ERROR_INVALID_VALUE, m_create_half),
    ROW("create: device 4242", CUDA_ERROR_INVALID_DEVICE, m_create_baddev),
    ROW("create: flags != 0", CUDA_ERROR_INVALID_VALUE, m_create_flags),
    ROW("create: allocation type INVALID", CUDA_ERROR_INVALID_VALUE, m_create_badtype),
    ROW("map: flags != 0", CUDA_ERROR_INVALID_VALUE, m_map_flags),
    ROW("map: part of a handle (G of a 2G handle)", CUDA_ERROR_NOT_SUPPORTED, m_map_part),
    ROW("map: size not a granularity multiple", CUDA_ERROR_NOT_SUPPORTED, m_map_unaligned_size),
    ROW("map: offset G into a 2G handle", CUDA_ERROR_NOT_SUPPORTED, m_map_offset),
    ROW("map: offset G, size 2G of a 2G handle", CUDA_ERROR_NOT_SUPPORTED, m_map_past_handle),
    ROW("map: size > handle size", CUDA_ERROR_NOT_SUPPORTED, m_map_too_big),
    ROW("map: whole handle, ptr not a granularity multiple", CUDA_ERROR_INVALID_VALUE, m_map_unaligned_ptr),
    ROW_STRICTER("map: whole handle straddling the reservation end", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, m_map_straddle),
    ROW("map: whole handle outside any reservation", CUDA_ERROR_INVALID_VALUE, m_map_outside),
    ROW("map: over already-mapped VA", CUDA_ERROR_INVALID_VALUE, m_map_over_mapped),
    ROW("map: one handle at two ranges, shared bytes, released while mapped (legal)", CUDA_SUCCESS, m_map_twice),
    ROW_EMU_ONLY("map: unknown handle (UB on the driver)", CUDA_ERROR_INVALID_VALUE, m_map_unknown_handle),
    ROW("unmap: half of a mapping", CUDA_ERROR_INVALID_VALUE, m_unmap_partial),
    ROW("unmap: size 0", CUDA_ERROR_INVALID_VALUE, m_unmap_size0),
    ROW_STRICTER("unmap: VA never mapped", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, m_unmap_unmapped),
    ROW_STRICTER("unmap: a mapping plus unmapped VA", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, m_unmap_plus_unmapped),
    ROW("unmap: starts inside a mapping", CUDA_ERROR_INVALID_VALUE, m_unmap_mid_start),
    ROW("unmap: two adjacent whole mappings (legal)", CUDA_SUCCESS, m_unmap_two_whole),
    ROW_EMU_ONLY("unmap: under a pending async copy (UB on the driver)", CUDA_ERROR_ILLEGAL_STATE,
                 m_unmap_pending_copy),
    ROW("set access: range not fully mapped", CUDA_ERROR_INVALID_VALUE, m_access_unmapped),
    ROW("set access: count 0", CUDA_ERROR_INVALID_VALUE, m_access_count0),
    ROW("set access: device 4242", CUDA_ERROR_INVALID_VALUE, m_access_baddev),
    ROW("address free: still mapped", CUDA_ERROR_INVALID_VALUE, m_free_mapped),
    ROW("address free: wrong size", CUDA_ERROR_INVALID_VALUE, m_free_wrong_size),
    ROW("address free: interior pointer", CUDA_ERROR_INVALID_VALUE, m_free_interior),
    ROW("retain: unmapped address", CUDA_ERROR_INVALID_VALUE, m_retain_unmapped),
    ROW("export: POSIX fd not requested at create", CUDA_ERROR_INVALID_VALUE, m_export_not_requested),
    ROW_EMU_ONLY("release: twice (UB on the driver)", CUDA_ERROR_INVALID_VALUE, m_release_twice),
    ROW("cuMemAlloc: size 0", CUDA_ERROR_INVALID_VALUE, m_alloc_size0),
    ROW("cuMemAlloc: no current context", CUDA_ERROR_INVALID_CONTEXT, m_alloc_no_ctx),
    ROW("cuMemGetInfo: no current context", CUDA_ERROR_INVALID_CONTEXT, m_meminfo_no_ctx),
    ROW("cuMemFree: interior pointer", CUDA_ERROR_INVALID_VALUE, m_free_interior_alloc),
    ROW("cuMemFree: twice", CUDA_ERROR_INVALID_VALUE, m_free_twice),
    ROW("cuMemFree: NULL", CUDA_SUCCESS, m_free_null),
    /* Fabric support depends on the system (NVLink, IMEX channel), so these rows are
     * the emulator's (CUDAEMU_FABRIC unset); test_fabric checks what the device reports. */
    ROW_EMU_NO_FABRIC("create: FABRIC handle type, fabric unsupported", CUDA_ERROR_NOT_SUPPORTED, m_create_fabric_unsupported),
    ROW_EMU_NO_FABRIC("export: FABRIC, fabric unsupported", CUDA_ERROR_NOT_SUPPORTED, m_export_fabric_unsupported),
    ROW_EMU_ONLY("import: a pipe as a POSIX fd (UB on the driver)", CUDA_ERROR_INVALID_VALUE, m_import_pipe_fd),
    /* The H200 (driver 580.159.04) answers INVALID_VALUE; cudaemu said NOT_SUPPORTED before. */
    ROW("export: WIN32 handle type on Linux", CUDA_ERROR_INVALID_VALUE, m_export_bad_type),
    /* Measured on the H200 as well, and agreed. */
    ROW("cuInit: flags 1", CUDA_ERROR_INVALID_VALUE, m_init_flags),
    ROW("cuDriverGetVersion: NULL", CUDA_ERROR_INVALID_VALUE, m_version_null),
    ROW("cuGetErrorName: unknown code (string cleared)", CUDA_ERROR_INVALID_VALUE, m_errname_unknown),
    ROW("cuGetErrorString: unknown code (string cleared)", CUDA_ERROR_INVALID_VALUE, m_errstring_unknown),
    /* Not yet run on a GPU: the H200's run stopped at "cuGetErrorName: NULL string out", which
     * faults the driver (test_null_out_faults, below); the next acceptance run's stage-1
     * summary prints the driver's answers to these. */
    ROW("cuGetErrorName: OUT_OF_MEMORY names itself", CUDA_SUCCESS, m_errname_known),
    ROW("cuDeviceGetName: NULL name", CUDA_ERROR_INVALID_VALUE, m_name_null),
    ROW("cuDeviceGetUuid: NULL uuid", CUDA_ERROR_INVALID_VALUE, m_uuid_null),
    ROW("cuDeviceGetUuid: device 4242", CUDA_ERROR_INVALID_DEVICE, m_uuid_baddev),
    ROW("cuDeviceTotalMem: device 4242", CUDA_ERROR_INVALID_DEVICE, m_totalmem_baddev),
    ROW("cuDeviceCanAccessPeer: peer 4242", CUDA_ERROR_INVALID_DEVICE, m_peer_baddev),
    ROW("cuCtxGetCurrent: NULL out", CUDA_ERROR_INVALID_VALUE, m_ctx_get_null),
    ROW("cuCtxGetDevice: no current context", CUDA_ERROR_INVALID_CONTEXT, m_ctx_device_no_ctx),
    ROW("cuCtxPopCurrent: empty stack", CUDA_ERROR_INVALID_CONTEXT, m_ctx_pop_empty),
    ROW("cuCtxPushCurrent + cuCtxPopCurrent: the same context back", CUDA_SUCCESS, m_ctx_push_pop),
    /* The rest of xseg's driver table (vmm/driver.h), one row each at least
     * (tests/build/conformance_rows.sh keeps it so); not yet run on a GPU. */
    ROW("cuDeviceGetCount: NULL count", CUDA_ERROR_INVALID_VALUE, m_devcount_null),
    ROW("cuDeviceGet: ordinal 4242", CUDA_ERROR_INVALID_DEVICE, m_devget_baddev),
    ROW("cuDeviceGetAttribute: attribute CU_DEVICE_ATTRIBUTE_MAX", CUDA_ERROR_INVALID_VALUE, m_attr_bad_attr),
    ROW("cuDeviceGetAttribute: device 4242", CUDA_ERROR_INVALID_DEVICE, m_attr_baddev),
    ROW("cuDevicePrimaryCtxRetain: device 4242", CUDA_ERROR_INVALID_DEVICE, m_retain_baddev),
    ROW("cuDevicePrimaryCtxRelease: device 4242", CUDA_ERROR_INVALID_DEVICE, m_release_baddev),
    ROW("cuCtxSetCurrent: NULL unbinds the thread's context (legal)", CUDA_SUCCESS, m_ctx_set_unset),
    ROW_EMU_ONLY("cuCtxSetCurrent: not a context (UB on the driver)", CUDA_ERROR_INVALID_CONTEXT, m_ctx_set_bogus),
    ROW("cuCtxSynchronize: no current context", CUDA_ERROR_INVALID_CONTEXT, m_ctx_sync_no_ctx),
    ROW("cuMemcpyHtoD: NULL host source", CUDA_ERROR_INVALID_VALUE, m_htod_null),
    ROW("cuMemcpyDtoH: NULL host destination", CUDA_ERROR_INVALID_VALUE, m_dtoh_null),
    ROW("cuMemsetD8: device pointer 0", CUDA_ERROR_INVALID_VALUE, m_memset_null),
    ROW("cuMemGetAllocationGranularity: option 7", CUDA_ERROR_INVALID_VALUE, m_gran_option),
    ROW("cuMemGetAllocationGranularity: NULL prop", CUDA_ERROR_INVALID_VALUE, m_gran_null_prop),
    ROW("cuMemGetAccess: reserved VA not mapped", CUDA_ERROR_INVALID_VALUE, m_getaccess_unmapped),
    ROW("cuStreamCreate: flags 0x80", CUDA_ERROR_INVALID_VALUE, m_stream_create_flags),
    ROW_DOC("cuStreamDestroy: the legacy NULL stream", CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
            m_stream_destroy_legacy),
    ROW("cuStreamWaitEvent: flags 0x10", CUDA_ERROR_INVALID_VALUE, m_wait_flags),
    ROW("cuStreamBeginCapture: the legacy NULL stream", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, m_begin_legacy),
    ROW("cuStreamBeginCapture: stream already capturing", CUDA_ERROR_ILLEGAL_STATE, m_begin_twice),
    ROW("cuStreamEndCapture: stream not capturing", CUDA_ERROR_ILLEGAL_STATE, m_end_not_capturing),
    ROW("cuStreamIsCapturing: NULL status out", CUDA_ERROR_INVALID_VALUE, m_iscapturing_null),
    ROW("cuStreamIsCapturing: legacy stream while a blocking stream captures",
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, m_iscapturing_legacy),
    /* Measured on the H200 (2026-11-26): the driver takes a mode it does not name. */
    ROW("cuThreadExchangeStreamCaptureMode: mode 7 (taken)", CUDA_SUCCESS, m_exchange_mode7),
    ROW("cuGraphDestroy: NULL graph", CUDA_ERROR_INVALID_VALUE, m_graph_destroy_null),
    ROW("cuEventCreate: flags 0x80", CUDA_ERROR_INVALID_VALUE, m_event_create_flags),
    ROW_DOC("cuEventDestroy: NULL event", CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, m_event_destroy_null),
    ROW_EMU_ONLY("cuEventDestroy: twice (UB on the driver)", CUDA_ERROR_INVALID_HANDLE, m_event_destroy_twice),
    ROW_DOC("cuEventRecord: NULL event", CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, m_event_record_null),
    ROW_EMU_ONLY("cuEventRecord: a destroyed event (UB on the driver)", CUDA_ERROR_INVALID_HANDLE,
                 m_event_record_destroyed),
    /* Documented, not yet run on a GPU. */
    ROW("cuEventQuery: recorded on a stream destroyed since (its work completes)", CUDA_SUCCESS,
        m_event_query_dead_stream),
    ROW_DOC("cuEventSynchronize: NULL event", CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, m_event_sync_null),
    ROW_EMU_ONLY("cuEventSynchronize: a destroyed event (UB on the driver)", CUDA_ERROR_INVALID_HANDLE,
                 m_event_sync_destroyed),
    ROW("cuMemHostAlloc: flags 0x80", CUDA_ERROR_INVALID_VALUE, m_hostalloc_flags),
    ROW("cuMemFreeHost: interior pointer", CUDA_ERROR_INVALID_VALUE, m_freehost_interior),
    /* Managed memory (a unified-memory pool's owner, issue 73): the documented codes, not yet
     * measured (the GPU run compares them). */
    ROW("cuMemAllocManaged: size 0", CUDA_ERROR_INVALID_VALUE, m_managed_size0),
    ROW("cuMemAllocManaged: flags 0", CUDA_ERROR_INVALID_VALUE, m_managed_flags0),
    ROW("cuMemAllocManaged: flags GLOBAL | HOST", CUDA_ERROR_INVALID_VALUE, m_managed_flags_both),
    ROW("cuMemPrefetchAsync: flags 1", CUDA_ERROR_INVALID_VALUE, m_prefetch_flags),
    ROW("cuMemPrefetchAsync: cuMemAlloc memory (not managed)", CUDA_ERROR_INVALID_VALUE, m_prefetch_not_managed),
    ROW("cuMemPrefetchAsync: device 4242", CUDA_ERROR_INVALID_DEVICE, m_prefetch_bad_device),
    ROW("cuMemHostRegister: flags 0x80", CUDA_ERROR_INVALID_VALUE, m_hostreg_flags),
    ROW("cuMemHostRegister: range overlapping a registered one", CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        m_hostreg_overlap),
    ROW("cuMemHostUnregister: not registered", CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, m_hostunreg_not),
    ROW("cuMemcpyHtoDAsync: NULL host source", CUDA_ERROR_INVALID_VALUE, m_htod_async_null),
    ROW("cuMemcpyDtoHAsync: NULL host destination", CUDA_ERROR_INVALID_VALUE, m_dtoh_async_null),
    ROW("cuMemsetD8Async: device pointer 0", CUDA_ERROR_INVALID_VALUE, m_memset_async_null),
    ROW("cuMemcpyDtoDAsync: source device pointer 0", CUDA_ERROR_INVALID_VALUE, m_dtod_async_null),
    ROW("cuMemRelease: handle 0", CUDA_ERROR_INVALID_VALUE, m_release_zero),
    /* cuMemcpyBatchAsync (issue 74 item 7): the rules cuda.h 13.0's comment documents, not yet
     * run on a GPU (the next run compares them); skipped where the driver lacks the call. */
    ROW_BATCH("cuMemcpyBatchAsync: HtoD, DtoD and DtoH batches, bytes checked", CUDA_SUCCESS, m_batch_ok),
    ROW_BATCH("cuMemcpyBatchAsync: count 0", CUDA_ERROR_INVALID_VALUE, m_batch_count0),
    ROW_BATCH("cuMemcpyBatchAsync: dsts NULL", CUDA_ERROR_INVALID_VALUE, m_batch_dsts_null),
    ROW_BATCH("cuMemcpyBatchAsync: numAttrs 0", CUDA_ERROR_INVALID_VALUE, m_batch_nattrs0),
    ROW_BATCH("cuMemcpyBatchAsync: numAttrs over count", CUDA_ERROR_INVALID_VALUE, m_batch_nattrs_over),
    ROW_BATCH("cuMemcpyBatchAsync: attrsIdxs[0] 1", CUDA_ERROR_INVALID_VALUE, m_batch_idx0),
    ROW_BATCH("cuMemcpyBatchAsync: attrsIdxs not increasing", CUDA_ERROR_INVALID_VALUE, m_batch_idx_order),
    ROW_BATCH("cuMemcpyBatchAsync: attrsIdxs entry = count", CUDA_ERROR_INVALID_VALUE, m_batch_idx_count),
    ROW_BATCH("cuMemcpyBatchAsync: srcAccessOrder INVALID", CUDA_ERROR_INVALID_VALUE, m_batch_order),
    ROW_BATCH("cuMemcpyBatchAsync: NULL (legacy) stream", CUDA_ERROR_INVALID_VALUE, m_batch_null_stream),
    ROW_BATCH("cuMemcpyBatchAsync: CU_STREAM_LEGACY", CUDA_ERROR_INVALID_VALUE, m_batch_legacy_stream),
    ROW_BATCH_DOC("cuMemcpyBatchAsync: source in unmapped VA", CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_INVALID_VALUE,
                  m_batch_unmapped),
    /* UNKNOWN, measured on the H200 (2026-11-26; the row said INVALID_VALUE before). */
    ROW_DOC("cuMemImportFromShareableHandle: descriptor -1", CUDA_ERROR_UNKNOWN, CUDA_ERROR_NOT_SUPPORTED,
            m_import_bad_fd),
    /* Host-located VMM memory and dma-buf export (this round's probes, below); on a driver
     * without them NOT_SUPPORTED may come first. */
    ROW_DOC("create: HOST_NUMA_CURRENT location", CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED,
            m_create_host_numa_current),
    ROW_DOC("set access: HOST_NUMA access to device memory", CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED,
            m_access_host_on_device_mem),
    ROW_DOC("create: HOST location with a POSIX fd handle type", CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED,
            m_create_host_handle_type),
    ROW_DOC("create: HOST_NUMA node 4242 (no such node)", CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_DEVICE,
            m_create_host_numa_missing),
    ROW("cuDeviceGetAttribute: CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID is a node or -1", CUDA_SUCCESS, m_attr_host_numa_id),
    ROW("cuMemGetAllocationPropertiesFromHandle: HOST_NUMA on the device's node gives that location back",
        CUDA_SUCCESS, m_props_host_numa),
    ROW("cuMemGetAllocationPropertiesFromHandle: NULL prop", CUDA_ERROR_INVALID_VALUE, m_props_null),
    /* GPUDirect RDMA capability of a pointer (docs/registrations.md); documented, not yet run on a
     * GPU: the driver documents INVALID_VALUE for a pointer nothing allocated. */
    ROW("cuPointerGetAttribute: IS_GPU_DIRECT_RDMA_CAPABLE of a mapped chunk (flag where the device reports it)",
        CUDA_SUCCESS, m_ptr_rdma_chunk),
    ROW("cuPointerGetAttribute: IS_GPU_DIRECT_RDMA_CAPABLE inside a cuMemAlloc block", CUDA_SUCCESS, m_ptr_rdma_alloc),
    ROW("cuPointerGetAttribute: NULL data", CUDA_ERROR_INVALID_VALUE, m_ptr_null_data),
    ROW("cuPointerGetAttribute: IS_GPU_DIRECT_RDMA_CAPABLE of device pointer 0", CUDA_ERROR_INVALID_VALUE, m_ptr_zero),
    ROW_DOC("cuMemGetHandleForAddressRange: handle type 7", CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED,
            m_range_handle_type),
    ROW_DOC("cuMemGetHandleForAddressRange: range not host-page aligned", CUDA_ERROR_INVALID_VALUE,
            CUDA_ERROR_NOT_SUPPORTED, m_range_unaligned),
    /* Modules and launches (vmm/kernel.c): the allocator's PTX through the driver's JIT; not yet
     * run on a GPU. Garbage images: the documentation names both codes. */
    ROW("cuModuleLoadData: the allocator's PTX", CUDA_SUCCESS, m_module_load_ok),
    ROW("cuModuleLoadData: NULL image", CUDA_ERROR_INVALID_VALUE, m_module_null_image),
    ROW_DOC("cuModuleLoadData: text that is not PTX", CUDA_ERROR_INVALID_PTX, CUDA_ERROR_INVALID_IMAGE,
            m_module_garbage_text),
    ROW_DOC("cuModuleLoadData: bytes that are not text", CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_PTX,
            m_module_garbage_bytes),
    ROW("cuModuleGetFunction: a name the module lacks", CUDA_ERROR_NOT_FOUND, m_function_missing),
    ROW("cuModuleGetFunction: NULL name", CUDA_ERROR_INVALID_VALUE, m_function_null_name),
    /* cudaemu runs only the allocator's two kernels, natively (cudaemu/README.md). */
    ROW_STRICTER("cuModuleGetFunction: an entry cudaemu does not implement", CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS,
                 m_function_unrun),
    ROW_DOC("cuModuleUnload: NULL module", CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, m_unload_null),
    ROW("cuLaunchKernel: xseg_fill_ranges over no range", CUDA_SUCCESS, m_launch_ok),
    ROW("cuLaunchKernel: a block of 1025 threads", CUDA_ERROR_INVALID_VALUE, m_launch_block_1025),
    ROW("cuLaunchKernel: block z 65", CUDA_ERROR_INVALID_VALUE, m_launch_block_z65),
    ROW("cuLaunchKernel: grid y 0", CUDA_ERROR_INVALID_VALUE, m_launch_grid_y0),
    ROW("cuLaunchKernel: grid y 65536", CUDA_ERROR_INVALID_VALUE, m_launch_grid_y65536),
    ROW_DOC("cuLaunchKernel: NULL function", CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
            m_launch_null_function),
};

static bool fabric_reported(void)
{
    CUdevice d0;
    int attr = 0;
    return drv->cuDeviceGet(&d0, 0) == CUDA_SUCCESS &&
           drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, d0) == CUDA_SUCCESS &&
           attr;
}

static void test_misuse_table(void **state)
{
    (void)state;
    bool emu = tu_emulated();
    int mismatches = 0;
    for (size_t i = 0; i < sizeof misuse_table / sizeof misuse_table[0]; i++) {
        const struct misuse *m = &misuse_table[i];
        if (m->emu_only && !emu) {
            print_message("misuse: %-60s skipped (emulator only)\n", m->what);
            continue;
        }
        if (m->needs_batch && !drv_memcpy_batch) {
            print_message("misuse: %-60s skipped (the driver lacks cuMemcpyBatchAsync_v2: CUDA 12.8's form or "
                          "older)\n", m->what);
            continue;
        }
        if (m->needs_no_fabric && fabric_reported()) {
            print_message("misuse: %-60s skipped (the device reports fabric handles)\n", m->what);
            continue;
        }
        CUresult got = m->run();
        CUresult want = emu ? m->expected : m->real;
        bool ok = got == want || (!emu && m->alt != CUDA_SUCCESS && got == m->alt);
        mismatches += !ok;
        print_message("misuse: %-62s -> %s%s%s\n", m->what, drv_error_name(got),
                      ok ? "" : ", expected ", ok ? "" : drv_error_name(want));
    }
    struct cudaemu_live live;
    if (tu_live(&live)) {
        assert_int_equal(live.mapped_bytes, 0);
        assert_int_equal(live.reservations, 0);
        assert_int_equal(live.handles, 0);
        assert_int_equal(live.allocs, 0);
    }
    if (mismatches)
        fail_msg("%d misuse row(s) differ from the expected CUresult (see above)", mismatches);
}

/* ---------------------------------------------------------------------------------------------
 * Success paths
 * ------------------------------------------------------------------------------------------- */

static void test_granularity(void **state)
{
    (void)state;
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    size_t min = 0, rec = 0;
    tu_assert_cu(drv->cuMemGetAllocationGranularity(&min, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    tu_assert_cu(drv->cuMemGetAllocationGranularity(&rec, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    print_message("granularity: minimum %zu, recommended %zu\n", min, rec);
    assert_true(min > 0 && (min & (min - 1)) == 0);
    assert_true(rec >= min && rec % min == 0);
    /* The device id is not checked here (H100, driver 580.159.04); a bad option is. */
    p.location.id = 4242;
    tu_assert_cu(drv->cuMemGetAllocationGranularity(&min, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    p.location.id = 0;
    tu_assert_cu_eq(drv->cuMemGetAllocationGranularity(&min, &p, (CUmemAllocationGranularity_flags)7),
                    CUDA_ERROR_INVALID_VALUE);
}

static void test_reserve_align_hint(void **state)
{
    (void)state;
    CUdeviceptr a = 0, b = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&a, 4 * G, 16 * G, 0, 0));
    assert_int_equal(a % (16 * G), 0);
    tu_assert_cu(drv->cuMemAddressFree(a, 4 * G));
    /* The address is a hint: honoured when free (cudaemu guarantees it), else placed elsewhere. */
    tu_assert_cu(drv->cuMemAddressReserve(&b, 4 * G, 0, a, 0));
    if (tu_emulated())
        assert_int_equal(b, a);
    CUdeviceptr c = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&c, 4 * G, 0, b, 0));
    assert_true(c + 4 * G <= b || c >= b + 4 * G);
    tu_assert_cu(drv->cuMemAddressFree(c, 4 * G));
    tu_assert_cu(drv->cuMemAddressFree(b, 4 * G));
}

static void test_map_rw_roundtrip(void **state)
{
    (void)state;
    size_t before = free_mem();
    CUdeviceptr va = reserve(4 * G);
    CUmemGenericAllocationHandle h = create(4 * G);
    assert_int_equal(before - free_mem(), 4 * G);
    tu_assert_cu(drv->cuMemMap(va, 4 * G, 0, h, 0));
    tu_assert_cu(set_rw(va, 4 * G));
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    unsigned long long fl = 0;
    tu_assert_cu(drv->cuMemGetAccess(&fl, &loc, va + G));
    assert_int_equal(fl, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    tu_assert_cu(tu_fill(va, 4 * G, 11));
    assert_true(tu_check(va, 4 * G, 11));
    assert_false(tu_check(va, 4 * G, 12));
    tu_assert_cu(drv->cuMemUnmap(va, 4 * G));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemAddressFree(va, 4 * G));
    assert_int_equal(free_mem(), before);
}

/* hip-tests Map2MultVMMs: one handle at two VAs; data written through one reads through the
 * other. */
static void test_two_mappings_alias(void **state)
{
    (void)state;
    CUdeviceptr a = reserve(2 * G), b = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(2 * G);
    tu_assert_cu(drv->cuMemMap(a, 2 * G, 0, h, 0));
    tu_assert_cu(drv->cuMemMap(b, 2 * G, 0, h, 0));
    tu_assert_cu(set_rw(a, 2 * G));
    tu_assert_cu(set_rw(b, 2 * G));
    tu_assert_cu(tu_fill(a, 2 * G, 21));
    assert_true(tu_check(b, 2 * G, 21));
    tu_assert_cu(tu_fill(b + G, G, 22));
    assert_true(tu_check(a + G, G, 22));
    tu_assert_cu(drv->cuMemUnmap(a, 2 * G));
    tu_assert_cu(drv->cuMemUnmap(b, 2 * G));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemAddressFree(a, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(b, 2 * G));
}

/* Release is legal while mapped; the memory goes with the last mapping. */
static void test_release_while_mapped(void **state)
{
    (void)state;
    size_t before = free_mem();
    CUdeviceptr va = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(2 * G);
    tu_assert_cu(drv->cuMemMap(va, 2 * G, 0, h, 0));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(set_rw(va, 2 * G));
    tu_assert_cu(tu_fill(va, 2 * G, 31));
    assert_true(tu_check(va, 2 * G, 31));
    assert_int_equal(before - free_mem(), 2 * G);
    tu_assert_cu(drv->cuMemUnmap(va, 2 * G));
    assert_int_equal(free_mem(), before);
    struct cudaemu_live live;
    if (tu_live(&live))
        assert_int_equal(live.handles, 0);
    tu_assert_cu(drv->cuMemAddressFree(va, 2 * G));
}

/* ---- the allocator's range kernels (vmm/kernel.c) over VMM memory: the same PTX the GPU run
 * JIT-compiles; their misuse rows are in the misuse table ---- */

static unsigned char peek_byte(CUdeviceptr p)
{
    unsigned char v = 0;
    tu_assert_cu(drv->cuMemcpyDtoH(&v, p, 1));
    return v;
}

static void kern_check_want(const struct vkern_range *r, size_t n, unsigned char v, const size_t *want)
{
    size_t *first = calloc(n, sizeof *first);
    assert_non_null(first);
    xseg_status st = vkern_check(r, n, v, NULL, first);
    if (st != XSEG_SUCCESS)
        fail_msg("vkern_check of %zu ranges: %s", n, xseg_last_error());
    for (size_t i = 0; i < n; i++)
        if (first[i] != (want ? want[i] : r[i].len))
            fail_msg("range %zu (+%zu bytes): first differing byte %zu, expected %zu", i, r[i].len, first[i],
                     want ? want[i] : r[i].len);
    free(first);
}

/* Four pages, each its own handle: ranges at odd alignments, lengths 0, 1, 7, 4 KiB + 3 and
 * several MiB (across handles), then VKERN_MAX_RANGES + 5 ranges (two launches a call); a changed
 * byte is found at its offset in its range, and nothing outside the ranges is written. */
static void test_kernel_ranges(void **state)
{
    (void)state;
    xseg_status st = vkern_ready();
    if (st != XSEG_SUCCESS)
        fail_msg("vkern_ready: %s", xseg_last_error()); /* cudaemu and a GPU both run them */
    size_t size = 4 * G;
    CUdeviceptr va = reserve(size);
    for (size_t i = 0; i < 4; i++) {
        CUmemGenericAllocationHandle h = create(G);
        tu_assert_cu(drv->cuMemMap(va + i * G, G, 0, h, 0));
        tu_assert_cu(drv->cuMemRelease(h));
    }
    tu_assert_cu(set_rw(va, size));
    tu_assert_cu(drv->cuMemsetD8(va, 0, size));
    struct vkern_range r[] = {
        {va + 1, 0}, {va + 3, 1}, {va + 17, 7}, {va + 4096 + 5, 4096 + 3}, {va + G - 5, 7}, {va + G + 3, 2 * G + 5},
    };
    enum { NR = sizeof r / sizeof r[0] };
    if ((st = vkern_fill(r, NR, 0xa5, NULL)) != XSEG_SUCCESS)
        fail_msg("vkern_fill: %s", xseg_last_error());
    kern_check_want(r, NR, 0xa5, NULL);
    for (size_t i = 1; i < NR; i++) {
        assert_int_equal(peek_byte(r[i].addr - 1), 0);
        assert_int_equal(peek_byte(r[i].addr), 0xa5);
        assert_int_equal(peek_byte(r[i].addr + r[i].len - 1), 0xa5);
        assert_int_equal(peek_byte(r[i].addr + r[i].len), 0);
    }
    size_t want[NR];
    for (size_t i = 0; i < NR; i++)
        want[i] = r[i].len;
    want[3] = 1;         /* in the unaligned head */
    want[4] = 6;         /* just across the page edge */
    want[5] = G + 4093;  /* a word in the middle of the second handle */
    for (size_t i = 3; i < NR; i++)
        tu_assert_cu(drv->cuMemsetD8(r[i].addr + want[i], 0x5a, 1));
    tu_assert_cu(drv->cuMemsetD8(r[5].addr + want[5] + 9, 0x5a, 1)); /* later: not the first */
    kern_check_want(r, NR, 0xa5, want);

    enum { NM = VKERN_MAX_RANGES + 5 };
    struct vkern_range *m = calloc(NM, sizeof *m);
    size_t *wm = calloc(NM, sizeof *wm);
    assert_non_null(m);
    assert_non_null(wm);
    for (size_t i = 0; i < NM; i++) {
        m[i] = (struct vkern_range){va + i * 12289 + i % 8, 3000 + i};
        wm[i] = m[i].len;
    }
    if ((st = vkern_fill(m, NM, 0x3c, NULL)) != XSEG_SUCCESS)
        fail_msg("vkern_fill of %d ranges: %s", NM, xseg_last_error());
    wm[NM - 2] = 1234; /* found by the second launch */
    tu_assert_cu(drv->cuMemsetD8(m[NM - 2].addr + wm[NM - 2], 0, 1));
    kern_check_want(m, NM, 0x3c, wm);
    free(m);
    free(wm);
    tu_assert_cu(drv->cuCtxSynchronize());
    tu_assert_cu(drv->cuMemUnmap(va, size));
    tu_assert_cu(drv->cuMemAddressFree(va, size));
}

/* A range over unmapped memory. Emulator-only: on a GPU the kernel's fault is reported at the next
 * wait and kills the context, so no later row of this suite could run; cudaemu refuses the launch
 * with the same code and runs nothing. */
static void test_kernel_unmapped(void **state)
{
    (void)state;
    if (!tu_emulated()) {
        print_message("[  SKIPPED ] a kernel's fault kills a GPU context (every later row would fail)\n");
        skip();
    }
    CUdeviceptr va = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(G);
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(set_rw(va, G));
    tu_assert_cu(drv->cuMemsetD8(va, 9, G));
    struct vkern_range r[] = {{va, 64}, {va + G - 1, 2}};
    assert_int_equal(vkern_fill(r, 2, 0, NULL), XSEG_ERROR_DRIVER);
    assert_non_null(strstr(xseg_last_error(), "CUDA_ERROR_ILLEGAL_ADDRESS"));
    assert_int_equal(peek_byte(va), 9); /* nothing ran */
    tu_assert_cu(drv->cuMemUnmap(va, G));
    tu_assert_cu(drv->cuMemAddressFree(va, 2 * G));
}

static void test_retain_handle(void **state)
{
    (void)state;
    CUdeviceptr va = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(2 * G), r = 0;
    tu_assert_cu(drv->cuMemMap(va, 2 * G, 0, h, 0));
    tu_assert_cu(drv->cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(va + G + 4096)));
    assert_int_equal(r, h);
    tu_assert_cu(drv->cuMemRelease(h));
    /* The retained reference keeps the handle usable: map it a second time. */
    CUdeviceptr vb = reserve(2 * G);
    tu_assert_cu(drv->cuMemMap(vb, 2 * G, 0, r, 0));
    tu_assert_cu(drv->cuMemRelease(r));
    tu_assert_cu(drv->cuMemUnmap(vb, 2 * G));
    tu_assert_cu(drv->cuMemUnmap(va, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(va, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(vb, 2 * G));
}

static void test_export_import_fd(void **state)
{
    (void)state;
    size_t before = free_mem();
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemGenericAllocationHandle h = 0, imp = 0;
    tu_assert_cu(drv->cuMemCreate(&h, 2 * G, &p, 0));
    int fd = -1;
    tu_assert_cu(drv->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    assert_true(fd >= 0);
    tu_assert_cu(drv->cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    /* The same memory, counted once. */
    assert_int_equal(before - free_mem(), 2 * G);
    CUdeviceptr a = reserve(2 * G), b = reserve(2 * G);
    tu_assert_cu(drv->cuMemMap(a, 2 * G, 0, h, 0));
    tu_assert_cu(drv->cuMemMap(b, 2 * G, 0, imp, 0));
    tu_assert_cu(set_rw(a, 2 * G));
    tu_assert_cu(set_rw(b, 2 * G));
    tu_assert_cu(tu_fill(a, 2 * G, 41));
    assert_true(tu_check(b, 2 * G, 41));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemRelease(imp));
    tu_assert_cu(drv->cuMemUnmap(a, 2 * G));
    tu_assert_cu(drv->cuMemUnmap(b, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(a, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(b, 2 * G));
    assert_int_equal(free_mem(), before);
}

/* Capacity: cuMemCreate and cuMemAlloc draw on the same device memory. */
static void test_capacity_oom(void **state)
{
    (void)state;
    size_t total = 0, f = 0;
    tu_assert_cu(drv->cuMemGetInfo(&f, &total));
    const size_t chunk = XSEG_GiB;
    size_t max = total / chunk + 2, n = 0;
    CUmemGenericAllocationHandle *hs = calloc(max, sizeof *hs);
    assert_non_null(hs);
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    CUresult r = CUDA_SUCCESS;
    while (n < max && (r = drv->cuMemCreate(&hs[n], chunk, &p, 0)) == CUDA_SUCCESS)
        n++;
    print_message("capacity: %zu x 1 GiB handles of %zu bytes total, then %s\n", n, total,
                  drv_error_name(r));
    assert_int_equal(r, CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr d = 0;
    tu_assert_cu_eq(drv->cuMemAlloc(&d, chunk), CUDA_ERROR_OUT_OF_MEMORY);
    CUmemGenericAllocationHandle big;
    tu_assert_cu_eq(drv->cuMemCreate(&big, xseg_align_up(total, G) + G, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    for (size_t i = 0; i < n; i++)
        tu_assert_cu(drv->cuMemRelease(hs[i]));
    free(hs);
    tu_assert_cu(drv->cuMemAlloc(&d, chunk));
    tu_assert_cu(drv->cuMemFree(d));
}

static void test_classic_alloc(void **state)
{
    (void)state;
    size_t before = free_mem();
    CUdeviceptr a = 0, b = 0;
    tu_assert_cu(drv->cuMemAlloc(&a, 1000));
    tu_assert_cu(drv->cuMemAlloc(&b, 3 * XSEG_MiB + 1));
    assert_int_equal(a % 256, 0);
    assert_int_equal(b % 256, 0);
    assert_true(free_mem() < before);
    tu_assert_cu(tu_fill(a, 1000, 51));
    tu_assert_cu(tu_fill(b, 3 * XSEG_MiB + 1, 52));
    assert_true(tu_check(a, 1000, 51));
    assert_true(tu_check(b, 3 * XSEG_MiB + 1, 52));
    tu_assert_cu(drv->cuMemFree(a));
    tu_assert_cu(drv->cuMemFree(b));
    assert_int_equal(free_mem(), before);
}

/* ---- pinned host memory, async copies and memset (services) ---- */

/* cuMemHostRegister / cuMemHostUnregister (the host cache under pinned_use_cuda_host_register):
 * a registered range is copied through like cuMemHostAlloc memory; registering an overlapping
 * range is HOST_MEMORY_ALREADY_REGISTERED and unregistering one not registered (or twice)
 * HOST_MEMORY_NOT_REGISTERED, as the driver documents; bad flags and NULL are INVALID_VALUE. */
static void test_host_register(void **state)
{
    (void)state;
    const size_t n = 4 * XSEG_MiB;
    unsigned char *h = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(h != MAP_FAILED);
    tu_assert_cu_eq(drv->cuMemHostRegister(NULL, n, CU_MEMHOSTREGISTER_PORTABLE), CUDA_ERROR_INVALID_VALUE);
    tu_assert_cu_eq(drv->cuMemHostRegister(h, n, 0x80u), CUDA_ERROR_INVALID_VALUE);
    tu_assert_cu(drv->cuMemHostRegister(h, n, CU_MEMHOSTREGISTER_PORTABLE));
    tu_assert_cu_eq(drv->cuMemHostRegister(h + n / 2, n / 4, CU_MEMHOSTREGISTER_PORTABLE),
                    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d = 0;
    tu_assert_cu(drv->cuMemAlloc(&d, n / 2));
    for (size_t i = 0; i < n / 2; i++)
        h[i] = (unsigned char)(i * 5 + 1);
    tu_assert_cu(drv->cuMemcpyHtoDAsync(d, h, n / 2, s));
    tu_assert_cu(drv->cuMemcpyDtoHAsync(h + n / 2, d, n / 2, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_memory_equal(h, h + n / 2, n / 2);
    if (tu_emulated()) {
        assert_true(tu_fail("cuMemHostUnregister", 1, CUDA_ERROR_UNKNOWN));
        tu_assert_cu_eq(drv->cuMemHostUnregister(h), CUDA_ERROR_UNKNOWN);
    }
    tu_assert_cu(drv->cuMemHostUnregister(h));
    tu_assert_cu_eq(drv->cuMemHostUnregister(h), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    tu_assert_cu(drv->cuMemFree(d));
    tu_assert_cu(drv->cuStreamDestroy(s));
    munmap(h, n);
}

/* Round trip through pinned buffers on a stream: the bytes arrive, memset zeroes, zero-byte
 * calls succeed, bad arguments are INVALID_VALUE. On cudaemu also: async work on a held stream is
 * pending until released, injected failures come back, a pointer cuMemHostAlloc did not give is
 * refused by cuMemFreeHost. */
static void test_host_copies(void **state)
{
    (void)state;
    const size_t n = 3 * XSEG_MiB + 1;
    void *h1 = NULL, *h2 = NULL, *bad = (void *)&state;
    tu_assert_cu(drv->cuMemHostAlloc(&h1, n, CU_MEMHOSTALLOC_PORTABLE));
    tu_assert_cu(drv->cuMemHostAlloc(&h2, n, 0));
    tu_assert_cu_eq(drv->cuMemHostAlloc(NULL, n, 0), CUDA_ERROR_INVALID_VALUE);
    tu_assert_cu_eq(drv->cuMemHostAlloc(&bad, n, 0x80u), CUDA_ERROR_INVALID_VALUE);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d = 0;
    tu_assert_cu(drv->cuMemAlloc(&d, n));
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)h1)[i] = (unsigned char)(i * 7 + 3);
    tu_assert_cu(drv->cuMemcpyHtoDAsync(d, h1, n, s));
    tu_assert_cu(drv->cuMemcpyDtoHAsync(h2, d, n, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_memory_equal(h1, h2, n);
    tu_assert_cu(drv->cuMemsetD8Async(d + 1, 0, n - 1, s));
    tu_assert_cu(drv->cuMemcpyDtoHAsync(h2, d, n, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(((unsigned char *)h2)[0], 3);
    for (size_t i = 1; i < n; i++)
        if (((unsigned char *)h2)[i])
            fail_msg("byte %zu is %d after cuMemsetD8Async(0)", i, ((unsigned char *)h2)[i]);
    tu_assert_cu(drv->cuMemcpyHtoDAsync(d, h1, 0, s));
    tu_assert_cu(drv->cuMemcpyDtoHAsync(h2, d, 0, s));
    tu_assert_cu(drv->cuMemsetD8Async(d, 0, 0, s));
    tu_assert_cu_eq(drv->cuMemcpyHtoDAsync(d, NULL, n, s), CUDA_ERROR_INVALID_VALUE);
    tu_assert_cu_eq(drv->cuMemcpyDtoHAsync(NULL, d, n, s), CUDA_ERROR_INVALID_VALUE);
    if (tu_emulated()) {
        assert_true(tu_stream_hold(s));
        tu_assert_cu(drv->cuMemcpyHtoDAsync(d, h1, n, s));
        tu_assert_cu_eq(drv->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        assert_true(tu_stream_release(s));
        tu_assert_cu(drv->cuStreamQuery(s));
        assert_true(tu_fail("cuMemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY));
        tu_assert_cu_eq(drv->cuMemHostAlloc(&bad, n, 0), CUDA_ERROR_OUT_OF_MEMORY);
        assert_true(tu_fail("cuMemcpyDtoHAsync", 1, CUDA_ERROR_UNKNOWN));
        tu_assert_cu_eq(drv->cuMemcpyDtoHAsync(h2, d, n, s), CUDA_ERROR_UNKNOWN);
        tu_assert_cu_eq(drv->cuMemFreeHost((char *)h1 + 4096), CUDA_ERROR_INVALID_VALUE);
    }
    tu_assert_cu(drv->cuMemFree(d));
    /* Over VMM memory: bytes written with an async copy, cleared by an async memset except the
     * first and last, read back with an async copy (two pages, a memset across them). */
    CUmemGenericAllocationHandle vh = create(2 * G);
    CUdeviceptr va = reserve(2 * G);
    tu_assert_cu(drv->cuMemMap(va, 2 * G, 0, vh, 0));
    tu_assert_cu(drv->cuMemRelease(vh));
    tu_assert_cu(set_rw(va, 2 * G));
    size_t m = n < 2 * G ? n : 2 * G;
    tu_assert_cu(drv->cuMemcpyHtoDAsync(va + 2 * G - m, h1, m, s));
    tu_assert_cu(drv->cuMemsetD8Async(va + 2 * G - m + 1, 0, m - 2, s));
    memset(h2, 0xee, m);
    tu_assert_cu(drv->cuMemcpyDtoHAsync(h2, va + 2 * G - m, m, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(((unsigned char *)h2)[0], ((unsigned char *)h1)[0]);
    assert_int_equal(((unsigned char *)h2)[m - 1], ((unsigned char *)h1)[m - 1]);
    for (size_t i = 1; i + 1 < m; i++)
        if (((unsigned char *)h2)[i])
            fail_msg("VMM byte %zu is %d after cuMemsetD8Async(0)", i, ((unsigned char *)h2)[i]);
    tu_assert_cu(drv->cuMemUnmap(va, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(va, 2 * G));
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuMemFreeHost(h1));
    tu_assert_cu(drv->cuMemFreeHost(h2));
    if (tu_emulated())
        tu_assert_cu_eq(drv->cuMemFreeHost(h1), CUDA_ERROR_INVALID_VALUE); /* freed already */
}

/* ---- faults, in a fresh process ---- */

static char self_path[4096];

static int exec_fault_child(void *arg)
{
    char opt[64];
    snprintf(opt, sizeof opt, "--fault=%s", (const char *)arg);
    char *argv[] = {self_path, opt, NULL};
    execv(self_path, argv);
    return 120;
}

/* Device memory is not host memory: a host read of a device address that is mapped, granted to
 * the device and written there faults (SIGSEGV), on a GPU as on cudaemu. VMM memory ("host-read")
 * or cuMemAlloc memory ("host-read-classic"), in a fresh process. */
static int host_read_child(const char *kind)
{
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    if (!strcmp(kind, "host-read")) {
        CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
        if (drv->cuMemAddressReserve(&va, G, 0, 0, 0) || drv->cuMemCreate(&h, G, &p, 0) ||
            drv->cuMemMap(va, G, 0, h, 0) || set_rw(va, G))
            return 105;
    } else if (drv->cuMemAlloc(&va, G)) {
        return 105;
    }
    if (drv->cuMemsetD8(va, 0x5a, G) || drv->cuCtxSynchronize())
        return 106;
    unsigned char b = 0;
    if (drv->cuMemcpyDtoH(&b, va + 7, 1) || b != 0x5a)
        return 107; /* the device's view holds the bytes */
    fprintf(stderr, "fault child %s: reading 0x%llx from the host\n", kind, (unsigned long long)va);
    return *(volatile unsigned char *)(uintptr_t)(va + 7) == 0x5a ? 0 : 1;
}

/* The child: set up the memory, then touch it. Exit 0 means "no fault" (a test failure);
 * 100 and up, a setup failure. */
static int fault_child_main(const char *kind)
{
    if (!tu_gpu_available())
        return 103;
    struct drv_device_info info;
    if (drv_device_query(0, &info) != XSEG_SUCCESS)
        return 104;
    G = info.granularity;
    if (!strcmp(kind, "host-read") || !strcmp(kind, "host-read-classic"))
        return host_read_child(kind);
    if (!strcmp(kind, "exchange-null")) {
        CUresult r = drv->cuThreadExchangeStreamCaptureMode(NULL); /* faulted the H200's driver */
        fprintf(stderr, "fault child %s: %s\n", kind, drv_error_name(r));
        return 0;
    }
    if (!strncmp(kind, "dead-stream", 11)) {
        CUstream s;
        if (drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || drv->cuStreamDestroy(s))
            return 108;
        static char hb[2][64];
        CUdeviceptr d[1] = {(CUdeviceptr)(uintptr_t)hb[0]}, src[1] = {(CUdeviceptr)(uintptr_t)hb[1]};
        size_t z[1] = {64}, idx[1] = {0};
        CUmemcpyAttributes a = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
        /* undefined: the driver may crash, cudaemu faults */
        CUresult r = !strcmp(kind, "dead-stream")         ? drv->cuStreamSynchronize(s)
                     : !strcmp(kind, "dead-stream-query") ? drv->cuStreamQuery(s)
                     : !strcmp(kind, "dead-stream-batch") ? drv_memcpy_batch(d, src, z, 1, &a, idx, 1, s)
                                                          : drv->cuStreamDestroy(s);
        fprintf(stderr, "fault child %s: %s\n", kind, drv_error_name(r));
        return 0;
    }
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    if (drv->cuMemAddressReserve(&va, 2 * G, 0, 0, 0) || drv->cuMemCreate(&h, G, &p, 0))
        return 105;
    if (!strcmp(kind, "noaccess") || !strcmp(kind, "after-unmap")) {
        if (drv->cuMemMap(va, G, 0, h, 0))
            return 106;
    }
    if (!strcmp(kind, "after-unmap")) {
        if (set_rw(va, G) || drv->cuMemsetD8(va, 1, G) || drv->cuMemUnmap(va, G))
            return 107;
    }
    if (tu_emulated()) {
        *(volatile char *)(uintptr_t)va = 1;
        return 0;
    }
    CUresult r = drv->cuMemsetD8(va, 1, 4096);
    CUresult s = drv->cuCtxSynchronize();
    fprintf(stderr, "fault child %s: cuMemsetD8 %s, cuCtxSynchronize %s\n", kind,
            drv_error_name(r), drv_error_name(s));
    return r != CUDA_SUCCESS || s != CUDA_SUCCESS ? 1 : 0;
}

static void fault_check(const char *kind)
{
    int detail = 0;
    enum tu_child_outcome o = tu_run_child(exec_fault_child, (void *)kind, &detail);
    print_message("fault %s: child %s %d\n", kind,
                  o == TU_CHILD_SIGNAL ? "killed by signal" : o == TU_CHILD_EXIT ? "exited" : "ok", detail);
    /* Codes >= 100 are setup failures. On cudaemu the fault kills the child by SIGSEGV, or a
     * sanitizer's handler turns it into an exit status (TSan: 66, ASan: 1). */
    if (tu_emulated() && o == TU_CHILD_SIGNAL)
        assert_true(detail == SIGSEGV || detail == SIGBUS || detail == SIGABRT);
    else
        assert_true(tu_child_failed(o) && detail > 0 && detail < 100);
}
/* Reading mapped device memory from the host kills the process, on the driver as on cudaemu. */
static void host_fault_check(const char *kind)
{
    int detail = 0;
    enum tu_child_outcome o = tu_run_child(exec_fault_child, (void *)kind, &detail);
    print_message("fault %s: child %s %d\n", kind,
                  o == TU_CHILD_SIGNAL ? "killed by signal" : o == TU_CHILD_EXIT ? "exited" : "ok", detail);
    /* A sanitizer's handler turns the fault into an abort or an exit status (ASan: SIGABRT with
     * abort_on_error, else 1; TSan: 66). */
    if (o == TU_CHILD_SIGNAL)
        assert_true(detail == SIGSEGV || detail == SIGBUS || detail == SIGABRT);
    else
        assert_true(o == TU_CHILD_EXIT && (detail == 1 || detail == 66));
}

/* The same read in a forked child of this process: the device memory it maps stays device
 * memory there (no driver call is made in the child). */
static int host_read_byte(void *arg)
{
    return *(volatile unsigned char *)arg == 0x5a ? 0 : 1;
}

static void test_fault_host_read(void **state)
{
    (void)state;
    host_fault_check("host-read");
    CUdeviceptr va = reserve(G);
    CUmemGenericAllocationHandle h = create(G);
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    tu_assert_cu(set_rw(va, G));
    tu_assert_cu(drv->cuMemsetD8(va, 0x5a, G));
    tu_assert_cu(drv->cuCtxSynchronize());
    int detail = 0;
    enum tu_child_outcome o = tu_run_child(host_read_byte, (void *)(uintptr_t)(va + 9), &detail);
    print_message("fault host-read-fork: child %s %d\n", o == TU_CHILD_SIGNAL ? "killed by signal" : "exited", detail);
    assert_int_equal(o, TU_CHILD_SIGNAL);
    assert_true(detail == SIGSEGV || detail == SIGBUS);
    tu_assert_cu(drv->cuMemUnmap(va, G));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemAddressFree(va, G));
}

static void test_fault_host_read_classic(void **state)
{
    (void)state;
    host_fault_check("host-read-classic");
}

/* A call with a destroyed stream is undefined on the driver (on an H200 cuLaunchKernel,
 * cuStreamIsCapturing and cuStreamSynchronize with one crashed the process): cudaemu faults, so
 * a program that keeps using a stream its owner destroyed fails in CI. Emulator-only. */
static void test_fault_dead_stream(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    /* a call with it; destroyed twice; cuStreamQuery of it (what xseg's passes asked before
     * issue 75: they query xseg's own event now); cuMemcpyBatchAsync on it (issue 74 item 7) */
    const char *kinds[] = {"dead-stream", "dead-stream-destroy", "dead-stream-query", "dead-stream-batch"};
    for (int i = 0; i < 4; i++) {
        int detail = 0;
        enum tu_child_outcome o = tu_run_child(exec_fault_child, (void *)kinds[i], &detail);
        print_message("fault %s: child %s %d\n", kinds[i], o == TU_CHILD_SIGNAL ? "killed by signal" : "exited",
                      detail);
        if (o == TU_CHILD_SIGNAL) /* SIGABRT: a sanitizer's handler with abort_on_error */
            assert_true(detail == SIGSEGV || detail == SIGABRT);
        else
            assert_true(o == TU_CHILD_EXIT && (detail == 1 || detail == 66));
    }
}

static void test_fault_unmapped(void **state) { (void)state; fault_check("unmapped"); }
static void test_fault_noaccess(void **state) { (void)state; fault_check("noaccess"); }
static void test_fault_after_unmap(void **state) { (void)state; fault_check("after-unmap"); }

/* A NULL string out of cuGetErrorName faults the driver (measured on the H200: the misuse row
 * that called it killed the table); cudaemu faults alike. cuGetErrorString: unmeasured, the
 * same. In a forked child, where both still answer (they need no context). */
static int errname_null_child(void *arg)
{
    if (arg)
        (void)drv->cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, NULL);
    else
        (void)drv->cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, NULL);
    return 0; /* it did not fault */
}

static void test_null_out_faults(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        int detail = 0;
        enum tu_child_outcome o = tu_run_child(errname_null_child, which ? (void *)1 : NULL, &detail);
        print_message("fault: %s with a NULL string out: child %s %d\n",
                      which ? "cuGetErrorString" : "cuGetErrorName",
                      o == TU_CHILD_SIGNAL ? "killed by signal" : o == TU_CHILD_EXIT ? "exited" : "returned", detail);
        /* A sanitizer's handler turns the fault into an exit status (TSan: 66, ASan: 1). */
        assert_true(tu_child_failed(o) && detail > 0);
    }
    /* cuThreadExchangeStreamCaptureMode with a NULL mode faulted the H200's driver (580.159.04,
     * 2026-11-26: the misuse table, which had it as an INVALID_VALUE row, died there). It needs
     * an initialized driver: a fresh process (a forked child may not call the driver). */
    host_fault_check("exchange-null");
}

/* ---- descriptors the driver opens for itself ---- */

/* A fresh process: the descriptor count before the driver, after cuInit, after the primary
 * context's retain, after a first allocation in it, after its last release. Exit 0 when the
 * driver holds more than it started with once the context is in use. */
static int fds_child_main(void)
{
    int before = tu_count_fds();
    if (drv_load() != XSEG_SUCCESS)
        return 103;
    int loaded = tu_count_fds();
    CUdevice dev;
    CUcontext ctx;
    if (drv->cuDeviceGet(&dev, 0) || drv->cuDevicePrimaryCtxRetain(&ctx, dev))
        return 104;
    int retained = tu_count_fds();
    CUdeviceptr p = 0;
    if (drv->cuCtxSetCurrent(ctx) || drv->cuMemAlloc(&p, 2 << 20) || drv->cuMemFree(p))
        return 105;
    int used = tu_count_fds();
    if (drv->cuCtxSetCurrent(NULL) || drv->cuDevicePrimaryCtxRelease(dev))
        return 106;
    int released = tu_count_fds();
    printf("descriptors: %d before the driver, %d after cuInit, %d after cuDevicePrimaryCtxRetain, %d after a "
           "first cuMemAlloc, %d after the last cuDevicePrimaryCtxRelease\n",
           before, loaded, retained, used, released);
    fflush(stdout);
    return before >= 0 && used > before ? 0 : 1;
}

static int exec_fds_child(void *arg)
{
    (void)arg;
    char *argv[] = {self_path, "--fds", NULL};
    execv(self_path, argv);
    return 120;
}

/* The driver opens descriptors of its own when a context becomes active and keeps them while it
 * is: a process's descriptor count is not stable across the first use of a device (the IPC
 * tests' leak checks take their baseline after it). */
static void test_driver_descriptors(void **state)
{
    (void)state;
    int detail = 0;
    enum tu_child_outcome o = tu_run_child(exec_fds_child, NULL, &detail);
    if (o != TU_CHILD_OK)
        fail_msg("descriptor child: %s %d (1: no descriptor of the driver's own; 100 and up: setup)",
                 o == TU_CHILD_SIGNAL ? "killed by signal" : "exit status", detail);
}

/* ---- streams and events ---- */

static void test_events(void **state)
{
    (void)state;
    CUstream s = NULL;
    CUevent e = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, 0));
    tu_assert_cu(drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    tu_assert_cu(drv->cuEventRecord(e, s));
    tu_assert_cu(drv->cuEventSynchronize(e));
    tu_assert_cu(drv->cuEventQuery(e));
    tu_assert_cu(drv->cuStreamWaitEvent(NULL, e, 0));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    tu_assert_cu(drv->cuStreamQuery(s));
    tu_assert_cu(drv->cuEventRecord(e, NULL));
    tu_assert_cu(drv->cuCtxSynchronize());
    tu_assert_cu(drv->cuEventQuery(e));
    tu_assert_cu(drv->cuEventDestroy(e));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

static void test_stream_hold(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    CUstream s = NULL;
    CUevent e1 = NULL, e2 = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuEventCreate(&e1, 0));
    tu_assert_cu(drv->cuEventCreate(&e2, 0));
    assert_true(tu_stream_hold(s));
    tu_assert_cu(drv->cuEventRecord(e1, s));
    tu_assert_cu(drv->cuEventRecord(e2, s));
    tu_assert_cu_eq(drv->cuEventQuery(e1), CUDA_ERROR_NOT_READY);
    tu_assert_cu_eq(drv->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    /* Waiting for e1 completes the work up to e1 only. */
    tu_assert_cu(drv->cuEventSynchronize(e1));
    tu_assert_cu(drv->cuEventQuery(e1));
    tu_assert_cu_eq(drv->cuEventQuery(e2), CUDA_ERROR_NOT_READY);
    /* The legacy stream does not wait for a non-blocking stream. */
    tu_assert_cu(drv->cuStreamSynchronize(NULL));
    tu_assert_cu_eq(drv->cuEventQuery(e2), CUDA_ERROR_NOT_READY);
    tu_assert_cu(drv->cuStreamSynchronize(s));
    tu_assert_cu(drv->cuEventQuery(e2));
    /* The hold outlives a wait: new work is pending again. */
    tu_assert_cu(drv->cuEventRecord(e1, s));
    tu_assert_cu_eq(drv->cuEventQuery(e1), CUDA_ERROR_NOT_READY);
    tu_assert_cu(drv->cuCtxSynchronize());
    tu_assert_cu(drv->cuEventQuery(e1));
    tu_assert_cu(drv->cuEventRecord(e1, s));
    assert_true(tu_stream_release(s));
    tu_assert_cu(drv->cuEventQuery(e1));
    tu_assert_cu(drv->cuStreamQuery(s));
    /* The NULL stream can be held too; destroying a held stream completes its work. */
    assert_true(tu_stream_hold(NULL));
    tu_assert_cu(drv->cuEventRecord(e1, NULL));
    tu_assert_cu_eq(drv->cuEventQuery(e1), CUDA_ERROR_NOT_READY);
    assert_true(tu_stream_release(NULL));
    tu_assert_cu(drv->cuEventQuery(e1));
    assert_true(tu_stream_hold(s));
    tu_assert_cu(drv->cuEventRecord(e2, s));
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuEventQuery(e2));
    tu_assert_cu(drv->cuEventDestroy(e1));
    tu_assert_cu(drv->cuEventDestroy(e2));
}

/* ---- capture ---- */

struct cap_fx {
    CUstream s;
    CUstream other;     /* a non-blocking stream that takes no part in the capture */
    CUevent e;
    CUdeviceptr dptr;   /* a cuMemAlloc block made before the capture */
    CUdeviceptr va;     /* G of VA with a mapping made before the capture */
    CUmemGenericAllocationHandle h;
    bool unmapped, freed;
};

static CUresult c_alloc(struct cap_fx *f)
{
    CUdeviceptr p = 0;
    CUresult r = drv->cuMemAlloc(&p, 4096);
    if (r == CUDA_SUCCESS)
        drv->cuMemFree(p);
    return r;
}
static CUresult c_free(struct cap_fx *f)
{
    CUresult r = drv->cuMemFree(f->dptr);
    f->freed = r == CUDA_SUCCESS;
    return r;
}
static CUresult c_unmap(struct cap_fx *f)
{
    CUresult r = drv->cuMemUnmap(f->va, G);
    f->unmapped = r == CUDA_SUCCESS;
    return r;
}
static CUresult c_event_query(struct cap_fx *f) { return drv->cuEventQuery(f->e); }
static CUresult c_stream_sync(struct cap_fx *f) { return drv->cuStreamSynchronize(f->s); }
static CUresult c_other_sync(struct cap_fx *f) { return drv->cuStreamSynchronize(f->other); }
static CUresult c_stream_query(struct cap_fx *f) { return drv->cuStreamQuery(f->s); }
static CUresult c_ctx_sync(struct cap_fx *f) { return drv->cuCtxSynchronize(); }
static CUresult c_event_record(struct cap_fx *f) { return drv->cuEventRecord(f->e, f->s); }
static CUresult c_map(struct cap_fx *f)
{
    CUdeviceptr va = 0;
    CUresult r = drv->cuMemAddressReserve(&va, G, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = drv->cuMemMap(va, G, 0, f->h, 0);
    if (r == CUDA_SUCCESS)
        r = set_rw(va, G);
    /* Undo after the capture ends would be cleaner; unmapping here would itself be unsafe. */
    if (r == CUDA_SUCCESS) {
        CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
        drv->cuThreadExchangeStreamCaptureMode(&m);
        drv->cuMemUnmap(va, G);
        drv->cuThreadExchangeStreamCaptureMode(&m);
    }
    drv->cuMemAddressFree(va, G);
    return r;
}

struct capture_row {
    const char *what;
    CUstreamCaptureMode mode;        /* of the capture */
    CUstreamCaptureMode thread_mode; /* of the calling thread */
    CUresult expected;
    CUresult expected_end;           /* of cuStreamEndCapture */
    CUresult (*run)(struct cap_fx *f);
};

static const struct capture_row capture_table[] = {
    {"cuMemAlloc in GLOBAL capture", CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, c_alloc},
    {"cuMemFree in GLOBAL capture", CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, c_free},
    {"cuMemUnmap in GLOBAL capture (legal)", CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_SUCCESS, CUDA_SUCCESS, c_unmap},
    {"cuEventQuery in GLOBAL capture", CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, c_event_query},
    /* The RELAXED thread mode lifts the prohibition (documented; not yet run on a GPU): xseg's
     * passes query their events so (vmm/event.h vevent_done_relaxed). */
    {"cuEventQuery, thread mode RELAXED, GLOBAL capture", CU_STREAM_CAPTURE_MODE_GLOBAL,
     CU_STREAM_CAPTURE_MODE_RELAXED, CUDA_SUCCESS, CUDA_SUCCESS, c_event_query},
    {"cuStreamSynchronize of the capturing stream", CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, c_stream_sync},
    {"cuStreamSynchronize of another stream in GLOBAL capture", CU_STREAM_CAPTURE_MODE_GLOBAL,
     CU_STREAM_CAPTURE_MODE_GLOBAL, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
     c_other_sync},
    {"cuStreamSynchronize of another stream in THREAD_LOCAL capture", CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
     CU_STREAM_CAPTURE_MODE_GLOBAL, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
     c_other_sync},
    {"cuStreamSynchronize of another stream, thread mode RELAXED", CU_STREAM_CAPTURE_MODE_GLOBAL,
     CU_STREAM_CAPTURE_MODE_RELAXED, CUDA_SUCCESS, CUDA_SUCCESS, c_other_sync},
    {"cuStreamQuery of the capturing stream", CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, c_stream_query},
    {"cuCtxSynchronize during capture", CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, c_ctx_sync},
    /* The RELAXED thread mode does not make a context wait legal beside a capture: cudaemu refuses
     * it and ends the capture, so sleep_wait_device refuses a sleep beside any capture it knows of
     * rather than wait (core/services/sleep.c). Not yet run on a GPU. */
    {"cuCtxSynchronize, thread mode RELAXED, GLOBAL capture", CU_STREAM_CAPTURE_MODE_GLOBAL,
     CU_STREAM_CAPTURE_MODE_RELAXED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
     c_ctx_sync},
    {"cuEventRecord on the capturing stream", CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_SUCCESS, CUDA_SUCCESS, c_event_record},
    {"cuMemMap + cuMemSetAccess in GLOBAL capture", CU_STREAM_CAPTURE_MODE_GLOBAL,
     CU_STREAM_CAPTURE_MODE_GLOBAL, CUDA_SUCCESS, CUDA_SUCCESS, c_map},
    {"cuMemAlloc in RELAXED capture", CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_SUCCESS, CUDA_SUCCESS, c_alloc},
    {"cuMemAlloc, thread mode RELAXED, GLOBAL capture", CU_STREAM_CAPTURE_MODE_GLOBAL,
     CU_STREAM_CAPTURE_MODE_RELAXED, CUDA_SUCCESS, CUDA_SUCCESS, c_alloc},
    {"cuMemFree in THREAD_LOCAL capture", CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, c_free},
};

static void test_capture_table(void **state)
{
    (void)state;
    int mismatches = 0;
    for (size_t i = 0; i < sizeof capture_table / sizeof capture_table[0]; i++) {
        const struct capture_row *row = &capture_table[i];
        struct cap_fx f = {0};
        tu_assert_cu(drv->cuStreamCreate(&f.s, CU_STREAM_NON_BLOCKING));
        tu_assert_cu(drv->cuStreamCreate(&f.other, CU_STREAM_NON_BLOCKING));
        tu_assert_cu(drv->cuEventCreate(&f.e, 0));
        tu_assert_cu(drv->cuEventRecord(f.e, NULL));
        tu_assert_cu(drv->cuMemAlloc(&f.dptr, 4096));
        f.va = reserve(G);
        f.h = create(G);
        tu_assert_cu(drv->cuMemMap(f.va, G, 0, f.h, 0));

        tu_assert_cu(drv->cuStreamBeginCapture(f.s, row->mode));
        CUstreamCaptureMode tm = row->thread_mode;
        tu_assert_cu(drv->cuThreadExchangeStreamCaptureMode(&tm));
        CUresult got = row->run(&f);
        tu_assert_cu(drv->cuThreadExchangeStreamCaptureMode(&tm));
        CUgraph g = NULL;
        CUresult end = drv->cuStreamEndCapture(f.s, &g);
        if (g)
            tu_assert_cu(drv->cuGraphDestroy(g));
        bool ok = got == row->expected && end == row->expected_end;
        mismatches += !ok;
        if (ok)
            print_message("capture: %-55s -> %s, end %s\n", row->what, drv_error_name(got),
                          drv_error_name(end));
        else
            print_message("capture: %-55s -> %s, end %s; expected %s, end %s\n", row->what,
                          drv_error_name(got), drv_error_name(end), drv_error_name(row->expected),
                          drv_error_name(row->expected_end));

        if (!f.unmapped)
            tu_assert_cu(drv->cuMemUnmap(f.va, G));
        tu_assert_cu(drv->cuMemRelease(f.h));
        tu_assert_cu(drv->cuMemAddressFree(f.va, G));
        if (!f.freed)
            tu_assert_cu(drv->cuMemFree(f.dptr));
        tu_assert_cu(drv->cuEventDestroy(f.e));
        tu_assert_cu(drv->cuStreamDestroy(f.other));
        tu_assert_cu(drv->cuStreamDestroy(f.s));
    }
    if (mismatches)
        fail_msg("%d capture row(s) differ from the expected CUresult (see above)", mismatches);
}

static void test_capture_state(void **state)
{
    (void)state;
    CUstream s = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    tu_assert_cu(drv->cuStreamIsCapturing(s, &st));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    tu_assert_cu_eq(drv->cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL),
                    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    tu_assert_cu(drv->cuStreamIsCapturing(s, &st));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    cuuint64_t id = 0;
    tu_assert_cu(drv->cuStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_true(id != 0);
    CUgraph g = NULL;
    tu_assert_cu(drv->cuStreamEndCapture(s, &g));
    assert_non_null(g);
    tu_assert_cu(drv->cuGraphDestroy(g));
    tu_assert_cu(drv->cuStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    tu_assert_cu_eq(drv->cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* ---- capture graph (graph_capture_record_stream_reuse): the nodes a capture builds, forks and
 * joins through events, and the graph queries. Portable: "work" is tu_stream_work (in a capture,
 * an empty node made the stream's dependency, on cudaemu and the driver alike). ---- */

/* The capture dependencies of @p s (count in *n; up to 8 copied to @p out). Only the status is
 * data unless it is ACTIVE (documented; cudaemu then leaves the other outputs as they were):
 * the rest is read only then, and *id, *g and *n are not touched otherwise. */
static CUstreamCaptureStatus cap_deps(CUstream s, cuuint64_t *id, CUgraph *g, CUgraphNode *out, size_t *n)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUgraphNode *deps = NULL;
    const CUgraphEdgeData *edges = NULL;
    cuuint64_t id_out = 0;
    CUgraph g_out = NULL;
    size_t n_out = 0;
    tu_assert_cu(drv->cuStreamGetCaptureInfo(s, &st, &id_out, &g_out, &deps, &edges, &n_out));
    if (st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return st;
    *id = id_out;
    *g = g_out;
    *n = n_out;
    if (n_out) {
        assert_non_null(deps);
        if (!edges)
            fail_msg("cuStreamGetCaptureInfo: %zu dependencies and no edge data array", n_out);
    }
    for (size_t i = 0; i < n_out && i < 8; i++) {
        out[i] = deps[i];
        assert_int_equal(edges[i].type, 0); /* default edges only */
    }
    return st;
}

/* How many nodes of @p g have type @p type. */
static size_t nodes_of_type(CUgraph g, CUgraphNodeType type)
{
    size_t count = 0;
    tu_assert_cu(drv->cuGraphGetNodes(g, NULL, &count));
    CUgraphNode v[16];
    assert_true(count <= 16);
    tu_assert_cu(drv->cuGraphGetNodes(g, v, &count));
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        CUgraphNodeType t;
        tu_assert_cu(drv->cuGraphNodeGetType(v[i], &t));
        k += t == type;
    }
    return k;
}

static void test_capture_graph(void **state)
{
    (void)state;
    CUstream s = NULL, side = NULL;
    CUevent e = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CUgraphNode d[8], sd[8];
    size_t n = 99, sn = 99;
    cuuint64_t id = 0, sid = 0;
    CUgraph g = NULL, sg = NULL;

    /* Not capturing: status NONE, and nothing else is data. */
    assert_int_equal(cap_deps(s, &id, &g, d, &n), CU_STREAM_CAPTURE_STATUS_NONE);

    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    assert_int_equal(cap_deps(s, &id, &g, d, &n), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_non_null(g);
    assert_int_equal(n, 0);
    size_t count = 99;
    tu_assert_cu(drv->cuGraphGetNodes(g, NULL, &count));
    assert_int_equal(count, 0);

    /* An empty node made the stream's only dependency. */
    CUgraphNode a = NULL;
    tu_assert_cu(drv->cuGraphAddEmptyNode(&a, g, NULL, 0));
    tu_assert_cu(drv->cuStreamUpdateCaptureDependencies(s, &a, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
    assert_int_equal(cap_deps(s, &id, &g, d, &n), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(n, 1);
    assert_ptr_equal(d[0], a);
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
    tu_assert_cu(drv->cuGraphNodeGetType(a, &type));
    assert_int_equal(type, CU_GRAPH_NODE_TYPE_EMPTY);

    /* Fork: side waits on an event recorded in the capture and joins it with s's dependencies. */
    tu_assert_cu(drv->cuEventRecord(e, s));
    tu_assert_cu(drv->cuStreamWaitEvent(side, e, 0));
    assert_int_equal(cap_deps(side, &sid, &sg, sd, &sn), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_true(sid == id);
    assert_ptr_equal(sg, g);
    assert_int_equal(sn, 1);
    assert_ptr_equal(sd[0], a);

    /* Work on side: one node after a; side depends on it alone. */
    assert_true(tu_stream_work(side));
    assert_int_equal(cap_deps(side, &sid, &sg, sd, &sn), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(sn, 1);
    CUgraphNode b = sd[0];
    assert_ptr_not_equal(b, a);
    CUgraphNode deps[4] = {NULL, NULL, NULL, NULL};
    size_t nd = 0;
    tu_assert_cu(drv->cuGraphNodeGetDependencies(b, NULL, NULL, &nd));
    assert_int_equal(nd, 1);
    nd = 4; /* more room than needed: the rest is NULL, the count comes back */
    tu_assert_cu(drv->cuGraphNodeGetDependencies(b, deps, NULL, &nd));
    assert_int_equal(nd, 1);
    assert_ptr_equal(deps[0], a);
    assert_null(deps[1]);
    CUgraphNode all[4] = {NULL, NULL, NULL, NULL};
    count = 4;
    tu_assert_cu(drv->cuGraphGetNodes(g, all, &count));
    assert_int_equal(count, 2);
    assert_true((all[0] == a && all[1] == b) || (all[0] == b && all[1] == a));
    assert_null(all[2]);

    /* ADD extends the set without duplicates. */
    CUgraphNode both[2] = {a, b};
    tu_assert_cu(drv->cuStreamUpdateCaptureDependencies(s, both, NULL, 2, CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
    assert_int_equal(cap_deps(s, &id, &g, d, &n), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(n, 2);
    tu_assert_cu(drv->cuStreamUpdateCaptureDependencies(s, &a, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));

    /* Ending the capture on side, which joined it (UNMATCHED), invalidates it: the origin's end
     * then says INVALIDATED, as the H200's driver did (2026-11-26). */
    CUgraph out = (CUgraph)(uintptr_t)1;
    tu_assert_cu_eq(drv->cuStreamEndCapture(side, &out), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    tu_assert_cu_eq(drv->cuStreamEndCapture(s, &out), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_null(out);
    assert_int_equal(cap_deps(s, &id, &g, d, &n), CU_STREAM_CAPTURE_STATUS_NONE);
    assert_int_equal(cap_deps(side, &sid, &sg, sd, &sn), CU_STREAM_CAPTURE_STATUS_NONE);

    /* A fork that never joins back, ended on its origin: the driver ends it (CUDA_SUCCESS), the
     * graph holds the side stream's nodes, and every stream leaves the capture. The H200 (driver
     * 580.159.04, 2026-11-27) answered so, where the test expected the documented UNJOINED:
     * "graph: fork on an event recorded before any node: side ACTIVE (0 dependencies), end
     * CUDA_SUCCESS, 1 nodes, side after NONE" and "fork after a node, never joined, ended on the
     * origin: side ACTIVE, end CUDA_SUCCESS, graph set, s after NONE, side after NONE". Both
     * cases, as then. First, the fork from an event recorded before the capture has any node:
     * side joins with no dependencies. */
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    tu_assert_cu(drv->cuEventRecord(e, s));
    tu_assert_cu(drv->cuStreamWaitEvent(side, e, 0));
    sn = 99;
    assert_int_equal(cap_deps(side, &sid, &sg, sd, &sn), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(sn, 0);
    assert_true(tu_stream_work(side));
    out = NULL;
    tu_assert_cu(drv->cuStreamEndCapture(s, &out));
    assert_non_null(out);
    count = 0;
    tu_assert_cu(drv->cuGraphGetNodes(out, NULL, &count));
    assert_int_equal(count, 1); /* side's work node */
    assert_int_equal(cap_deps(s, &id, &g, d, &n), CU_STREAM_CAPTURE_STATUS_NONE);
    assert_int_equal(cap_deps(side, &sid, &sg, sd, &sn), CU_STREAM_CAPTURE_STATUS_NONE);
    tu_assert_cu(drv->cuGraphDestroy(out));

    /* Then the fork after a node of the origin, side's work never joined back: s's node and
     * side's, the second depending on the first. */
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    assert_true(tu_stream_work(s));
    tu_assert_cu(drv->cuEventRecord(e, s));
    tu_assert_cu(drv->cuStreamWaitEvent(side, e, 0));
    assert_int_equal(cap_deps(side, &sid, &sg, sd, &sn), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_true(tu_stream_work(side));
    out = NULL;
    tu_assert_cu(drv->cuStreamEndCapture(s, &out));
    assert_non_null(out);
    count = 0;
    tu_assert_cu(drv->cuGraphGetNodes(out, NULL, &count));
    assert_int_equal(count, 2);
    assert_int_equal(cap_deps(s, &id, &g, d, &n), CU_STREAM_CAPTURE_STATUS_NONE);
    assert_int_equal(cap_deps(side, &sid, &sg, sd, &sn), CU_STREAM_CAPTURE_STATUS_NONE);
    tu_assert_cu(drv->cuGraphDestroy(out));

    /* Again, joined: s waits on an event recorded on side after its work. The event record and
     * wait add no node: the graph holds the three work nodes (all empty nodes), nothing else. */
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    assert_true(tu_stream_work(s));
    tu_assert_cu(drv->cuEventRecord(e, s));
    tu_assert_cu(drv->cuStreamWaitEvent(side, e, 0));
    assert_true(tu_stream_work(side));
    assert_true(tu_stream_work(s));
    tu_assert_cu(drv->cuEventRecord(e, side));
    tu_assert_cu(drv->cuStreamWaitEvent(s, e, 0));
    assert_int_equal(cap_deps(s, &id, &g, d, &n), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(n, 2); /* s's last node and side's */
    tu_assert_cu(drv->cuStreamEndCapture(s, &out));
    assert_non_null(out);
    count = 0;
    tu_assert_cu(drv->cuGraphGetNodes(out, NULL, &count));
    assert_int_equal(count, 3);
    assert_int_equal(nodes_of_type(out, CU_GRAPH_NODE_TYPE_EMPTY), 3);
    assert_int_equal(cap_deps(side, &sid, &sg, sd, &sn), CU_STREAM_CAPTURE_STATUS_NONE);
    tu_assert_cu(drv->cuGraphDestroy(out));

    tu_assert_cu(drv->cuEventDestroy(e));
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* Misuse of the capture-graph calls: one printed line per row, as the capture table. */
struct graph_fx {
    CUstream s, other;
    CUevent e;
    CUgraph g;
    CUgraphNode a;
};

static CUresult g_update_not_capturing(struct graph_fx *f)
{
    return drv->cuStreamUpdateCaptureDependencies(f->other, &f->a, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
}
static CUresult g_update_flags(struct graph_fx *f)
{
    return drv->cuStreamUpdateCaptureDependencies(f->s, &f->a, NULL, 1, 7);
}
static CUresult g_update_null_deps(struct graph_fx *f)
{
    return drv->cuStreamUpdateCaptureDependencies(f->s, NULL, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
}
static CUresult g_add_null_out(struct graph_fx *f) { return drv->cuGraphAddEmptyNode(NULL, f->g, &f->a, 1); }
static CUresult g_add_duplicates(struct graph_fx *f)
{
    CUgraphNode n, two[2] = {f->a, f->a};
    return drv->cuGraphAddEmptyNode(&n, f->g, two, 2);
}
static CUresult g_add_null_deps(struct graph_fx *f)
{
    CUgraphNode n;
    return drv->cuGraphAddEmptyNode(&n, f->g, NULL, 1);
}
static CUresult g_nodes_null_count(struct graph_fx *f) { return drv->cuGraphGetNodes(f->g, NULL, NULL); }
static CUresult g_deps_null_count(struct graph_fx *f)
{
    return drv->cuGraphNodeGetDependencies(f->a, NULL, NULL, NULL);
}
static CUresult g_deps_edges_without_nodes(struct graph_fx *f)
{
    CUgraphEdgeData ed[2];
    size_t n = 2;
    return drv->cuGraphNodeGetDependencies(f->a, NULL, ed, &n);
}
static CUresult g_type_null(struct graph_fx *f) { return drv->cuGraphNodeGetType(f->a, NULL); }
static CUresult g_info_null_status(struct graph_fx *f)
{
    return drv->cuStreamGetCaptureInfo(f->s, NULL, NULL, NULL, NULL, NULL, NULL);
}
static CUresult g_info_edges_without_deps(struct graph_fx *f)
{
    CUstreamCaptureStatus st;
    const CUgraphEdgeData *ed;
    return drv->cuStreamGetCaptureInfo(f->s, &st, NULL, NULL, NULL, &ed, NULL);
}
static CUresult g_wait_outside_event(struct graph_fx *f)
{
    tu_assert_cu(drv->cuEventRecord(f->e, f->other)); /* recorded outside any capture */
    return drv->cuStreamWaitEvent(f->s, f->e, 0);
}

struct graph_row {
    const char *what;
    CUresult expected;
    CUresult expected_end;
    CUresult (*run)(struct graph_fx *f);
};

/* A fork that is never joined back before the origin's end (the end is the row's "end"). */
static CUresult g_fork_unjoined(struct graph_fx *f)
{
    CUresult r = drv->cuEventRecord(f->e, f->s);
    if (r == CUDA_SUCCESS)
        r = drv->cuStreamWaitEvent(f->other, f->e, 0);
    if (r == CUDA_SUCCESS && !tu_stream_work(f->other))
        r = CUDA_ERROR_UNKNOWN;
    return r;
}

static const struct graph_row graph_table[] = {
    {"cuStreamUpdateCaptureDependencies, stream not capturing", CUDA_ERROR_ILLEGAL_STATE, CUDA_SUCCESS,
     g_update_not_capturing},
    /* The H200, driver 580.159.04 (2026-11-27): ended, not UNJOINED as documented. */
    {"cuStreamEndCapture after a fork never joined back", CUDA_SUCCESS, CUDA_SUCCESS, g_fork_unjoined},
    {"cuStreamUpdateCaptureDependencies, flags 7", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, g_update_flags},
    {"cuStreamUpdateCaptureDependencies, NULL nodes, count 1", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS,
     g_update_null_deps},
    {"cuGraphAddEmptyNode, NULL node out", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, g_add_null_out},
    {"cuGraphAddEmptyNode, duplicate dependencies", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, g_add_duplicates},
    {"cuGraphAddEmptyNode, NULL dependencies, count 1", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, g_add_null_deps},
    {"cuGraphGetNodes, NULL count", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, g_nodes_null_count},
    {"cuGraphNodeGetDependencies, NULL count", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, g_deps_null_count},
    {"cuGraphNodeGetDependencies, edge data without nodes", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS,
     g_deps_edges_without_nodes},
    {"cuGraphNodeGetType, NULL type", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, g_type_null},
    {"cuStreamGetCaptureInfo, NULL status", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, g_info_null_status},
    {"cuStreamGetCaptureInfo, edge data without dependencies", CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS,
     g_info_edges_without_deps},
    {"cuStreamWaitEvent in capture on an outside event", CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, g_wait_outside_event},
};

static void test_capture_graph_table(void **state)
{
    (void)state;
    int mismatches = 0;
    for (size_t i = 0; i < sizeof graph_table / sizeof graph_table[0]; i++) {
        const struct graph_row *row = &graph_table[i];
        struct graph_fx f = {0};
        tu_assert_cu(drv->cuStreamCreate(&f.s, CU_STREAM_NON_BLOCKING));
        tu_assert_cu(drv->cuStreamCreate(&f.other, CU_STREAM_NON_BLOCKING));
        tu_assert_cu(drv->cuEventCreate(&f.e, CU_EVENT_DISABLE_TIMING));
        tu_assert_cu(drv->cuStreamBeginCapture(f.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CUstreamCaptureStatus st;
        tu_assert_cu(drv->cuStreamGetCaptureInfo(f.s, &st, NULL, &f.g, NULL, NULL, NULL));
        tu_assert_cu(drv->cuGraphAddEmptyNode(&f.a, f.g, NULL, 0));
        tu_assert_cu(drv->cuStreamUpdateCaptureDependencies(f.s, &f.a, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
        CUresult got = row->run(&f);
        CUgraph g = NULL;
        CUresult end = drv->cuStreamEndCapture(f.s, &g);
        if (g)
            tu_assert_cu(drv->cuGraphDestroy(g));
        bool ok = got == row->expected && end == row->expected_end;
        mismatches += !ok;
        if (ok)
            print_message("graph: %-57s -> %s, end %s\n", row->what, drv_error_name(got), drv_error_name(end));
        else
            print_message("graph: %-57s -> %s, end %s; expected %s, end %s\n", row->what, drv_error_name(got),
                          drv_error_name(end), drv_error_name(row->expected), drv_error_name(row->expected_end));
        tu_assert_cu(drv->cuEventDestroy(f.e));
        tu_assert_cu(drv->cuStreamDestroy(f.other));
        tu_assert_cu(drv->cuStreamDestroy(f.s));
    }
    if (mismatches)
        fail_msg("%d graph row(s) differ from the expected CUresult (see above)", mismatches);
}

/* ---- executable graphs: a capture replayed (cuGraphInstantiate, ABI name
 * cuGraphInstantiateWithFlags / cuGraphLaunch / cuGraphExecDestroy, reached through tu_graph():
 * xseg's driver table does not hold them). ---- */

/* Are the @p n bytes at @p d all @p v (read with cuMemcpyDtoH)? */
static bool dev_all(CUdeviceptr d, size_t n, unsigned char v)
{
    unsigned char *h = malloc(n);
    assert_non_null(h);
    tu_assert_cu(drv->cuMemcpyDtoH(h, d, n));
    size_t i = 0;
    while (i < n && h[i] == v)
        i++;
    free(h);
    return i == n;
}

/* A capture of memset A, copy A -> B and a kernel replays after the graph is gone, as often as
 * launched, and only when launched. */
static void test_graph_launch(void **state)
{
    (void)state;
    const struct tu_graph_api *gx = tu_graph();
    const size_t n = 64 * 1024;
    CUstream s = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr va = reserve(2 * G);
    CUmemGenericAllocationHandle h = create(2 * G);
    tu_assert_cu(drv->cuMemMap(va, 2 * G, 0, h, 0));
    tu_assert_cu(set_rw(va, 2 * G));
    CUdeviceptr a = va, b = va + G;
    tu_assert_cu(drv->cuMemsetD8(b, 0x11, n));
    tu_assert_cu(drv->cuCtxSynchronize());

    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    tu_assert_cu(drv->cuMemsetD8Async(a, 0xa5, n, s));
    tu_assert_cu(gx->memcpy_dtod_async(b, a, n, s));
    assert_true(tu_stream_work(s));
    CUgraph g = NULL;
    tu_assert_cu(drv->cuStreamEndCapture(s, &g));
    size_t count = 0;
    tu_assert_cu(drv->cuGraphGetNodes(g, NULL, &count));
    assert_int_equal(count, 3);
    assert_true(dev_all(b, n, 0x11)); /* captured, not run */

    CUgraphExec x = NULL;
    tu_assert_cu(gx->instantiate(&x, g, 0));
    assert_non_null(x);
    tu_assert_cu(drv->cuGraphDestroy(g)); /* the exec does not need its graph */
    tu_assert_cu(gx->launch(x, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_true(dev_all(a, n, 0xa5));
    assert_true(dev_all(b, n, 0xa5));
    tu_assert_cu(drv->cuMemsetD8(a, 0, n));
    tu_assert_cu(drv->cuMemsetD8(b, 0x22, n));
    tu_assert_cu(drv->cuCtxSynchronize());
    tu_assert_cu(gx->launch(x, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_true(dev_all(b, n, 0xa5));
    if (tu_emulated()) {
        /* On a held stream a launch is pending work, like the async calls. */
        assert_true(tu_stream_hold(s));
        tu_assert_cu(gx->launch(x, s));
        tu_assert_cu_eq(drv->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        assert_true(tu_stream_release(s));
        tu_assert_cu(drv->cuStreamQuery(s));
    }
    tu_assert_cu(gx->exec_destroy(x));

    tu_assert_cu(drv->cuMemUnmap(va, 2 * G));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemAddressFree(va, 2 * G));
    tu_assert_cu(drv->cuStreamDestroy(s));
    struct cudaemu_live live;
    if (tu_live(&live)) {
        assert_int_equal(live.graphs, 0);
        assert_int_equal(live.graph_execs, 0);
        assert_int_equal(live.handles, 0);
    }
}

/* Misuse of the executable-graph calls, one printed line per row. The fixture: G of mapped,
 * writable VA, and an exec of a capture that memsets its first 4 KiB and runs a kernel. */
struct exec_fx {
    CUstream s, other;
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CUgraph g;
    CUgraphExec x;
    bool x_gone;
    CUresult end;   /* cuStreamEndCapture of a row that captures */
};

static CUresult x_launch_sync(struct exec_fx *f)
{
    CUresult r = tu_graph()->launch(f->x, f->s);
    return r != CUDA_SUCCESS ? r : drv->cuStreamSynchronize(f->s);
}
static CUresult x_inst_null_out(struct exec_fx *f) { return tu_graph()->instantiate(NULL, f->g, 0); }
static CUresult x_inst_null_graph(struct exec_fx *f)
{
    CUgraphExec x = NULL;
    (void)f;
    return tu_graph()->instantiate(&x, NULL, 0);
}
static CUresult x_inst_upload_flag(struct exec_fx *f)
{
    CUgraphExec x = NULL;
    CUresult r = tu_graph()->instantiate(&x, f->g, CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
    if (r == CUDA_SUCCESS)
        tu_graph()->exec_destroy(x);
    return r;
}
static CUresult x_launch_null(struct exec_fx *f) { return tu_graph()->launch(NULL, f->s); }
static CUresult x_destroy_null(struct exec_fx *f)
{
    (void)f;
    return tu_graph()->exec_destroy(NULL);
}
static CUresult x_launch_capturing(struct exec_fx *f)
{
    tu_assert_cu(drv->cuStreamBeginCapture(f->other, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult r = tu_graph()->launch(f->x, f->other);
    CUgraph g = NULL;
    f->end = drv->cuStreamEndCapture(f->other, &g);
    if (g)
        drv->cuGraphDestroy(g);
    return r;
}
static CUresult x_launch_destroyed(struct exec_fx *f)
{
    tu_assert_cu(tu_graph()->exec_destroy(f->x));
    f->x_gone = true;
    return tu_graph()->launch(f->x, f->s);
}
static CUresult x_destroy_twice(struct exec_fx *f)
{
    tu_assert_cu(tu_graph()->exec_destroy(f->x));
    f->x_gone = true;
    return tu_graph()->exec_destroy(f->x);
}
static CUresult x_launch_unmapped(struct exec_fx *f)
{
    tu_assert_cu(drv->cuMemUnmap(f->va, G));
    CUresult r = tu_graph()->launch(f->x, f->s);
    tu_assert_cu(drv->cuMemMap(f->va, G, 0, f->h, 0));
    tu_assert_cu(set_rw(f->va, G));
    return r;
}
static CUresult x_launch_readonly(struct exec_fx *f)
{
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READ};
    tu_assert_cu(drv->cuMemSetAccess(f->va, G, &d, 1));
    CUresult r = tu_graph()->launch(f->x, f->s);
    tu_assert_cu(set_rw(f->va, G));
    return r;
}

struct exec_row {
    const char *what;
    bool emu_only;          /* undefined behaviour, or a lost context, on the real driver */
    CUresult expected;
    CUresult expected_end;  /* of the row's own capture (CUDA_SUCCESS: it captures nothing) */
    CUresult (*run)(struct exec_fx *f);
};

static const struct exec_row exec_table[] = {
    {"cuGraphLaunch + cuStreamSynchronize", false, CUDA_SUCCESS, CUDA_SUCCESS, x_launch_sync},
    {"cuGraphInstantiate, NULL exec out", false, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, x_inst_null_out},
    {"cuGraphInstantiate, NULL graph", false, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, x_inst_null_graph},
    {"cuGraphInstantiate, flag UPLOAD (WithParams only)", false, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS,
     x_inst_upload_flag},
    {"cuGraphLaunch, NULL exec", false, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, x_launch_null},
    {"cuGraphExecDestroy, NULL", false, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, x_destroy_null},
    {"cuGraphLaunch into a GLOBAL capture", false, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, x_launch_capturing},
    {"cuGraphLaunch, destroyed exec (UB on the driver)", true, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS,
     x_launch_destroyed},
    {"cuGraphExecDestroy, twice (UB on the driver)", true, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, x_destroy_twice},
    /* A GPU accepts the launch and faults later, losing the context: the emulator reports it. */
    {"cuGraphLaunch, memset over unmapped VA (GPU: lost context)", true, CUDA_ERROR_ILLEGAL_ADDRESS,
     CUDA_SUCCESS, x_launch_unmapped},
    {"cuGraphLaunch, memset over read-only VA (GPU: lost context)", true, CUDA_ERROR_ILLEGAL_ADDRESS,
     CUDA_SUCCESS, x_launch_readonly},
};

static void test_graph_exec_table(void **state)
{
    (void)state;
    bool emu = tu_emulated();
    const struct tu_graph_api *gx = tu_graph();
    int mismatches = 0;
    for (size_t i = 0; i < sizeof exec_table / sizeof exec_table[0]; i++) {
        const struct exec_row *row = &exec_table[i];
        if (row->emu_only && !emu) {
            print_message("exec: %-60s skipped (emulator only)\n", row->what);
            continue;
        }
        struct exec_fx f = {0};
        tu_assert_cu(drv->cuStreamCreate(&f.s, CU_STREAM_NON_BLOCKING));
        tu_assert_cu(drv->cuStreamCreate(&f.other, CU_STREAM_NON_BLOCKING));
        f.va = reserve(G);
        f.h = create(G);
        tu_assert_cu(drv->cuMemMap(f.va, G, 0, f.h, 0));
        tu_assert_cu(set_rw(f.va, G));
        tu_assert_cu(drv->cuStreamBeginCapture(f.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        tu_assert_cu(drv->cuMemsetD8Async(f.va, 0x5a, 4096, f.s));
        assert_true(tu_stream_work(f.s));
        tu_assert_cu(drv->cuStreamEndCapture(f.s, &f.g));
        tu_assert_cu(gx->instantiate(&f.x, f.g, 0));

        CUresult got = row->run(&f);
        bool ok = got == row->expected && f.end == row->expected_end;
        mismatches += !ok;
        if (ok)
            print_message("exec: %-62s -> %s\n", row->what, drv_error_name(got));
        else
            print_message("exec: %-62s -> %s, end %s; expected %s, end %s\n", row->what, drv_error_name(got),
                          drv_error_name(f.end), drv_error_name(row->expected),
                          drv_error_name(row->expected_end));

        tu_assert_cu(drv->cuStreamSynchronize(f.s));
        if (!f.x_gone)
            tu_assert_cu(gx->exec_destroy(f.x));
        tu_assert_cu(drv->cuGraphDestroy(f.g));
        tu_assert_cu(drv->cuMemUnmap(f.va, G));
        tu_assert_cu(drv->cuMemRelease(f.h));
        tu_assert_cu(drv->cuMemAddressFree(f.va, G));
        tu_assert_cu(drv->cuStreamDestroy(f.other));
        tu_assert_cu(drv->cuStreamDestroy(f.s));
    }
    struct cudaemu_live live;
    if (tu_live(&live)) {
        assert_int_equal(live.graphs, 0);
        assert_int_equal(live.graph_execs, 0);
    }
    if (mismatches)
        fail_msg("%d exec row(s) differ from the expected CUresult (see above)", mismatches);
}

/* Two non-blocking streams are ordered only by an event wait (or a host wait): learned on an H200
 * (driver 580.159.04), where a 1-byte memset queued on stream S after a 1 MiB fill queued on
 * another non-blocking stream W, with nothing ordering S after W, often landed first and was
 * overwritten by the fill (debug_stale_access lost 5 of 64 injected writes). The ordered rows run
 * on the driver too; cudaemu's deferring streams (cudaemu_stream_defer_new) run W's fills only
 * when waited for, so there the unordered rows are deterministic (the driver's outcome is either
 * order: they run on cudaemu only). */
static void test_stream_order(void **state)
{
    (void)state;
    const size_t n = 1 << 20;
    CUdeviceptr p = 0;
    tu_assert_cu(drv->cuMemAlloc(&p, n));
    CUstream s = NULL, w = NULL;
    CUevent ev = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    bool deferring = tu_stream_defer_new(true);
    tu_assert_cu(drv->cuStreamCreate(&w, CU_STREAM_NON_BLOCKING));
    tu_stream_defer_new(false);
    tu_assert_cu(drv->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    tu_assert_cu(drv->cuMemsetD8(p, 0, n));
    unsigned char b = 9;
    /* Ordered by an event: S's later write lands after W's fill. */
    tu_assert_cu(drv->cuMemsetD8Async(p, 0xFF, n, w));
    tu_assert_cu(drv->cuEventRecord(ev, w));
    tu_assert_cu(drv->cuStreamWaitEvent(s, ev, 0));
    tu_assert_cu(drv->cuMemsetD8Async(p + 7, 0x5a, 1, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    tu_assert_cu(drv->cuMemcpyDtoH(&b, p + 7, 1));
    assert_int_equal(b, 0x5a);
    tu_assert_cu(drv->cuMemcpyDtoH(&b, p + 8, 1));
    assert_int_equal(b, 0xFF); /* S waited for W's fill */
    /* Ordered by a host wait of W. */
    tu_assert_cu(drv->cuMemsetD8Async(p, 0x11, n, w));
    tu_assert_cu(drv->cuStreamSynchronize(w));
    tu_assert_cu(drv->cuMemsetD8Async(p + 7, 0x22, 1, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    tu_assert_cu(drv->cuMemcpyDtoH(&b, p + 7, 1));
    assert_int_equal(b, 0x22);
    if (deferring) {
        /* Unordered: the later 1-byte write lands first and the fill overwrites it; a wait of S,
         * or a synchronous copy (the legacy stream waits for no non-blocking stream), does not
         * wait for W; a context wait does. */
        tu_assert_cu(drv->cuMemsetD8Async(p, 0x33, n, w));
        tu_assert_cu(drv->cuMemsetD8Async(p + 7, 0x44, 1, s));
        tu_assert_cu(drv->cuStreamSynchronize(s));
        tu_assert_cu(drv->cuMemcpyDtoH(&b, p + 7, 1));
        assert_int_equal(b, 0x44);
        tu_assert_cu(drv->cuMemcpyDtoH(&b, p + 8, 1));
        assert_int_equal(b, 0x11); /* W's fill has not run */
        tu_assert_cu_eq(drv->cuStreamQuery(w), CUDA_ERROR_NOT_READY);
        tu_assert_cu(drv->cuCtxSynchronize());
        tu_assert_cu(drv->cuMemcpyDtoH(&b, p + 7, 1));
        assert_int_equal(b, 0x33); /* the later write lost */
        /* A copy queued on W after its fill reads the fill (in-stream order kept). */
        tu_assert_cu(drv->cuMemsetD8Async(p, 0x55, n, w));
        tu_assert_cu(drv->cuMemcpyDtoHAsync(&b, p + 3, 1, w));
        tu_assert_cu(drv->cuStreamSynchronize(w));
        assert_int_equal(b, 0x55);
        /* Destroying W lets what it holds run. */
        tu_assert_cu(drv->cuMemsetD8Async(p, 0x66, n, w));
    }
    tu_assert_cu(drv->cuStreamDestroy(w));
    tu_assert_cu(drv->cuCtxSynchronize());
    if (deferring) {
        tu_assert_cu(drv->cuMemcpyDtoH(&b, p + 3, 1));
        assert_int_equal(b, 0x66);
    }
    tu_assert_cu(drv->cuEventDestroy(ev));
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuMemFree(p));
}

/* cudaemu_stream_work outside a capture: pending on a held stream, done once released. */
static void test_stream_work_held(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    CUstream s = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    assert_true(tu_stream_work(s));
    tu_assert_cu(drv->cuStreamQuery(s));
    assert_true(tu_stream_hold(s));
    assert_true(tu_stream_work(s));
    tu_assert_cu_eq(drv->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    assert_true(tu_stream_release(s));
    tu_assert_cu(drv->cuStreamQuery(s));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* ---------------------------------------------------------------------------------------------
 * Shareable handles across processes, fabric handles, per-device access rights
 * ------------------------------------------------------------------------------------------- */

/* The importing child: import, map, check what the parent wrote (tag 61), write tag 62, unmap.
 * Exit 0 on success; 100 and up name the step that failed. */
static int ipc_child_main(const char *arg)
{
    if (!tu_gpu_available())
        return 100;
    struct drv_device_info info;
    if (drv_device_query(0, &info) != XSEG_SUCCESS || drv_ctx_ensure(info.primary_ctx) != XSEG_SUCCESS)
        return 101;
    G = info.granularity;
    CUmemGenericAllocationHandle h = 0;
    CUresult r;
    if (!strncmp(arg, "posix:", 6)) {
        int fd = atoi(arg + 6);
        r = drv->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
    } else if (!strncmp(arg, "fabric:", 7)) {
        CUmemFabricHandle fh;
        const char *hex = arg + 7;
        if (strlen(hex) != 2 * sizeof fh)
            return 102;
        for (size_t i = 0; i < sizeof fh; i++) {
            unsigned v;
            if (sscanf(hex + 2 * i, "%2x", &v) != 1)
                return 102;
            ((unsigned char *)&fh)[i] = (unsigned char)v;
        }
        r = drv->cuMemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
    } else {
        return 102;
    }
    if (r != CUDA_SUCCESS)
        return 103;
    CUdeviceptr va = 0;
    if (drv->cuMemAddressReserve(&va, 2 * G, 0, 0, 0) || drv->cuMemMap(va, 2 * G, 0, h, 0) ||
        drv->cuMemRelease(h) || set_rw(va, 2 * G))
        return 104;
    if (!tu_check(va, 2 * G, 61))
        return 105;
    if (tu_fill(va, 2 * G, 62) || drv->cuMemUnmap(va, 2 * G) || drv->cuMemAddressFree(va, 2 * G))
        return 106;
    return 0;
}

struct ipc_exec_arg {
    char opt[256];
    int keep_fd; /* descriptor to pass across exec, or -1 */
};

static int exec_ipc_child(void *p)
{
    struct ipc_exec_arg *a = p;
    if (a->keep_fd >= 0)
        fcntl(a->keep_fd, F_SETFD, 0); /* exported descriptors are close-on-exec */
    char *argv[] = {self_path, a->opt, NULL};
    execv(self_path, argv);
    return 120;
}

/* Export a 2G handle of @p type, write tag 61, let a fresh process import and rewrite it, and
 * check its tag 62 here. */
static void ipc_roundtrip(CUmemAllocationHandleType type)
{
    CUmemAllocationProp p = prop_dev(0, type | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemGenericAllocationHandle h = 0;
    tu_assert_cu(drv->cuMemCreate(&h, 2 * G, &p, 0));
    CUdeviceptr va = reserve(2 * G);
    tu_assert_cu(drv->cuMemMap(va, 2 * G, 0, h, 0));
    tu_assert_cu(set_rw(va, 2 * G));
    tu_assert_cu(tu_fill(va, 2 * G, 61));
    struct ipc_exec_arg a = {.keep_fd = -1};
    if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
        CUmemFabricHandle fh;
        tu_assert_cu(drv->cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        int k = snprintf(a.opt, sizeof a.opt, "--ipc-child=fabric:");
        for (size_t i = 0; i < sizeof fh; i++)
            k += snprintf(a.opt + k, sizeof a.opt - (size_t)k, "%02x", ((unsigned char *)&fh)[i]);
    } else {
        tu_assert_cu(drv->cuMemExportToShareableHandle(&a.keep_fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        snprintf(a.opt, sizeof a.opt, "--ipc-child=posix:%d", a.keep_fd);
    }
    int detail = 0;
    enum tu_child_outcome o = tu_run_child(exec_ipc_child, &a, &detail);
    if (a.keep_fd >= 0)
        close(a.keep_fd);
    if (o != TU_CHILD_OK)
        fail_msg("importing child (%s): outcome %d, detail %d", a.opt, (int)o, detail);
    assert_true(tu_check(va, 2 * G, 62));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemUnmap(va, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(va, 2 * G));
}

static void test_export_import_fd_process(void **state)
{
    (void)state;
    ipc_roundtrip(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

/* Fabric handles: on cudaemu only with CUDAEMU_FABRIC=1 (the driver-vmm-fabric test); on a GPU
 * where the device reports support and an allocation with it succeeds (an IMEX channel). */
static void test_fabric(void **state)
{
    (void)state;
    CUdevice d0;
    tu_assert_cu(drv->cuDeviceGet(&d0, 0));
    int attr = -1;
    tu_assert_cu(drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, d0));
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_FABRIC);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = drv->cuMemCreate(&h, 2 * G, &p, 0);
    print_message("fabric: device attribute %d, cuMemCreate(FABRIC) -> %s\n", attr, drv_error_name(r));
    if (!attr || r != CUDA_SUCCESS) {
        if (tu_emulated()) {
            assert_int_equal(attr, 0);
            tu_assert_cu_eq(r, CUDA_ERROR_NOT_SUPPORTED);
        }
        if (r == CUDA_SUCCESS)
            drv->cuMemRelease(h);
        skip();
    }
    /* Same process: the import is the same memory, counted once. */
    size_t before = free_mem();
    CUmemFabricHandle fh;
    tu_assert_cu(drv->cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
    CUmemGenericAllocationHandle imp = 0;
    tu_assert_cu(drv->cuMemImportFromShareableHandle(&imp, &fh, CU_MEM_HANDLE_TYPE_FABRIC));
    assert_int_equal(before, free_mem());
    CUdeviceptr a = reserve(2 * G), b = reserve(2 * G);
    tu_assert_cu(drv->cuMemMap(a, 2 * G, 0, h, 0));
    tu_assert_cu(drv->cuMemMap(b, 2 * G, 0, imp, 0));
    tu_assert_cu(set_rw(a, 2 * G));
    tu_assert_cu(set_rw(b, 2 * G));
    tu_assert_cu(tu_fill(a, 2 * G, 71));
    assert_true(tu_check(b, 2 * G, 71));
    /* A POSIX fd was not requested: exporting one is refused. */
    int fd = -1;
    tu_assert_cu_eq(drv->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                    CUDA_ERROR_INVALID_VALUE);
    if (tu_emulated()) {
        /* A corrupted fabric handle names no memory (undefined on the driver). */
        CUmemFabricHandle bad = fh;
        bad.data[20] ^= 0x5a;
        CUmemGenericAllocationHandle x = 0;
        tu_assert_cu_eq(drv->cuMemImportFromShareableHandle(&x, &bad, CU_MEM_HANDLE_TYPE_FABRIC),
                        CUDA_ERROR_INVALID_VALUE);
    }
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemRelease(imp));
    tu_assert_cu(drv->cuMemUnmap(a, 2 * G));
    tu_assert_cu(drv->cuMemUnmap(b, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(a, 2 * G));
    tu_assert_cu(drv->cuMemAddressFree(b, 2 * G));
    assert_int_equal(free_mem(), before + 2 * G); /* h was created before `before` */
    /* Across processes, no descriptor passing. */
    ipc_roundtrip(CU_MEM_HANDLE_TYPE_FABRIC);
}

/* Access is per device: a copy by a device that was not granted access fails (cudaemu returns
 * CUDA_ERROR_ILLEGAL_ADDRESS; a GPU faults and loses its context, so this runs on the emulator
 * only), READ allows reads only, READWRITE both. Needs two devices. */
static void test_access_per_device(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    int ndev = 0;
    tu_assert_cu(drv->cuDeviceGetCount(&ndev));
    if (ndev < 2) {
        print_message("[  SKIPPED ] needs two devices (CUDAEMU_DEVICES=2: the driver-vmm-fabric test)\n");
        skip();
    }
    CUmemGenericAllocationHandle h = create(G);
    CUdeviceptr va = reserve(G);
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(set_rw(va, G)); /* device 0 only */
    tu_assert_cu(tu_fill(va, G, 81));
    CUdevice d1;
    CUcontext c1;
    tu_assert_cu(drv->cuDeviceGet(&d1, 1));
    tu_assert_cu(drv->cuDevicePrimaryCtxRetain(&c1, d1));
    tu_assert_cu(drv->cuCtxSetCurrent(c1));
    char buf[64];
    memset(buf, 0, sizeof buf);
    tu_assert_cu_eq(drv->cuMemcpyDtoH(buf, va, sizeof buf), CUDA_ERROR_ILLEGAL_ADDRESS);
    tu_assert_cu_eq(drv->cuMemcpyHtoD(va, buf, sizeof buf), CUDA_ERROR_ILLEGAL_ADDRESS);
    tu_assert_cu_eq(drv->cuMemsetD8(va, 1, sizeof buf), CUDA_ERROR_ILLEGAL_ADDRESS);
    /* The asynchronous ones too (services: sleep offload and wake run on a stream). */
    tu_assert_cu_eq(drv->cuMemcpyDtoHAsync(buf, va, sizeof buf, NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
    tu_assert_cu_eq(drv->cuMemcpyHtoDAsync(va, buf, sizeof buf, NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
    tu_assert_cu_eq(drv->cuMemsetD8Async(va, 0, sizeof buf, NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 1;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    tu_assert_cu(drv->cuMemSetAccess(va, G, &d, 1));
    tu_assert_cu(drv->cuMemcpyDtoH(buf, va, sizeof buf));
    tu_assert_cu_eq(drv->cuMemsetD8(va, 1, sizeof buf), CUDA_ERROR_ILLEGAL_ADDRESS);
    tu_assert_cu(drv->cuMemcpyDtoHAsync(buf, va, sizeof buf, NULL));
    tu_assert_cu_eq(drv->cuMemsetD8Async(va, 1, sizeof buf, NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    tu_assert_cu(drv->cuMemSetAccess(va, G, &d, 1));
    tu_assert_cu(drv->cuMemsetD8(va, 1, sizeof buf));
    /* Device 1 wrote; device 0 (unchanged rights) reads it. */
    tu_assert_cu(drv->cuDevicePrimaryCtxRelease(d1));
    tu_ctx_set();
    unsigned char one = 0;
    tu_assert_cu(drv->cuMemcpyDtoH(&one, va, 1));
    assert_int_equal(one, 1);
    tu_assert_cu(drv->cuMemUnmap(va, G));
    tu_assert_cu(drv->cuMemAddressFree(va, G));
}

/* ---------------------------------------------------------------------------------------------
 * Probes for this round's other work: each prints "probe: WHAT -> supported" or "-> not
 * supported: CALL -> CUresult" and passes either way on a GPU (the run records the answer); on
 * cudaemu it must give cudaemu's documented answer.
 * ------------------------------------------------------------------------------------------- */

static void probe_print(const char *what, const char *step, CUresult r, const char *detail)
{
    if (r == CUDA_SUCCESS)
        print_message("probe: %s -> supported%s%s\n", what, *detail ? ": " : "", detail);
    else
        print_message("probe: %s -> not supported: %s -> %s%s%s\n", what, step, drv_error_name(r),
                      *detail ? "; " : "", detail);
}

/* Bytes [0, n) of @p va read back as @p v at offsets 0, n/2 and n-64 (64 bytes each)? */
static CUresult probe_reads(CUdeviceptr va, size_t n, unsigned char v, const char **step)
{
    unsigned char buf[64];
    size_t at[3] = {0, n / 2, n - sizeof buf};
    for (int i = 0; i < 3; i++) {
        CUresult r = drv->cuMemcpyDtoH(buf, va + at[i], sizeof buf);
        if (r != CUDA_SUCCESS) {
            *step = "cuMemcpyDtoH";
            return r;
        }
        for (size_t k = 0; k < sizeof buf; k++)
            if (buf[k] != v) {
                *step = "read back (wrong bytes)";
                return CUDA_ERROR_UNKNOWN;
            }
    }
    return CUDA_SUCCESS;
}

/* Host-located VMM memory (location @p type: HOST_NUMA node 0, or HOST, whose id is ignored: 7
 * here) mapped for device 0 and written and read by the device's copy engines (cuMemsetD8,
 * cuMemcpyHtoD/DtoH); it does not count against device memory. @p attrib is the device
 * attribute that says the driver supports it. A kernel's access is the GPU run's own check. */
static void probe_host_located(CUmemLocationType type, CUdevice_attribute attrib, const char *what)
{
    CUdevice d0;
    tu_assert_cu(drv->cuDeviceGet(&d0, 0));
    int attr = -1;
    CUresult ra = drv->cuDeviceGetAttribute(&attr, attrib, d0);
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    p.location.type = type;
    p.location.id = type == CU_MEM_LOCATION_TYPE_HOST ? 7 : 0;
    size_t hg = 0, before = free_mem();
    const char *step = "cuMemGetAllocationGranularity";
    CUresult r = drv->cuMemGetAllocationGranularity(&hg, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    struct vmm_range v = {0};
    size_t n = 0;
    if (r == CUDA_SUCCESS) {
        n = hg > G ? hg : G;
        n = xseg_align_up(2 * n, hg); /* two granules of each: a multiple of both */
        r = range_make(&v, &p, n, &step);
    }
    size_t used = 0;
    if (r == CUDA_SUCCESS) {
        used = before - free_mem();
        unsigned char pat[256];
        memset(pat, 0x3c, sizeof pat);
        if ((r = drv->cuMemsetD8(v.va, 0x3c, n)) != CUDA_SUCCESS)
            step = "cuMemsetD8";
        else if ((r = drv->cuMemcpyHtoD(v.va + n - sizeof pat, pat, sizeof pat)) != CUDA_SUCCESS)
            step = "cuMemcpyHtoD";
        else if ((r = drv->cuCtxSynchronize()) != CUDA_SUCCESS)
            step = "cuCtxSynchronize";
        else
            r = probe_reads(v.va, n, 0x3c, &step);
    }
    char detail[160];
    snprintf(detail, sizeof detail, "attribute %d (%s), granularity %zu, %zu bytes, device memory used %zu",
             attr, drv_error_name(ra), hg, n, used);
    probe_print(what, step, r, detail);
    range_drop(&v);
    if (tu_emulated()) {
        tu_assert_cu(r);
        assert_int_equal(attr, 1);
        assert_int_equal(used, 0);
        assert_int_equal(free_mem(), before);
    }
}

static void test_probe_host_numa(void **state)
{
    (void)state;
    probe_host_located(CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                       "host-located VMM memory (HOST_NUMA 0), device copies and memset");
}

/* Location HOST (CUDA 12.2+: no NUMA node named; what spill uses where the device supports it). */
static void test_probe_host(void **state)
{
    (void)state;
    probe_host_located(CU_MEM_LOCATION_TYPE_HOST, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                       "host-located VMM memory (HOST, id ignored), device copies and memset");
}

/* Spill's swap (vmm/segment.c seg_move_chunk, issue 49): a device chunk's bytes copied on a stream
 * (cuMemcpyDtoDAsync) into a HOST_NUMA chunk mapped at a scratch range, the device chunk unmapped
 * and released, the host chunk mapped at the same address with the device's access: the bytes
 * read back there, the device memory is free again; then the way back. */
static void test_probe_spill_swap(void **state)
{
    (void)state;
    CUmemAllocationProp pd = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE), ph = pd;
    ph.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    ph.location.id = 0;
    size_t n = 2 * G, before = free_mem(), used_dev = 0, used_host = 0;
    struct vmm_range dev = {0}, scratch = {0};
    const char *step = "";
    CUresult r = range_make(&dev, &pd, n, &step);
    for (int way = 0; r == CUDA_SUCCESS && way < 2; way++) {
        unsigned char v = way ? 0x77 : 0x5a;
        if ((r = drv->cuMemsetD8(dev.va, v, n)) != CUDA_SUCCESS) {
            step = "cuMemsetD8";
            break;
        }
        if (!way)
            used_dev = before - free_mem();
        if ((r = range_make(&scratch, way ? &pd : &ph, n, &step)) != CUDA_SUCCESS)
            break;
        if ((r = drv->cuMemcpyDtoDAsync(scratch.va, dev.va, n, NULL)) != CUDA_SUCCESS ||
            (r = drv->cuStreamSynchronize(NULL)) != CUDA_SUCCESS) {
            step = "cuMemcpyDtoDAsync to the scratch range";
            break;
        }
        if ((r = drv->cuMemUnmap(dev.va, n)) != CUDA_SUCCESS) {
            step = "cuMemUnmap of the old chunk";
            break;
        }
        dev.mapped = false;
        drv->cuMemRelease(dev.h);
        dev.h = scratch.h; /* the new memory moves to the old address */
        scratch.h = 0;
        if ((r = drv->cuMemMap(dev.va, n, 0, dev.h, 0)) != CUDA_SUCCESS) {
            step = "cuMemMap of the new chunk at the old address";
            break;
        }
        dev.mapped = true;
        if ((r = set_rw(dev.va, n)) != CUDA_SUCCESS) {
            step = "cuMemSetAccess of the new chunk";
            break;
        }
        range_drop(&scratch); /* unmaps the scratch range; the handle is the old address's now */
        if (!way)
            used_host = before - free_mem();
        if ((r = probe_reads(dev.va, n, v, &step)) != CUDA_SUCCESS)
            break;
    }
    char detail[160];
    snprintf(detail, sizeof detail, "%zu bytes; device memory used: %zu before, %zu with the page on host", n,
             used_dev, used_host);
    probe_print("spill swap: a device page to HOST_NUMA memory at the same address and back", step, r, detail);
    range_drop(&scratch);
    range_drop(&dev);
    if (tu_emulated()) {
        tu_assert_cu(r);
        assert_int_equal(used_dev, n);
        assert_int_equal(used_host, 0);
        assert_int_equal(free_mem(), before);
    }
}

/* One physical handle mapped at 8 addresses: a memset through one and a copy through another are
 * seen through all. */
static void test_probe_many_aliases(void **state)
{
    (void)state;
    enum { K = 8 };
    CUdeviceptr va[K] = {0};
    bool mapped[K] = {false};
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    const char *step = "cuMemCreate";
    CUresult r = drv->cuMemCreate(&h, G, &p, 0);
    for (int k = 0; k < K && r == CUDA_SUCCESS; k++) {
        if ((r = drv->cuMemAddressReserve(&va[k], G, 0, 0, 0)) != CUDA_SUCCESS) {
            step = "cuMemAddressReserve";
            va[k] = 0;
        } else if ((r = drv->cuMemMap(va[k], G, 0, h, 0)) != CUDA_SUCCESS) {
            step = "cuMemMap";
        } else {
            mapped[k] = true;
            if ((r = set_rw(va[k], G)) != CUDA_SUCCESS)
                step = "cuMemSetAccess";
        }
    }
    if (r == CUDA_SUCCESS && (r = drv->cuMemsetD8(va[3], 0x71, G)) != CUDA_SUCCESS)
        step = "cuMemsetD8 through address 3";
    for (int k = 0; k < K && r == CUDA_SUCCESS; k++)
        r = probe_reads(va[k], G, 0x71, &step);
    unsigned char pat[64];
    memset(pat, 0x19, sizeof pat);
    if (r == CUDA_SUCCESS && (r = drv->cuMemcpyHtoD(va[K - 1] + G / 2, pat, sizeof pat)) != CUDA_SUCCESS)
        step = "cuMemcpyHtoD through address 7";
    unsigned char got[64];
    for (int k = 0; k < K && r == CUDA_SUCCESS; k++) {
        if ((r = drv->cuMemcpyDtoH(got, va[k] + G / 2, sizeof got)) != CUDA_SUCCESS)
            step = "cuMemcpyDtoH";
        else if (memcmp(got, pat, sizeof got)) {
            step = "read back (wrong bytes)";
            r = CUDA_ERROR_UNKNOWN;
        }
    }
    char detail[64];
    snprintf(detail, sizeof detail, "%d addresses of one %zu-byte handle", K, G);
    probe_print("one physical handle mapped at 8 addresses", step, r, detail);
    for (int k = 0; k < K; k++) {
        if (mapped[k])
            tu_assert_cu(drv->cuMemUnmap(va[k], G));
        if (va[k])
            tu_assert_cu(drv->cuMemAddressFree(va[k], G));
    }
    if (h)
        tu_assert_cu(drv->cuMemRelease(h));
    if (tu_emulated())
        tu_assert_cu(r);
}

/* A dma-buf descriptor for a mapped VMM range (cuMemGetHandleForAddressRange, for RDMA
 * registration). cudaemu has no dma-buf exporter: attribute 0, NOT_SUPPORTED. */
static void test_probe_dmabuf(void **state)
{
    (void)state;
    CUdevice d0;
    tu_assert_cu(drv->cuDeviceGet(&d0, 0));
    int attr = -1;
    CUresult ra = drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d0);
    struct vmm_range v = {0};
    const char *step = "cuMemGetHandleForAddressRange (not exported by the driver)";
    CUresult r = CUDA_ERROR_NOT_FOUND;
    int fd = -1;
    CUmemAllocationProp p = prop_dev(0, CU_MEM_HANDLE_TYPE_NONE);
    if (get_range_handle && (r = range_make(&v, &p, 2 * G, &step)) == CUDA_SUCCESS) {
        step = "cuMemGetHandleForAddressRange(DMA_BUF_FD)";
        r = get_range_handle(&fd, v.va, 2 * G, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    }
    char detail[128];
    struct stat st;
    snprintf(detail, sizeof detail, "attribute %d (%s)%s", attr, drv_error_name(ra),
             r == CUDA_SUCCESS && fd >= 0 && !fstat(fd, &st) ? ", a descriptor came back" : "");
    probe_print("dma-buf export of a mapped VMM range", step, r, detail);
    if (r == CUDA_SUCCESS && fd >= 0)
        close(fd);
    range_drop(&v);
    if (tu_emulated()) /* no dma-buf unless CUDAEMU_DMA_BUF=1 (driver-vmm-dmabuf) */
        tu_assert_cu_eq(r, attr ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED);
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n > 0)
        self_path[n] = '\0';
    if (argc > 1 && !strncmp(argv[1], "--fault=", 8))
        return fault_child_main(argv[1] + 8);
    if (argc > 1 && !strncmp(argv[1], "--ipc-child=", 12))
        return ipc_child_main(argv[1] + 12);
    if (argc > 1 && !strcmp(argv[1], "--fds"))
        return fds_child_main();
    tu_exit_skip_without_gpu();
    struct drv_device_info info;
    if (drv_device_query(0, &info) != XSEG_SUCCESS || !info.vmm_supported) {
        fprintf(stderr, "SKIP: device 0 has no VMM support\n");
        return 77;
    }
    G = info.granularity;
    resolve_extra();
    print_message("device 0: %s, %zu bytes, granularity %zu, %s\n", info.name, info.total_mem, G,
                  tu_emulated() ? "cudaemu" : "real driver");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_granularity, setup),
        cmocka_unit_test_setup(test_reserve_align_hint, setup),
        cmocka_unit_test_setup(test_map_rw_roundtrip, setup),
        cmocka_unit_test_setup(test_two_mappings_alias, setup),
        cmocka_unit_test_setup(test_release_while_mapped, setup),
        cmocka_unit_test_setup(test_retain_handle, setup),
        cmocka_unit_test_setup(test_export_import_fd, setup),
        cmocka_unit_test_setup(test_classic_alloc, setup),
        cmocka_unit_test_setup(test_capacity_oom, setup),
        cmocka_unit_test_setup(test_misuse_table, setup),
        cmocka_unit_test_setup(test_dmabuf_ranges, setup),
        cmocka_unit_test_setup(test_rdma_flag, setup),
        cmocka_unit_test_setup(test_rdma_pointer_attribute, setup),
        cmocka_unit_test_setup(test_fault_unmapped, setup),
        cmocka_unit_test_setup(test_fault_noaccess, setup),
        cmocka_unit_test_setup(test_fault_after_unmap, setup),
        cmocka_unit_test_setup(test_null_out_faults, setup),
        cmocka_unit_test_setup(test_driver_descriptors, setup),
        cmocka_unit_test_setup(test_fault_host_read, setup),
        cmocka_unit_test_setup(test_fault_host_read_classic, setup),
        cmocka_unit_test_setup(test_fault_dead_stream, setup),
        cmocka_unit_test_setup(test_events, setup),
        cmocka_unit_test_setup(test_stream_hold, setup),
        cmocka_unit_test_setup(test_capture_state, setup),
        cmocka_unit_test_setup(test_capture_table, setup),
        /* capture graph */
        cmocka_unit_test_setup(test_capture_graph, setup),
        cmocka_unit_test_setup(test_capture_graph_table, setup),
        cmocka_unit_test_setup(test_stream_work_held, setup),
        cmocka_unit_test_setup(test_stream_order, setup),
        cmocka_unit_test_setup(test_graph_launch, setup),
        cmocka_unit_test_setup(test_graph_exec_table, setup),
        cmocka_unit_test_setup(test_export_import_fd_process, setup),
        cmocka_unit_test_setup(test_fabric, setup),
        cmocka_unit_test_setup(test_access_per_device, setup),
        cmocka_unit_test_setup(test_host_copies, setup), /* services */
        cmocka_unit_test_setup(test_host_register, setup),
        cmocka_unit_test_setup(test_kernel_ranges, setup), /* the allocator's range kernels */
        cmocka_unit_test_setup(test_kernel_unmapped, setup),
        /* probes for this round's other issues */
        cmocka_unit_test_setup(test_probe_host_numa, setup),
        cmocka_unit_test_setup(test_probe_host, setup),
        cmocka_unit_test_setup(test_probe_spill_swap, setup),
        cmocka_unit_test_setup(test_probe_many_aliases, setup),
        cmocka_unit_test_setup(test_probe_dmabuf, setup),
    };
    return cmocka_run_group_tests_name("driver-vmm", tests, NULL, NULL);
}
