/*
 * Ranges xseg hands to another party enter the registration ledger by themselves (issue 76 item
 * 3, docs/registrations.md "Ranges xseg registers itself"), through the public API on cudaemu:
 *   - a dma-buf of a range (xseg_range_dmabuf, CUDAEMU_DMA_BUF=1): in the ledger while its
 *     descriptor is open and the blocks under it live; a sleep of its pool is refused naming it;
 *   - an IPC export (xseg_ipc_export): in the ledger until the block's free;
 *   - register_blocks_above_mb: every live block at least that large, from malloc to free;
 *     smaller blocks stay out; a host allocation failure for the entry fails the malloc with
 *     nothing held.
 * Each fails on 531c8c7 (no entry appears: xseg_registration_stats_get's active stays 0, and the
 * config key is unknown there).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "base/hostmem.h"
#include "tests/common/testutil.h"
#include "tests/services/fixture.h"
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

/* A dma-buf handed out puts its range in the ledger; the pool does not sleep under it; closing
 * the descriptor ends it (the next action sees that), and so does the free of the block. */
static void test_ledger_own_dmabuf(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False");
    void *a = tu_malloc(60 * MiB, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)a, 60 * MiB, 7));
    int fd = -1;
    size_t off = 0;
    assert_int_equal(active(), 0);
    xseg_status st = xseg_range_dmabuf(a, 60 * MiB, &fd, &off);
    if (st == XSEG_ERROR_NOT_SUPPORTED) { /* a device without dma-buf export: nothing handed out */
        assert_int_equal(active(), 0);
        tu_free(a);
        skip();
    }
    assert_int_equal(st, XSEG_SUCCESS);
    assert_int_equal(active(), 1);
    /* The sleep meets a registrant that cannot be asked: refused, nothing changed. */
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_ILLEGAL_STATE);
    must_contain("xseg_range_dmabuf");
    assert_true(tu_check((CUdeviceptr)a, 60 * MiB, 7));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* a live block: nothing to ask */
    /* Closed: the entry goes at the next action that asks, and the pool sleeps. */
    close(fd);
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(active(), 0);
    assert_int_equal(xseg_wake(0, POOL0), XSEG_SUCCESS);
    assert_true(tu_check((CUdeviceptr)a, 60 * MiB, 7));
    /* A second one over part of it; the block's free ends it though the descriptor is open. */
    assert_int_equal(xseg_range_dmabuf((char *)a + 21 * MiB, 4 * MiB, &fd, &off), XSEG_SUCCESS);
    assert_int_equal(active(), 1);
    tu_free(a);
    assert_int_equal(active(), 0);
    close(fd);
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, POOL0), XSEG_SUCCESS);
}

/* The NIXL pattern of docs/registrations.md: the program registers the range too, closes the
 * dma-buf in before and takes a new one in after. Its sleeps go through however the entries are
 * ordered (the second cycle's dma-buf entry is newer than the program's). */
struct cycler {
    int fd;
    unsigned befores, afters;
};

static int cyc_before(const xseg_range_event *ev, void *ctx)
{
    struct cycler *c = ctx;
    c->befores++;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    (void)ev;
    return 0;
}

static int cyc_after(const xseg_range_event *ev, void *ctx)
{
    struct cycler *c = ctx;
    size_t off;
    c->afters++;
    return xseg_range_dmabuf(ev->ptr, ev->size, &c->fd, &off) == XSEG_SUCCESS ? 0 : 1;
}

static void test_ledger_own_dmabuf_cycles(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False");
    void *a = tu_malloc(40 * MiB, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)a, 40 * MiB, 9));
    struct cycler c = {-1, 0, 0};
    size_t off;
    xseg_status st = xseg_range_dmabuf(a, 40 * MiB, &c.fd, &off);
    if (st == XSEG_ERROR_NOT_SUPPORTED) {
        tu_free(a);
        skip();
    }
    assert_int_equal(st, XSEG_SUCCESS);
    xseg_range_callbacks cb = {cyc_before, cyc_after, 0};
    assert_int_equal(xseg_register_range(a, 40 * MiB, &cb, &c), XSEG_SUCCESS);
    for (int i = 0; i < 3; i++) {
        if (xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD) != XSEG_SUCCESS)
            fail_msg("cycle %d: xseg_sleep: %s", i, xseg_last_error());
        assert_int_equal(xseg_wake(0, POOL0), XSEG_SUCCESS);
        assert_true(c.fd >= 0);
        assert_int_equal(active(), 2); /* the program's and the new dma-buf's */
    }
    assert_int_equal(c.befores, 3);
    assert_int_equal(c.afters, 3);
    assert_true(tu_check((CUdeviceptr)a, 40 * MiB, 9));
    assert_int_equal(xseg_unregister_range(a, 40 * MiB, &c), XSEG_SUCCESS);
    close(c.fd);
    tu_free(a);
    assert_int_equal(active(), 0);
}

/* An IPC export is in the ledger until the block's free (not the handle's: the importer's
 * mapping outlives it). */
static void test_ledger_own_export(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False");
    void *a = tu_malloc(24 * MiB, NULL);
    xseg_ipc_handle *h = NULL;
    assert_int_equal(active(), 0);
    assert_int_equal(xseg_ipc_export(a, &h), XSEG_SUCCESS);
    assert_int_equal(active(), 1);
    xseg_ipc_handle *h2 = NULL;
    assert_int_equal(xseg_ipc_export(a, &h2), XSEG_SUCCESS); /* one entry a block */
    assert_int_equal(active(), 1);
    xseg_ipc_handle_free(h);
    xseg_ipc_handle_free(h2);
    assert_int_equal(active(), 1);
    tu_free(a);
    assert_int_equal(active(), 0);
    /* Its entry costs host memory: where that runs out the export fails, nothing left open. */
    a = tu_malloc(24 * MiB, NULL);
    bool done = false;
    for (int n = 1; n < 64 && !done; n++) {
        h = NULL;
        hostmem_fail_nth(n);
        xseg_status st = xseg_ipc_export(a, &h);
        bool hit = hostmem_failed();
        hostmem_disarm();
        if (st == XSEG_SUCCESS) { /* past the last allocation, or a failure xseg got past */
            assert_int_equal(active(), 1);
            xseg_ipc_handle_free(h);
            done = !hit;
            if (!done) { /* start again from a block never exported */
                tu_free(a);
                a = tu_malloc(24 * MiB, NULL);
            }
        } else {
            assert_int_equal(st, XSEG_ERROR_OUT_OF_MEMORY);
            assert_null(h);
            assert_int_equal(active(), 0);
        }
    }
    assert_true(done);
    tu_free(a);
    assert_int_equal(active(), 0);
}

/* register_blocks_above_mb: live blocks at least that large are in the ledger from malloc to
 * free; smaller ones never; a sleep of their pool is refused while one lives; off by default. */
static void test_ledger_own_blocks_above(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False");
    void *p = tu_malloc(16 * MiB, NULL);
    assert_int_equal(active(), 0); /* the default: off */
    tu_free(p);
    if (xseg_set_config("register_blocks_above_mb:8") != XSEG_SUCCESS)
        fail_msg("register_blocks_above_mb: %s", xseg_last_error());
    char why[1024];
    int safe = 0;
    assert_int_equal(xseg_registration_safe(&safe, why, sizeof why, NULL), XSEG_SUCCESS);
    if (!safe || !strstr(why, "at least 8 MiB"))
        fail_msg("xseg_registration_safe does not name register_blocks_above_mb: %s", why);
    void *small[32];
    for (int i = 0; i < 32; i++) /* the small path: no entry */
        small[i] = tu_malloc(4096 + (size_t)i * 512, NULL);
    void *mid = tu_malloc(7 * MiB, NULL);
    assert_int_equal(active(), 0);
    void *big = tu_malloc(8 * MiB, NULL), *big2 = tu_malloc(40 * MiB, NULL);
    assert_int_equal(active(), 2);
    tu_assert_cu(tu_fill((CUdeviceptr)big2, 40 * MiB, 3));
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_ILLEGAL_STATE);
    must_contain("register_blocks_above_mb");
    assert_true(tu_check((CUdeviceptr)big2, 40 * MiB, 3));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    tu_free(big);
    assert_int_equal(active(), 1);
    tu_free(big2);
    assert_int_equal(active(), 0);
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, POOL0), XSEG_SUCCESS);
    /* The same sizes again and again on one thread and stream, what a stream slot serves without
     * the device lock: every malloc enters the ledger, every free leaves it. */
    for (int i = 0; i < 8; i++) {
        void *r = tu_malloc(i & 1 ? 8 * MiB : 9 * MiB, NULL);
        assert_int_equal(active(), 1);
        tu_free(r);
        assert_int_equal(active(), 0);
    }
    /* A host allocation failure for the entry fails the malloc, nothing held. */
    int64_t allocated = tu_stat("allocated_bytes.all.current");
    bool done = false;
    for (int n = 1; n < 64 && !done; n++) {
        void *q = NULL;
        hostmem_fail_nth(n);
        xseg_status st = xseg_malloc(&q, 12 * MiB, 0, NULL);
        bool hit = hostmem_failed();
        hostmem_disarm();
        if (st == XSEG_SUCCESS && !hit) {
            assert_int_equal(active(), 1);
            tu_free(q);
            done = true;
        } else if (st == XSEG_SUCCESS) { /* a failure the allocator got past */
            tu_free(q);
        } else {
            assert_int_equal(st, XSEG_ERROR_OUT_OF_MEMORY);
            assert_null(q);
            assert_int_equal(active(), 0);
            assert_int_equal(tu_stat("allocated_bytes.all.current"), allocated);
        }
        assert_int_equal(active(), 0);
    }
    assert_true(done);
    /* Off again: nothing new enters. */
    assert_int_equal(xseg_set_config("register_blocks_above_mb:0"), XSEG_SUCCESS);
    big = tu_malloc(16 * MiB, NULL);
    assert_int_equal(active(), 0);
    tu_free(big);
    tu_free(mid);
    for (int i = 0; i < 32; i++)
        tu_free(small[i]);
}

/* xseg_shutdown ends every entry of xseg's own, live blocks and open descriptors included; nothing
 * leaks (the sanitizer run) and xseg starts again. */
static void test_ledger_own_shutdown(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,register_blocks_above_mb:4");
    void *a = tu_malloc(24 * MiB, NULL), *b = tu_malloc(8 * MiB, NULL);
    xseg_ipc_handle *h = NULL;
    assert_int_equal(xseg_ipc_export(b, &h), XSEG_SUCCESS);
    int fd = -1;
    size_t off = 0;
    bool dmabuf = xseg_range_dmabuf(a, MiB, &fd, &off) == XSEG_SUCCESS;
    assert_int_equal(active(), dmabuf ? 4 : 3); /* a, b (size), b (export), the dma-buf */
    if (xseg_shutdown() != XSEG_SUCCESS)
        fail_msg("xseg_shutdown: %s", xseg_last_error());
    xseg_ipc_handle_free(h);
    if (dmabuf)
        close(fd);
    assert_int_equal(xseg_set_config("expandable_segments:True"), XSEG_SUCCESS);
    assert_int_equal(active(), 0);
}

static const struct tu_named_test all_tests[] = {
    TU_NAMED(test_ledger_own_dmabuf),
    TU_NAMED(test_ledger_own_dmabuf_cycles),
    TU_NAMED(test_ledger_own_export),
    TU_NAMED(test_ledger_own_blocks_above),
    TU_NAMED(test_ledger_own_shutdown),
};

int main(int argc, char **argv)
{
    return tu_run_named("ledger_own", all_tests, sizeof all_tests / sizeof all_tests[0], argc, argv);
}
