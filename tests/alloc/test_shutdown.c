/*
 * xseg_shutdown through the public API: after a mixed workload left everything in use (live
 * blocks on both pools and two streams, a record_stream'ed free still waiting for its stream, a
 * private pool recording, an IPC import open, history recording with stacks, observers and
 * callbacks attached, the idle-reclaim thread running, a memory fraction and an OOM snapshot
 * path set), xseg_shutdown leaves cudaemu with no handle, mapping, reservation, cuMemAlloc block,
 * event, graph or pinned host allocation; the statistics and the configuration are back to the
 * start; and the next calls initialize again and work, twice over. It refuses (changing nothing)
 * while a capture is under way or a pool sleeps. Under ASan, LeakSanitizer checks at exit that no
 * host memory of xseg is left unreachable. Emulator only.
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

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define OK(call) assert_int_equal_msg((call), XSEG_SUCCESS, #call)
#define assert_int_equal_msg(a, b, what)                                                          \
    do {                                                                                          \
        int a_ = (int)(a);                                                                        \
        if (a_ != (int)(b))                                                                       \
            fail_msg("%s returned %s: %s", what, xseg_status_name((xseg_status)a_), xseg_last_error()); \
    } while (0)

static const xseg_pool_id default_pool = {0, 0};
static char start_config[4096];
static int observed, callbacks;

static void observer(const xseg_segment_event *ev, void *user)
{
    (void)ev;
    (void)user;
    observed++;
}

static int free_cb(int device, size_t requested, void *user)
{
    (void)device;
    (void)requested;
    (void)user;
    callbacks++;
    return 0;
}

static int only_s2(CUstream s, void *user) { return s == (CUstream)user; }

static void check_nothing_held(const char *when)
{
    struct cudaemu_live live = {.size = sizeof live};
    assert_true(tu_live(&live));
    size_t pinned = tu_host_live(NULL);
    if (live.handles || live.mapped_bytes || live.reservations || live.allocs || live.events || live.graphs ||
        live.graph_execs || pinned)
        fail_msg("%s: left behind: %zu handles, %zu mapped bytes, %zu reservations, %zu allocs, %zu events, "
                 "%zu graphs, %zu graph execs, %zu pinned host allocations",
                 when, live.handles, live.mapped_bytes, live.reservations, live.allocs, live.events, live.graphs,
                 live.graph_execs, pinned);
}

/* Leave a bit of everything in use; return the pointers the program still holds. */
static void workload(CUstream s1, CUstream s2, void **keep, size_t nkeep)
{
    OK(xseg_set_config("expandable_segments:True,idle_release_ms:50,idle_release_thread:True"));
    OK(xseg_set_memory_fraction(0.75, 0));
    OK(xseg_set_oom_snapshot("/nonexistent/xseg-shutdown-test.pickle"));
    OK(xseg_attach_segment_observer(observer, NULL));
    OK(xseg_attach_free_memory_callback(free_cb, NULL));
    xseg_history_options h = {.enabled = 1, .stacks = XSEG_STACKS_C};
    OK(xseg_record_memory_history(&h));
    size_t sizes[] = {4 * KiB, 3 * MiB, 600 * KiB, 5 * MiB};
    for (size_t i = 0; i < nkeep; i++) {
        OK(xseg_malloc(&keep[i], sizes[i % 4], 0, i % 2 ? s2 : s1));
        tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)keep[i], sizes[i % 4], 900u + (unsigned)i));
    }
    /* A free waiting for a held stream. */
    void *p = NULL;
    OK(xseg_malloc(&p, 2 * MiB, 0, s1));
    OK(xseg_record_stream(p, s2));
    assert_true(tu_stream_hold(s2));
    OK(xseg_free(p));
    assert_true(tu_stream_release(s2)); /* the work completes; the event is polled later */
    /* A private pool recording s2's allocations, with a live block in it. */
    xseg_pool_id pool;
    OK(xseg_pool_create(&pool));
    OK(xseg_begin_allocate_to_pool(0, pool, only_s2, s2));
    void *q = NULL;
    OK(xseg_malloc(&q, 1 * MiB, 0, s2));
    /* An IPC import of a live block, open. */
    xseg_ipc_handle *handle = NULL;
    void *imported = NULL;
    OK(xseg_ipc_export(keep[1], &handle));
    OK(xseg_ipc_import(handle, 0, &imported));
    xseg_ipc_handle_free(handle);
    xseg_snapshot *snap = NULL;
    OK(xseg_take_snapshot(0, &snap));
    xseg_snapshot_free(snap);
    assert_true(observed > 0);
}

static void check_fresh(const char *when)
{
    char cfg[4096];
    OK(xseg_get_config(cfg, sizeof cfg, NULL));
    if (strcmp(cfg, start_config))
        fail_msg("%s: the configuration is %s, not the start's %s", when, cfg, start_config);
    int64_t v = -1;
    const char *zero[] = {"allocated_bytes.all.current", "reserved_bytes.all.current", "allocated_bytes.all.peak",
                          "reserved_bytes.all.peak", "allocation.all.allocated", "num_device_alloc"};
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++) {
        OK(xseg_stat(0, zero[i], &v));
        if (v != 0)
            fail_msg("%s: %s is %lld after xseg_shutdown", when, zero[i], (long long)v);
    }
    xseg_snapshot *snap = NULL;
    OK(xseg_take_snapshot(0, &snap));
    assert_int_equal(snap->nsegments, 0);
    xseg_snapshot_free(snap);
}

static void test_shutdown(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    OK(xseg_get_config(start_config, sizeof start_config, NULL));
    for (int round = 0; round < 2; round++) {
        CUstream s1, s2;
        tu_assert_cu(drv->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
        tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
        void *keep[6];
        workload(s1, s2, keep, 6);
        int observed_before = observed;
        OK(xseg_shutdown());
        assert_true(observed > observed_before); /* the observer heard the unmaps before it went */
        check_nothing_held(round ? "second shutdown" : "first shutdown");
        /* Observers and callbacks are detached: nothing more reaches them. */
        observed_before = observed;
        check_fresh(round ? "after the second shutdown" : "after the first shutdown");
        void *a = NULL;
        OK(xseg_malloc(&a, 3 * MiB, 0, s1));
        OK(xseg_free(a));
        OK(xseg_empty_cache(0));
        assert_int_equal(observed, observed_before);
        tu_assert_cu(drv->cuStreamDestroy(s1));
        tu_assert_cu(drv->cuStreamDestroy(s2));
    }
    OK(xseg_shutdown());
    OK(xseg_shutdown()); /* nothing left: a no-op */
    check_nothing_held("last shutdown");
}

/* A capture under way: refused, nothing changed (the live block keeps its data and frees). */
static void test_refuse_capture(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *a = tu_malloc(1 * MiB, s);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)a, 1 * MiB, 77));
    xseg_pool_id pool = {0, 0};
    OK(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_RELAXED));
    assert_int_equal(xseg_shutdown(), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "capture"));
    CUgraph g = NULL;
    OK(xseg_capture_end(0, s, &g));
    if (g)
        tu_assert_cu(drv->cuGraphDestroy(g));
    OK(xseg_release_pool(0, pool));
    assert_true(tu_check((CUdeviceptr)(uintptr_t)a, 1 * MiB, 77));
    /* A sleeping pool: refused too, until it wakes. */
    OK(xseg_set_config("expandable_segments:True"));
    void *b = tu_malloc(3 * MiB, s);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)b, 3 * MiB, 78));
    OK(xseg_sleep(0, default_pool, XSEG_SLEEP_OFFLOAD));
    assert_int_equal(xseg_shutdown(), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "wake"));
    OK(xseg_wake(0, default_pool));
    assert_true(tu_check((CUdeviceptr)(uintptr_t)b, 3 * MiB, 78));
    tu_free(a);
    OK(xseg_shutdown()); /* b is freed with the rest */
    check_nothing_held("after the refusals");
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* After a capture whose pool a graph still uses (graph_capture_record_stream_reuse on, a block
 * freed during the capture while recorded on a forked stream): shutdown releases the pool too and
 * gives everything back; only the program's graph is left, until it destroys it. */
static void test_after_capture(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    OK(xseg_set_config("expandable_segments:True,graph_capture_record_stream_reuse:True"));
    CUstream s, s2;
    CUevent fork_ev, join_ev;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuEventCreate(&fork_ev, CU_EVENT_DISABLE_TIMING));
    tu_assert_cu(drv->cuEventCreate(&join_ev, CU_EVENT_DISABLE_TIMING));
    xseg_pool_id pool = {0, 0};
    OK(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL));
    void *a = NULL, *b = NULL, *c = NULL;
    OK(xseg_malloc(&a, 6 * MiB, 0, s));
    tu_assert_cu(drv->cuEventRecord(fork_ev, s));
    tu_assert_cu(drv->cuStreamWaitEvent(s2, fork_ev, 0));
    OK(xseg_record_stream(a, s2));
    assert_true(tu_stream_work(s2));
    OK(xseg_malloc(&b, 1 * MiB, 0, s2));
    OK(xseg_free(a)); /* deferred: recorded on s2 during the capture */
    tu_assert_cu(drv->cuEventRecord(join_ev, s2));
    tu_assert_cu(drv->cuStreamWaitEvent(s, join_ev, 0));
    OK(xseg_malloc(&c, 4 * MiB, 0, s));
    CUgraph g = NULL;
    OK(xseg_capture_end(0, s, &g));
    assert_non_null(g);
    OK(xseg_shutdown()); /* b and c are freed, and the pool the graph used is released */
    struct cudaemu_live live = {.size = sizeof live};
    assert_true(tu_live(&live));
    assert_int_equal(live.handles + live.mapped_bytes + live.reservations + live.allocs, 0);
    tu_assert_cu(drv->cuGraphDestroy(g));
    tu_assert_cu(drv->cuEventDestroy(fork_ev));
    tu_assert_cu(drv->cuEventDestroy(join_ev));
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuStreamDestroy(s2));
    check_nothing_held("after the capture");
}

static int setup(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shutdown),
        cmocka_unit_test(test_refuse_capture),
        cmocka_unit_test(test_after_capture),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
