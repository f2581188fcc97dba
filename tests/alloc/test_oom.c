/*
 * The OOM path: retry after releasing cached blocks (num_alloc_retries), free-memory callbacks,
 * the OOM observer's arguments, the message, the memory fraction, sizes over the device.
 * main() sets CUDAEMU_TOTAL_MEM=1G (unless set) so the emulated device fills quickly; sizes are
 * fractions of the device's total, so the same test runs on a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)

static size_t total;

static void must_contain(const char *what)
{
    if (!strstr(xseg_last_error(), what))
        fail_msg("message \"%s\" lacks \"%s\"", xseg_last_error(), what);
}

static void start(const char *config)
{
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    if (!tu_gpu_available())
        skip();
    size_t f = 0;
    tu_assert_cu(drv->cuMemGetInfo(&f, &total));
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
}

static void finish(void)
{
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
}

/* 60% cached on one stream, 60% wanted on another: only a release-and-retry can serve it. */
static void retry_after_release(const char *config)
{
    start(config);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    size_t big = total / 10 * 6;
    void *a = NULL, *b = NULL;
    assert_int_equal(xseg_malloc(&a, big, 0, NULL), XSEG_SUCCESS);
    tu_assert_cu(drv->cuMemsetD8((CUdeviceptr)(uintptr_t)a, 0x5a, 4096));
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    int64_t retries = tu_stat("num_alloc_retries"), ooms = tu_stat("num_ooms");
    assert_int_equal(xseg_malloc(&b, big, 0, s), XSEG_SUCCESS);
    assert_int_equal(tu_stat("num_alloc_retries"), retries + 1);
    assert_int_equal(tu_stat("num_ooms"), ooms);
    tu_assert_cu(drv->cuMemsetD8((CUdeviceptr)(uintptr_t)b, 0x33, 4096));
    /* Both can never be live together. */
    assert_int_equal(xseg_malloc(&a, big, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_int_equal(tu_stat("num_ooms"), ooms + 1);
    must_contain("CUDA out of memory. Tried to allocate");
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    finish();
    tu_assert_cu(drv->cuStreamDestroy(s));
}

static void test_retry_classic(void **state) { (void)state; retry_after_release("expandable_segments:False"); }
/* Recycling would move the cached pages to the other stream without the OOM path (see
 * tests/alloc/test_recycle.c); this checks PyTorch's release-and-retry itself. */
static void test_retry_expandable(void **state)
{
    (void)state;
    retry_after_release("expandable_segments:True,expandable_segments_recycle:False");
}

struct observed {
    int calls, device;
    size_t requested, dev_total, dev_free;
};

static void observer(int device, size_t requested, size_t device_total, size_t device_free, void *user)
{
    struct observed *o = user;
    o->calls++;
    o->device = device;
    o->requested = requested;
    o->dev_total = device_total;
    o->dev_free = device_free;
    /* Observers may call xseg (no lock held): a snapshot works. */
    xseg_snapshot *snap = NULL;
    if (xseg_take_snapshot(0, &snap) == XSEG_SUCCESS)
        xseg_snapshot_free(snap);
}

static struct observed obs;

static void test_observer_and_message(void **state)
{
    (void)state;
    start("expandable_segments:False");
    int calls = obs.calls;
    void *p = (void *)1;
    size_t huge = total * 2 + 3 * MiB;
    assert_int_equal(xseg_malloc(&p, huge, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_null(p);
    assert_int_equal(obs.calls, calls + 1);
    assert_int_equal(obs.device, 0);
    assert_int_equal(obs.requested, (huge + 2 * MiB - 1) / (2 * MiB) * (2 * MiB));
    assert_int_equal(obs.dev_total, total);
    assert_true(obs.dev_free <= total);
    must_contain("CUDA out of memory. Tried to allocate");
    must_contain("GPU 0 has a total capacity of");
    must_contain("is free.");
    must_contain("is allocated by xseg");
    must_contain("reserved by xseg but unallocated");
    must_contain("exceeds the device's total memory");
    /* Absurd sizes fail the same way, without overflow. */
    assert_int_equal(xseg_malloc(&p, SIZE_MAX, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    must_contain("exceeds the device's total memory");
    assert_int_equal(xseg_malloc(&p, SIZE_MAX - 4096, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    finish();
}

static void fraction(const char *config)
{
    start(config);
    assert_int_equal(xseg_set_memory_fraction(0.5, 0), XSEG_SUCCESS);
    int calls = obs.calls;
    void *a = NULL, *b = NULL;
    assert_int_equal(xseg_malloc(&a, total / 100 * 55, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    must_contain("allowed;");
    assert_int_equal(obs.calls, calls + 1);
    assert_int_equal(obs.dev_total, (size_t)(0.5 * (double)total)); /* the limit, not the total */
    assert_int_equal(xseg_malloc(&a, total / 100 * 30, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&b, total / 100 * 30, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_int_equal(xseg_malloc(&b, total / 100 * 15, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&a, total / 100 * 55, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    finish();
}

static void test_fraction_classic(void **state) { (void)state; fraction("expandable_segments:False"); }
static void test_fraction_expandable(void **state) { (void)state; fraction("expandable_segments:True"); }

static void *held_by_user;
static int callback_calls;

static int free_memory_callback(int device, size_t requested, void *user)
{
    (void)device;
    (void)requested;
    (void)user;
    callback_calls++;
    if (!held_by_user)
        return 0;
    assert_int_equal(xseg_free(held_by_user), XSEG_SUCCESS); /* lock is not held: may call xseg */
    held_by_user = NULL;
    return 1;
}

static void test_free_memory_callback(void **state)
{
    (void)state;
    start("expandable_segments:False");
    assert_int_equal(xseg_attach_free_memory_callback(free_memory_callback, NULL), XSEG_SUCCESS);
    size_t big = total / 10 * 6;
    assert_int_equal(xseg_malloc(&held_by_user, big, 0, NULL), XSEG_SUCCESS);
    int64_t retries = tu_stat("num_alloc_retries"), allocs = tu_stat("num_device_alloc");
    void *p = NULL;
    int calls = callback_calls;
    assert_int_equal(xseg_malloc(&p, big, 0, NULL), XSEG_SUCCESS);
    assert_true(callback_calls > calls);
    assert_null(held_by_user);
    /* Served from the block the callback freed: no retry, no new segment. */
    assert_int_equal(tu_stat("num_alloc_retries"), retries);
    assert_int_equal(tu_stat("num_device_alloc"), allocs);
    assert_int_equal(xseg_free(p), XSEG_SUCCESS);
    finish();
}

int main(void)
{
    setenv("CUDAEMU_TOTAL_MEM", "1G", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_classic),
        cmocka_unit_test(test_retry_expandable),
        cmocka_unit_test(test_observer_and_message),
        cmocka_unit_test(test_fraction_classic),
        cmocka_unit_test(test_fraction_expandable),
        cmocka_unit_test(test_free_memory_callback),
    };
    if (xseg_attach_oom_observer(observer, &obs) != XSEG_SUCCESS)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
