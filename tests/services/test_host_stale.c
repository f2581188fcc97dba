/*
 * debug_stale_access for the pinned host cache (issue 50, seed 003's third case: a CPU tensor
 * freed under a captured H2D copy), through the public API on cudaemu graphs: with the mode off
 * the replay copies the block's next owner's data to the device (silent); on, the next
 * allocation gets another block and the device receives poison (NaN). A stale D2H write into a
 * freed host block is reported with its allocation's and its free's frames; the bound holds;
 * the mode switched at run time; nothing leaks. One process per test (meson passes its name).
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

#define KiB ((size_t)1 << 10)
#define N (256 * KiB) /* the CPU tensor: a block of the small host pool */

/* ---- reports and frames ---- */

struct seen {
    int device;
    uintptr_t addr;
    size_t size, requested, first_offset;
    char pool[8], when[32], alloc_name[64], free_name[64];
    int host_msg;
};
static struct seen reports[16];
static size_t nreports;

static void observer(const xseg_stale_report *r, void *user)
{
    (void)user;
    if (nreports >= sizeof reports / sizeof reports[0])
        return;
    struct seen *s = &reports[nreports++];
    *s = (struct seen){r->device, r->addr, r->size, r->requested, r->first_offset, "", "", "", "", 0};
    snprintf(s->pool, sizeof s->pool, "%s", r->pool);
    snprintf(s->when, sizeof s->when, "%s", r->when);
    if (r->n_alloc_frames && r->alloc_frames[0].name)
        snprintf(s->alloc_name, sizeof s->alloc_name, "%s", r->alloc_frames[0].name);
    if (r->n_free_frames && r->free_frames[0].name)
        snprintf(s->free_name, sizeof s->free_name, "%s", r->free_frames[0].name);
    s->host_msg = strstr(r->message, "stale access in pinned host memory") != NULL &&
                  strstr(r->message, "was written after its free") != NULL;
}

/* The "Python" frame history records: the step the test is at. */
static const char *phase = "setup";
static int frames_cb(xseg_frame *frames, int max, void *user)
{
    (void)user;
    if (max < 1)
        return 0;
    frames[0] = (xseg_frame){"seed003.py", phase, 3};
    return 1;
}

static void start(const char *config)
{
    tu_xseg_init_or_skip(config);
    xseg_history_options o = {0};
    o.enabled = 1;
    o.stacks = XSEG_STACKS_CALLBACK;
    o.callback = frames_cb;
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    assert_int_equal(xseg_attach_stale_observer(observer, NULL), XSEG_SUCCESS);
    nreports = 0;
}

/* Everything back: the host cache and the driver's pinned memory empty after xseg_shutdown. */
static void stop(void)
{
    xseg_history_options o = {0};
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    assert_int_equal(hstat("segment.current"), 0);
    if (tu_emulated())
        assert_int_equal(tu_host_live(NULL), 0);
}

static void *hmalloc_at(const char *where, size_t n)
{
    phase = where;
    void *p = hmalloc(n);
    phase = "elsewhere";
    return p;
}

static void hfree_at(const char *where, void *p)
{
    phase = where;
    hfree(p);
    phase = "elsewhere";
}

static CUstream new_stream(void)
{
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

/* Does device range [p, p + n) hold byte @p v throughout? */
static bool dev_holds(void *p, size_t n, unsigned char v)
{
    unsigned char *h = malloc(n);
    assert_non_null(h);
    tu_assert_cu(drv->cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)p, n));
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++)
        ok = h[i] == v;
    free(h);
    return ok;
}

static bool host_holds(const void *p, size_t n, unsigned char v)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != v)
            return false;
    return true;
}

/* Capture on @p s one copy (H2D: @p host to @p dev; else D2H), instantiated. */
static CUgraphExec capture_copy(CUstream s, void *dev, void *host, bool h2d)
{
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    if (h2d)
        tu_assert_cu(drv->cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dev, host, N, s));
    else
        tu_assert_cu(drv->cuMemcpyDtoHAsync(host, (CUdeviceptr)(uintptr_t)dev, N, s));
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

/* ---- seed 003's third case: a freed CPU tensor under a captured H2D copy ---- */

static void h2d_replay(bool on)
{
    start(on ? "debug_stale_access:True" : NULL);
    CUstream s = new_stream();
    void *dev = tu_malloc(N, s);
    void *cpu = hmalloc_at("make_cpu_tensor", N); /* x_cpu = torch.ones(n).pin_memory() */
    memset(cpu, 0x11, N);
    CUgraphExec x = capture_copy(s, dev, cpu, true); /* static_x.copy_(x_cpu, non_blocking=True) */
    replay(x, s);
    assert_true(dev_holds(dev, N, 0x11));
    hfree_at("cpu_tensor_collected", cpu); /* x_cpu goes out of scope; the graph keeps its address */
    void *other = hmalloc_at("other_cpu_tensor", N); /* another pinned tensor of the same size */
    memset(other, 0x22, N);
    replay(x, s);
    if (!on) {
        /* Off: the cache handed the block out again and the replay copied the other tensor's data. */
        assert_ptr_equal(other, cpu);
        assert_true(dev_holds(dev, N, 0x22));
    } else {
        /* On: the block is quarantined, the other tensor got another one, the device got NaN. */
        assert_ptr_not_equal(other, cpu);
        assert_true(host_holds(cpu, N, 0xFF));
        assert_true(dev_holds(dev, N, 0xFF));
        float f;
        tu_assert_cu(drv->cuMemcpyDtoH(&f, (CUdeviceptr)(uintptr_t)dev, sizeof f));
        assert_true(f != f); /* NaN */
        size_t found = 9;
        assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS); /* a stale read writes nothing */
        assert_int_equal(found, 0);
    }
    assert_int_equal(nreports, 0);
    tu_assert_cu(tu_graph()->exec_destroy(x));
    hfree(other);
    tu_free(dev);
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
}

static void test_h2d_replay_off(void **st)
{
    (void)st;
    h2d_replay(false);
}

static void test_h2d_replay_on(void **st)
{
    (void)st;
    h2d_replay(true);
}

/* A stale D2H write (a replayed copy into a freed pinned block) is found at the check, reported
 * once with both frames, named as host memory; at xseg_host_empty_cache and at snapshot time too. */
static void test_d2h_stale_write(void **st)
{
    (void)st;
    start("debug_stale_access:True");
    CUstream s = new_stream();
    void *dev = tu_malloc(N, s);
    tu_assert_cu(drv->cuMemsetD8(((CUdeviceptr)(uintptr_t)dev), 0x33, N));
    void *out = hmalloc_at("make_output_buffer", N);
    CUgraphExec x = capture_copy(s, dev, out, false); /* out_cpu.copy_(static_y, non_blocking=True) */
    replay(x, s);
    assert_true(host_holds(out, N, 0x33));
    hfree_at("output_buffer_freed", out);
    assert_true(host_holds(out, N, 0xFF)); /* filled at the free (no stream used it: done at once) */
    size_t found = 9;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 0);
    replay(x, s); /* the stale write */
    assert_int_equal(nreports, 0); /* found at a check, not before */
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 1);
    assert_int_equal(nreports, 1);
    const struct seen *r = &reports[0];
    assert_int_equal(r->device, -1);
    assert_int_equal(r->addr, (uintptr_t)out);
    assert_int_equal(r->size, N);
    assert_int_equal(r->requested, N);
    assert_int_equal(r->first_offset, 0);
    assert_string_equal(r->pool, "host");
    assert_string_equal(r->when, "xseg_check_stale");
    assert_string_equal(r->alloc_name, "make_output_buffer");
    assert_string_equal(r->free_name, "output_buffer_freed");
    assert_true(r->host_msg);
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS); /* once */
    assert_int_equal(found, 0);
    assert_int_equal(nreports, 1);

    /* Another freed block written at an offset: found by xseg_host_empty_cache, which keeps it
     * quarantined (the mode is on). */
    void *b = hmalloc_at("second_buffer", N);
    hfree_at("second_freed", b);
    ((unsigned char *)b)[4096 + 5] = 0;
    assert_int_equal(xseg_host_empty_cache(), XSEG_SUCCESS);
    assert_int_equal(nreports, 2);
    assert_string_equal(reports[1].when, "xseg_host_empty_cache");
    assert_int_equal(reports[1].first_offset, 4096 + 5);
    assert_string_equal(reports[1].free_name, "second_freed");
    void *again = hmalloc(N);
    assert_ptr_not_equal(again, b);
    assert_ptr_not_equal(again, out);

    /* And at snapshot time. */
    void *c = hmalloc_at("third_buffer", N);
    hfree_at("third_freed", c);
    ((unsigned char *)c)[N - 1] = 7;
    char path[] = "/tmp/xseg-host-stale-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(xseg_dump_snapshot(0, path), XSEG_SUCCESS);
    unlink(path);
    assert_int_equal(nreports, 3);
    assert_string_equal(reports[2].when, "snapshot");
    assert_int_equal(reports[2].first_offset, N - 1);

    tu_assert_cu(tu_graph()->exec_destroy(x));
    hfree(again);
    tu_free(dev);
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop(); /* the quarantined blocks drain: every pinned segment goes back */
    assert_int_equal(nreports, 3);
}

/* A block used on a stream enters the quarantine once the stream's work is done (filled then,
 * not before: the copy still reads it). */
static void test_recorded_stream(void **st)
{
    (void)st;
    start("debug_stale_access:True");
    tu_require_emulator_or_skip(); /* a held stream */
    CUstream s = new_stream();
    void *p = hmalloc(N);
    memset(p, 0x44, N);
    assert_int_equal(xseg_host_record_stream(p, 0, s), XSEG_SUCCESS);
    assert_true(tu_stream_hold(s));
    hfree(p);
    assert_true(host_holds(p, N, 0x44)); /* the stream's work may still read it */
    void *q = hmalloc(N);
    assert_ptr_not_equal(q, p);
    assert_true(tu_stream_release(s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    size_t found = 9;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS); /* its events done: it enters */
    assert_int_equal(found, 0);
    assert_true(host_holds(p, N, 0xFF));
    void *r = hmalloc(N);
    assert_ptr_not_equal(r, p);
    hfree(q);
    hfree(r);
    tu_assert_cu(drv->cuStreamDestroy(s));
    stop();
    assert_int_equal(nreports, 0);
}

/* debug_quarantine_mb bounds the host quarantine (its own bound, not the devices'): past it the
 * oldest blocks leave, checked, down to 7/8 of it; a block larger than the bound is not held. */
static void test_bound(void **st)
{
    (void)st;
    start("debug_stale_access:True,debug_quarantine_mb:1");
    unsigned char *a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = hmalloc(N);
        if (i)
            assert_ptr_equal(a[i], a[i - 1] + N); /* one 2 MiB segment, in order */
    }
    for (int i = 0; i < 4; i++)
        hfree(a[i]); /* 1 MiB held: the bound */
    a[0][17] = 1;    /* a stale write into the oldest */
    hfree(a[4]);     /* 1.25 MiB: a[0] and a[1] leave (768 KiB left), a[0] checked as it goes */
    assert_int_equal(nreports, 1);
    assert_string_equal(reports[0].when, "quarantine exit");
    assert_int_equal(reports[0].addr, (uintptr_t)a[0]);
    assert_int_equal(reports[0].first_offset, 17);
    void *b0 = hmalloc(N), *b1 = hmalloc(N), *b2 = hmalloc(N);
    assert_ptr_equal(b0, a[0]);
    assert_ptr_equal(b1, a[1]);
    assert_true((unsigned char *)b2 < a[0] || (unsigned char *)b2 >= a[0] + 2 * MiB); /* a[2..4] still held */
    /* Larger than the whole quarantine: back to the cache at once. */
    void *big = hmalloc(2 * MiB);
    hfree(big);
    void *big2 = hmalloc(2 * MiB);
    assert_ptr_equal(big2, big);
    hfree(big2);
    for (int i = 5; i < 8; i++)
        hfree(a[i]);
    hfree(b0);
    hfree(b1);
    hfree(b2);
    stop();
    assert_int_equal(nreports, 1);
}

/* The mode switched at run time: on, a block live before is quarantined at its free (no
 * allocation frames: history kept none for it); off with blocks held, they stay held until
 * xseg_host_empty_cache (or xseg_check_stale, a snapshot, xseg_shutdown) checks and releases them. */
static void test_switch(void **st)
{
    (void)st;
    start(NULL);
    void *live = hmalloc_at("before_switch", N);
    assert_int_equal(xseg_set_config("debug_stale_access:True"), XSEG_SUCCESS);
    hfree_at("after_switch", live);
    void *next = hmalloc(N);
    assert_ptr_not_equal(next, live); /* quarantined */
    ((unsigned char *)live)[3] = 0;
    assert_int_equal(xseg_set_config("debug_stale_access:False"), XSEG_SUCCESS);
    void *more = hmalloc(N);
    assert_ptr_not_equal(more, live); /* still held */
    hfree(more);                      /* off: straight back, not quarantined */
    assert_ptr_equal(hmalloc(N), more);
    hfree(more);
    assert_int_equal(nreports, 0);
    assert_int_equal(xseg_host_empty_cache(), XSEG_SUCCESS); /* checked and released */
    assert_int_equal(nreports, 1);
    assert_string_equal(reports[0].alloc_name, "");        /* allocated before the mode */
    assert_string_equal(reports[0].free_name, "after_switch");
    void *back = hmalloc(N);
    assert_ptr_equal(back, live);
    hfree(back);
    hfree(next);
    assert_host_empty();
    stop();
}

/* Blocks still quarantined at xseg_shutdown are checked (observers attached) and go back. */
static void test_shutdown_drains(void **st)
{
    (void)st;
    start("debug_stale_access:True");
    void *p = hmalloc_at("kept", 3 * MiB); /* a large block */
    void *q = hmalloc(N);
    hfree_at("freed_then_written", p);
    hfree(q);
    ((unsigned char *)p)[MiB] = 1;
    assert_int_equal(hstat("segment.current"), 2);
    stop();
    assert_int_equal(nreports, 1);
    assert_string_equal(reports[0].when, "xseg_shutdown");
    assert_int_equal(reports[0].first_offset, MiB);
}

/* Host memory failing at each allocation of a free with the mode on (its stack, the
 * quarantine's record) and of a check's finding: the free still succeeds (the block held, or
 * back in the cache when its record could not be made), the check too (a finding without memory
 * is counted, not kept), and nothing leaks. */
static void test_host_faults(void **st)
{
    (void)st;
    start("debug_stale_access:True");
    void *held[64];
    size_t nheld = 0;
    bool failed = true;
    for (unsigned long n = 1; failed && n < 64; n++) {
        void *p = hmalloc_at("sweep", N);
        hostmem_fail_nth(n);
        assert_int_equal(xseg_host_free(p), XSEG_SUCCESS);
        failed = hostmem_failed();
        hostmem_disarm();
        void *q = hmalloc(N); /* p again only when it was not quarantined */
        if (q == p)
            held[nheld++] = q;
        else
            hfree(q);
        assert_true(nheld < 64);
    }
    assert_false(failed); /* the sweep reached a free that allocates less than n times */
    void *w = hmalloc(N);
    hfree(w);
    ((unsigned char *)w)[0] = 0;
    failed = true;
    for (unsigned long n = 1; failed; n++) {
        size_t found = 9;
        hostmem_fail_nth(n);
        assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
        failed = hostmem_failed();
        hostmem_disarm();
        if (!failed || found)
            break; /* the finding made (kept or counted as dropped): once */
    }
    for (size_t i = 0; i < nheld; i++)
        hfree(held[i]);
    stop();
}

int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_h2d_replay_off), cmocka_unit_test(test_h2d_replay_on),
        cmocka_unit_test(test_d2h_stale_write), cmocka_unit_test(test_recorded_stream),
        cmocka_unit_test(test_bound),         cmocka_unit_test(test_switch),
        cmocka_unit_test(test_shutdown_drains), cmocka_unit_test(test_host_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
