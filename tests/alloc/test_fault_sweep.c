/*
 * Fault-injection sweep (issue 11): every driver entry point the allocator calls during a mixed
 * workload fails, in turn, at each of its call indices (quick: a sample of them), in expandable
 * and in classic mode. After each run, with the fault disarmed:
 *   - every allocation that succeeded still holds its data, and is writable (a page left mapped
 *     without access would fail the fill or the check);
 *   - the statistics match a walk of a snapshot (reserved, allocated, active, requested, counts);
 *   - every pointer frees (an xseg_free that failed under the fault succeeds when retried);
 *   - empty_cache then succeeds, reserved reads 0, and cudaemu holds no handle, mapping,
 *     reservation or cuMemAlloc block: nothing leaked.
 * One process, one allocator across all runs: a failure must leave xseg usable.
 *
 * `test_fault_sweep MODE` with MODE expandable or classic. XSEG_FAULT_SWEEP=full tries every call
 * index (the long run, docs/testing.md); otherwise about 4 indices per entry point, fewer when
 * XSEG_TEST_SCALE is below 1. Emulator only (skips on the real driver).
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
#define NBUF 10

/* Entry points of the driver table that the allocator may call. Excluded: what only this test
 * calls to set up and check (stream create/destroy, memcpy, memset), and cuInit / the loader's
 * own calls, which run once before the sweep. */
static const char *const entries[] = {
    "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxGetDevice", "cuCtxPushCurrent", "cuCtxPopCurrent",
    "cuCtxSynchronize", "cuDeviceGetAttribute", "cuDeviceTotalMem", "cuDevicePrimaryCtxRetain",
    "cuMemGetInfo", "cuMemAlloc", "cuMemFree", "cuMemGetAllocationGranularity",
    "cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemRelease", "cuMemMap",
    "cuMemUnmap", "cuMemSetAccess", "cuStreamSynchronize", "cuStreamQuery", "cuStreamWaitEvent",
    "cuStreamIsCapturing", "cuStreamGetCaptureInfo", "cuEventCreate", "cuEventDestroy",
    "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuGetErrorName",
};

/* Entry points whose failure still loses something, skipped until fixed (remove the line with
 * the fix; XSEG_FAULT_SWEEP_SKIP=none sweeps them anyway, a comma list skips others). */
static const struct {
    const char *entry, *why;
} pending[] = {
    /* None today: failed cuMemRelease / cuMemAddressFree calls are kept and retried at the next
     * reclaim (vmm/segment.h, issue 11 item 2). */
    {NULL, NULL},
};

static const char *pending_reason(const char *entry)
{
    const char *env = getenv("XSEG_FAULT_SWEEP_SKIP");
    if (env && strstr(env, entry))
        return "named in XSEG_FAULT_SWEEP_SKIP";
    if (env && !strcmp(env, "none"))
        return NULL;
    for (size_t i = 0; i < sizeof pending / sizeof pending[0]; i++)
        if (pending[i].entry && !strcmp(pending[i].entry, entry))
            return pending[i].why;
    return NULL;
}

struct work {
    void *p[NBUF];
    size_t size[NBUF];
    CUstream s, s2;
};

static void w_alloc(struct work *w, int i, size_t size, CUstream s)
{
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, size, 0, s);
    if (st == XSEG_SUCCESS) {
        w->p[i] = p;
        w->size[i] = size;
        CUresult r = tu_fill((CUdeviceptr)(uintptr_t)p, size, 500u + (unsigned)i);
        if (r != CUDA_SUCCESS)
            fail_msg("xseg_malloc(%zu) returned memory that cannot be written (%d)", size, (int)r);
    } else if (st != XSEG_ERROR_OUT_OF_MEMORY && st != XSEG_ERROR_DRIVER) {
        fail_msg("xseg_malloc(%zu) failed with %s: %s", size, xseg_status_name(st), xseg_last_error());
    } else if (!*xseg_last_error()) {
        fail_msg("xseg_malloc(%zu) failed with %s and no message", size, xseg_status_name(st));
    }
}

/* Free under the fault: a failure is allowed, but the pointer must stay ours to free later. */
static void w_free(struct work *w, int i)
{
    if (!w->p[i])
        return;
    if (xseg_free(w->p[i]) == XSEG_SUCCESS)
        w->p[i] = NULL;
}

static void w_record(struct work *w, int i, CUstream s)
{
    if (w->p[i])
        (void)xseg_record_stream(w->p[i], s); /* may fail under the fault; the block stays ours */
}

/* A mixed workload: both pools, two streams, record_stream, deferred frees, growth, reclaim. */
static void workload(struct work *w)
{
    w_alloc(w, 0, 30 * MiB, NULL);
    w_alloc(w, 1, 3 * MiB, NULL);
    w_alloc(w, 2, 700 * 1024, NULL);
    w_alloc(w, 3, 24 * MiB, w->s);
    w_record(w, 3, w->s2);
    w_alloc(w, 4, 5 * MiB, NULL);
    w_free(w, 1);
    w_free(w, 0);
    (void)xseg_empty_cache(0);
    w_alloc(w, 5, 22 * MiB, NULL);
    tu_stream_hold(w->s2);
    w_free(w, 3); /* deferred: s2 still has work pending */
    w_alloc(w, 6, 2 * MiB + 512, w->s);
    w_alloc(w, 7, 100 * 1024, w->s);
    tu_stream_release(w->s2);
    w_free(w, 2);
    w_alloc(w, 8, 45 * MiB, NULL); /* grows past what is cached */
    w_free(w, 4);
    (void)xseg_empty_cache(0);
    w_alloc(w, 9, 1 * MiB, w->s2);
    w_free(w, 6);
}

/* Stats that a snapshot determines must match it. */
static void check_consistent(const char *when)
{
    xseg_snapshot *s = NULL;
    if (xseg_take_snapshot(0, &s) != XSEG_SUCCESS)
        fail_msg("%s: xseg_take_snapshot: %s", when, xseg_last_error());
    int64_t reserved = 0, allocated = 0, active = 0, requested = 0, nalloc = 0;
    for (size_t i = 0; i < s->nsegments; i++) {
        const xseg_segment_info *g = &s->segments[i];
        reserved += (int64_t)g->total_size;
        for (size_t j = 0; j < g->nblocks; j++) {
            const xseg_block_info *b = &g->blocks[j];
            if (b->state == XSEG_BLOCK_ACTIVE_ALLOCATED) {
                allocated += (int64_t)b->size;
                nalloc++;
            }
            if (b->state != XSEG_BLOCK_INACTIVE) {
                active += (int64_t)b->size;
                requested += (int64_t)b->requested_size;
            }
        }
    }
    xseg_snapshot_free(s);
    const struct {
        const char *key;
        int64_t want;
    } rows[] = {{"reserved_bytes.all.current", reserved}, {"allocated_bytes.all.current", allocated},
                {"active_bytes.all.current", active}, {"requested_bytes.all.current", requested},
                {"allocation.all.current", nalloc}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int64_t got = tu_stat(rows[i].key);
        if (got != rows[i].want)
            fail_msg("%s: %s = %lld, the snapshot says %lld", when, rows[i].key, (long long)got,
                     (long long)rows[i].want);
    }
}

static void check_after(struct work *w, const char *when)
{
    for (int i = 0; i < NBUF; i++)
        if (w->p[i] && !tu_check((CUdeviceptr)(uintptr_t)w->p[i], w->size[i], 500u + (unsigned)i))
            fail_msg("%s: buffer %d (%zu bytes) lost its data", when, i, w->size[i]);
    check_consistent(when);
    for (int i = 0; i < NBUF; i++)
        if (w->p[i]) {
            if (xseg_free(w->p[i]) != XSEG_SUCCESS)
                fail_msg("%s: buffer %d cannot be freed after the fault: %s", when, i, xseg_last_error());
            w->p[i] = NULL;
        }
    tu_assert_cu(drv->cuCtxSynchronize());
    if (xseg_empty_cache(0) != XSEG_SUCCESS)
        fail_msg("%s: empty_cache after the fault: %s", when, xseg_last_error());
    check_consistent(when);
    int64_t reserved = tu_stat("reserved_bytes.all.current");
    if (reserved != 0)
        fail_msg("%s: %lld bytes still reserved after freeing everything and empty_cache", when,
                 (long long)reserved);
    struct cudaemu_live live;
    if (tu_live(&live) && (live.handles || live.mapped_bytes || live.reservations || live.allocs))
        fail_msg("%s: leaked %zu handles, %zu bytes mapped, %zu reservations, %zu cuMemAlloc blocks",
                 when, live.handles, live.mapped_bytes, live.reservations, live.allocs);
}

static void sweep(const char *mode, const char *config)
{
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    if (!tu_gpu_available())
        skip();
    tu_require_emulator_or_skip();
    assert_int_equal(xseg_set_config(config), XSEG_SUCCESS);
    struct work w;
    memset(&w, 0, sizeof w);
    tu_assert_cu(drv->cuStreamCreate(&w.s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&w.s2, CU_STREAM_NON_BLOCKING));
    const char *full_env = getenv("XSEG_FAULT_SWEEP");
    int full = full_env && !strcmp(full_env, "full");
    size_t samples = tu_scaled(4, 2);

    /* A clean run first: which entries the workload reaches, and how often. */
    unsigned long calls[sizeof entries / sizeof entries[0]];
    tu_counts_reset();
    workload(&w);
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++)
        calls[e] = tu_call_count(entries[e]);
    check_after(&w, "the run without faults");

    unsigned runs = 0, entries_hit = 0;
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++) {
        if (!calls[e])
            continue;
        const char *why = pending_reason(entries[e]);
        if (why) {
            print_message("fault sweep (%s): %s not swept: %s\n", mode, entries[e], why);
            continue;
        }
        entries_hit++;
        unsigned long step = full || calls[e] <= samples ? 1 : (calls[e] + samples - 1) / samples;
        for (unsigned long n = 1; n <= calls[e]; n += step) {
            char when[96];
            snprintf(when, sizeof when, "%s: %s failing at call %lu of %lu", mode, entries[e], n, calls[e]);
            CUresult res = n % 2 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
            memset(w.p, 0, sizeof w.p);
            assert_true(tu_fail(entries[e], n, res));
            workload(&w);
            tu_fail_clear();
            tu_stream_release(w.s2);
            check_after(&w, when);
            runs++;
        }
    }
    print_message("fault sweep (%s): %u entry points reached, %u runs%s\n", mode, entries_hit, runs,
                  full ? " (every call index)" : "");
    assert_true(entries_hit >= 8);
    tu_assert_cu(drv->cuStreamDestroy(w.s));
    tu_assert_cu(drv->cuStreamDestroy(w.s2));
}

static void test_fault_sweep_expandable(void **state)
{
    (void)state;
    sweep("expandable", "expandable_segments:True");
}

static void test_fault_sweep_classic(void **state)
{
    (void)state;
    sweep("classic", "expandable_segments:False");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_fault_sweep_expandable),
        cmocka_unit_test(test_fault_sweep_classic),
    };
    if (argc > 1) {
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (strstr(all[i].name, argv[1]) && strlen(argv[1]) > 0) {
                const struct CMUnitTest one[] = {all[i]};
                return cmocka_run_group_tests(one, NULL, NULL);
            }
        fprintf(stderr, "unknown test %s\n", argv[1]);
        return 1;
    }
    return cmocka_run_group_tests(all, NULL, NULL);
}
