/*
 * Segment observers over a real workload: a bundled xseg-replay workload replayed through the
 * replay runner (tools/replay/runner.h) with a segment observer attached, in one mode per process
 * (one replay per process, as xseg-replay does). The observer keeps a model of what is mapped
 * and checks each event against the contract (include/xseg.h, vmm/segment.h seg_params.observe):
 * ranges tile the event, at most 64 of them; an expandable range is one whole chunk (its own
 * handle, offset 0) of any length, since chunks differ in size (pages, a small device's chunks,
 * fine chunks cut at a block's end under pressure); a map never overlaps a mapped range, an
 * unmap names exactly ranges that are mapped (same address, length, handle). A `mark` is inserted
 * every MARK_EVERY actions; at each mark (the runner flushes its output there, outside any xseg
 * lock) and after the replay's final empty_cache the model is compared with the allocator:
 *  - the mapped ranges add up to reserved_bytes.all.current, and every segment of
 *    xseg_take_snapshot is covered exactly by mapped ranges;
 *  - the xseg_block_handles ranges of every live block tile the block and lie inside observed
 *    mappings, with the mapping's handle and a consistent offset.
 * A problem found at a mark is recorded and reported once the replay is over: a cmocka failure
 * inside the output callback would exit, and exit's flush of the stream would call it again.
 *
 *   test_replay_observer WORKLOAD MODE [VARIANT]   (training|inference, classic|expandable)
 * VARIANT (emulator only) replays the workload at 1/SCALE of its sizes on a small emulated device:
 *   small     4 GiB: expandable pages come in the device's smaller chunks (core/policy/expandable.c
 *             device_chunk), and no allocation fails;
 *   pressure  a device below the scaled workload's peak: refused growth, reclaim, fine chunks.
 *   inject    (self-check) a problem at the third check; selfcheck runs it in a child and wants a
 *             clean failure that names it once.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/common.h"
#include "base/vec.h"
#include "tools/replay/runner.h"
#include "tools/replay/trace.h"
#include "tools/replay/workloads.h"
#include "xseg.h"

#define MARK_EVERY 64
/* The contract's most ranges an event (xseg_segment_observer). */
#define EVENT_RANGES_MAX 64
/* The variants' workloads at 1/SCALE of their sizes: training's peak allocated becomes 2.48 GiB,
 * inference's 3.38 GiB (xseg-replay --min-device on the scaled traces: 2.50 and 3.38 GiB
 * expandable). */
#define SCALE 16

static const char *workload, *mode, *variant = "";

struct rec {
    uint64_t addr;
    size_t len;
    uint64_t handle;
    size_t offset; /* of addr inside the handle's memory */
};

struct model {
    struct rec *r;      /* mapped ranges, sorted by address, disjoint */
    size_t n, cap;
    size_t maps, unmaps, checks;
    size_t uneven; /* events whose ranges are not all of one length */
    size_t bad;
    char why[320];
};

static struct model model;
static struct trace trace; /* the replayed trace; freed by observer_teardown */
static bool trace_live;

static void model_bad(struct model *m, const char *fmt, ...)
{
    if (m->bad++)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->why, sizeof m->why, fmt, ap);
    va_end(ap);
}

/* Index of the first range with addr >= @p a (m->n if none). */
static size_t lower(const struct model *m, uint64_t a)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->r[mid].addr < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The mapped range containing address @p a, or NULL. */
static const struct rec *containing(const struct model *m, uint64_t a)
{
    size_t i = lower(m, a);
    if (i < m->n && m->r[i].addr == a)
        return &m->r[i];
    if (i == 0)
        return NULL;
    const struct rec *p = &m->r[i - 1];
    return a - p->addr < p->len ? p : NULL;
}

static void map_one(struct model *m, const xseg_phys_range *x)
{
    size_t i = lower(m, x->address);
    if ((i < m->n && x->address + x->length > m->r[i].addr) ||
        (i > 0 && m->r[i - 1].addr + m->r[i - 1].len > x->address))
        return model_bad(m, "map of [0x%llx, +%zu) overlaps a mapped range", (unsigned long long)x->address,
                         x->length);
    if (!VEC_RESERVE(m->r, m->cap, m->n + 1))
        return model_bad(m, "out of host memory");
    memmove(&m->r[i + 1], &m->r[i], (m->n - i) * sizeof *m->r);
    m->r[i] = (struct rec){x->address, x->length, x->handle, x->offset};
    m->n++;
}

static void unmap_one(struct model *m, const xseg_phys_range *x)
{
    size_t i = lower(m, x->address);
    if (i == m->n || m->r[i].addr != x->address || m->r[i].len != x->length || m->r[i].handle != x->handle ||
        m->r[i].offset != x->offset)
        return model_bad(m, "unmap of [0x%llx, +%zu) handle %llu that is not mapped as such",
                         (unsigned long long)x->address, x->length, (unsigned long long)x->handle);
    memmove(&m->r[i], &m->r[i + 1], (m->n - i - 1) * sizeof *m->r);
    m->n--;
}

/* The observer: called with the device lock held; it only updates the model. */
static void observe(const xseg_segment_event *ev, void *user)
{
    struct model *m = user;
    if (ev->device != 0 || ev->nranges == 0 || ev->nranges > EVENT_RANGES_MAX || !ev->ranges || ev->size == 0)
        return model_bad(m, "event with device %d, %zu ranges, %zu bytes", ev->device, ev->nranges, ev->size);
    if (ev->kind == XSEG_SEGMENT_MAP)
        m->maps++;
    else if (ev->kind == XSEG_SEGMENT_UNMAP)
        m->unmaps++;
    else
        return model_bad(m, "unknown event kind %d", (int)ev->kind);
    bool expandable = !strcmp(mode, "expandable");
    if (ev->is_expandable != expandable)
        return model_bad(m, "is_expandable %d in %s mode", ev->is_expandable, mode);
    if (!expandable && (ev->nranges != 1 || ev->ranges[0].handle != 0 || ev->ranges[0].offset != 0))
        return model_bad(m, "classic segment event with %zu ranges, handle %llu", ev->nranges,
                         (unsigned long long)ev->ranges[0].handle);
    uint64_t at = ev->address;
    bool uneven = false;
    for (size_t i = 0; i < ev->nranges; i++) {
        const xseg_phys_range *x = &ev->ranges[i];
        if (x->address != at || x->length == 0)
            return model_bad(m, "ranges do not tile the event at 0x%llx", (unsigned long long)at);
        /* One whole chunk: its own handle from its start. Chunks of one event may differ in length
         * (a page cut into the device's chunks, fine chunks ending at a block's end). */
        if (expandable && (x->handle == 0 || x->offset != 0))
            return model_bad(m, "expandable range at 0x%llx: handle %llu, offset %zu, %zu bytes",
                             (unsigned long long)x->address, (unsigned long long)x->handle, x->offset, x->length);
        uneven |= x->length != ev->ranges[0].length;
        at += x->length;
        if (ev->kind == XSEG_SEGMENT_MAP)
            map_one(m, x);
        else
            unmap_one(m, x);
    }
    m->uneven += uneven;
    if (at != ev->address + ev->size)
        model_bad(m, "ranges add up to %llu of the event's %zu bytes", (unsigned long long)(at - ev->address),
                  ev->size);
}

/* The handle ranges of live block @p b tile it inside observed mappings. Each call with a
 * capacity is a hand-out that holds the block's pool awake: this releases them (the workload
 * sleeps pools later). */
static void block_verify(struct model *m, const xseg_block_info *b, const char *where)
{
    static xseg_phys_range *hr;
    static size_t hcap;
    void *p = (void *)(uintptr_t)b->address;
    size_t n = 0;
    int holds = 0;
    xseg_status st = xseg_block_handles(p, hr, hcap, &n);
    holds += st == XSEG_SUCCESS && hcap > 0;
    if (st == XSEG_SUCCESS && n > hcap) {
        if (!VEC_RESERVE(hr, hcap, n)) {
            model_bad(m, "%s: out of host memory", where);
        } else {
            st = xseg_block_handles(p, hr, hcap, &n);
            holds += st == XSEG_SUCCESS;
        }
    }
    if (st != XSEG_SUCCESS)
        model_bad(m, "%s: xseg_block_handles: %s", where, xseg_last_error());
    while (holds-- > 0)
        if (xseg_block_handles_release(p) != XSEG_SUCCESS)
            model_bad(m, "%s: xseg_block_handles_release: %s", where, xseg_last_error());
    if (m->bad)
        return;
    uint64_t at = b->address;
    for (size_t k = 0; k < n; k++) {
        const xseg_phys_range *x = &hr[k];
        const struct rec *q = containing(m, x->address);
        if (x->address != at || !q || x->length > q->addr + q->len - x->address || x->handle != q->handle ||
            x->offset != q->offset + (x->address - q->addr))
            return model_bad(m,
                             "%s: block 0x%llx range %zu [0x%llx, +%zu) handle %llu offset %zu is not inside an "
                             "observed mapping",
                             where, (unsigned long long)b->address, k, (unsigned long long)x->address, x->length,
                             (unsigned long long)x->handle, x->offset);
        at += x->length;
    }
    if (at != b->address + b->size)
        model_bad(m, "%s: block 0x%llx of %zu bytes: its handle ranges cover %llu", where,
                  (unsigned long long)b->address, b->size, (unsigned long long)(at - b->address));
}

/* Compare the model with the allocator (no xseg lock held). Fails nothing: the first problem
 * (here or in an event) is recorded in m->why, and later checks stop at once. */
static void model_verify(struct model *m, const char *where)
{
    m->checks++;
    if (m->bad)
        return;
    size_t mapped = 0;
    for (size_t i = 0; i < m->n; i++)
        mapped += m->r[i].len;
    int64_t reserved = -1;
    if (xseg_stat(0, "reserved_bytes.all.current", &reserved) != XSEG_SUCCESS)
        return model_bad(m, "%s: xseg_stat: %s", where, xseg_last_error());
    if ((int64_t)mapped != reserved)
        return model_bad(m, "%s: the observer sees %zu bytes mapped, reserved_bytes says %lld", where, mapped,
                         (long long)reserved);
    if (!strcmp(variant, "inject") && m->checks == 3)
        return model_bad(m, "%s: injected problem (check %zu)", where, m->checks);

    xseg_snapshot *s = NULL;
    if (xseg_take_snapshot(0, &s) != XSEG_SUCCESS)
        return model_bad(m, "%s: xseg_take_snapshot: %s", where, xseg_last_error());
    size_t segbytes = 0;
    for (size_t si = 0; si < s->nsegments && !m->bad; si++) {
        const xseg_segment_info *g = &s->segments[si];
        segbytes += g->total_size;
        /* The segment is covered by consecutive mapped ranges, exactly. */
        uint64_t a = g->address, end = g->address + g->total_size;
        size_t i = lower(m, a);
        while (a < end && !m->bad) {
            if (i == m->n || m->r[i].addr != a || m->r[i].len > end - a)
                model_bad(m, "%s: segment [0x%llx, +%zu) is not tiled by observed mappings at 0x%llx", where,
                          (unsigned long long)g->address, g->total_size, (unsigned long long)a);
            else
                a += m->r[i++].len;
        }
        for (size_t bi = 0; bi < g->nblocks && !m->bad; bi++)
            if (g->blocks[bi].state == XSEG_BLOCK_ACTIVE_ALLOCATED)
                block_verify(m, &g->blocks[bi], where);
    }
    xseg_snapshot_free(s);
    if (!m->bad && (int64_t)segbytes != reserved)
        model_bad(m, "%s: the snapshot's segments hold %zu bytes, reserved_bytes says %lld", where, segbytes,
                  (long long)reserved);
}

/* Fail the test with the first problem found (never from inside the runner's output). */
static void model_assert(struct model *m, const char *where)
{
    model_verify(m, where);
    if (m->bad)
        fail_msg("%s", m->why);
}

/* Set while run_trace runs: only then does a flush check the model. A stream cmocka leaves open
 * when a test fails is flushed again by exit(), and must not reach xseg then. */
static bool replaying;

/* The runner's output: it flushes after every mark, outside any xseg lock. */
static ssize_t out_write(void *cookie, const char *buf, size_t size)
{
    (void)cookie;
    if (replaying && memchr(buf, '\n', size)) {
        char where[48];
        snprintf(where, sizeof where, "at mark %zu", model.checks);
        model_verify(&model, where);
    }
    return (ssize_t)size;
}

/* The workload's trace text with `mark obs` after every MARK_EVERY actions. */
static char *with_marks(const char *text, size_t len, size_t *outlen)
{
    char *out = NULL;
    size_t olen = 0;
    FILE *f = open_memstream(&out, &olen);
    assert_non_null(f);
    size_t actions = 0;
    for (const char *p = text, *e = text + len; p < e;) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        size_t n = nl ? (size_t)(nl - p) + 1 : (size_t)(e - p);
        fwrite(p, 1, n, f);
        if (!nl)
            fputc('\n', f);
        if (n > 1 && p[0] != '#' && ++actions % MARK_EVERY == 0)
            fputs("mark obs\n", f);
        p += n;
    }
    assert_int_equal(fclose(f), 0);
    *outlen = olen;
    return out;
}

/* Whether the driver xseg loaded is cudaemu (it exports its controls). */
static bool emulated(void)
{
    const char *lib = getenv("XSEG_LIBCUDA");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    bool yes = h && dlsym(h, "cudaemu_call_count");
    if (h)
        dlclose(h);
    return yes;
}

/* The emulated device of a variant (NULL: the runner's 80 GiB). */
static const char *device_mem(void)
{
    if (!strcmp(variant, "small"))
        return "4G";
    if (!strcmp(variant, "pressure")) /* under the scaled peaks (2.48 and 3.38 GiB) */
        return !strcmp(workload, "training") ? "2400M" : "3200M";
    return NULL;
}

static void test_observer_replay(void **state)
{
    (void)state;
    char err[TRACE_ERR_MAX];
    int emu = 0;
    if (run_find_driver(NULL, 0, device_mem(), &emu, err, sizeof err) != XSEG_SUCCESS) {
        print_message("[  SKIPPED ] %s\n", err);
        skip();
    }
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(wl_generate(workload, 1, &text, &len, err, sizeof err), XSEG_SUCCESS);
    size_t mlen = 0;
    char *marked = with_marks(text, len, &mlen);
    free(text);
    struct trace *t = &trace;
    char source[64];
    snprintf(source, sizeof source, "builtin:%s", workload);
    assert_int_equal(trace_init(t, source), XSEG_SUCCESS);
    trace_live = true;
    if (trace_parse_text(t, marked, mlen, err, sizeof err) != XSEG_SUCCESS)
        fail_msg("parse: %s", err);
    free(marked);
    bool scaled = !strcmp(variant, "small") || !strcmp(variant, "pressure");
    size_t nmarks = 0;
    for (size_t i = 0; i < t->count; i++) {
        struct trace_action *a = &t->actions[i];
        nmarks += a->op == TRACE_MARK;
        if (scaled && (a->op == TRACE_ALLOC || a->op == TRACE_TRIM))
            a->size = a->size / SCALE ? a->size / SCALE : 1;
    }

    const char *cfg = !strcmp(mode, "expandable") ? "expandable_segments:True" : "expandable_segments:False";
    if (run_init(cfg, err, sizeof err) != XSEG_SUCCESS) {
        print_message("[  SKIPPED ] %s\n", err);
        skip();
    }
    if (scaled && !emulated()) {
        print_message("[  SKIPPED ] the %s variant needs the emulator's device size\n", variant);
        skip();
    }
    assert_int_equal(xseg_attach_segment_observer(observe, &model), XSEG_SUCCESS);
    model_assert(&model, "after attach");

    FILE *out = fopencookie(NULL, "w", (cookie_io_functions_t){.write = out_write});
    assert_non_null(out);
    struct run_options o = {.pool = XSEG_STAT_ALL, .marks = RUN_MARKS_JSONL};
    struct run_summary sum;
    replaying = true;
    xseg_status st = run_trace(t, &o, out, &sum, NULL, err, sizeof err);
    fclose(out);
    replaying = false;
    if (model.bad) /* first: a wrong model may be why the replay went wrong */
        fail_msg("%s", model.why);
    if (st != XSEG_SUCCESS)
        fail_msg("replay: %s", err);
    assert_string_equal(sum.mode, mode);
    /* Every mark was checked (plus the check after attach), then the state after the final
     * empty_cache. */
    assert_int_equal(model.checks, nmarks + 1);
    model_assert(&model, "after the replay's final empty_cache");
    size_t mapped = 0;
    for (size_t i = 0; i < model.n; i++)
        mapped += model.r[i].len;
    assert_int_equal((int64_t)mapped, sum.reserved_after_empty_cache);
    /* The workload grows and its final empty_cache gives cached memory back: both directions seen. */
    assert_true(model.maps > 0 && model.unmaps > 0);
    int64_t retries = -1;
    assert_int_equal(xseg_stat(0, "num_alloc_retries", &retries), XSEG_SUCCESS);
    if (!strcmp(variant, "pressure")) {
        /* The device refused growth: the reclaim ran, and some allocations failed. */
        assert_true(retries > 0);
    } else {
        assert_int_equal(sum.failed_allocs, 0);
    }
    /* Pages cut into unequal chunks were observed (small: 8 MiB chunks of 20 MiB pages). */
    if (scaled && !strcmp(mode, "expandable"))
        assert_true(model.uneven > 0);
    print_message("%s%s%s, %s: %zu map and %zu unmap events (%zu of unequal ranges), %zu checks, %zu ranges "
                  "mapped at the end, %lld retries, %llu failed allocations\n",
                  source, *variant ? " " : "", variant, mode, model.maps, model.unmaps, model.uneven, model.checks,
                  model.n, (long long)retries, (unsigned long long)sum.failed_allocs);

    assert_int_equal(xseg_detach_segment_observer(observe, &model), XSEG_SUCCESS);
}

/* Runs after a failure too (cmocka's longjmp skips the test's own cleanup). */
static int observer_teardown(void **state)
{
    (void)state;
    if (trace_live)
        trace_destroy(&trace);
    trace_live = false;
    (void)xseg_detach_segment_observer(observe, &model); /* still attached after a failure */
    free(model.r);
    model.r = NULL;
    model.n = model.cap = 0;
    return 0;
}

/* A problem found at a mark fails the test cleanly: the `inject` variant, run in a child, exits
 * with a failure that names the problem once (before, exit's flush re-entered the check until the
 * stack overflowed: SIGSEGV). */
static void test_failure_is_clean(void **state)
{
    (void)state;
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        execl("/proc/self/exe", "test_replay_observer", "training", "expandable", "inject", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    /* Read all of it (the old failure printed megabytes), counting the problem's lines. */
    static const char needle[] = "injected problem";
    char buf[8192 + sizeof needle];
    size_t keep = 0, found = 0, total = 0;
    for (;;) {
        ssize_t r = read(fd[0], buf + keep, sizeof buf - 1 - keep);
        if (r <= 0)
            break;
        total += (size_t)r;
        size_t n = keep + (size_t)r;
        buf[n] = 0;
        for (const char *q = buf; (q = strstr(q, needle)); q += sizeof needle - 1)
            found++;
        /* Carry a tail shorter than the needle, so that no match is counted twice or missed. */
        keep = XSEG_MIN(n, sizeof needle - 2);
        memmove(buf, buf + n - keep, keep);
    }
    close(fd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        fail_msg("the failing run was killed by signal %d after %zu bytes of output", WTERMSIG(status), total);
    assert_true(WIFEXITED(status));
    assert_int_not_equal(WEXITSTATUS(status), 0);
    assert_int_not_equal(WEXITSTATUS(status), 127);
    assert_int_equal(found, 1);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "selfcheck")) {
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_failure_is_clean)};
        return cmocka_run_group_tests(tests, NULL, NULL);
    }
    if ((argc != 3 && argc != 4) || (strcmp(argv[2], "classic") && strcmp(argv[2], "expandable")) ||
        (argc == 4 && strcmp(argv[3], "small") && strcmp(argv[3], "pressure") && strcmp(argv[3], "inject"))) {
        fprintf(stderr, "usage: %s WORKLOAD classic|expandable [small|pressure|inject], or %s selfcheck\n", argv[0],
                argv[0]);
        return 2;
    }
    workload = argv[1];
    mode = argv[2];
    if (argc == 4)
        variant = argv[3];
    const struct CMUnitTest tests[] = {cmocka_unit_test_teardown(test_observer_replay, observer_teardown)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
