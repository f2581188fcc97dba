/*
 * debug_stale_access (issue 50): seed 003's "Illegal Memory Access" cases played end to end on
 * the public API with graph replays, in classic and expandable segments, with the mode on (each
 * one reported with its allocation's and its free's frames, the reused memory intact) and off
 * (the same replay silently corrupts the tensor that reused the memory); the bad input; and a
 * randomized oracle (several streams, both pools, private pools, record_stream, graphs) that
 * must make no false report.
 *
 * argv[1]: "scenarios" (default), "bad_input", "oracle_classic" or "oracle_expandable"
 * (XSEG_STALE_OPS operations, default 100000 or XSEG_TEST_STEPS; the CI-level run is 10^6).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "tests/common/testutil.h"
#include "vmm/kernel.h"
#include "xseg.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ---- reports and frames ---- */

struct seen {
    uintptr_t addr;
    size_t size, first_offset;
    char alloc_name[64], free_name[64];
    int n_alloc, n_free;
    char when[32];
};
static struct seen reports[64];
static size_t nreports;

static void observer(const xseg_stale_report *r, void *user)
{
    (void)user;
    if (nreports >= sizeof reports / sizeof reports[0])
        return;
    struct seen *s = &reports[nreports++];
    *s = (struct seen){r->addr, r->size, r->first_offset, "", "", r->n_alloc_frames, r->n_free_frames, ""};
    if (r->n_alloc_frames && r->alloc_frames[0].name)
        snprintf(s->alloc_name, sizeof s->alloc_name, "%s", r->alloc_frames[0].name);
    if (r->n_free_frames && r->free_frames[0].name)
        snprintf(s->free_name, sizeof s->free_name, "%s", r->free_frames[0].name);
    snprintf(s->when, sizeof s->when, "%s", r->when);
    assert_non_null(strstr(r->message, "was written after its free"));
}

/* The "Python" frame history records for each malloc and free: the step the test is at. */
static const char *phase = "setup";
static int frames_cb(xseg_frame *frames, int max, void *user)
{
    (void)user;
    if (max < 1)
        return 0;
    frames[0] = (xseg_frame){"seed003.py", phase, 7};
    return 1;
}

/* On cudaemu xseg's own streams (the quarantine's, created at its first use) run their fills
 * late, after work the test queues later on its streams unless something orders it after them,
 * as a GPU may; the test's own streams (new_stream) run at once. */
static void start(const char *config)
{
    tu_xseg_init_or_skip(config);
    tu_stream_defer_new(true); /* the driver is loaded now; the quarantine's stream is not made yet */
    xseg_history_options o = {0};
    o.enabled = 1;
    o.stacks = XSEG_STACKS_CALLBACK;
    o.callback = frames_cb;
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    assert_int_equal(xseg_attach_stale_observer(observer, NULL), XSEG_SUCCESS); /* shutdown detached it */
    nreports = 0;
}

static void stop(void)
{
    xseg_history_options o = {0};
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    tu_stream_defer_new(false);
}

static void *alloc_at(const char *where, size_t size, CUstream s)
{
    phase = where;
    void *p = tu_malloc(size, s);
    phase = "elsewhere";
    return p;
}

static void free_at(const char *where, void *p)
{
    phase = where;
    tu_free(p);
    phase = "elsewhere";
}

/* Does [p, p + n) hold byte @p v throughout (read on @p s after its work)? */
static bool holds(void *p, size_t n, unsigned char v, CUstream s)
{
    unsigned char *h = malloc(n);
    assert_non_null(h);
    tu_assert_cu(drv->cuStreamSynchronize(s));
    tu_assert_cu(drv->cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)p, n));
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++)
        ok = h[i] == v;
    free(h);
    return ok;
}

static CUstream new_stream(void)
{
    CUstream s;
    bool deferring = tu_stream_defer_new(false);
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    if (deferring)
        tu_stream_defer_new(true);
    return s;
}

/* Capture on @p s what @p body queues, instantiate it. */
static CUgraphExec capture(CUstream s, void (*body)(CUstream, void *), void *arg)
{
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    body(s, arg);
    CUgraph g = NULL;
    tu_assert_cu(drv->cuStreamEndCapture(s, &g));
    CUgraphExec x = NULL;
    tu_assert_cu(tu_graph()->instantiate(&x, g, 0));
    tu_assert_cu(drv->cuGraphDestroy(g));
    return x;
}

static void replay(CUgraphExec x, CUstream s)
{
    tu_assert_cu(tu_graph()->launch(x, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
}

/* ---- scenario 1: an input tensor goes out of scope before the replay ---- */

struct inout {
    void *in, *out;
    size_t n;
};

/* The captured step: an in-place update of its input (x.add_(1) stands as a memset), then out = x. */
static void step_body(CUstream s, void *arg)
{
    struct inout *io = arg;
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)io->in, 0x11, io->n, s));
    tu_assert_cu(tu_graph()->memcpy_dtod_async((CUdeviceptr)(uintptr_t)io->out, (CUdeviceptr)(uintptr_t)io->in,
                                               io->n, s));
}

static void out_of_scope(const char *config, bool on, size_t n)
{
    start(config);
    CUstream s = new_stream();
    void *out = alloc_at("make_output", n, s);
    struct inout io = {alloc_at("make_input", n, s), out, n};
    CUgraphExec x = capture(s, step_body, &io);
    void *old = io.in;
    free_at("input_out_of_scope", io.in); /* the graph still holds its address */
    void *other = alloc_at("other_tensor", n, s);
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)other, 0x22, n, s));
    /* The waiting fills go before a replay (debug_stale_fill_batch; xseg.torch does this at every
     * CUDAGraph.replay); with the mode off it does nothing. */
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS);
    replay(x, s);
    if (!on) {
        /* The memory was reused: the replay overwrote another tensor, and nothing said so. */
        assert_ptr_equal(other, old);
        assert_false(holds(other, n, 0x22, s));
        size_t found = 9;
        assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
        assert_int_equal(found, 0);
        assert_int_equal(nreports, 0);
    } else {
        assert_ptr_not_equal(other, old);
        assert_true(holds(other, n, 0x22, s)); /* never another tensor's memory */
        size_t found = 0;
        assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
        assert_int_equal(found, 1);
        assert_int_equal(nreports, 1);
        assert_int_equal(reports[0].addr, (uintptr_t)old);
        assert_int_equal(reports[0].first_offset, 0);
        assert_string_equal(reports[0].alloc_name, "make_input");
        assert_string_equal(reports[0].free_name, "input_out_of_scope");
        assert_string_equal(reports[0].when, "xseg_check_stale");
        /* Reported once: a second check finds nothing new. */
        assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
        assert_int_equal(found, 0);
        /* The snapshot holds the quarantined block (pending, with its allocation's frames) and the
         * finding with both stacks. */
        char path[] = "/tmp/xseg-stale-XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        assert_int_equal(xseg_dump_snapshot_json(0, path), XSEG_SUCCESS);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        static char text[1 << 20];
        size_t len = fread(text, 1, sizeof text - 1, f);
        text[len] = 0;
        fclose(f);
        unlink(path);
        assert_non_null(strstr(text, "\"active_pending_free\""));
        const char *st = strstr(text, "\"xseg_stale_accesses\"");
        assert_non_null(st);
        assert_non_null(strstr(st, "\"make_input\""));
        assert_non_null(strstr(st, "\"input_out_of_scope\""));
        assert_non_null(strstr(st, "\"xseg_check_stale\""));
    }
    tu_assert_cu(tu_graph()->exec_destroy(x));
    tu_free(other);
    tu_free(out);
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

static void test_out_of_scope_on_classic(void **st)
{
    (void)st;
    out_of_scope("expandable_segments:False,debug_stale_access:True", true, 3 * MiB);
}
static void test_out_of_scope_off_classic(void **st)
{
    (void)st;
    out_of_scope("expandable_segments:False", false, 3 * MiB);
}
static void test_out_of_scope_on_expandable(void **st)
{
    (void)st;
    out_of_scope("expandable_segments:True,debug_stale_access:True", true, 24 * MiB);
}
static void test_out_of_scope_off_expandable(void **st)
{
    (void)st;
    out_of_scope("expandable_segments:True", false, 24 * MiB);
}
static void test_out_of_scope_on_small(void **st)
{
    (void)st;
    out_of_scope("debug_stale_access:True", true, 4 * KiB);
}

/* ---- scenario 2: reassignment instead of copy_ (x = new_tensor) ---- */

/* The captured step reads its static input: out = x. */
static void read_body(CUstream s, void *arg)
{
    struct inout *io = arg;
    tu_assert_cu(tu_graph()->memcpy_dtod_async((CUdeviceptr)(uintptr_t)io->out, (CUdeviceptr)(uintptr_t)io->in,
                                               io->n, s));
}

static void reassigned(const char *config, bool on, size_t n)
{
    start(config);
    CUstream s = new_stream();
    struct inout io = {alloc_at("static_input", n, s), alloc_at("static_output", n, s), n};
    CUgraphExec x = capture(s, read_body, &io);
    /* x = new_tensor: the new data is elsewhere, the old tensor is freed. */
    void *fresh = alloc_at("new_tensor", n, s);
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)fresh, 0x33, n, s));
    void *old = io.in;
    free_at("reassign_x", old);
    void *other = alloc_at("unrelated", n, s); /* reuses the old address when nothing holds it */
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)other, 0x44, n, s));
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS); /* the waiting fills before the replay */
    replay(x, s);
    if (!on) {
        assert_ptr_equal(other, old);
        assert_true(holds(io.out, n, 0x44, s)); /* another tensor's data, silently */
    } else {
        /* The replay read poison (all-ones: NaN in every float type), never another tensor. */
        assert_ptr_not_equal(other, old);
        assert_true(holds(io.out, n, 0xFF, s));
        /* A write into the old x through the graph (the step's in-place update) is reported. */
        struct inout w = {old, io.out, n};
        CUgraphExec x2 = capture(s, step_body, &w);
        replay(x2, s);
        tu_assert_cu(tu_graph()->exec_destroy(x2));
        /* empty_cache checks the quarantine too. */
        assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
        assert_int_equal(nreports, 1);
        assert_int_equal(reports[0].addr, (uintptr_t)old);
        assert_string_equal(reports[0].alloc_name, "static_input");
        assert_string_equal(reports[0].free_name, "reassign_x");
        assert_string_equal(reports[0].when, "empty_cache");
    }
    tu_assert_cu(tu_graph()->exec_destroy(x));
    tu_free(other);
    tu_free(fresh);
    tu_free(io.out);
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

static void test_reassigned_on_classic(void **st)
{
    (void)st;
    reassigned("expandable_segments:False,debug_stale_access:True", true, 2 * MiB);
}
static void test_reassigned_off_classic(void **st)
{
    (void)st;
    reassigned("expandable_segments:False", false, 2 * MiB);
}
static void test_reassigned_on_expandable(void **st)
{
    (void)st;
    reassigned("debug_stale_access:True", true, 40 * MiB);
}
static void test_reassigned_off_expandable(void **st)
{
    (void)st;
    reassigned("expandable_segments:True", false, 40 * MiB);
}

/* A write after the free found when the block leaves the FIFO (the bound passed), without a
 * check being asked for; the block's memory then serves again. debug_stale_full_check: the
 * write lies between the samples a default check reads (test_sampled_at_exit). */
static void test_found_at_exit(void **st)
{
    (void)st;
    start("expandable_segments:False,debug_stale_access:True,debug_quarantine_mb:4,debug_stale_full_check:True");
    CUstream s = new_stream();
    void *a = alloc_at("victim", 1 * MiB, s);
    free_at("victim_freed", a);
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS); /* filled now, not when its batch is full */
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a + 4096 + 3, 0, 1, s)); /* a stale write */
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(nreports, 0);
    for (int i = 0; i < 4; i++) /* 4 MiB more: the victim leaves */
        tu_free(alloc_at("filler", 1 * MiB, s));
    assert_int_equal(nreports, 1);
    assert_int_equal(reports[0].addr, (uintptr_t)a);
    assert_int_equal(reports[0].first_offset, 4096 + 3);
    assert_string_equal(reports[0].when, "quarantine exit");
    assert_string_equal(reports[0].free_name, "victim_freed");
    /* Reserved memory stays within the budget plus what is live. */
    assert_true(tu_stat("reserved_bytes.all.current") <= (int64_t)(4 * MiB + 20 * MiB));
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

/* The default check reads samples of a block over 256 KiB: its first and last 4 KiB and 4 KiB at
 * every 4 MiB. A write at a probe is found when the block leaves; one between the samples is not
 * (the documented limit of the sampled check: debug_stale_full_check reads every byte). */
static void test_sampled_at_exit(void **st)
{
    (void)st;
    start("expandable_segments:False,debug_stale_access:True,debug_quarantine_mb:24");
    CUstream s = new_stream();
    void *a = alloc_at("between_samples", 9 * MiB, s), *b = alloc_at("at_a_probe", 9 * MiB, s);
    free_at("a_freed", a);
    free_at("b_freed", b);
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS);
    unsigned long launches0 = tu_call_count("cuLaunchKernel");
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a + 4096 + 3, 0, 1, s));
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)b + 4 * MiB + 5, 0, 1, s));
    for (int i = 0; i < 12; i++) /* 24 MiB more: both leave */
        tu_free(alloc_at("filler", 2 * MiB, s));
    /* With the allocator's kernels (vmm/kernel.h) the check compares whole blocks on the device:
     * the write between the samples is found too. */
    bool whole = vkern_ready() == XSEG_SUCCESS; /* the driver's answer too (no call counts there) */
    err_clear();
    if (tu_emulated()) /* and on cudaemu they did run */
        assert_int_equal(tu_call_count("cuLaunchKernel") > launches0, whole);
    assert_int_equal(nreports, whole ? 2 : 1);
    struct seen *at_b = &reports[whole && reports[0].addr != (uintptr_t)b ? 1 : 0];
    assert_int_equal(at_b->addr, (uintptr_t)b);
    assert_int_equal(at_b->first_offset, 4 * MiB + 5);
    assert_string_equal(at_b->when, "quarantine exit");
    if (whole) {
        struct seen *at_a = &reports[at_b == &reports[0] ? 1 : 0];
        assert_int_equal(at_a->addr, (uintptr_t)a);
        assert_int_equal(at_a->first_offset, 4096 + 3);
    }
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

/* A block record_stream'ed on a stream still working when it is freed enters the quarantine once
 * that stream is done, filled after the stream's use, and keeps its free's frames. */
static void test_recorded_stream(void **st)
{
    (void)st;
    start("expandable_segments:False,debug_stale_access:True");
    CUstream s = new_stream(), side = new_stream();
    void *a = alloc_at("shared_buffer", 1 * MiB, s);
    bool held = tu_stream_hold(side);
    assert_int_equal(xseg_record_stream(a, side), XSEG_SUCCESS);
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a, 0x66, 1 * MiB, side)); /* its last use */
    free_at("freed_while_used", a);
    if (held)
        tu_stream_release(side);
    tu_assert_cu(drv->cuStreamSynchronize(side));
    size_t found = 9;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS); /* processes the event: it enters */
    assert_int_equal(found, 0); /* the side stream's write came before the free completed */
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a + 100, 1, 1, side)); /* now stale */
    tu_assert_cu(drv->cuStreamSynchronize(side));
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 1);
    assert_int_equal(reports[0].addr, (uintptr_t)a);
    assert_int_equal(reports[0].first_offset, 100);
    assert_string_equal(reports[0].alloc_name, "shared_buffer");
    assert_string_equal(reports[0].free_name, "freed_while_used");
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

/* Expandable segments: the whole pages of a quarantined block are swapped for one canary page
 * mapped over each of their granules, so a stale write anywhere in them shows in all of them and
 * the check reads one page; the first changed offset is then known within a granule (its place
 * in the first page of the span). When the block leaves, its own pages are back, distinct.
 * debug_stale_full_check: the page read whole (by default it is sampled as a granule). */
static void test_canary_pages(void **st)
{
    (void)st;
    start("expandable_segments:True,debug_stale_access:True,debug_quarantine_mb:64,debug_stale_full_check:True");
    CUstream s = new_stream();
    const size_t n = 60 * MiB, G = 2 * MiB;
    unsigned char *a = alloc_at("big_activation", n, s);
    free_at("big_activation_freed", a);
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS);
    unsigned long reads0 = tu_call_count("cuMemcpyDtoHAsync");
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a + 45 * MiB + 7, 0x3c, 1, s)); /* stale */
    unsigned char seen = 0;
    tu_assert_cu(drv->cuStreamSynchronize(s));
    tu_assert_cu(drv->cuMemcpyDtoH(&seen, (CUdeviceptr)(uintptr_t)a + 3 * MiB + 7, 1));
    assert_int_equal(seen, 0x3c); /* one page behind every granule */
    tu_assert_cu(drv->cuMemcpyDtoH(&seen, (CUdeviceptr)(uintptr_t)a + 3 * MiB + 8, 1));
    assert_int_equal(seen, 0xFF);
    size_t found = 0;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 1);
    assert_int_equal(reports[0].addr, (uintptr_t)a);
    assert_int_equal(reports[0].first_offset % G, (45 * MiB + 7) % G);
    assert_string_equal(reports[0].free_name, "big_activation_freed");
    if (tu_emulated()) /* one page read back, not 60 MiB: at most one copy a MiB of it */
        assert_true(tu_call_count("cuMemcpyDtoHAsync") - reads0 <= G / MiB);
    /* Leaving (drained with the mode off), the pages are the block's own again: distinct bytes. */
    assert_int_equal(xseg_set_config("debug_stale_access:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    unsigned char *b = tu_malloc(n, s);
    assert_ptr_equal(b, a);
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)b, 0x01, n, s));
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)b + 45 * MiB, 0x02, 1, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    tu_assert_cu(drv->cuMemcpyDtoH(&seen, (CUdeviceptr)(uintptr_t)b + 3 * MiB, 1));
    assert_int_equal(seen, 0x01);
    tu_free(b);
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

/* ---- fills in batches (debug_stale_fill_batch) ---- */

/* Freed blocks keep their bytes until the device holds a batch of them, then all are filled
 * (one launch on the quarantine's own stream with the allocator's kernels, whatever streams the
 * blocks were freed on, else a memset each); xseg_stale_flush fills
 * a partial batch; a stale write between the free and the fill is overwritten (the documented
 * window) while one after it is found. */
static void test_fill_batch(void **st)
{
    (void)st;
    start("expandable_segments:False,debug_stale_access:True,debug_stale_fill_batch:4");
    CUstream s = new_stream(), s2 = new_stream();
    enum { N = 6 };
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = alloc_at("batched", 1 * MiB, i % 2 ? s2 : s); /* two streams: still one launch */
        tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)p[i], (unsigned char)(0x10 + i), 1 * MiB,
                                          i % 2 ? s2 : s));
    }
    /* Launches and memsets as cudaemu counts them: one launch, or (kernels refused:
     * CUDAEMU_KERNELS=0, the fallback) a memset a block. */
    const char *kenv = getenv("CUDAEMU_KERNELS");
    bool kernels = !(kenv && !strcmp(kenv, "0"));
    unsigned long launches0 = tu_call_count("cuLaunchKernel"), memsets0 = tu_call_count("cuMemsetD8Async");
    for (int i = 0; i < 3; i++)
        free_at("batched_freed", p[i]);
    for (int i = 0; i < 3; i++) /* waiting: their old bytes (quarantined, never handed out) */
        assert_true(holds(p[i], 1 * MiB, (unsigned char)(0x10 + i), i % 2 ? s2 : s));
    /* A stale write now (before the fill) is overwritten by it: missed, the window's trade. (Done
     * before the fill is queued: nothing else orders the fill on xseg's stream after work on s.) */
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)p[0] + 5, 0x5a, 1, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    unsigned long memsets1 = tu_call_count("cuMemsetD8Async");
    if (tu_emulated()) { /* nothing filled yet: the only memset is the test's own stale write */
        assert_int_equal(tu_call_count("cuLaunchKernel"), launches0);
        assert_int_equal(memsets1 - memsets0, 1);
    }
    free_at("batched_freed", p[3]); /* the fourth: the batch is full */
    if (tu_emulated()) {
        assert_int_equal(tu_call_count("cuLaunchKernel") - launches0, kernels ? 1 : 0);
        assert_int_equal(tu_call_count("cuMemsetD8Async") - memsets1, kernels ? 0 : 4);
    }
    /* The stream of the free that queued the fill (s2) is ordered after it: read there. */
    for (int i = 0; i < 4; i++)
        assert_true(holds(p[i], 1 * MiB, 0xFF, s2));
    free_at("batched_freed", p[4]);
    assert_true(holds(p[4], 1 * MiB, 0x14, s));
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS); /* a partial batch, on demand */
    assert_true(holds(p[4], 1 * MiB, 0xFF, s));
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS); /* nothing waits: nothing done */
    /* After its fill a stale write is found; a check fills the waiting blocks first. */
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)p[1] + 77, 0x5a, 1, s2));
    free_at("batched_freed", p[5]);
    size_t found = 0;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 1);
    assert_int_equal(reports[0].addr, (uintptr_t)p[1]);
    assert_int_equal(reports[0].first_offset, 77);
    assert_true(holds(p[5], 1 * MiB, 0xFF, s2));
    tu_assert_cu(drv->cuStreamDestroy(s2));
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

/* debug_stale_fill_batch:1 fills at each free: a stale write right after the free is found
 * without a flush (the exact window). */
static void test_fill_batch_one(void **st)
{
    (void)st;
    start("expandable_segments:False,debug_stale_access:True,debug_stale_fill_batch:1");
    CUstream s = new_stream();
    void *a = alloc_at("exact", 1 * MiB, s);
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a, 0x31, 1 * MiB, s));
    free_at("exact_freed", a);
    assert_true(holds(a, 1 * MiB, 0xFF, s));
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a + 9, 0x5a, 1, s));
    size_t found = 0;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 1);
    assert_int_equal(reports[0].addr, (uintptr_t)a);
    assert_int_equal(reports[0].first_offset, 9);
    assert_string_equal(reports[0].free_name, "exact_freed");
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

/* ---- bad input ---- */

static void test_bad_input(void **st)
{
    (void)st;
    /* Impossible quarantine sizes: refused, naming the key and the range. */
    assert_int_equal(xseg_check_config("debug_quarantine_mb:0", NULL, 0, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "debug_quarantine_mb"));
    assert_int_equal(xseg_check_config("debug_quarantine_mb:99999999", NULL, 0, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_check_config("debug_stale_access:maybe", NULL, 0, NULL), XSEG_ERROR_INVALID_VALUE);
    const char *bad_batch[] = {"debug_stale_fill_batch:0", "debug_stale_fill_batch:4097", "debug_stale_fill_batch:x"};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(xseg_check_config(bad_batch[i], NULL, 0, NULL), XSEG_ERROR_INVALID_VALUE);
        assert_non_null(strstr(xseg_last_error(), "debug_stale_fill_batch"));
    }
    assert_int_equal(xseg_check_config("debug_stale_fill_batch:4096", NULL, 0, NULL), XSEG_SUCCESS);

    /* The mode switched on with blocks live: they are quarantined at their free (no frames from
     * before history began are needed); switched off with blocks quarantined: the next
     * empty_cache checks and releases them. */
    start("expandable_segments:False");
    CUstream s = new_stream();
    void *live = alloc_at("before_switch", 2 * MiB, s);
    assert_int_equal(xseg_set_config("debug_stale_access:True"), XSEG_SUCCESS);
    free_at("after_switch", live);
    void *next = tu_malloc(2 * MiB, s);
    assert_ptr_not_equal(next, live); /* quarantined */
    assert_int_equal(tu_stat("active_bytes.all.current"), (int64_t)(4 * MiB)); /* held, pending */
    assert_int_equal(tu_stat("allocated_bytes.all.current"), (int64_t)(2 * MiB));
    assert_int_equal(xseg_set_config("debug_stale_access:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("active_bytes.all.current"), (int64_t)(2 * MiB)); /* released */
    tu_free(next);
    assert_int_equal(nreports, 0);

    /* A check during a capture: a clear error, nothing checked; it works after the capture. */
    assert_int_equal(xseg_set_config("debug_stale_access:True"), XSEG_SUCCESS);
    void *q = tu_malloc(1 * MiB, s), *q2 = tu_malloc(1 * MiB, s);
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)q2, 0x2b, 1 * MiB, s));
    tu_free(q);
    CUstream cs = new_stream();
    xseg_pool_id pool;
    assert_int_equal(xseg_capture_begin(0, cs, &pool, CU_STREAM_CAPTURE_MODE_RELAXED), XSEG_SUCCESS);
    size_t found = 7;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "capture is underway"));
    assert_int_equal(found, 0);
    /* A flush during a capture: a clear error; a block freed then waits unfilled until it ends. */
    tu_free(q2);
    assert_int_equal(xseg_stale_flush(0), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "xseg_stale_flush"));
    assert_non_null(strstr(xseg_last_error(), "capture is underway"));
    CUgraph g = NULL;
    assert_int_equal(xseg_capture_end(0, cs, &g), XSEG_SUCCESS);
    tu_assert_cu(drv->cuGraphDestroy(g));
    assert_true(holds(q2, 1 * MiB, 0x2b, s)); /* not filled during the capture */
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS);
    assert_true(holds(q2, 1 * MiB, 0xFF, s));
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 0);
    assert_int_equal(xseg_check_stale(7, &found), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(xseg_stale_flush(7), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(xseg_stale_flush(-5), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    tu_assert_cu(drv->cuStreamDestroy(cs));
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

/* ---- the randomized oracle: no false report, every injected stale write found ---- */

struct live {
    void *p;
    size_t size;
    CUstream s;
    unsigned char tag;
    bool recorded; /* record_stream'ed on another stream */
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Mostly small tensors, some up to 1 MiB, a few large (the cost is a memset and a read-back of
 * each freed byte). */
static size_t rnd_size(void)
{
    uint64_t r = rnd() % 1000;
    if (r < 900)
        return 1 + rnd() % (8 * KiB);
    if (r < 995)
        return 8 * KiB + rnd() % (1 * MiB);
    return 2 * MiB + rnd() % (22 * MiB);
}

/* Does live block @p l still hold its tag (its first, middle and last byte)? */
static bool intact(const struct live *l)
{
    tu_assert_cu(drv->cuStreamSynchronize(l->s));
    size_t at[3] = {0, l->size / 2, l->size - 1};
    for (int i = 0; i < 3; i++) {
        unsigned char v;
        tu_assert_cu(drv->cuMemcpyDtoH(&v, (CUdeviceptr)(uintptr_t)l->p + at[i], 1));
        if (v != l->tag)
            return false;
    }
    return true;
}

struct injected {
    uintptr_t addr;
    size_t off;
};

static void oracle(const char *config)
{
    start(config);
    bool full = strstr(config, "debug_stale_full_check:True") != NULL;
    size_t ops = tu_steps(100000, 2000);
    const char *env = getenv("XSEG_STALE_OPS");
    if (env && *env)
        ops = strtoull(env, NULL, 10);
    enum { NS = 3, MAXLIVE = 256, MAXINJ = 64 };
    CUstream st[NS];
    for (int i = 0; i < NS; i++)
        st[i] = new_stream();
    struct live *lv = calloc(MAXLIVE, sizeof *lv);
    size_t nlive = 0;
    struct injected inj[MAXINJ];
    size_t ninj = 0, graphs = 0, recorded = 0;
    for (size_t op = 0; op < ops; op++) {
        uint64_t r = rnd() % 100;
        if ((r < 48 && nlive < MAXLIVE) || nlive == 0) {
            struct live l = {NULL, rnd_size(), st[rnd() % NS], (unsigned char)(1 + rnd() % 250), false};
            l.p = tu_malloc(l.size, l.s);
            tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)l.p, l.tag, l.size, l.s));
            lv[nlive++] = l;
        } else if (r < 94) {
            size_t i = rnd() % nlive;
            struct live l = lv[i];
            lv[i] = lv[--nlive];
            /* The quarantine never handed a live block's memory out nor filled it. */
            if (!intact(&l))
                fail_msg("op %zu: live block %p (%zu bytes) lost its tag", op, l.p, l.size);
            tu_free(l.p);
            /* Now and then a stale write right after the free, after the fill (the flush returns
             * once it is done: a write before the flush would be overwritten by it), anywhere with debug_stale_full_check, else where the sampled check reads (the
             * whole of a block up to 256 KiB, else its first or last 4 KiB). */
            if (!l.recorded && ninj < MAXINJ && rnd() % 200 == 0) {
                size_t off = rnd() % l.size;
                if (!full && l.size > 256 * KiB)
                    off = rnd() % 2 ? rnd() % (4 * KiB) : l.size - 1 - rnd() % (4 * KiB);
                assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS);
                tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)l.p + off, 0x5a, 1, l.s));
                inj[ninj++] = (struct injected){(uintptr_t)l.p, off};
            }
        } else if (r < 96) {
            /* record_stream: the block is used on another stream (held, so its event waits). */
            struct live *l = &lv[rnd() % nlive];
            CUstream o = st[(size_t)(l->s == st[0] ? 1 : 0)];
            if (!l->recorded && tu_stream_hold(o)) {
                assert_int_equal(xseg_record_stream(l->p, o), XSEG_SUCCESS);
                tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)l->p, l->tag, l->size, o));
                l->recorded = true;
                recorded++;
                tu_stream_release(o);
            }
        } else if (r < 98) {
            /* A graph: captured into a private pool (whose frees are the graph's, not stale), with
             * a node writing a live default-pool block, replayed while that block lives. */
            CUstream cs = st[rnd() % NS];
            struct live *l = &lv[rnd() % nlive];
            if (l->s != cs)
                tu_assert_cu(drv->cuStreamSynchronize(l->s));
            xseg_pool_id pool;
            assert_int_equal(xseg_capture_begin(0, cs, &pool, CU_STREAM_CAPTURE_MODE_RELAXED), XSEG_SUCCESS);
            void *tmp[3];
            for (int k = 0; k < 3; k++) {
                tmp[k] = tu_malloc(rnd_size(), cs);
                tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)tmp[k], 7, 1, cs));
            }
            tu_free(tmp[0]);
            tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)l->p, l->tag, l->size, cs));
            tu_free(tmp[1]);
            CUgraph g = NULL;
            assert_int_equal(xseg_capture_end(0, cs, &g), XSEG_SUCCESS);
            CUgraphExec x = NULL;
            tu_assert_cu(tu_graph()->instantiate(&x, g, 0));
            tu_assert_cu(drv->cuGraphDestroy(g));
            for (int k = 0; k < 2; k++)
                replay(x, cs);
            tu_assert_cu(tu_graph()->exec_destroy(x));
            tu_free(tmp[2]);
            assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
            if (l->s != cs)
                tu_assert_cu(drv->cuStreamSynchronize(cs));
            graphs++;
        } else if (r < 99) {
            size_t found = 0;
            assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
        } else {
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
        }
    }
    while (nlive) {
        struct live l = lv[--nlive];
        assert_true(intact(&l));
        tu_free(l.p);
    }
    size_t found = 0;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    free(lv);
    for (int i = 0; i < NS; i++)
        tu_assert_cu(drv->cuStreamDestroy(st[i]));
    /* Every report is an injected write (no false report), and every injected write is found. */
    for (size_t i = 0; i < nreports; i++) {
        bool known = false;
        for (size_t k = 0; k < ninj && !known; k++)
            known = inj[k].addr == reports[i].addr &&
                    (inj[k].off == reports[i].first_offset || /* in a canary page: within a granule */
                     inj[k].off % (2 * MiB) == reports[i].first_offset % (2 * MiB));
        if (!known)
            fail_msg("false report: block 0x%" PRIxPTR " offset %zu (%s)", reports[i].addr, reports[i].first_offset,
                     reports[i].when);
    }
    assert_int_equal(nreports, ninj);
    printf("oracle: %zu operations, %zu graphs, %zu record_stream, %zu stale writes injected and found, 0 false\n",
           ops, graphs, recorded, ninj);
    stop(); /* the quarantine drains: nothing more is found there */
    assert_int_equal(nreports, ninj);
}

static void test_oracle_classic(void **st)
{
    (void)st;
    /* Every byte checked: stale writes anywhere in a block. */
    oracle("expandable_segments:False,debug_stale_access:True,debug_quarantine_mb:32,debug_stale_full_check:True");
}
static void test_oracle_expandable(void **st)
{
    (void)st;
    /* 2 MiB chunks: most blocks from 4 MiB hold whole chunks, swapped for canary pages. The
     * default, sampled check: stale writes where it reads. */
    oracle("expandable_segments:True,expandable_chunk_mb:2,debug_stale_access:True,debug_quarantine_mb:32");
}

/* After each test, also one that failed before its stop(): nothing it left (a quarantine, waiting
 * fills, a config) reaches the next test. */
static int teardown(void **st)
{
    (void)st;
    xseg_history_options o = {0};
    (void)xseg_record_memory_history(&o);
    (void)xseg_shutdown();
    tu_stream_defer_new(false);
    return 0;
}
#undef cmocka_unit_test
#define cmocka_unit_test(f) cmocka_unit_test_teardown(f, teardown)

int main(int argc, char **argv)
{
    const struct CMUnitTest scenarios[] = {
        cmocka_unit_test(test_out_of_scope_on_classic),    cmocka_unit_test(test_out_of_scope_off_classic),
        cmocka_unit_test(test_out_of_scope_on_expandable), cmocka_unit_test(test_out_of_scope_off_expandable),
        cmocka_unit_test(test_out_of_scope_on_small),      cmocka_unit_test(test_reassigned_on_classic),
        cmocka_unit_test(test_reassigned_off_classic),     cmocka_unit_test(test_reassigned_on_expandable),
        cmocka_unit_test(test_reassigned_off_expandable),  cmocka_unit_test(test_found_at_exit),
        cmocka_unit_test(test_recorded_stream),            cmocka_unit_test(test_canary_pages),
        cmocka_unit_test(test_sampled_at_exit),            cmocka_unit_test(test_fill_batch),
        cmocka_unit_test(test_fill_batch_one),
    };
    const struct CMUnitTest bad[] = {cmocka_unit_test(test_bad_input)};
    const struct CMUnitTest oracle_classic[] = {cmocka_unit_test(test_oracle_classic)};
    const struct CMUnitTest oracle_expandable[] = {cmocka_unit_test(test_oracle_expandable)};
    const char *which = argc > 1 ? argv[1] : "scenarios";
    if (!strcmp(which, "oracle_classic"))
        return cmocka_run_group_tests(oracle_classic, NULL, NULL);
    if (!strcmp(which, "oracle_expandable"))
        return cmocka_run_group_tests(oracle_expandable, NULL, NULL);
    if (!strcmp(which, "bad_input"))
        return cmocka_run_group_tests(bad, NULL, NULL);
    return cmocka_run_group_tests(scenarios, NULL, NULL);
}
