/*
 * Issue 75, item 1: a stream destroyed after its blocks were freed never crashes a later pass.
 * The program: 4 blocks on stream S, S synchronized, every block freed, S destroyed, and the
 * program goes on. The passes that never wait (the idle thread, idle reclaim in malloc,
 * release_threshold_mb at a cache-missing malloc) must not hand S to the driver again (cudaemu
 * faults on any call naming a destroyed stream, as the driver crashes); the runs cached under S
 * stay until a call that waits for the context (empty_cache), which gives them back. One process
 * per test (tests/services/meson.build). Bounded by tries, never by time: under load a pass may
 * come late, and the test still checks that the process lives and its books are whole.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "tests/services/fixture.h"
#include "xseg.h"

enum policy { IDLE_THREAD, IDLE_MALLOC, THRESHOLD };

static void dead_stream(enum policy pol, bool expandable, size_t size)
{
    char config[160];
    snprintf(config, sizeof config, "expandable_segments:%s,%s", expandable ? "True" : "False",
             pol == IDLE_THREAD   ? "idle_release_ms:20,idle_release_thread:True"
             : pol == IDLE_MALLOC ? "idle_release_ms:20"
                                  : "release_threshold_mb:1");
    tu_xseg_init_or_skip(config);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = tu_malloc(size, s);
    tu_assert_cu(drv->cuStreamSynchronize(s));
    for (int i = 0; i < 4; i++)
        tu_free(p[i]);
    tu_assert_cu(drv->cuStreamDestroy(s));
    /* The program goes on: mallocs on the default stream that miss the cache (each a new size,
     * above what it cached), so that malloc's passes run, and naps for the idle thread's. */
    struct timespec nap = {0, 5 * 1000 * 1000};
    for (int i = 0; i < 40; i++) {
        void *q = tu_malloc((size_t)(i + 1) * 3 * MiB, NULL);
        tu_free(q);
        nanosleep(&nap, NULL);
    }
    assert_int_equal(tu_dead_stream_calls(), 0);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), 0);
    /* empty_cache waits for the context: S's runs go back with the rest. */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(tu_dead_stream_calls(), 0);
}

#define DEAD(name, pol, exp, size)                                                                \
    static void test_dead_##name(void **state)                                                    \
    {                                                                                             \
        (void)state;                                                                              \
        dead_stream(pol, exp, size);                                                              \
    }
DEAD(idle_thread_classic_small, IDLE_THREAD, false, 256 * 1024)
DEAD(idle_thread_classic_large, IDLE_THREAD, false, 8 * MiB)
DEAD(idle_thread_expandable_small, IDLE_THREAD, true, 256 * 1024)
DEAD(idle_thread_expandable_large, IDLE_THREAD, true, 8 * MiB)
DEAD(idle_classic_small, IDLE_MALLOC, false, 256 * 1024)
DEAD(idle_classic_large, IDLE_MALLOC, false, 8 * MiB)
DEAD(idle_expandable_small, IDLE_MALLOC, true, 256 * 1024)
DEAD(idle_expandable_large, IDLE_MALLOC, true, 8 * MiB)
DEAD(threshold_classic_small, THRESHOLD, false, 256 * 1024)
DEAD(threshold_classic_large, THRESHOLD, false, 8 * MiB)
DEAD(threshold_expandable_small, THRESHOLD, true, 256 * 1024)
DEAD(threshold_expandable_large, THRESHOLD, true, 8 * MiB)

/* ---- one record per stream and window (issue 75, item 1's cost) ---------------------------- */

/* N frees on a program stream S within one window (idle_release_ms: one minute, or
 * release_threshold_mb far above the cache) record xseg's event on S at most once per pool: the
 * first free records, the later ones find it pending and recent. Frees through the device lock
 * (idle ticks without the thread keep the slots off; round robin over 8 blocks). */
static void record_once(const char *policy)
{
    char config[160];
    snprintf(config, sizeof config, "expandable_segments:True,%s", policy);
    tu_xseg_init_or_skip(config);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    enum { K = 8, N = 400 };
    void *p[K];
    for (int i = 0; i < K; i++)
        p[i] = tu_malloc((size_t)(i + 1) * 512 * 1024, s); /* small and large pools */
    unsigned long before = tu_call_count("cuEventRecord");
    for (int i = 0; i < N; i++) {
        tu_free(p[i % K]);
        p[i % K] = tu_malloc((size_t)(i % K + 1) * 512 * 1024, s);
    }
    unsigned long records = tu_call_count("cuEventRecord") - before;
    for (int i = 0; i < K; i++)
        tu_free(p[i]);
    /* At most one record per (pool, stream): two pools. */
    if (records > 2)
        fail_msg("%lu cuEventRecord calls over %d frees on one stream within one window (want <= 2)", records, N);
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    tu_assert_cu(drv->cuStreamDestroy(s));
    assert_int_equal(tu_dead_stream_calls(), 0);
}
static void test_dead_record_once_idle(void **state)
{
    (void)state;
    record_once("idle_release_ms:60000");
}
static void test_dead_record_once_threshold(void **state)
{
    (void)state;
    record_once("release_threshold_mb:4096");
}

/* The frees after a record are covered by a later one: idle reclaim (malloc's ticks; @p thread:
 * the idle thread) gives back S's runs freed after the first record once a free on S after the
 * window recorded again; S is alive. */
static void record_later(bool thread)
{
    tu_xseg_init_or_skip(thread ? "expandable_segments:True,idle_release_ms:20,idle_release_thread:True"
                                : "expandable_segments:True,idle_release_ms:20");
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = tu_malloc(24 * MiB, s);
    for (int i = 0; i < 4; i++)
        tu_free(p[i]); /* the first records; the rest wait for a later record */
    struct timespec nap = {0, 5 * 1000 * 1000};
    int64_t reserved0 = tu_stat("reserved_bytes.all.current"), reserved = reserved0;
    int64_t bound = reserved0 / 4;
    for (int i = 0; i < 400 && reserved > bound; i++) {
        nanosleep(&nap, NULL);
        if (i == 10) { /* 50 ms on, the first record seen complete: this free records again */
            void *q = tu_malloc(2 * MiB, s);
            tu_free(q);
        }
        void *t = tu_malloc(512, NULL); /* malloc's idle ticks (without the thread) */
        tu_free(t);
        reserved = tu_stat("reserved_bytes.all.current");
    }
    if (reserved > bound)
        fail_msg("S's runs freed after the first record stayed cached: %lld of %lld bytes reserved",
                 (long long)reserved, (long long)reserved0);
    tu_assert_cu(drv->cuStreamDestroy(s));
    assert_int_equal(tu_dead_stream_calls(), 0);
}
static void test_dead_record_later(void **state)
{
    (void)state;
    record_later(false);
}

/* ---- a capture on another thread during empty_cache and trim (issue 75, item 2's audit) ------ */

struct capthread {
    atomic_int phase; /* 1: T captures; 2: the main thread is done */
    CUresult begin, end;
    pthread_t t;
    CUcontext ctx;
};

static void *cap_main(void *arg)
{
    struct capthread *c = arg;
    CUstream s = NULL;
    c->begin = drv->cuCtxSetCurrent(c->ctx);
    if (c->begin == CUDA_SUCCESS)
        c->begin = drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (c->begin == CUDA_SUCCESS)
        c->begin = drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (c->begin == CUDA_SUCCESS)
        (void)tu_stream_work(s); /* one captured node */
    atomic_store(&c->phase, 1);
    struct timespec nap = {0, 1000 * 1000};
    while (atomic_load(&c->phase) != 2)
        nanosleep(&nap, NULL);
    if (c->begin == CUDA_SUCCESS) {
        CUgraph g = NULL;
        c->end = drv->cuStreamEndCapture(s, &g);
        if (g)
            drv->cuGraphDestroy(g);
    }
    if (s)
        drv->cuStreamDestroy(s);
    return NULL;
}

/* Runs cached under a live program stream S, each (pool, S)'s last free followed by xseg's record
 * (one free a pool), while thread T captures in GLOBAL mode on a stream of its own and allocates
 * nothing through xseg: xseg_empty_cache (@p how 0) or xseg_trim (1) gives S's runs back by
 * waiting for xseg's event, never the context, and T's capture ends with its graph. */
static void capture_other(int how)
{
    tu_xseg_init_or_skip("expandable_segments:True,idle_release_ms:60000");
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *big = tu_malloc(8 * MiB, s), *small = tu_malloc(256 * 1024, s);
    (void)tu_stream_work(s); /* work on S before the frees: the event covers it */
    tu_free(big);
    tu_free(small);
    assert_true(tu_stat("reserved_bytes.all.current") > 0);
    struct capthread c = {0};
    atomic_init(&c.phase, 0);
    tu_assert_cu(drv->cuCtxGetCurrent(&c.ctx));
    assert_int_equal(pthread_create(&c.t, NULL, cap_main, &c), 0);
    struct timespec nap = {0, 1000 * 1000};
    while (atomic_load(&c.phase) != 1)
        nanosleep(&nap, NULL);
    tu_assert_cu(c.begin);
    xseg_status st = how == 0 ? xseg_empty_cache(0) : xseg_trim(0, 0);
    int64_t reserved = tu_stat("reserved_bytes.all.current");
    atomic_store(&c.phase, 2);
    assert_int_equal(pthread_join(c.t, NULL), 0);
    if (c.end != CUDA_SUCCESS)
        fail_msg("T's cuStreamEndCapture: %s (its capture was invalidated)", drv_error_name(c.end));
    if (st != XSEG_SUCCESS)
        fail_msg("%s during T's capture: %s", how == 0 ? "xseg_empty_cache" : "xseg_trim", xseg_last_error());
    assert_int_equal(reserved, 0);
    tu_assert_cu(drv->cuStreamDestroy(s));
    assert_int_equal(tu_dead_stream_calls(), 0);
}
static void test_dead_capture_other_empty_cache(void **state)
{
    (void)state;
    capture_other(0);
}
static void test_dead_capture_other_trim(void **state)
{
    (void)state;
    capture_other(1);
}

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "8G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dead_idle_thread_classic_small),
        cmocka_unit_test(test_dead_idle_thread_classic_large),
        cmocka_unit_test(test_dead_idle_thread_expandable_small),
        cmocka_unit_test(test_dead_idle_thread_expandable_large),
        cmocka_unit_test(test_dead_idle_classic_small),
        cmocka_unit_test(test_dead_idle_classic_large),
        cmocka_unit_test(test_dead_idle_expandable_small),
        cmocka_unit_test(test_dead_idle_expandable_large),
        cmocka_unit_test(test_dead_threshold_classic_small),
        cmocka_unit_test(test_dead_threshold_classic_large),
        cmocka_unit_test(test_dead_threshold_expandable_small),
        cmocka_unit_test(test_dead_threshold_expandable_large),
        cmocka_unit_test(test_dead_record_once_idle),
        cmocka_unit_test(test_dead_record_once_threshold),
        cmocka_unit_test(test_dead_record_later),
        cmocka_unit_test(test_dead_capture_other_empty_cache),
        cmocka_unit_test(test_dead_capture_other_trim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
