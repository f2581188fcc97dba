/*
 * Allocation history and snapshots through the public API: the events of a known
 * sequence of calls, their frames (from the callback and from the C stack), block state, the ring
 * bound, both recording modes, stopping, threads, an OOM that writes a snapshot, the live-process
 * log, bad options. The files are checked here for their framing; tests/history/test_snapshot.py
 * loads them with a restricted unpickler and checks their structure field by field.
 *
 *   test_history              the cmocka tests
 *   test_history oom_env      XSEG_OOM_SNAPSHOT, in a process that never called xseg_set_oom_snapshot
 *   test_history write DIR    write sample snapshots into DIR for test_snapshot.py, then exit
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/hostmem.h"
#include "core/process/history.h"
#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)

static char tmpdir[256];

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int i;
    char *p = buf[i++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

/* Frames from the "interpreter": a fixed stack per thread-local depth, like Python's. */
static _Thread_local const char *cb_func = "train_step";
static _Thread_local int cb_line = 42;
static int cb_calls;

static int frames_cb(xseg_frame *frames, int max, void *user)
{
    (void)user;
    __atomic_fetch_add(&cb_calls, 1, __ATOMIC_RELAXED);
    xseg_frame f[3] = {{"model.py", cb_func, cb_line}, {"train.py", "main", 7}, {"<string>", "<module>", 1}};
    int n = max < 3 ? max : 3;
    memcpy(frames, f, (size_t)n * sizeof *f);
    return n;
}

static void record(xseg_history_record what, int stacks, size_t entries)
{
    xseg_history_options o = {0};
    o.enabled = 1;
    o.record = what;
    o.stacks = stacks;
    o.max_entries = entries;
    o.callback = (stacks & XSEG_STACKS_CALLBACK) ? frames_cb : NULL;
    o.clear = 1;
    if (xseg_record_memory_history(&o) != XSEG_SUCCESS)
        fail_msg("xseg_record_memory_history: %s", xseg_last_error());
}

static void stop(void)
{
    xseg_history_options o = {0};
    o.clear = 1;
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    assert_int_equal(xseg_record_memory_history(NULL), XSEG_SUCCESS);
}

static int setup(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    stop();
    xseg_set_oom_snapshot(NULL);
    xseg_empty_cache(0);
    return 0;
}

static const char *frame_name(uintptr_t f)
{
    static char buf[512];
    const char *file, *name;
    int line;
    hist_frame_info(f, buf, sizeof buf, &file, &name, &line);
    return name;
}

/* alloc a, alloc b, free a, record_stream b on a held stream, free b: free_completed of b waits
 * for the stream; each event carries the allocation's frames and the requested size. */
static void test_events_known_sequence(void **state)
{
    (void)state;
    CUstream s2;
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    record(XSEG_HISTORY_ALL, XSEG_STACKS_CALLBACK, 0);
    cb_func = "alloc_a";
    void *a = tu_malloc(3 * MiB + 5, NULL);
    cb_func = "alloc_b";
    cb_line = 43;
    void *b = tu_malloc(1000, NULL);
    tu_free(a);
    bool held = tu_stream_hold(s2);
    assert_int_equal(xseg_record_stream(b, s2), XSEG_SUCCESS);
    tu_free(b);

    struct hist_event *ev;
    size_t n;
    uint64_t dropped;
    assert_int_equal(hist_events_copy(&ev, &n, &dropped), XSEG_SUCCESS);
    /* segment_map (a's pages), alloc a, segment_map (b's small page), alloc b, free_requested a,
     * free_completed a, free_requested b (+ free_completed b unless the stream is held). */
    int want[] = {HIST_SEGMENT_MAP, HIST_ALLOC, HIST_SEGMENT_MAP, HIST_ALLOC, HIST_FREE_REQUESTED,
                  HIST_FREE_COMPLETED, HIST_FREE_REQUESTED};
    size_t nwant = sizeof want / sizeof *want;
    if (n < nwant)
        fail_msg("%zu events, expected at least %zu", n, nwant);
    for (size_t i = 0; i < nwant; i++)
        if (ev[i].action != want[i])
            fail_msg("event %zu is %s, expected %s", i, hist_action_name(ev[i].action), hist_action_name(want[i]));
    assert_int_equal(dropped, 0);
    assert_int_equal(ev[1].addr, (uintptr_t)a);
    assert_int_equal(ev[1].size, 3 * MiB + 5);
    assert_int_equal(ev[3].addr, (uintptr_t)b);
    assert_int_equal(ev[3].size, 1000);
    assert_int_equal(ev[4].addr, (uintptr_t)a);
    assert_int_equal(ev[5].size, 3 * MiB + 5);
    assert_int_equal(ev[6].addr, (uintptr_t)b);
    assert_true(ev[0].size >= 3 * MiB);
    for (size_t i = 1; i < n; i++)
        assert_true(ev[i].time_us >= ev[i - 1].time_us);
    /* Frames: the callback's, innermost first; a's free events carry a's allocation stack. */
    assert_non_null(ev[1].stack);
    assert_int_equal(ev[1].stack->n, 3);
    assert_string_equal(frame_name(ev[1].stack->f[0]), "alloc_a");
    assert_string_equal(frame_name(ev[3].stack->f[0]), "alloc_b");
    assert_ptr_equal(ev[4].stack, ev[1].stack);
    assert_ptr_equal(ev[5].stack, ev[1].stack);
    assert_ptr_equal(ev[0].stack, ev[1].stack); /* the segment_map it caused */
    if (held)
        assert_int_equal(n, nwant); /* b's free waits for s2 */
    hist_events_free(ev, n);

    /* The snapshot shows b pending with its stack; after the stream completes, b's free does. */
    xseg_snapshot *snap;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    xseg_snapshot_free(snap);
    if (held) {
        assert_true(tu_stream_release(s2));
        void *c = tu_malloc(512, NULL); /* processes the completed event */
        assert_int_equal(hist_events_copy(&ev, &n, &dropped), XSEG_SUCCESS);
        bool found = false;
        for (size_t i = nwant; i < n; i++)
            if (ev[i].action == HIST_FREE_COMPLETED && ev[i].addr == (uintptr_t)b && ev[i].size == 1000)
                found = true;
        assert_true(found);
        hist_events_free(ev, n);
        tu_free(c);
    }
    cb_func = "train_step";
    cb_line = 42;
    tu_assert_cu(drv->cuStreamSynchronize(s2));
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

/* The ring keeps the newest max_entries events and counts the rest. */
static void test_ring_overflow(void **state)
{
    (void)state;
    void *warm = tu_malloc(4096, NULL); /* the segment exists before recording */
    tu_free(warm);
    record(XSEG_HISTORY_ALL, XSEG_STACKS_NONE, 8);
    size_t pairs = 50;
    void *last = NULL;
    for (size_t i = 0; i < pairs; i++) {
        last = tu_malloc(4096 + i * 512, NULL);
        tu_free(last);
    }
    struct hist_event *ev;
    size_t n;
    uint64_t dropped;
    assert_int_equal(hist_events_copy(&ev, &n, &dropped), XSEG_SUCCESS);
    assert_int_equal(n, 8);
    assert_int_equal(dropped, pairs * 3 - 8);
    /* The last three: alloc, free_requested, free_completed of the last pair. */
    assert_int_equal(ev[5].action, HIST_ALLOC);
    assert_int_equal(ev[5].size, 4096 + (pairs - 1) * 512);
    assert_int_equal(ev[7].action, HIST_FREE_COMPLETED);
    assert_int_equal(ev[7].addr, (uintptr_t)last);
    hist_events_free(ev, n);
    /* A smaller ring keeps the newest. */
    xseg_history_options o = {.enabled = 1, .max_entries = 2};
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    assert_int_equal(hist_events_copy(&ev, &n, &dropped), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    assert_int_equal(ev[1].action, HIST_FREE_COMPLETED);
    hist_events_free(ev, n);
}

static size_t count_substr(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* STATE only: no events, blocks keep their frames. TRACE only: events, blocks without frames. */
static void test_modes(void **state)
{
    (void)state;
    record(XSEG_HISTORY_STATE, XSEG_STACKS_CALLBACK, 0);
    cb_func = "state_only_fn";
    void *a = tu_malloc(2 * MiB, NULL);
    struct hist_event *ev;
    size_t n;
    assert_int_equal(hist_events_copy(&ev, &n, NULL), XSEG_SUCCESS);
    assert_int_equal(n, 0);
    hist_events_free(ev, n);
    const char *p = tmp_path("state.json");
    assert_int_equal(xseg_dump_snapshot_json(0, p), XSEG_SUCCESS);
    char *j = slurp(p, NULL);
    assert_int_equal(count_substr(j, "\"name\":\"state_only_fn\""), 1); /* the block, no event */
    assert_non_null(strstr(j, "\"device_traces\":[[]"));
    free(j);

    record(XSEG_HISTORY_TRACE, XSEG_STACKS_CALLBACK, 0);
    cb_func = "trace_only_fn";
    void *b = tu_malloc(2 * MiB, NULL);
    assert_int_equal(xseg_dump_snapshot_json(0, p), XSEG_SUCCESS);
    j = slurp(p, NULL);
    /* a still shows its STATE-mode stack; b's block has none, its alloc event does. */
    assert_int_equal(count_substr(j, "\"name\":\"state_only_fn\""), 1);
    assert_int_equal(count_substr(j, "\"name\":\"trace_only_fn\""), 1);
    assert_non_null(strstr(j, "\"action\":\"alloc\""));
    free(j);
    tu_free(a);
    tu_free(b);
    cb_func = "train_step";

    /* Stopped: nothing more is recorded, and the fast path is back (pairs still work). */
    xseg_history_options off = {0};
    assert_int_equal(xseg_record_memory_history(&off), XSEG_SUCCESS);
    assert_int_equal(hist_events_copy(&ev, &n, NULL), XSEG_SUCCESS);
    size_t before = n;
    hist_events_free(ev, n);
    int calls = cb_calls;
    for (int i = 0; i < 10; i++)
        tu_free(tu_malloc(4096, NULL));
    assert_int_equal(hist_events_copy(&ev, &n, NULL), XSEG_SUCCESS);
    assert_int_equal(n, before); /* kept, not added to */
    hist_events_free(ev, n);
    assert_int_equal(cb_calls, calls);
}

/* Blocks live when recording starts: their frees are recorded (without a stack). */
static void test_live_before_start(void **state)
{
    (void)state;
    void *a = tu_malloc(5000, NULL);
    record(XSEG_HISTORY_ALL, XSEG_STACKS_NONE, 0);
    tu_free(a);
    struct hist_event *ev;
    size_t n;
    assert_int_equal(hist_events_copy(&ev, &n, NULL), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    assert_int_equal(ev[0].action, HIST_FREE_REQUESTED);
    assert_int_equal(ev[0].addr, (uintptr_t)a);
    assert_int_equal(ev[0].size, 5000);
    assert_int_equal(ev[1].action, HIST_FREE_COMPLETED);
    assert_null(ev[1].stack);
    hist_events_free(ev, n);
}

__attribute__((noinline)) void history_test_c_caller(void **out);
__attribute__((noinline)) void history_test_c_caller(void **out)
{
    *out = tu_malloc(6 * MiB, NULL);
    __asm__ volatile("" ::: "memory"); /* not a tail call: this frame stays on the stack */
}

/* C frames: return addresses symbolized at dump time; the caller is named (-rdynamic). */
static void test_c_frames(void **state)
{
    (void)state;
    record(XSEG_HISTORY_ALL, XSEG_STACKS_C, 0);
    void *a;
    history_test_c_caller(&a);
    const char *p = tmp_path("cframes.json");
    assert_int_equal(xseg_dump_snapshot_json(0, p), XSEG_SUCCESS);
    char *j = slurp(p, NULL);
    if (!strstr(j, "\"name\":\"history_test_c_caller\""))
        fail_msg("the C caller is not among the frames: %.2000s", j);
    free(j);
    tu_free(a);
}

/* Both kinds: C frames first, then the callback's. */
static void test_both_stacks(void **state)
{
    (void)state;
    record(XSEG_HISTORY_ALL, XSEG_STACKS_C | XSEG_STACKS_CALLBACK, 0);
    void *a;
    history_test_c_caller(&a);
    struct hist_event *ev;
    size_t n;
    assert_int_equal(hist_events_copy(&ev, &n, NULL), XSEG_SUCCESS);
    const struct hstack *s = NULL;
    for (size_t i = 0; i < n; i++)
        if (ev[i].action == HIST_ALLOC)
            s = ev[i].stack;
    assert_non_null(s);
    assert_true(s->n > 3);
    assert_false(s->f[0] & HIST_FRAME_TAG);
    assert_true(s->f[s->n - 1] & HIST_FRAME_TAG);
    assert_string_equal(frame_name(s->f[s->n - 3]), "train_step");
    hist_events_free(ev, n);
    tu_free(a);
}

/* Identical stacks are stored once. Two allocations from one call site share one stack;
 * repeating the call (allocations and frees, each event holding the stack) adds no stack and no
 * frame; another call site, or other callback frames, add one stack each. */
/* Out-parameters, so that the compiler cannot make the calls tail calls (no frame of their own). */
static __attribute__((noinline)) void dedup_site_a(void **out) { *out = tu_malloc(4096, NULL); }
static __attribute__((noinline)) void dedup_site_b(void **out) { *out = tu_malloc(4096, NULL); }
static volatile int dedup_two = 2; /* a loop the compiler cannot unroll into two call sites */

static const struct hstack *last_alloc_stack(uint64_t addr)
{
    struct hist_event *ev;
    size_t n;
    assert_int_equal(hist_events_copy(&ev, &n, NULL), XSEG_SUCCESS);
    const struct hstack *s = NULL;
    for (size_t i = 0; i < n; i++)
        if (ev[i].action == HIST_ALLOC && ev[i].addr == addr)
            s = ev[i].stack;
    hist_events_free(ev, n); /* the pointer is only compared from here */
    assert_non_null(s);
    return s;
}

static void test_stack_dedup(void **state)
{
    (void)state;
    record(XSEG_HISTORY_ALL, XSEG_STACKS_C | XSEG_STACKS_CALLBACK, 0);
    cb_func = "dedup_step";
    cb_line = 77;
    size_t s0, f0, s1 = 0, f1 = 0, s2, f2;
    hist_table_counts(&s0, &f0);
    /* One call site, in a loop: the first two allocations stay live, the rest come and go. */
    void *p[2] = {NULL, NULL}, *q = NULL;
    const struct hstack *a0 = NULL;
    int reps = 200 + dedup_two;
    for (int i = 0; i < reps; i++) {
        dedup_site_a(&q);
        if (i < 2) {
            p[i] = q;
        } else if (i < reps - 1) {
            tu_free(q);
        }
        if (i == 1) {
            hist_table_counts(&s1, &f1);
            assert_int_equal(s1, s0 + 1);
            a0 = last_alloc_stack((uintptr_t)p[0]);
            assert_ptr_equal(last_alloc_stack((uintptr_t)p[1]), a0);
            assert_true(a0->n > 3); /* C frames and the callback's */
        }
    }
    assert_ptr_equal(last_alloc_stack((uintptr_t)q), a0);
    hist_table_counts(&s2, &f2);
    assert_int_equal(s2, s1);
    assert_int_equal(f2, f1);
    /* Another call site: one more stack, no new callback frame. */
    void *b;
    dedup_site_b(&b);
    hist_table_counts(&s2, &f2);
    assert_int_equal(s2, s1 + 1);
    assert_int_equal(f2, f1);
    assert_true(last_alloc_stack((uintptr_t)b) != a0);
    /* Another callback line: one more stack and one more interned frame. */
    cb_line = 78;
    void *c;
    dedup_site_a(&c);
    hist_table_counts(&s2, &f2);
    assert_int_equal(s2, s1 + 2);
    assert_int_equal(f2, f1 + 1);
    cb_line = 42;
    cb_func = "train_step";
    tu_free(c);
    tu_free(b);
    tu_free(q);
    tu_free(p[0]);
    tu_free(p[1]);
}

struct thr {
    int id;
    size_t iters;
};

static void *thread_main(void *arg)
{
    struct thr *t = arg;
    tu_ctx_set();
    static const char *const names[] = {"thread_0", "thread_1", "thread_2", "thread_3"};
    cb_func = names[t->id % 4];
    void *held[8] = {0};
    for (size_t i = 0; i < t->iters; i++) {
        size_t k = i % 8;
        if (held[k])
            tu_free(held[k]);
        held[k] = tu_malloc(512 * (1 + (i * 7 + (size_t)t->id) % 64), NULL);
    }
    for (int k = 0; k < 8; k++)
        if (held[k])
            tu_free(held[k]);
    return NULL;
}

/* Four threads allocate and free with history on: every alloc has its free_requested and
 * free_completed, each with the frames of its own thread. */
static void test_threads(void **state)
{
    (void)state;
    record(XSEG_HISTORY_ALL, XSEG_STACKS_CALLBACK, 1 << 20);
    enum { T = 4 };
    pthread_t th[T];
    struct thr a[T];
    size_t iters = tu_scaled(2000, 100);
    for (int i = 0; i < T; i++) {
        a[i] = (struct thr){i, iters};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &a[i]), 0);
    }
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    struct hist_event *ev;
    size_t n;
    uint64_t dropped;
    assert_int_equal(hist_events_copy(&ev, &n, &dropped), XSEG_SUCCESS);
    assert_int_equal(dropped, 0);
    size_t allocs = 0, req = 0, done = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].action == HIST_ALLOC)
            allocs++;
        if (ev[i].action == HIST_FREE_REQUESTED)
            req++;
        if (ev[i].action == HIST_FREE_COMPLETED) {
            done++;
            assert_non_null(ev[i].stack);
            assert_int_equal(strncmp(frame_name(ev[i].stack->f[0]), "thread_", 7), 0);
        }
    }
    assert_int_equal(allocs, T * iters);
    assert_int_equal(req, allocs);
    assert_int_equal(done, allocs);
    hist_events_free(ev, n);
    cb_func = "train_step";
}

/* An OOM that surfaces writes the snapshot once, names it in the message, then rate-limits. */
static void test_oom_snapshot(void **state)
{
    (void)state;
    record(XSEG_HISTORY_ALL, XSEG_STACKS_CALLBACK, 0);
    const char *p = tmp_path("oom.pickle");
    remove(p);
    assert_int_equal(xseg_set_oom_snapshot(p), XSEG_SUCCESS);
    void *keep = tu_malloc(8 * MiB, NULL);
    size_t fr = 0, total = 0;
    tu_assert_cu(drv->cuMemGetInfo(&fr, &total));
    void *x = NULL;
    assert_int_equal(xseg_malloc(&x, total * 2, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    if (!strstr(xseg_last_error(), "A memory snapshot was written to ") || !strstr(xseg_last_error(), p))
        fail_msg("OOM message does not name the snapshot: %s", xseg_last_error());
    size_t len;
    char *buf = slurp(p, &len);
    assert_true(len > 16);
    assert_int_equal((unsigned char)buf[0], 0x80);
    assert_int_equal(buf[1], 2);
    assert_int_equal(buf[len - 1], '.');
    assert_non_null(memmem(buf, len, "oom", 3));
    assert_non_null(memmem(buf, len, "device_free", 11));
    free(buf);
    /* A second OOM right after: no new file, and the message says so. */
    remove(p);
    assert_int_equal(xseg_malloc(&x, total * 2, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    if (!strstr(xseg_last_error(), "No memory snapshot this time"))
        fail_msg("second OOM message: %s", xseg_last_error());
    assert_int_equal(access(p, F_OK), -1);
    /* Off: nothing is said. */
    assert_int_equal(xseg_set_oom_snapshot(NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&x, total * 2, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_null(strstr(xseg_last_error(), "snapshot"));
    tu_free(keep);
}

/* XSEG_OOM_SNAPSHOT names the OOM snapshot while xseg_set_oom_snapshot has not been called (a
 * process of its own: `test_history oom_env`), with history off too; the API then overrides it. */
static void test_oom_env(void **state)
{
    (void)state;
    const char *p = tmp_path("env-oom.pickle");
    remove(p);
    assert_int_equal(setenv("XSEG_OOM_SNAPSHOT", p, 1), 0);
    void *keep = tu_malloc(8 * MiB, NULL);
    size_t fr = 0, total = 0;
    tu_assert_cu(drv->cuMemGetInfo(&fr, &total));
    void *x = NULL;
    assert_int_equal(xseg_malloc(&x, total * 2, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    if (!strstr(xseg_last_error(), "A memory snapshot was written to ") || !strstr(xseg_last_error(), p))
        fail_msg("OOM message does not name the snapshot of XSEG_OOM_SNAPSHOT: %s", xseg_last_error());
    size_t len;
    char *buf = slurp(p, &len);
    assert_true(len > 16);
    assert_int_equal((unsigned char)buf[0], 0x80);
    assert_int_equal(buf[len - 1], '.');
    assert_non_null(memmem(buf, len, "segments", 8));
    assert_non_null(memmem(buf, len, "device_traces", 13));
    free(buf);
    /* The API decides from now on, even to turn it off: the variable is not read. */
    remove(p);
    assert_int_equal(xseg_set_oom_snapshot(NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&x, total * 2, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_null(strstr(xseg_last_error(), "snapshot"));
    assert_int_equal(access(p, F_OK), -1);
    unsetenv("XSEG_OOM_SNAPSHOT");
    tu_free(keep);
}

/* The OOM observer of seed 004 may write a snapshot itself: it runs with no xseg lock held. */
static int observer_calls;
static void snap_observer(int device, size_t requested, size_t total, size_t free_bytes, void *user)
{
    (void)device;
    (void)requested;
    (void)total;
    (void)free_bytes;
    if (observer_calls++ == 0 && xseg_dump_snapshot(-1, (const char *)user) != XSEG_SUCCESS)
        fprintf(stderr, "observer: %s\n", xseg_last_error());
}

static void test_oom_observer_dumps(void **state)
{
    (void)state;
    record(XSEG_HISTORY_ALL, XSEG_STACKS_NONE, 0);
    const char *p = tmp_path("observer.pickle");
    remove(p);
    assert_int_equal(xseg_attach_oom_observer(snap_observer, (void *)p), XSEG_SUCCESS);
    size_t fr = 0, total = 0;
    tu_assert_cu(drv->cuMemGetInfo(&fr, &total));
    void *x = NULL;
    assert_int_equal(xseg_malloc(&x, total * 2, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_true(observer_calls >= 1);
    size_t len;
    char *buf = slurp(p, &len);
    assert_int_equal((unsigned char)buf[0], 0x80);
    assert_int_equal(buf[len - 1], '.');
    /* The trace it holds ends with the oom (recorded before observers run) and its snapshot. */
    assert_non_null(memmem(buf, len, "device_free", 11));
    free(buf);
}

/* The pickle's framing, for a classic and an expandable device state. */
static void test_dump_pickle(void **state)
{
    (void)state;
    record(XSEG_HISTORY_ALL, XSEG_STACKS_CALLBACK, 0);
    void *a = tu_malloc(MiB / 2, NULL), *b = tu_malloc(30 * MiB, NULL);
    const char *p = tmp_path("snap.pickle");
    assert_int_equal(xseg_dump_snapshot(-1, p), XSEG_SUCCESS);
    size_t len;
    char *buf = slurp(p, &len);
    assert_int_equal((unsigned char)buf[0], 0x80);
    assert_int_equal(buf[1], 2);
    assert_int_equal(buf[len - 1], '.');
    assert_non_null(memmem(buf, len, "segments", 8));
    assert_non_null(memmem(buf, len, "device_traces", 13));
    assert_non_null(memmem(buf, len, "allocator_settings", 18));
    assert_non_null(memmem(buf, len, "active_allocated", 16));
    free(buf);
    tu_free(a);
    tu_free(b);
    /* Bad arguments name what was wrong; nothing is written. */
    assert_int_equal(xseg_dump_snapshot(0, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "path is NULL"));
    assert_int_equal(xseg_dump_snapshot(0, "/nonexistent-dir/x.pickle"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "/nonexistent-dir/x.pickle"));
    assert_int_equal(xseg_dump_snapshot(99, p), XSEG_ERROR_INVALID_DEVICE);
}

/* The live-process log: an xseg-replay trace of the window, with seeds for earlier blocks. */
static void test_dump_trace(void **state)
{
    (void)state;
    void *early = tu_malloc(7000, NULL);
    record(XSEG_HISTORY_ALL, XSEG_STACKS_NONE, 0);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *a = tu_malloc(1234, s);
    void *b = tu_malloc(3 * MiB, NULL);
    tu_free(early);
    tu_free(a);
    const char *p = tmp_path("live.trace");
    assert_int_equal(xseg_dump_trace(0, p), XSEG_SUCCESS);
    char *t = slurp(p, NULL);
    char line[128];
    snprintf(line, sizeof line, "stream s%llx\n", (unsigned long long)(uintptr_t)s);
    assert_non_null(strstr(t, line));
    assert_non_null(strstr(t, "alloc p1 7000\n"));
    snprintf(line, sizeof line, "alloc b1 1234 @s%llx\n", (unsigned long long)(uintptr_t)s);
    assert_non_null(strstr(t, line));
    assert_non_null(strstr(t, "alloc b2 3145728\n"));
    assert_non_null(strstr(t, "free p1\n"));
    assert_non_null(strstr(t, "free b1\n"));
    assert_null(strstr(t, "free b2"));
    /* seed, then the window in order */
    assert_true(strstr(t, "alloc p1") < strstr(t, "alloc b1"));
    assert_true(strstr(t, "free p1") < strstr(t, "free b1"));
    free(t);
    tu_free(b);
    tu_assert_cu(drv->cuStreamDestroy(s));
    assert_int_equal(xseg_dump_trace(0, NULL), XSEG_ERROR_INVALID_VALUE);
}

/* Files in folder @p dir (a written file, or a temporary one left behind). */
static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* xseg_dump_trace with its nth host allocation failing, for each n it makes: OUT_OF_MEMORY and
 * no file, not even a temporary one, or a trace equal to the one written without a failure;
 * never a wrong trace (a name map that could not grow used to drop names silently). */
static void test_dump_trace_host_oom(void **state)
{
    (void)state;
    void *early = tu_malloc(7000, NULL);
    record(XSEG_HISTORY_ALL, XSEG_STACKS_NONE, 0);
    void *a = tu_malloc(1234, NULL), *b = tu_malloc(3 * MiB, NULL);
    tu_free(early);
    tu_free(a);
    const char *ref = tmp_path("ref.trace");
    assert_int_equal(xseg_dump_trace(0, ref), XSEG_SUCCESS);
    char *want = slurp(ref, NULL);
    char dir[300], out[320];
    snprintf(dir, sizeof dir, "%s/oom", tmpdir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(out, sizeof out, "%s/live.trace", dir);
    int nfailed = 0;
    for (unsigned long n = 1;; n++) {
        hostmem_fail_nth(n);
        xseg_status st = xseg_dump_trace(0, out);
        bool failed = hostmem_failed();
        hostmem_disarm();
        if (st == XSEG_SUCCESS) {
            char *got = slurp(out, NULL);
            if (strcmp(got, want))
                fail_msg("host allocation %lu failed, and xseg_dump_trace wrote a wrong trace:\n%s", n, got);
            free(got);
            assert_int_equal(unlink(out), 0);
            if (!failed)
                break; /* past the last allocation */
            continue;
        }
        assert_true(failed);
        assert_int_equal(st, XSEG_ERROR_OUT_OF_MEMORY);
        assert_non_null(strstr(xseg_last_error(), "out of host memory"));
        assert_int_equal(count_files(dir), 0);
        nfailed++;
    }
    assert_true(nfailed >= 4); /* the ring's copy, the name maps, the temporary file's name */
    assert_int_equal(rmdir(dir), 0);
    free(want);
    tu_free(b);
}

static void test_bad_options(void **state)
{
    (void)state;
    xseg_history_options o = {.enabled = 1, .record = (xseg_history_record)7};
    assert_int_equal(xseg_record_memory_history(&o), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "record is 7"));
    o = (xseg_history_options){.enabled = 1, .stacks = XSEG_STACKS_CALLBACK};
    assert_int_equal(xseg_record_memory_history(&o), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "callback is NULL"));
    o = (xseg_history_options){.enabled = 1, .stacks = 8};
    assert_int_equal(xseg_record_memory_history(&o), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "stacks is 0x8"));
    o = (xseg_history_options){.enabled = 1, .max_frames = 1000};
    assert_int_equal(xseg_record_memory_history(&o), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "max_frames is 1000"));
    assert_int_equal(hist_mode(), 0); /* nothing changed */
}

/* `write DIR`: sample snapshots for test_snapshot.py (classic and expandable, with frames,
 * pending frees, an OOM event, JSON twins, and a live trace). */
static int write_samples(const char *dir)
{
    char cfgs[2][64] = {"expandable_segments:True", "expandable_segments:False"};
    const char *names[2] = {"expandable", "classic"};
    if (xseg_init(cfgs[0]) != XSEG_SUCCESS || !tu_gpu_available()) {
        fprintf(stderr, "no device: %s\n", xseg_last_error());
        return 77;
    }
    size_t fr = 0, total = 0;
    drv->cuMemGetInfo(&fr, &total);
    for (int m = 0; m < 2; m++) {
        if (xseg_set_config(cfgs[m]) != XSEG_SUCCESS)
            return 1;
        record(XSEG_HISTORY_ALL, XSEG_STACKS_C | XSEG_STACKS_CALLBACK, 0);
        CUstream s2;
        drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING);
        void *p[24] = {0};
        for (int i = 0; i < 24; i++) {
            cb_line = 100 + i;
            cb_func = i % 2 ? "forward" : "backward";
            if (xseg_malloc(&p[i], (size_t)(i % 5 + 1) * (i % 3 ? 700 * 1024 : 3 * MiB) + (size_t)i, 0,
                            i % 4 == 3 ? s2 : NULL) != XSEG_SUCCESS)
                return 1;
        }
        for (int i = 0; i < 24; i += 3)
            xseg_free(p[i]);
        void *x;
        (void)xseg_malloc(&x, total * 2, 0, NULL); /* an oom event */
        /* a pending free: used on s2, which is held (after the OOM, which waits for events) */
        tu_stream_hold(s2);
        xseg_record_stream(p[1], s2);
        xseg_free(p[1]);
        char path[512];
        snprintf(path, sizeof path, "%s/%s.pickle", dir, names[m]);
        if (xseg_dump_snapshot(-1, path) != XSEG_SUCCESS)
            return 1;
        snprintf(path, sizeof path, "%s/%s.json", dir, names[m]);
        if (xseg_dump_snapshot_json(-1, path) != XSEG_SUCCESS)
            return 1;
        snprintf(path, sizeof path, "%s/%s.trace", dir, names[m]);
        if (xseg_dump_trace(-1, path) != XSEG_SUCCESS)
            return 1;
        tu_stream_release(s2);
        drv->cuStreamSynchronize(s2);
        for (int i = 0; i < 24; i++)
            if (i % 3 && i != 1)
                xseg_free(p[i]);
        xseg_empty_cache(0);
        stop();
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "write"))
        return write_samples(argv[2]);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/xseg-history-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    if (!getenv("CUDAEMU_TOTAL_MEM"))
        setenv("CUDAEMU_TOTAL_MEM", "1G", 1);
    if (argc == 2 && !strcmp(argv[1], "oom_env")) {
        const struct CMUnitTest env_tests[] = {cmocka_unit_test_setup_teardown(test_oom_env, setup, teardown)};
        int rc = cmocka_run_group_tests(env_tests, NULL, NULL);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir);
        return rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_events_known_sequence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ring_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_modes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_live_before_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_c_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_both_stacks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stack_dedup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oom_snapshot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dump_pickle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oom_observer_dumps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dump_trace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dump_trace_host_oom, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_options, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
