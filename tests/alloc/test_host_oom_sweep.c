/*
 * Host-OOM sweep: every host allocation the library makes (base/hostmem.h, the seam) fails, in
 * turn, during a mixed workload: both pools, two streams, record_stream, history with stacks and
 * a snapshot, a private pool, IPC export and import, trim, sleep and wake, empty_cache, and
 * last xseg_shutdown (then xseg_init again, for the next run). A first
 * run with the seam counting (and failing nothing) gives the number N of seam calls; then for
 * each n in 1..N (quick: a stride once N passes 400, so that about 400 runs are made; XSEG_HOST_OOM_SWEEP=full or
 * the `long` setup: every n) the workload runs again with the nth call failing. After each run:
 *   - every call that failed returned XSEG_ERROR_OUT_OF_MEMORY with a message, and only while
 *     the injected failure had happened (a call may also succeed by a fallback);
 *   - every allocation that succeeded still holds its data (checked after the whole workload);
 *   - the allocator is usable: with the seam disarmed, a malloc and free work;
 *   - nothing leaked: once everything is freed and the cache emptied, cudaemu holds no handle,
 *     mapping, reservation, cuMemAlloc block or graph, no pinned host memory, and no more events
 *     than the run without faults (xseg keeps an event pool); under ASan, LeakSanitizer checks
 *     the host side at exit (history is switched off and cleared at the end of each run).
 * One process, one allocator across all runs: a failure must leave xseg usable.
 *
 * `test_host_oom_sweep [classic] [FIRST LAST]`: classic segments instead of expandable ones (no IPC
 * export or sleep then); only n in [FIRST, LAST]. Emulator only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/hostmem.h"
#include "tests/common/testutil.h"
#include "xseg.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define NBUF 6

static const xseg_pool_id default_pool = {0, 0};

struct run {
    unsigned long nth;  /* the seam call to fail (0: none) */
    void *p[NBUF];      /* live blocks (NULL: not allocated or freed) */
    size_t size[NBUF];
    void *imported;     /* an IPC import open */
    xseg_ipc_handle *handle;
    bool routing;       /* begin_allocate_to_pool done, end not yet */
    bool asleep;        /* the default pool sleeps */
    xseg_pool_id pool;
    int failures;       /* calls that returned OUT_OF_MEMORY */
    bool shut, shut_ok; /* xseg_shutdown was called; it succeeded */
    unsigned char *host; /* a pinned host block (xseg_host_malloc) holding a pattern */
};

static CUstream s1, s2;
static bool classic; /* classic segments (no sleep, no IPC export: both need expandable ones) */
static const char *config = "expandable_segments:True";

/* A call returned @p st at @p what: fine when it succeeded, or when it is the clear host-OOM
 * error of the injected failure. Anything else fails the test naming n. */
static bool ok(struct run *r, xseg_status st, const char *what)
{
    if (st == XSEG_SUCCESS)
        return true;
    if (st != XSEG_ERROR_OUT_OF_MEMORY || !r->nth || !hostmem_failed())
        fail_msg("n=%lu: %s returned %s: %s", r->nth, what, xseg_status_name(st), xseg_last_error());
    const char *msg = xseg_last_error();
    if (!msg || !*msg)
        fail_msg("n=%lu: %s returned OUT_OF_MEMORY with no message", r->nth, what);
    r->failures++;
    return false;
}

static void alloc_buf(struct run *r, int i, size_t size, CUstream s)
{
    r->size[i] = size;
    if (!ok(r, xseg_malloc(&r->p[i], size, 0, s), "xseg_malloc")) {
        r->p[i] = NULL;
        return;
    }
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)r->p[i], size, 700u + (unsigned)i));
}

static void free_buf(struct run *r, int i)
{
    if (r->p[i] && ok(r, xseg_free(r->p[i]), "xseg_free"))
        r->p[i] = NULL;
}

static void check_data(const struct run *r)
{
    for (int i = 0; i < NBUF; i++)
        if (r->p[i] && !tu_check((CUdeviceptr)(uintptr_t)r->p[i], r->size[i], 700u + (unsigned)i))
            fail_msg("n=%lu: block %d lost its data", r->nth, i);
}

static void workload(struct run *r)
{
    xseg_history_options h = {.enabled = 1, .stacks = XSEG_STACKS_C, .max_entries = 64};
    ok(r, xseg_record_memory_history(&h), "xseg_record_memory_history");
    alloc_buf(r, 0, 4 * KiB, s1);   /* small pool */
    alloc_buf(r, 1, 3 * MiB, s1);   /* large pool */
    alloc_buf(r, 2, 600 * KiB, s2); /* small pool, second stream */
    alloc_buf(r, 3, 5 * MiB, s2);   /* large pool, second stream */
    if (r->p[0])
        ok(r, xseg_record_stream(r->p[0], s2), "xseg_record_stream");
    free_buf(r, 0); /* waits for s2's event */
    xseg_snapshot *snap = NULL;
    if (ok(r, xseg_take_snapshot(0, &snap), "xseg_take_snapshot"))
        xseg_snapshot_free(snap);

    /* A private pool. */
    if (ok(r, xseg_pool_create(&r->pool), "xseg_pool_create") &&
        ok(r, xseg_begin_allocate_to_pool(0, r->pool, NULL, NULL), "xseg_begin_allocate_to_pool")) {
        r->routing = true;
        alloc_buf(r, 4, 2 * MiB, s1);
        if (ok(r, xseg_end_allocate_to_pool(0, r->pool), "xseg_end_allocate_to_pool"))
            r->routing = false;
    }

    /* Pinned host memory: a block used on a stream and freed (it waits for an event), and one
     * that holds a pattern to the end. */
    void *hb = NULL;
    if (ok(r, xseg_host_malloc(&hb, 3000), "xseg_host_malloc")) {
        memset(hb, 0x5a, 3000);
        ok(r, xseg_host_record_stream(hb, 0, s2), "xseg_host_record_stream");
        ok(r, xseg_host_free(hb), "xseg_host_free");
    }
    if (ok(r, xseg_host_malloc((void **)&r->host, 5 * MiB), "xseg_host_malloc"))
        memset(r->host, 0xa5, 5 * MiB);

    /* Sleep and wake the default pools (their live blocks come back with their data). */
    if (!classic && ok(r, xseg_sleep(0, default_pool, XSEG_SLEEP_OFFLOAD), "xseg_sleep")) {
        r->asleep = true;
        if (ok(r, xseg_wake(0, default_pool), "xseg_wake"))
            r->asleep = false;
    }

    /* IPC: export a live block, import it (a second mapping), close. */
    if (!classic && r->p[1] && ok(r, xseg_ipc_export(r->p[1], &r->handle), "xseg_ipc_export")) {
        if (ok(r, xseg_ipc_import(r->handle, 0, &r->imported), "xseg_ipc_import")) {
            if (!tu_check((CUdeviceptr)(uintptr_t)r->imported, r->size[1], 701u))
                fail_msg("n=%lu: the import does not show the exported block's data", r->nth);
            if (ok(r, xseg_ipc_close(r->imported), "xseg_ipc_close"))
                r->imported = NULL;
        }
    }

    alloc_buf(r, 5, 7 * MiB, s1);
    free_buf(r, 3);
    ok(r, xseg_trim(0, 0), "xseg_trim");
    free_buf(r, 2);
    ok(r, xseg_empty_cache(0), "xseg_empty_cache");
    if (ok(r, xseg_take_snapshot(0, &snap), "xseg_take_snapshot"))
        xseg_snapshot_free(snap);

    /* Last, xseg_shutdown (refused while a pool sleeps): it frees the live blocks, so their data
     * is checked first. Failing, it may have freed some: finish() calls it again. */
    check_data(r);
    if (!r->asleep) {
        r->shut = true;
        r->shut_ok = ok(r, xseg_shutdown(), "xseg_shutdown");
    }
}

/* With the seam disarmed: check the data of the blocks still live, undo what a failure left
 * (each of these succeeds now), free everything, stop history. */
static void finish(struct run *r)
{
    hostmem_disarm();
    if (r->shut) {
        /* Everything of xseg's is gone (or goes now): only the program's own handle stays. */
        if (!r->shut_ok)
            ok(r, xseg_shutdown(), "xseg_shutdown (after)");
        memset(r->p, 0, sizeof r->p);
        r->imported = NULL;
        r->routing = false;
        r->pool = (xseg_pool_id){0, 0};
        /* The configuration is the defaults' now: this test's again (initializing anew). */
        ok(r, xseg_init(config), "xseg_init (after xseg_shutdown)");
    }
    if (r->asleep)
        ok(r, xseg_wake(0, default_pool), "xseg_wake (after)");
    if (r->routing)
        ok(r, xseg_end_allocate_to_pool(0, r->pool), "xseg_end_allocate_to_pool (after)");
    check_data(r);
    if (r->imported)
        ok(r, xseg_ipc_close(r->imported), "xseg_ipc_close (after)");
    if (r->handle)
        xseg_ipc_handle_free(r->handle);
    for (int i = 0; i < NBUF; i++)
        if (r->p[i])
            ok(r, xseg_free(r->p[i]), "xseg_free (after)");
    if (r->pool.first || r->pool.second) {
        xseg_status st = xseg_release_pool(0, r->pool);
        /* A pool never created on the device (its begin failed) is unknown: fine. */
        if (st != XSEG_SUCCESS && st != XSEG_ERROR_INVALID_VALUE)
            fail_msg("n=%lu: xseg_release_pool: %s", r->nth, xseg_last_error());
    }
    if (r->host) {
        for (size_t i = 0; i < 5 * MiB; i += 4096)
            if (r->host[i] != 0xa5)
                fail_msg("n=%lu: the pinned host block lost its pattern", r->nth);
        ok(r, xseg_host_free(r->host), "xseg_host_free (after)");
    }
    ok(r, xseg_host_empty_cache(), "xseg_host_empty_cache (after)");
    xseg_history_options off = {.enabled = 0, .clear = 1};
    ok(r, xseg_record_memory_history(&off), "xseg_record_memory_history (off)");
    ok(r, xseg_empty_cache(0), "xseg_empty_cache (after)");
    /* Usable after: a malloc and a free of both pools. */
    void *a = tu_malloc(4 * KiB, s1), *b = tu_malloc(3 * MiB, s2);
    tu_free(a);
    tu_free(b);
    ok(r, xseg_empty_cache(0), "xseg_empty_cache (last)");
}

static size_t base_events = SIZE_MAX; /* set after the first run */

static void check_nothing_held(unsigned long nth)
{
    struct cudaemu_live live = {.size = sizeof live};
    tu_live(&live);
    size_t pinned = tu_host_live(NULL);
    if (live.handles || live.mapped_bytes || live.reservations || live.allocs || live.graphs || pinned ||
        live.events > base_events)
        fail_msg("n=%lu: left behind: %zu handles, %zu mapped bytes, %zu reservations, %zu allocs, %zu graphs, "
                 "%zu pinned host allocations, %zu events (at most %zu expected)",
                 nth, live.handles, live.mapped_bytes, live.reservations, live.allocs, live.graphs, pinned,
                 live.events, base_events);
}

static unsigned long runs_failed; /* runs where some call returned OUT_OF_MEMORY */

static unsigned long run_once(unsigned long nth)
{
    struct run r = {.nth = nth};
    hostmem_fail_nth(nth);
    workload(&r);
    unsigned long calls = hostmem_calls();
    bool hit = hostmem_failed();
    bool failed_call = r.failures > 0;
    finish(&r);
    runs_failed += failed_call;
    if (nth && nth <= calls && !hit)
        fail_msg("n=%lu: the seam counted %lu calls but never failed the nth", nth, calls);
    check_nothing_held(nth);
    return calls;
}

static unsigned long first_n = 1, last_n = (unsigned long)-1;

static void test_sweep(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    tu_assert_cu(drv->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    /* The run without faults: the count, and the events xseg keeps pooled after it. */
    run_once(0);
    struct cudaemu_live live = {.size = sizeof live};
    tu_live(&live);
    base_events = live.events;
    unsigned long total = run_once(0);
    assert_true(total > 0);
    const char *full = getenv("XSEG_HOST_OOM_SWEEP");
    unsigned long stride = full && !strcmp(full, "full") ? 1 : (total + 399) / 400;
    unsigned long last = XSEG_MIN(total, last_n), runs = 0;
    for (unsigned long n = first_n; n <= last; n += stride, runs++)
        run_once(n);
    printf("host-OOM sweep: %lu seam calls in the workload; %lu runs (n %lu..%lu, stride %lu), %lu with a call "
           "failing OUT_OF_MEMORY (the others succeeded by a fallback)\n",
           total, runs, first_n, last, stride, runs_failed);
    tu_assert_cu(drv->cuStreamDestroy(s1));
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

static int setup(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(config);
    return 0;
}

int main(int argc, char **argv)
{
    int a = 1;
    if (a < argc && !strcmp(argv[a], "classic")) {
        classic = true;
        config = "expandable_segments:False";
        a++;
    }
    if (argc - a == 2) {
        first_n = strtoul(argv[a], NULL, 10);
        last_n = strtoul(argv[a + 1], NULL, 10);
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sweep)};
    return cmocka_run_group_tests(tests, setup, NULL);
}
