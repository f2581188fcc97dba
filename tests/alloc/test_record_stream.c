/*
 * record_stream: a block freed while another stream still has work queued on it is not reused
 * until that work completes (cudaemu holds the stream), then it is. Blocks waiting count as
 * active but not allocated. Emulator-only (holding a stream needs cudaemu).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)

static void run(const char *config, size_t size)
{
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    if (!tu_gpu_available())
        skip();
    tu_require_emulator_or_skip();
    CUstream side;
    tu_assert_cu(drv->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    void *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(xseg_malloc(&a, size, 0, NULL), XSEG_SUCCESS);
    assert_true(tu_stream_hold(side));
    assert_int_equal(xseg_record_stream(a, side), XSEG_SUCCESS);
    assert_int_equal(xseg_record_stream(a, NULL), XSEG_SUCCESS); /* own stream: no-op */
    int64_t alloc0 = tu_stat("allocated_bytes.all.current"), active0 = tu_stat("active_bytes.all.current");
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_true(tu_stat("allocated_bytes.all.current") < alloc0);
    assert_int_equal(tu_stat("active_bytes.all.current"), active0); /* still active */
    /* Pending: the same size on the same stream must not get a's memory. */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(xseg_malloc(&b, size, 0, NULL), XSEG_SUCCESS);
        assert_ptr_not_equal(a, b);
        assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    }
    int64_t device_allocs = tu_stat("num_device_alloc");
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    int pending = 0;
    for (size_t i = 0; i < snap->nsegments; i++)
        for (size_t j = 0; j < snap->segments[i].nblocks; j++)
            if (snap->segments[i].blocks[j].state == XSEG_BLOCK_ACTIVE_PENDING_FREE) {
                pending++;
                assert_int_equal(snap->segments[i].blocks[j].address, (uint64_t)(uintptr_t)a);
            }
    xseg_snapshot_free(snap);
    assert_int_equal(pending, 1);
    /* The side stream finishes: the next malloc polls the event and reuses a's block. */
    assert_true(tu_stream_release(side));
    assert_int_equal(xseg_malloc(&c, size, 0, NULL), XSEG_SUCCESS);
    /* Best fit by (size, address): a's block is free again; b's may sit lower. Either way no
     * new device memory, and a is not pending any more. */
    assert_true(c == a || c == b);
    assert_int_equal(tu_stat("num_device_alloc"), device_allocs);
    void *d2 = NULL;
    assert_int_equal(xseg_malloc(&d2, size, 0, NULL), XSEG_SUCCESS);
    assert_true((c == a && d2 == b) || (c == b && d2 == a) || tu_stat("num_device_alloc") == device_allocs);
    assert_int_equal(xseg_free(d2), XSEG_SUCCESS);
    assert_int_equal(tu_stat("active_bytes.all.current"), active0);
    assert_int_equal(xseg_free(c), XSEG_SUCCESS);

    /* empty_cache waits for pending frees (num_sync_all_streams). */
    assert_int_equal(xseg_malloc(&a, size, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_record_stream(a, side), XSEG_SUCCESS);
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    int64_t syncs = tu_stat("num_sync_all_streams");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("num_sync_all_streams"), syncs + 1);
    assert_int_equal(tu_stat("active_bytes.all.current"), 0);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    tu_assert_cu(drv->cuStreamDestroy(side));
}

static void test_classic_small(void **state) { (void)state; run("expandable_segments:False", 4096); }
static void test_classic_large(void **state) { (void)state; run("expandable_segments:False", 12 * MiB); }
static void test_expandable_small(void **state) { (void)state; run("expandable_segments:True", 4096); }
static void test_expandable_large(void **state) { (void)state; run("expandable_segments:True", 12 * MiB); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classic_small),
        cmocka_unit_test(test_classic_large),
        cmocka_unit_test(test_expandable_small),
        cmocka_unit_test(test_expandable_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
