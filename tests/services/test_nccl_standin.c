/*
 * NCCL's user-buffer registration through the ledger (issue 76 item 6, xseg_nccl_register), on
 * cudaemu with a stand-in NCCL (tests/services/nccl_standin.h): a library that exports NCCL's
 * ncclCommRegister / ncclCommDeregister / ncclGetErrorString, retains the allocation handle behind
 * every granule it registers and maps those chunks at addresses of its own, as NCCL does with cuMem
 * memory, and checks at deregistration that no handle changed. Through the public API:
 *   - register: a block's range; empty_cache, trim, out-of-memory spill and defragmentation leave
 *     it, a sleep of its pool and xseg_shutdown are refused naming it, a free inside it keeps its
 *     pages; bytes read through the stand-in's mapping are the program's; deregistered, every
 *     action proceeds;
 *   - pool: every segment of a private pool at the call (PyTorch's register_mem_pool), later growth
 *     not registered;
 *   - faults: NCCL's error, a driver call of NCCL failing, a failure on the second segment of a
 *     pool, a refused deregistration: nothing left behind, or the registration kept whole;
 *   - errors: NULL arguments, memory xseg did not allocate, pages not mapped, unknown or foreign
 *     handles, a second deregistration, no NCCL loaded;
 *   - classic, classic_pool: cuMemAlloc segments (expandable_segments:False): a registered one is
 *     never freed (empty_cache, trim, release_threshold_mb, the out-of-memory ladder,
 *     xseg_release_pool) until deregistered; shutdown refused; a range past its segment's end
 *     refused; NCCL's failure leaves nothing held.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "tests/common/testutil.h"
#include "tests/services/fixture.h"
#include "tests/services/nccl_standin.h"
#include "xseg.h"

static const xseg_pool_id POOL0 = {0, 0};

static size_t active(void)
{
    xseg_registration_stats s;
    assert_int_equal(xseg_registration_stats_get(0, &s), XSEG_SUCCESS);
    return s.active;
}

static void must_contain(const char *what)
{
    if (!strstr(xseg_last_error(), what))
        fail_msg("expected \"%s\" in: %s", what, xseg_last_error());
}

/* Load the stand-in as PyTorch loads libnccl (local symbols) and name it to xseg. */
static void load_nccl(void)
{
    setenv("XSEG_NCCL_LIBRARY", NCCL_STANDIN, 1);
    if (!dlopen(NCCL_STANDIN, RTLD_NOW | RTLD_LOCAL))
        fail_msg("dlopen(%s): %s", NCCL_STANDIN, dlerror());
}

static void comm_init(struct standin_comm *c)
{
    memset(c, 0, sizeof *c);
    c->drv = drv;
}

/* Write one page of @p addr with @p v through xseg's address; the stand-in reads it through its own. */
static void write_read(const struct standin_comm *c, uintptr_t addr, uint8_t v)
{
    uint8_t want[4096], seen[4096];
    tu_assert_cu(drv->cuMemsetD8((CUdeviceptr)addr, v, sizeof want));
    memset(want, v, sizeof want);
    memset(seen, 0, sizeof seen);
    if (!standin_read(c, addr, seen, sizeof seen))
        fail_msg("the stand-in NCCL registered nothing holding %#lx", (unsigned long)addr);
    if (memcmp(want, seen, sizeof seen))
        fail_msg("the stand-in NCCL read %#x at %#lx, the program wrote %#x", seen[0], (unsigned long)addr, v);
}

static void *try_malloc(size_t size)
{
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, size, 0, NULL);
    if (st != XSEG_SUCCESS && st != XSEG_ERROR_OUT_OF_MEMORY)
        fail_msg("xseg_malloc(%zu): %s", size, xseg_last_error());
    return st == XSEG_SUCCESS ? p : NULL;
}

static void test_nccl_register(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False,spill_to_host:True,"
                         "expandable_segments_defrag:True,expandable_chunk_mb:20");
    tu_ctx_set();
    struct standin_comm c;
    comm_init(&c);
    uintptr_t a = (uintptr_t)tu_malloc(40 * MiB, NULL);
    void *b = tu_malloc(10 * MiB, NULL);
    void *h = NULL;
    unsetenv("XSEG_NCCL_LIBRARY"); /* nothing loaded yet: refused, nothing made */
    assert_int_equal(xseg_nccl_register(&c, (void *)a, 40 * MiB, &h), XSEG_ERROR_NOT_SUPPORTED);
    must_contain("no NCCL is loaded");
    setenv("XSEG_NCCL_LIBRARY", NCCL_STANDIN, 1);
    assert_int_equal(xseg_nccl_register(&c, (void *)a, 40 * MiB, &h), XSEG_ERROR_NOT_SUPPORTED);
    must_contain("is not loaded in this process");
    assert_int_equal(active(), 0);
    load_nccl();

    if (xseg_nccl_register(&c, (void *)a, 40 * MiB, &h) != XSEG_SUCCESS)
        fail_msg("xseg_nccl_register: %s", xseg_last_error());
    assert_non_null(h);
    assert_int_equal(c.live, 1);
    assert_int_equal(active(), 1);
    write_read(&c, a, 1);
    write_read(&c, a + 40 * MiB - 4096, 2);

    /* The cache's reclaim: nothing of the range to give, nothing asked. */
    tu_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    /* A sleep of its pool, and shutdown: refused, naming the registration. */
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_ILLEGAL_STATE);
    must_contain("xseg_nccl_register");
    assert_int_equal(xseg_shutdown(), XSEG_ERROR_ILLEGAL_STATE);
    must_contain("xseg_nccl_register");
    write_read(&c, a + 20 * MiB, 3);
    /* Out of memory with the range declared cold and defragmentation on: spill and defrag skip it. */
    assert_int_equal(xseg_spill_hint((void *)a, XSEG_SPILL_COLD), XSEG_SUCCESS);
    void *cold = try_malloc(30 * MiB);
    if (cold)
        assert_int_equal(xseg_spill_hint(cold, XSEG_SPILL_COLD), XSEG_SUCCESS);
    int64_t spilled = 0; /* other cold blocks may move: printed, the range's own pages are checked */
    unsigned oom = 0;
    for (int i = 0; i < 4; i++) {
        void *big = try_malloc((size_t)(160 + 40 * i) * MiB);
        int64_t sp = tu_stat("spilled_bytes.all.current");
        spilled = sp > spilled ? sp : spilled;
        oom += !big;
        if (big)
            tu_free(big);
    }
    print_message("out of memory %u of 4, at most %lld bytes spilled\n", oom, (long long)spilled);
    assert_int_equal(xseg_spill_hint((void *)a, XSEG_SPILL_NONE), XSEG_SUCCESS);
    write_read(&c, a + 8 * MiB, 4);
    if (cold)
        tu_free(cold);

    /* A free inside the range: the block goes, the pages stay registered (and mapped). */
    tu_free((void *)a);
    assert_int_equal(xseg_empty_cache(0), XSEG_ERROR_ILLEGAL_STATE);
    must_contain("xseg_nccl_register");
    assert_true(tu_stat("reserved_bytes.all.current") >= (int64_t)(40 * MiB));
    uint8_t seen[4096];
    assert_true(standin_read(&c, a + 12 * MiB, seen, sizeof seen)); /* its pages still readable */

    /* Deregistered: NCCL let go of the handles it retained, unchanged; every action proceeds. */
    if (xseg_nccl_deregister(&c, h) != XSEG_SUCCESS)
        fail_msg("xseg_nccl_deregister: %s", xseg_last_error());
    assert_int_equal(c.live, 0);
    assert_int_equal(c.deregisters, 1);
    assert_int_equal(c.handle_changes, 0);
    assert_int_equal(active(), 0);
    assert_int_equal(xseg_nccl_deregister(&c, h), XSEG_ERROR_INVALID_VALUE); /* a second time */
    must_contain("unknown handle");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    void *d = tu_malloc(20 * MiB, NULL);
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, POOL0), XSEG_SUCCESS);
    tu_free(d);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
}

/* PyTorch's register_mem_pool: the segments of a private pool as they are now, under one handle. */
static void test_nccl_pool(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False,expandable_chunk_mb:20");
    tu_ctx_set();
    load_nccl();
    struct standin_comm c;
    comm_init(&c);
    CUstream s2;
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    void *h = NULL;
    size_t n = 99;
    assert_int_equal(xseg_nccl_register_pool(&c, 0, pool, &h, &n), XSEG_SUCCESS); /* maps nothing yet */
    assert_null(h);
    assert_int_equal(n, 0);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    uintptr_t p1 = (uintptr_t)tu_malloc(30 * MiB, NULL);
    void *p2 = tu_malloc(8 * MiB, NULL);
    uintptr_t p3 = (uintptr_t)tu_malloc(24 * MiB, s2); /* another stream: another segment */
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    tu_free(p2);
    void *other = tu_malloc(20 * MiB, NULL); /* the default pool's: not registered */

    if (xseg_nccl_register_pool(&c, 0, pool, &h, &n) != XSEG_SUCCESS)
        fail_msg("xseg_nccl_register_pool: %s", xseg_last_error());
    assert_non_null(h);
    assert_true(n >= 2);
    assert_int_equal(c.live, n);
    assert_int_equal(active(), n);
    write_read(&c, p1, 5);
    write_read(&c, p3 + 24 * MiB - 4096, 6);
    uint8_t seen[4096];
    assert_false(standin_read(&c, (uintptr_t)other, seen, sizeof seen));

    assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_ILLEGAL_STATE);
    must_contain("xseg_nccl_register");
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS); /* another pool sleeps */
    assert_int_equal(xseg_wake(0, POOL0), XSEG_SUCCESS);
    (void)xseg_empty_cache(0); /* the freed block's pages are registered: they stay */
    (void)xseg_trim(0, 0);
    write_read(&c, p1 + 29 * MiB, 7);

    /* Growth after the call is not registered (PyTorch registers the snapshot's segments). */
    unsigned before = c.registers;
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *p4 = tu_malloc(60 * MiB, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(c.registers, before);
    assert_int_equal(active(), n);

    if (xseg_nccl_deregister(&c, h) != XSEG_SUCCESS)
        fail_msg("xseg_nccl_deregister: %s", xseg_last_error());
    assert_int_equal(c.live, 0);
    assert_int_equal(c.handle_changes, 0);
    assert_int_equal(active(), 0);
    assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, pool), XSEG_SUCCESS);
    tu_free((void *)p1);
    tu_free((void *)p3);
    tu_free(p4);
    tu_free(other);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
}

/* Failures on either side leave nothing behind, or keep the registration whole. */
static void test_nccl_faults(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False,expandable_chunk_mb:20");
    tu_ctx_set();
    load_nccl();
    struct standin_comm c;
    comm_init(&c);
    void *a = tu_malloc(40 * MiB, NULL);
    void *h = NULL;

    c.fail_register = STANDIN_CUDA_ERROR; /* NCCL's own error: no ledger entry stays */
    assert_int_equal(xseg_nccl_register(&c, a, 40 * MiB, &h), XSEG_ERROR_DRIVER);
    must_contain("stand-in: a driver call failed");
    assert_null(h);
    assert_int_equal(active(), 0);
    assert_int_equal(c.live, 0);

    if (tu_emulated()) { /* a driver call NCCL makes fails: it undoes its part, xseg its own */
        for (const char *entry = "cuMemRetainAllocationHandle"; entry; entry = entry[5] == 'R' ? "cuMemMap" : NULL) {
            assert_true(tu_fail(entry, 1, CUDA_ERROR_OUT_OF_MEMORY));
            assert_int_equal(xseg_nccl_register(&c, a, 40 * MiB, &h), XSEG_ERROR_DRIVER);
            tu_fail_clear();
            assert_int_equal(active(), 0);
            assert_int_equal(c.live, 0);
        }
    }
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS); /* nothing held the pool */
    assert_int_equal(xseg_wake(0, POOL0), XSEG_SUCCESS);

    /* A pool of two segments, NCCL failing on the second: the first is deregistered again. */
    CUstream s2;
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *p1 = tu_malloc(20 * MiB, NULL);
    void *p2 = tu_malloc(20 * MiB, s2);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    c.fail_register = STANDIN_INTERNAL_ERROR;
    c.fail_skip = 1;
    size_t n = 7;
    assert_int_equal(xseg_nccl_register_pool(&c, 0, pool, &h, &n), XSEG_ERROR_DRIVER);
    assert_null(h);
    assert_int_equal(n, 0);
    assert_int_equal(c.registers, 1); /* one made, then undone */
    assert_int_equal(c.deregisters, 1);
    assert_int_equal(c.live, 0);
    assert_int_equal(active(), 0);

    /* NCCL refuses a deregistration: the registration stays whole (the pool stays awake). */
    assert_int_equal(xseg_nccl_register_pool(&c, 0, pool, &h, &n), XSEG_SUCCESS);
    assert_int_equal(c.live, n);
    c.fail_deregister = STANDIN_INVALID_USAGE;
    assert_int_equal(xseg_nccl_deregister(&c, h), XSEG_ERROR_DRIVER);
    must_contain("stays registered");
    assert_int_equal(active(), 1);
    assert_int_equal(c.live, 1);
    assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_ILLEGAL_STATE);
    assert_int_equal(xseg_nccl_deregister(&c, h), XSEG_SUCCESS); /* the retry finishes it */
    assert_int_equal(active(), 0);
    assert_int_equal(c.live, 0);
    assert_int_equal(c.handle_changes, 0);
    assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, pool), XSEG_SUCCESS);
    tu_free(p1);
    tu_free(p2);
    tu_free(a);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
}

static void test_nccl_errors(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_chunk_mb:20");
    tu_ctx_set();
    load_nccl();
    struct standin_comm c, c2;
    comm_init(&c);
    comm_init(&c2);
    uint8_t *a = tu_malloc(20 * MiB, NULL);
    void *h = NULL, *h2 = NULL;
    assert_int_equal(xseg_nccl_register(NULL, a, MiB, &h), XSEG_ERROR_INVALID_VALUE);
    must_contain("comm is NULL");
    assert_int_equal(xseg_nccl_register(&c, NULL, MiB, &h), XSEG_ERROR_INVALID_VALUE);
    must_contain("ptr is NULL");
    assert_int_equal(xseg_nccl_register(&c, a, 0, &h), XSEG_ERROR_INVALID_VALUE);
    must_contain("size is 0");
    assert_int_equal(xseg_nccl_register(&c, a, MiB, NULL), XSEG_ERROR_INVALID_VALUE);
    must_contain("handle is NULL");
    assert_int_equal(xseg_nccl_register(&c, &c, sizeof c, &h), XSEG_ERROR_INVALID_VALUE);
    must_contain("not inside one segment of xseg");
    assert_int_equal(xseg_nccl_register(&c, a, 200 * MiB, &h), XSEG_ERROR_INVALID_VALUE); /* past what is mapped */
    must_contain("not all mapped");
    assert_int_equal(active(), 0);
    assert_int_equal(c.registers, 0);

    assert_int_equal(xseg_nccl_register(&c, a + MiB, 2 * MiB, &h), XSEG_SUCCESS); /* part of a block */
    assert_int_equal(xseg_nccl_register(&c, a + MiB, 2 * MiB, &h2), XSEG_SUCCESS); /* again: its own handle */
    assert_ptr_not_equal(h, h2);
    assert_int_equal(c.live, 1); /* NCCL's cache holds one, referenced twice */
    assert_int_equal(active(), 2);
    assert_int_equal(xseg_nccl_deregister(NULL, h), XSEG_ERROR_INVALID_VALUE);
    must_contain("comm is NULL");
    assert_int_equal(xseg_nccl_deregister(&c, NULL), XSEG_ERROR_INVALID_VALUE);
    must_contain("handle is NULL");
    assert_int_equal(xseg_nccl_deregister(&c, (void *)(uintptr_t)0x7777), XSEG_ERROR_INVALID_VALUE);
    must_contain("unknown handle");
    assert_int_equal(xseg_nccl_deregister(&c2, h), XSEG_ERROR_INVALID_VALUE);
    must_contain("registered with comm");
    assert_int_equal(xseg_nccl_deregister(&c, h), XSEG_SUCCESS);
    assert_int_equal(xseg_nccl_deregister(&c, h), XSEG_ERROR_INVALID_VALUE);
    must_contain("unknown handle");
    assert_int_equal(c.live, 1);
    assert_int_equal(xseg_nccl_deregister(&c, h2), XSEG_SUCCESS);
    assert_int_equal(c.live, 0);

    xseg_pool_id nopool = {12345, 678};
    size_t n = 0;
    h = &c;
    n = 3;
    assert_int_equal(xseg_nccl_register_pool(&c, 0, nopool, &h, &n), XSEG_SUCCESS); /* maps nothing here */
    assert_null(h);
    assert_int_equal(n, 0);
    assert_int_equal(xseg_nccl_register_pool(&c, -1, POOL0, &h, &n), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(xseg_nccl_register_pool(NULL, 0, POOL0, &h, &n), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(active(), 0);
    tu_free(a);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
}

/* Classic (cuMemAlloc) segments: their pages never move, so a registration only holds its segment
 * off every release (cuMemFree) until deregistered; the stand-in registers the allocation itself. */
static void test_nccl_classic(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False,release_threshold_mb:0");
    tu_ctx_set();
    load_nccl();
    struct standin_comm c;
    comm_init(&c);
    uintptr_t a = (uintptr_t)tu_malloc(20 * MiB, NULL); /* a segment of its own, 20 MiB */
    void *b = tu_malloc(20 * MiB, NULL);                 /* another, not registered */
    void *h = NULL;
    size_t n = 0;

    /* Still refused: a range running past its segment's end; nothing made, NCCL not called. */
    assert_int_equal(xseg_nccl_register(&c, (void *)(a + 10 * MiB), 20 * MiB, &h), XSEG_ERROR_INVALID_VALUE);
    must_contain("past the end of its classic");
    assert_null(h);
    assert_int_equal(c.registers, 0);
    assert_int_equal(active(), 0);

    if (xseg_nccl_register(&c, (void *)a, 20 * MiB, &h) != XSEG_SUCCESS)
        fail_msg("xseg_nccl_register: %s", xseg_last_error());
    assert_non_null(h);
    assert_int_equal(c.live, 1);
    assert_int_equal(active(), 1);
    write_read(&c, a, 1);
    write_read(&c, a + 20 * MiB - 4096, 2);

    /* Freed, then every release: the registered segment stays cached (reserved), the other goes. */
    tu_free((void *)a);
    tu_free(b);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(40 * MiB));
    unsigned long frees = tu_call_count("cuMemFree");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(20 * MiB));
    if (tu_emulated())
        assert_int_equal(tu_call_count("cuMemFree"), frees + 1);
    frees = tu_call_count("cuMemFree");
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(20 * MiB));
    /* release_threshold_mb:0: a miss gives every cached segment back, but this one. */
    void *m = tu_malloc(30 * MiB, NULL);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(50 * MiB));
    assert_int_equal(tu_call_count("cuMemFree"), frees);
    tu_free(m);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* m's segment goes */
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(20 * MiB));
    frees = tu_call_count("cuMemFree");
    /* Out of memory (320 MiB emulated): the ladder's release rungs skip it too. */
    if (tu_emulated())
        assert_null(try_malloc(310 * MiB));
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(20 * MiB));
    assert_int_equal(tu_call_count("cuMemFree"), frees);
    write_read(&c, a + 8 * MiB, 3); /* the stand-in reads the current bytes */
    /* Classic pools never sleep; shutdown is refused naming the registration, as for expandable. */
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_NOT_SUPPORTED);
    assert_int_equal(xseg_shutdown(), XSEG_ERROR_ILLEGAL_STATE);
    must_contain("xseg_nccl_register");
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(20 * MiB));

    /* Deregistered: NCCL found its allocation alive throughout; the next empty_cache frees it. */
    if (xseg_nccl_deregister(&c, h) != XSEG_SUCCESS)
        fail_msg("xseg_nccl_deregister: %s", xseg_last_error());
    assert_int_equal(c.live, 0);
    assert_int_equal(c.handle_changes, 0);
    assert_int_equal(active(), 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    if (tu_emulated())
        assert_int_equal(tu_call_count("cuMemFree"), frees + 1);

    /* NCCL's error: no entry stays, the segment is releasable again. */
    a = (uintptr_t)tu_malloc(20 * MiB, NULL);
    c.fail_register = STANDIN_CUDA_ERROR;
    assert_int_equal(xseg_nccl_register(&c, (void *)a, 20 * MiB, &h), XSEG_ERROR_DRIVER);
    must_contain("stand-in: a driver call failed");
    assert_null(h);
    assert_int_equal(active(), 0);
    assert_int_equal(c.live, 0);
    tu_free((void *)a);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(xseg_nccl_register_pool(&c, 0, POOL0, &h, &n), XSEG_SUCCESS); /* nothing mapped: none */
    assert_null(h);
    assert_int_equal(n, 0);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
}

/* A private pool of classic segments: one registration per segment, each held off release (also
 * past xseg_release_pool) until deregistered; NCCL failing on the second leaves none. */
static void test_nccl_classic_pool(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    tu_ctx_set();
    load_nccl();
    struct standin_comm c;
    comm_init(&c);
    CUstream s2;
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    uintptr_t p1 = (uintptr_t)tu_malloc(20 * MiB, NULL);
    uintptr_t p2 = (uintptr_t)tu_malloc(12 * MiB, s2);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    void *other = tu_malloc(20 * MiB, NULL); /* the default pool's: not registered */
    void *h = NULL;
    size_t n = 0;

    /* NCCL failing on the second segment: the first is deregistered again, nothing stays. */
    c.fail_register = STANDIN_INTERNAL_ERROR;
    c.fail_skip = 1;
    assert_int_equal(xseg_nccl_register_pool(&c, 0, pool, &h, &n), XSEG_ERROR_DRIVER);
    assert_null(h);
    assert_int_equal(n, 0);
    assert_int_equal(active(), 0);
    assert_int_equal(c.live, 0);

    if (xseg_nccl_register_pool(&c, 0, pool, &h, &n) != XSEG_SUCCESS)
        fail_msg("xseg_nccl_register_pool: %s", xseg_last_error());
    assert_non_null(h);
    assert_int_equal(n, 2);
    assert_int_equal(c.live, 2);
    assert_int_equal(active(), 2);
    write_read(&c, p1, 5);
    write_read(&c, p2 + 12 * MiB - 4096, 6);
    uint8_t seen[4096];
    assert_false(standin_read(&c, (uintptr_t)other, seen, sizeof seen));

    tu_free((void *)p1);
    tu_free((void *)p2);
    tu_free(other);
    unsigned long frees = tu_call_count("cuMemFree");
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS); /* no user: its cache would go */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(32 * MiB)); /* other's 20 MiB went */
    if (tu_emulated())
        assert_int_equal(tu_call_count("cuMemFree"), frees + 1);
    write_read(&c, p2, 7);

    if (xseg_nccl_deregister(&c, h) != XSEG_SUCCESS)
        fail_msg("xseg_nccl_deregister: %s", xseg_last_error());
    assert_int_equal(c.live, 0);
    assert_int_equal(c.handle_changes, 0);
    assert_int_equal(active(), 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
}

int main(int argc, char **argv)
{
    static const struct tu_named_test all[] = {
        TU_NAMED(test_nccl_register), TU_NAMED(test_nccl_pool), TU_NAMED(test_nccl_faults),
        TU_NAMED(test_nccl_errors), TU_NAMED(test_nccl_classic), TU_NAMED(test_nccl_classic_pool),
    };
    setenv("CUDAEMU_TOTAL_MEM", "320M", 0); /* out of memory within reach: spill and defrag get their turn */
    return tu_run_named("test_nccl_standin", all, sizeof all / sizeof *all, argc, argv);
}
