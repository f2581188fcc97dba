/*
 * The pinned host caching allocator through the public API (xseg_host_malloc, xseg_host_free,
 * xseg_host_record_stream, xseg_host_empty_cache, xseg_host_stat and its resets): rounding to 512 B and device
 * segment sizes (not powers of two), reuse, blocks held back until the streams that used them
 * are done, PyTorch's pinned_* keys (cuMemHostRegister with threads, the event thread), every
 * driver call failing in turn, misuse. One process per test (meson passes the test name).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "tests/services/fixture.h"
#include "xseg.h"

/* Sizes round to 512 B and share segments as device blocks do; a freed block is reused with no
 * driver call; empty_cache gives every free segment back. */
static void test_host_basic(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    /* Small requests share one 2 MiB segment, each rounded to 512 B. */
    void *a = hmalloc(1000), *b = hmalloc(1), *c = hmalloc(0);
    assert_int_equal(hstat("segment.current"), 1);
    assert_int_equal(hstat("reserved_bytes.current"), 2 * MiB);
    assert_int_equal(hstat("allocated_bytes.current"), 1024 + 512 + 512);
    assert_int_equal(hstat("allocation.current"), 3);
    assert_int_equal((char *)b - (char *)a, 1024);
    memset(a, 1, 1000);
    memset(b, 2, 1);
    memset(c, 3, 512);

    /* 100 MiB + 1 byte: a segment of 102 MiB (2 MiB rounding), not 128 MiB (a power of two,
     * PyTorch's rounding, pytorch#150517). */
    void *big = hmalloc(100 * MiB + 1);
    assert_int_equal(hstat("reserved_bytes.current"), 2 * MiB + 102 * MiB);
    assert_int_equal(hstat("allocated_bytes.current"), 2048 + 100 * MiB + 512);
    memset(big, 4, 100 * MiB + 1);
    /* 3 MiB: a 20 MiB segment, split; the next 3 MiB comes from its rest. */
    void *m1 = hmalloc(3 * MiB), *m2 = hmalloc(3 * MiB);
    assert_int_equal((char *)m2 - (char *)m1, 3 * MiB);
    assert_int_equal(hstat("segment.current"), 3);
    int64_t allocs = hstat("num_host_alloc");
    assert_int_equal(allocs, 3);

    /* Freed blocks are reused without a driver call, the same address for the same size. */
    unsigned long calls = tu_call_count("cuMemHostAlloc");
    hfree(big);
    void *big2 = hmalloc(100 * MiB);
    assert_ptr_equal(big2, big);
    hfree(a);
    void *a2 = hmalloc(700);
    assert_ptr_equal(a2, a);
    assert_int_equal(hstat("num_host_alloc"), allocs);
    if (tu_emulated())
        assert_int_equal(tu_call_count("cuMemHostAlloc"), calls);
    assert_int_equal(((unsigned char *)b)[0], 2);

    /* Merges: m1 and m2 freed give back a whole segment to empty_cache. */
    hfree(m1);
    hfree(m2);
    assert_int_equal(xseg_host_empty_cache(), XSEG_SUCCESS);
    assert_int_equal(hstat("segment.current"), 2);
    assert_int_equal(hstat("num_host_free"), 1);
    hfree(a2);
    hfree(b);
    hfree(c);
    hfree(big2);
    assert_int_equal(hstat("allocated_bytes.peak"), (int64_t)(2048 + 100 * MiB + 512 + 6 * MiB));
    assert_host_empty();
    assert_int_equal(hstat("num_host_free"), 3);
    assert_int_equal(hstat("host_alloc_time.count"), 3);
    /* xseg_shutdown gives the free cached pinned memory back too. */
    hfree(hmalloc(5000));
    assert_int_equal(hstat("segment.current"), 1);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    assert_int_equal(hstat("segment.current"), 0);
    if (tu_emulated())
        assert_int_equal(tu_host_live(NULL), 0);
}

/* Every key of torch.cuda.host_memory_stats() is there; an unknown key is an error naming it. */
static void test_host_stats_keys(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    static const char *const want[] = {
        "allocation.current",     "allocation.peak",      "allocation.allocated",      "allocation.freed",
        "segment.current",        "segment.peak",         "segment.allocated",         "segment.freed",
        "allocated_bytes.current", "allocated_bytes.peak", "allocated_bytes.allocated", "allocated_bytes.freed",
        "reserved_bytes.current", "reserved_bytes.peak",  "reserved_bytes.allocated",  "reserved_bytes.freed",
        "host_alloc_time.total",  "host_alloc_time.max",  "host_alloc_time.min",       "host_alloc_time.count",
        "host_alloc_time.avg",    "host_free_time.total", "host_free_time.max",        "host_free_time.min",
        "host_free_time.count",   "host_free_time.avg",   "num_host_alloc",            "num_host_free"};
    size_t n = 0;
    const char *k;
    for (; xseg_host_stat_key(n, &k) == XSEG_SUCCESS && k; n++) {
        bool found = false;
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            found = found || !strcmp(want[i], k);
        if (!found)
            fail_msg("unexpected key %s", k);
        (void)hstat(k);
    }
    assert_int_equal(n, sizeof want / sizeof want[0]);
    int64_t v;
    assert_int_equal(xseg_host_stat("allocation.all.current", &v), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "allocation.all.current"));
    assert_int_equal(xseg_host_stat(NULL, &v), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_host_stat_key(0, NULL), XSEG_ERROR_INVALID_VALUE);
}

/* The resets, as PyTorch's: peaks become the current values (durations' max 0); the accumulated
 * figures (counts, durations' totals, driver calls) become 0 while current values stay. */
static void test_host_stats_reset(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    void *a = hmalloc(3 * MiB), *b = hmalloc(1000);
    hfree(a);
    assert_int_equal(hstat("allocated_bytes.peak"), 3 * MiB + 1024);
    assert_int_equal(xseg_host_reset_peak_stats(), XSEG_SUCCESS);
    assert_int_equal(hstat("allocated_bytes.peak"), 1024);
    assert_int_equal(hstat("allocation.peak"), 1);
    assert_int_equal(hstat("segment.peak"), hstat("segment.current"));
    assert_int_equal(hstat("host_alloc_time.max"), 0);
    assert_int_equal(hstat("allocation.allocated"), 2);
    assert_true(hstat("num_host_alloc") > 0 && hstat("host_alloc_time.count") > 0);
    assert_int_equal(xseg_host_reset_accumulated_stats(), XSEG_SUCCESS);
    static const char *const zero[] = {"allocation.allocated",    "allocation.freed",      "segment.allocated",
                                       "allocated_bytes.freed",   "reserved_bytes.allocated", "host_alloc_time.count",
                                       "host_alloc_time.total",   "host_free_time.count",  "num_host_alloc",
                                       "num_host_free"};
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++)
        assert_int_equal(hstat(zero[i]), 0);
    assert_int_equal(hstat("allocation.current"), 1);
    assert_int_equal(hstat("allocated_bytes.current"), 1024);
    assert_int_equal(hstat("allocated_bytes.peak"), 1024);
    hfree(b);
    assert_int_equal(hstat("allocation.freed"), 1);
    assert_host_empty();
}

/* A block used on a stream is not reused (nor its segment released) before the stream's work up
 * to the free is done; then it returns, merged. */
static void test_host_record_stream(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    if (!tu_emulated())
        skip();
    tu_ctx_set();
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    assert_true(tu_stream_hold(s));
    assert_true(tu_stream_work(s)); /* a copy from the block, still running */
    void *p = hmalloc(4 * MiB);
    assert_int_equal(xseg_host_record_stream(p, 0, s), XSEG_SUCCESS);
    assert_int_equal(xseg_host_record_stream(p, 0, s), XSEG_SUCCESS); /* once is enough */
    unsigned long rec = tu_call_count("cuEventRecord");
    hfree(p);
    assert_int_equal(tu_call_count("cuEventRecord"), rec + 1);
    assert_int_equal(hstat("allocation.current"), 0);
    /* Pending: a malloc of its size takes other memory, empty_cache keeps its segment. */
    void *q = hmalloc(4 * MiB);
    assert_ptr_not_equal(q, p);
    hfree(q);
    assert_int_equal(xseg_host_empty_cache(), XSEG_SUCCESS);
    assert_int_equal(hstat("segment.current"), 1);
    /* Done: the block returns and the segment goes. */
    assert_true(tu_stream_release(s));
    assert_int_equal(xseg_host_empty_cache(), XSEG_SUCCESS);
    assert_int_equal(hstat("segment.current"), 0);
    tu_assert_cu(drv->cuStreamDestroy(s));
    assert_host_empty();
}

/* pinned_use_background_threads:True: a thread returns the blocks whose events completed, so a
 * malloc that finds the block cached makes no event query; the thread's queries are counted. */
static void test_host_background_thread(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("pinned_use_background_threads:True");
    if (!tu_emulated())
        skip();
    tu_ctx_set();
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *p = hmalloc(4 * MiB);
    assert_int_equal(xseg_host_record_stream(p, 0, s), XSEG_SUCCESS);
    /* The stream is idle: the event completes at once, and the thread's next pass (no xseg call
     * in between) queries it and returns the block. */
    unsigned long q0 = tu_call_count("cuEventQuery");
    hfree(p);
    for (int i = 0; i < 5000 && tu_call_count("cuEventQuery") == q0; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    assert_true(tu_call_count("cuEventQuery") > q0);
    unsigned long allocs = tu_call_count("cuMemHostAlloc");
    unsigned long q1 = tu_call_count("cuEventQuery");
    void *w = hmalloc(20 * MiB); /* the whole segment: the block came back, merged */
    assert_ptr_equal(w, p);
    assert_int_equal(tu_call_count("cuMemHostAlloc"), allocs);
    assert_int_equal(tu_call_count("cuEventQuery"), q1); /* the malloc queried nothing */
    hfree(w);
    assert_int_equal(xseg_set_config("pinned_use_background_threads:False"), XSEG_SUCCESS);
    tu_assert_cu(drv->cuStreamDestroy(s));
    assert_host_empty();
}

/* pinned_use_cuda_host_register:True: pages from the host, pinned with cuMemHostRegister after
 * pinned_num_register_threads threads fault them in; unregistered when given back. */
static void test_host_register(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("pinned_use_cuda_host_register:True,pinned_num_register_threads:4");
    char cfg[2048];
    size_t len;
    assert_int_equal(xseg_get_config(cfg, sizeof cfg, &len), XSEG_SUCCESS);
    assert_non_null(strstr(cfg, "pinned_use_cuda_host_register:True"));
    assert_non_null(strstr(cfg, "pinned_num_register_threads:4"));
    unsigned long ha = tu_call_count("cuMemHostAlloc");
    void *p = hmalloc(32 * MiB);
    memset(p, 7, 32 * MiB);
    if (tu_emulated()) {
        assert_int_equal(tu_call_count("cuMemHostRegister"), 1);
        assert_int_equal(tu_call_count("cuMemHostAlloc"), ha);
        assert_int_equal(tu_host_live(NULL), 1);
    }
    hfree(p);
    assert_host_empty();
    if (tu_emulated())
        assert_int_equal(tu_call_count("cuMemHostUnregister"), 1);
}

/* Each driver call of the host allocator fails in turn: a clear error, nothing held, and the
 * next call works. */
static void test_host_faults(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    if (!tu_emulated())
        skip();
    tu_ctx_set();
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static const struct {
        const char *entry, *config;
        CUresult r;
    } cases[] = {
        {"cuMemHostAlloc", "pinned_use_cuda_host_register:False", CUDA_ERROR_OUT_OF_MEMORY},
        {"cuMemHostAlloc", "pinned_use_cuda_host_register:False", CUDA_ERROR_UNKNOWN},
        {"cuMemHostRegister", "pinned_use_cuda_host_register:True", CUDA_ERROR_OUT_OF_MEMORY},
        {"cuMemHostRegister", "pinned_use_cuda_host_register:True", CUDA_ERROR_UNKNOWN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(xseg_set_config(cases[i].config), XSEG_SUCCESS);
        unsigned long fired = tu_fail_fired();
        assert_true(tu_fail(cases[i].entry, 1, cases[i].r));
        void *p = (void *)1;
        xseg_status st = xseg_host_malloc(&p, 3 * MiB);
        assert_int_equal(st, cases[i].r == CUDA_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_OUT_OF_MEMORY : XSEG_ERROR_DRIVER);
        assert_null(p);
        assert_non_null(strstr(xseg_last_error(), cases[i].entry));
        assert_non_null(strstr(xseg_last_error(), "3145728 bytes"));
        tu_fail_clear();
        tu_assert_fired_n(fired, 1, "host malloc: %s", cases[i].entry);
        assert_int_equal(hstat("segment.current"), 0);
        assert_int_equal(tu_host_live(NULL), 0);
        p = hmalloc(3 * MiB);
        hfree(p);
        assert_host_empty();
    }
    /* The free's event calls: without an event, the free waits for the stream instead; the block
     * returns at once either way and nothing leaks. */
    static const char *const ev_entries[] = {"cuEventCreate", "cuEventRecord"};
    for (size_t i = 0; i < 2; i++) {
        void *p = hmalloc(4096);
        assert_int_equal(xseg_host_record_stream(p, 0, s), XSEG_SUCCESS);
        unsigned long fired = tu_fail_fired();
        assert_true(tu_fail(ev_entries[i], 1, CUDA_ERROR_UNKNOWN));
        hfree(p);
        tu_fail_clear();
        tu_assert_fired_n(fired, 1, "host free: %s", ev_entries[i]);
        assert_host_empty();
    }
    /* Out of pinned memory with a free segment cached: it is given back and the malloc tried once
     * more; when that fails too, the message says so after the driver's. */
    assert_int_equal(xseg_set_config("pinned_use_cuda_host_register:False"), XSEG_SUCCESS);
    hfree(hmalloc(3 * MiB)); /* a 20 MiB segment, cached whole and free */
    assert_int_equal(hstat("segment.current"), 1);
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY));
    assert_true(tu_fail("cuMemHostAlloc", 2, CUDA_ERROR_OUT_OF_MEMORY));
    void *p = (void *)1;
    assert_int_equal(xseg_host_malloc(&p, 30 * MiB), XSEG_ERROR_OUT_OF_MEMORY);
    tu_fail_clear();
    tu_assert_fired_n(fired, 2, "host malloc and its retry");
    assert_null(p);
    assert_non_null(strstr(xseg_last_error(), "cuMemHostAlloc"));
    assert_non_null(strstr(xseg_last_error(), "(after giving back every free cached segment)"));
    assert_int_equal(hstat("segment.current"), 0);
    assert_host_empty();
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* Misuse: a clear error naming the argument, nothing changes, the allocator stays usable. */
static void test_host_errors(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    assert_int_equal(xseg_host_malloc(NULL, 1), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "ptr is NULL"));
    void *p = (void *)1;
    assert_int_equal(xseg_host_malloc(&p, SIZE_MAX), XSEG_ERROR_OUT_OF_MEMORY);
    assert_null(p);
    char local[64];
    assert_int_equal(xseg_host_free(local), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "not a block of xseg's host allocator"));
    void *a = hmalloc(100);
    assert_int_equal(xseg_host_free((char *)a + 8), XSEG_ERROR_INVALID_VALUE); /* interior */
    assert_int_equal(xseg_host_record_stream(local, 0, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_host_record_stream(a, 99, NULL), XSEG_ERROR_INVALID_DEVICE);
    hfree(a);
    assert_int_equal(xseg_host_free(a), XSEG_ERROR_INVALID_VALUE); /* twice */
    assert_non_null(strstr(xseg_last_error(), "freed already"));
    assert_int_equal(xseg_host_free(NULL), XSEG_SUCCESS);
    /* Device memory is not host memory. */
    void *d = tu_malloc(4096, NULL);
    assert_int_equal(xseg_host_free(d), XSEG_ERROR_INVALID_VALUE);
    tu_free(d);
    assert_int_equal(xseg_set_config("pinned_num_register_threads:3"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "power of 2"));
    hfree(hmalloc(100));
    assert_host_empty();
}

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "8G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_basic),           cmocka_unit_test(test_host_stats_keys),
        cmocka_unit_test(test_host_stats_reset),
        cmocka_unit_test(test_host_record_stream),   cmocka_unit_test(test_host_background_thread),
        cmocka_unit_test(test_host_register),        cmocka_unit_test(test_host_faults),
        cmocka_unit_test(test_host_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
