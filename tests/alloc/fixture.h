/*
 * The alloc suite's shared fixture (test_expandable.c, test_fit.c, test_faults.c, test_defrag.c,
 * test_spill.c): starting xseg uncapped (start_emu: on cudaemu only), a malloc that must succeed,
 * capping device 0, and the checks run after a scenario (the statistics a snapshot determines;
 * nothing left with the driver); and for test_host_oom.c one call with its nth host allocation
 * failing. Include after cmocka.h and tests/common/testutil.h.
 */
#ifndef XSEG_TESTS_ALLOC_FIXTURE_H
#define XSEG_TESTS_ALLOC_FIXTURE_H

#include <stdint.h>
#include <string.h>

#include "base/hostmem.h"
#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))

/* xseg_init(@p config), the test skipped without a device; no memory cap left behind by a test
 * that failed half-way (cap_device). */
static inline void start(const char *config)
{
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    if (!tu_gpu_available())
        skip();
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
}

/* start(@p config), the test skipped unless the driver is cudaemu: for tests whose device size,
 * fault injection, stream holds or graphs are the emulator's. */
static inline void start_emu(const char *config)
{
    start(config);
    tu_require_emulator_or_skip();
}

static inline void *must_malloc(size_t size, CUstream s)
{
    void *p = NULL;
    if (xseg_malloc(&p, size, 0, s) != XSEG_SUCCESS)
        fail_msg("xseg_malloc(%zu): %s", size, xseg_last_error());
    return p;
}

/* Cap device 0 at @p bytes through the memory fraction. */
static inline void cap_device(size_t bytes) { tu_set_memory_cap(bytes); }

/* Stats that a snapshot determines must match it (PyTorch's _check_memory_stat_consistency):
 * blocks tile each segment; reserved, allocated, active, requested bytes, allocations and
 * (classic) segments equal their recount. */
static inline void check_consistent(void)
{
    xseg_snapshot *s = NULL;
    assert_int_equal(xseg_take_snapshot(0, &s), XSEG_SUCCESS);
    int64_t reserved = 0, allocated = 0, active = 0, requested = 0, nalloc = 0, segs = 0;
    for (size_t i = 0; i < s->nsegments; i++) {
        const xseg_segment_info *g = &s->segments[i];
        reserved += (int64_t)g->total_size;
        if (!g->is_expandable)
            segs++;
        uint64_t at = g->address;
        for (size_t j = 0; j < g->nblocks; j++) {
            const xseg_block_info *b = &g->blocks[j];
            assert_int_equal(b->address, at); /* blocks tile the range */
            at += b->size;
            if (b->state == XSEG_BLOCK_ACTIVE_ALLOCATED) {
                allocated += (int64_t)b->size;
                nalloc++;
            }
            if (b->state != XSEG_BLOCK_INACTIVE) {
                active += (int64_t)b->size;
                requested += (int64_t)b->requested_size;
            }
        }
        assert_int_equal(at, g->address + g->total_size);
    }
    xseg_snapshot_free(s);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), allocated);
    assert_int_equal(tu_stat("active_bytes.all.current"), active);
    assert_int_equal(tu_stat("requested_bytes.all.current"), requested);
    assert_int_equal(tu_stat("allocation.all.current"), nalloc);
    assert_int_equal(tu_stat("segment.all.current"), segs);
}

/* Nothing left with the driver (cudaemu's live counts; no check on a GPU). */
static inline void check_no_leaks(void)
{
    struct cudaemu_live live;
    if (!tu_live(&live))
        return;
    if (live.handles || live.mapped_bytes || live.reservations || live.allocs)
        fail_msg("leak: %zu handles, %zu bytes mapped, %zu reservations, %zu cuMemAlloc blocks",
                 live.handles, live.mapped_bytes, live.reservations, live.allocs);
}

/* @p st = @p call with the @p n th host allocation from now failing (base/hostmem.h; 0: none),
 * @p hit = whether the call reached it. An OUT_OF_MEMORY must come from that failure and say so. */
#define HOST_OOM_CALL(n, st, hit, call)                                                           \
    do {                                                                                          \
        hostmem_fail_nth(n);                                                                      \
        (st) = (call);                                                                            \
        (hit) = hostmem_failed();                                                                 \
        hostmem_disarm();                                                                         \
        if ((st) == XSEG_ERROR_OUT_OF_MEMORY) {                                                   \
            assert_true(hit);                                                                     \
            assert_non_null(strstr(xseg_last_error(), "out of host memory"));                     \
        }                                                                                         \
    } while (0)

#endif
