/*
 * Driver-loader tests. drv_load() runs once per process, so each case is its own test() entry
 * (tests/driver/meson.build) with its own environment, selecting the case by argv[1].
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"

static void expect_contains(const char *msg, const char *needle)
{
    if (!msg)
        fail_msg("no message (expected one containing \"%s\")", needle);
    else if (!strstr(msg, needle))
        fail_msg("message \"%s\" does not contain \"%s\"", msg, needle);
}

/* XSEG_LIBCUDA names a file that does not exist: the message names the path and dlerror(). */
static void test_missing_library(void **state)
{
    (void)state;
    const char *path = getenv("XSEG_LIBCUDA");
    assert_non_null(path);
    assert_int_equal(drv_load(), XSEG_ERROR_DRIVER);
    char first[1024];
    snprintf(first, sizeof first, "%s", xseg_last_error());
    print_message("message: %s\n", first);
    expect_contains(first, path);
    expect_contains(first, "No such file");
    assert_null(drv);
    /* Once only: a second call gives the same status and message. */
    assert_int_equal(drv_load(), XSEG_ERROR_DRIVER);
    assert_string_equal(xseg_last_error(), first);
    /* drv_device_query passes the load error on. */
    struct drv_device_info info;
    assert_int_equal(drv_device_query(0, &info), XSEG_ERROR_DRIVER);
    assert_string_equal(xseg_last_error(), first);
}

/* No XSEG_LIBCUDA and no libcuda.so.1 on the machine: the message says how to name one (a GPU
 * machine has the driver: skipped there). */
static void test_no_driver(void **state)
{
    (void)state;
    unsetenv("XSEG_LIBCUDA");
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h) {
        dlclose(h);
        skip(); /* a driver is installed: nothing to say */
    }
    assert_int_equal(drv_load(), XSEG_ERROR_DRIVER);
    const char *msg = xseg_last_error();
    print_message("message: %s\n", msg);
    expect_contains(msg, "libcuda.so.1");
    expect_contains(msg, "set XSEG_LIBCUDA to the driver's libcuda.so.1, or to cudaemu's libcudaemu.so");
}

/* A library lacking entry points: the message names the first missing one and the library. */
static void test_missing_symbol(void **state)
{
    (void)state;
    assert_int_equal(drv_load(), XSEG_ERROR_DRIVER);
    const char *msg = xseg_last_error();
    print_message("message: %s\n", msg);
    expect_contains(msg, "cuDeviceGetCount");
    expect_contains(msg, getenv("XSEG_LIBCUDA"));
    assert_null(drv);
}

/* CUDAEMU_DEVICES=0: like the real driver, cuInit fails with CUDA_ERROR_NO_DEVICE. */
static void test_no_device(void **state)
{
    (void)state;
    struct drv_device_info info;
    assert_int_equal(drv_device_query(0, &info), XSEG_ERROR_DRIVER);
    const char *msg = xseg_last_error();
    print_message("message: %s\n", msg);
    expect_contains(msg, "CUDA_ERROR_NO_DEVICE");
    expect_contains(msg, "cuInit");
    assert_false(tu_gpu_available());
}

static void test_invalid_device(void **state)
{
    (void)state;
    tu_require_gpu_or_skip();
    int n = 0;
    tu_assert_cu(drv->cuDeviceGetCount(&n));
    struct drv_device_info info;
    char want[128];
    snprintf(want, sizeof want, "device %d is out of range: the driver reports %d device(s)", n + 2, n);
    assert_int_equal(drv_device_query(n + 2, &info), XSEG_ERROR_INVALID_DEVICE);
    assert_string_equal(xseg_last_error(), want);
    assert_int_equal(drv_device_query(-1, &info), XSEG_ERROR_INVALID_DEVICE);
    expect_contains(xseg_last_error(), "device -1 is out of range");
}

static void test_no_vmm(void **state)
{
    (void)state;
    struct drv_device_info info;
    assert_int_equal(drv_device_query(0, &info), XSEG_SUCCESS);
    assert_int_equal(info.vmm_supported, 0);
    assert_int_equal(info.granularity, 0);
    assert_true(info.total_mem > 0);
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h;
    tu_assert_cu_eq(drv->cuMemCreate(&h, 2 << 20, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(drv->cuDevicePrimaryCtxRelease(info.dev), CUDA_SUCCESS);
}

static void *load_thread(void *arg)
{
    *(xseg_status *)arg = drv_load();
    return NULL;
}

/* A working driver: device facts, context handling, drv_fail and drv_error_name. */
static void test_device_query(void **state)
{
    (void)state;
    /* Concurrent first loads agree (pthread_once). */
    pthread_t th[4];
    xseg_status st[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, load_thread, &st[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    if (st[0] != XSEG_SUCCESS) {
        print_message("[  SKIPPED ] no CUDA driver: %s\n", xseg_last_error());
        skip();
    }
    for (int i = 1; i < 4; i++)
        assert_int_equal(st[i], st[0]);
    assert_non_null(drv);
    struct drv_device_info info;
    assert_int_equal(drv_device_query(0, &info), XSEG_SUCCESS);
    print_message("device 0: %s, %zu bytes, vmm %d, granularity %zu\n", info.name, info.total_mem,
                  info.vmm_supported, info.granularity);
    assert_non_null(info.primary_ctx);
    assert_true(info.total_mem > 0);
    assert_true(info.name[0] != '\0');
    if (info.vmm_supported)
        assert_true(info.granularity > 0 && (info.granularity & (info.granularity - 1)) == 0);
    if (tu_emulated()) {
        assert_int_equal(info.total_mem, (size_t)80 << 30);
        assert_int_equal(info.granularity, (size_t)2 << 20);
    }
    assert_int_equal(drv_ctx_ensure(info.primary_ctx), XSEG_SUCCESS);
    CUcontext cur = NULL;
    tu_assert_cu(drv->cuCtxGetCurrent(&cur));
    assert_ptr_equal(cur, info.primary_ctx);
    unsigned long sets = tu_call_count("cuCtxSetCurrent");
    assert_int_equal(drv_ctx_ensure(info.primary_ctx), XSEG_SUCCESS);
    if (tu_emulated())
        assert_int_equal(tu_call_count("cuCtxSetCurrent"), sets);   /* already current: no set */

    assert_int_equal(drv_fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate(2097152 bytes)"), XSEG_ERROR_OUT_OF_MEMORY);
    assert_string_equal(xseg_last_error(), "cuMemCreate(2097152 bytes) failed: CUDA_ERROR_OUT_OF_MEMORY");
    assert_int_equal(drv_fail(CUDA_ERROR_INVALID_VALUE, "cuMemMap(0x1000)"), XSEG_ERROR_DRIVER);
    assert_string_equal(xseg_last_error(), "cuMemMap(0x1000) failed: CUDA_ERROR_INVALID_VALUE");
    assert_string_equal(drv_error_name(CUDA_ERROR_NOT_READY), "CUDA_ERROR_NOT_READY");
    assert_string_equal(drv_error_name((CUresult)987654), "CUDA_ERROR_987654");
    assert_int_equal(drv->cuDevicePrimaryCtxRelease(info.dev), CUDA_SUCCESS);
    assert_int_equal(drv_device_query(0, NULL), XSEG_ERROR_INVALID_VALUE);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        CMUnitTestFunction fn;
    } cases[] = {
        {"missing-library", test_missing_library}, {"missing-symbol", test_missing_symbol},
        {"no-device", test_no_device},             {"invalid-device", test_invalid_device},
        {"no-vmm", test_no_vmm},                   {"device-query", test_device_query},
        {"no-driver", test_no_driver},
    };
    for (size_t i = 0; argc > 1 && i < sizeof cases / sizeof cases[0]; i++) {
        if (strcmp(argv[1], cases[i].name))
            continue;
        const struct CMUnitTest t[] = {{cases[i].name, cases[i].fn, NULL, NULL, NULL}};
        return cmocka_run_group_tests_name("driver-loader", t, NULL, NULL);
    }
    fprintf(stderr, "usage: %s missing-library|missing-symbol|no-device|invalid-device|no-vmm|device-query|no-driver\n", argv[0]);
    return 2;
}
