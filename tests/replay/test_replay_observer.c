/*
 * Segment observers over a real workload: a bundled xseg-replay workload replayed through the
 * replay runner (tools/replay/runner.h) with a segment observer attached, in one mode per process
 * (one replay per process, as xseg-replay does). The observer keeps a model of what is mapped
 * and checks each event: ranges tile the event, a map never overlaps a mapped range, an unmap
 * names exactly ranges that are mapped (same address, length, handle). A `mark` is inserted every
 * MARK_EVERY actions; at each mark (the runner flushes its output there, outside any xseg lock)
 * and after the replay's final empty_cache the model is compared with the allocator:
 *  - the mapped ranges add up to reserved_bytes.all.current, and every segment of
 *    xseg_take_snapshot is covered exactly by mapped ranges;
 *  - the xseg_block_handles ranges of every live block tile the block and lie inside observed
 *    mappings, with the mapping's handle and a consistent offset.
 *
 *   test_replay_observer WORKLOAD MODE     (training|inference, classic|expandable)
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/vec.h"
#include "tools/replay/runner.h"
#include "tools/replay/trace.h"
#include "tools/replay/workloads.h"
#include "xseg.h"

#define MARK_EVERY 64

static const char *workload, *mode;

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
    size_t bad;
    char why[320];
};

static struct model model;

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
    if (ev->device != 0 || ev->nranges == 0 || !ev->ranges || ev->size == 0)
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
    for (size_t i = 0; i < ev->nranges; i++) {
        const xseg_phys_range *x = &ev->ranges[i];
        if (x->address != at || x->length == 0)
            return model_bad(m, "ranges do not tile the event at 0x%llx", (unsigned long long)at);
        if (expandable && (x->handle == 0 || x->offset != 0 || x->length != ev->ranges[0].length))
            return model_bad(m, "expandable range at 0x%llx: handle %llu, offset %zu, %zu bytes",
                             (unsigned long long)x->address, (unsigned long long)x->handle, x->offset, x->length);
        at += x->length;
        if (ev->kind == XSEG_SEGMENT_MAP)
            map_one(m, x);
        else
            unmap_one(m, x);
    }
    if (at != ev->address + ev->size)
        model_bad(m, "ranges add up to %llu of the event's %zu bytes", (unsigned long long)(at - ev->address),
                  ev->size);
}

/* Compare the model with the allocator (no xseg lock held). */
static void model_check(struct model *m, const char *where)
{
    m->checks++;
    if (m->bad)
        fail_msg("%s: observer: %s", where, m->why);
    size_t mapped = 0;
    for (size_t i = 0; i < m->n; i++)
        mapped += m->r[i].len;
    int64_t reserved = -1;
    assert_int_equal(xseg_stat(0, "reserved_bytes.all.current", &reserved), XSEG_SUCCESS);
    if ((int64_t)mapped != reserved)
        fail_msg("%s: the observer sees %zu bytes mapped, reserved_bytes says %lld", where, mapped,
                 (long long)reserved);

    xseg_snapshot *s = NULL;
    assert_int_equal(xseg_take_snapshot(0, &s), XSEG_SUCCESS);
    static xseg_phys_range *hr;
    static size_t hcap;
    size_t segbytes = 0, live = 0;
    for (size_t si = 0; si < s->nsegments; si++) {
        const xseg_segment_info *g = &s->segments[si];
        segbytes += g->total_size;
        /* The segment is covered by consecutive mapped ranges, exactly. */
        uint64_t a = g->address, end = g->address + g->total_size;
        size_t i = lower(m, a);
        while (a < end) {
            if (i == m->n || m->r[i].addr != a || m->r[i].len > end - a)
                fail_msg("%s: segment [0x%llx, +%zu) is not tiled by observed mappings at 0x%llx", where,
                         (unsigned long long)g->address, g->total_size, (unsigned long long)a);
            a += m->r[i++].len;
        }
        for (size_t bi = 0; bi < g->nblocks; bi++) {
            const xseg_block_info *b = &g->blocks[bi];
            if (b->state != XSEG_BLOCK_ACTIVE_ALLOCATED)
                continue;
            live++;
            void *p = (void *)(uintptr_t)b->address;
            size_t n = 0;
            /* Each call with a capacity is a hand-out that holds the block's pool awake: this
             * check releases them (the workload sleeps pools later). */
            int holds = hcap > 0;
            assert_int_equal(xseg_block_handles(p, hr, hcap, &n), XSEG_SUCCESS);
            if (n > hcap) {
                assert_true(VEC_RESERVE(hr, hcap, n));
                assert_int_equal(xseg_block_handles(p, hr, hcap, &n), XSEG_SUCCESS);
                holds++;
            }
            while (holds--)
                assert_int_equal(xseg_block_handles_release(p), XSEG_SUCCESS);
            uint64_t at = b->address;
            for (size_t k = 0; k < n; k++) {
                const xseg_phys_range *x = &hr[k];
                const struct rec *q = containing(m, x->address);
                if (x->address != at || !q || x->length > q->addr + q->len - x->address || x->handle != q->handle ||
                    x->offset != q->offset + (x->address - q->addr))
                    fail_msg("%s: block 0x%llx range %zu [0x%llx, +%zu) handle %llu offset %zu is not inside an "
                             "observed mapping",
                             where, (unsigned long long)b->address, k, (unsigned long long)x->address, x->length,
                             (unsigned long long)x->handle, x->offset);
                at += x->length;
            }
            if (at != b->address + b->size)
                fail_msg("%s: block 0x%llx of %zu bytes: its handle ranges cover %llu", where,
                         (unsigned long long)b->address, b->size, (unsigned long long)(at - b->address));
        }
    }
    xseg_snapshot_free(s);
    assert_int_equal((int64_t)segbytes, reserved);
    (void)live;
}

/* The runner's output: it flushes after every mark, outside any xseg lock. */
static ssize_t out_write(void *cookie, const char *buf, size_t size)
{
    (void)cookie;
    if (memchr(buf, '\n', size))
        model_check(&model, "at a mark");
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

static void test_observer_replay(void **state)
{
    (void)state;
    char err[TRACE_ERR_MAX];
    int emu = 0;
    if (run_find_driver(NULL, 0, NULL, &emu, err, sizeof err) != XSEG_SUCCESS) {
        print_message("[  SKIPPED ] %s\n", err);
        skip();
    }
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(wl_generate(workload, 1, &text, &len, err, sizeof err), XSEG_SUCCESS);
    size_t mlen = 0;
    char *marked = with_marks(text, len, &mlen);
    free(text);
    struct trace t;
    char source[64];
    snprintf(source, sizeof source, "builtin:%s", workload);
    assert_int_equal(trace_init(&t, source), XSEG_SUCCESS);
    if (trace_parse_text(&t, marked, mlen, err, sizeof err) != XSEG_SUCCESS)
        fail_msg("parse: %s", err);
    free(marked);
    size_t nmarks = 0;
    for (size_t i = 0; i < t.count; i++)
        nmarks += t.actions[i].op == TRACE_MARK;

    const char *cfg = !strcmp(mode, "expandable") ? "expandable_segments:True" : "expandable_segments:False";
    if (run_init(cfg, err, sizeof err) != XSEG_SUCCESS) {
        print_message("[  SKIPPED ] %s\n", err);
        skip();
    }
    assert_int_equal(xseg_attach_segment_observer(observe, &model), XSEG_SUCCESS);
    model_check(&model, "after attach");

    FILE *out = fopencookie(NULL, "w", (cookie_io_functions_t){.write = out_write});
    assert_non_null(out);
    struct run_options o = {.pool = XSEG_STAT_ALL, .marks = RUN_MARKS_JSONL};
    struct run_summary sum;
    if (run_trace(&t, &o, out, &sum, NULL, err, sizeof err) != XSEG_SUCCESS)
        fail_msg("replay: %s", err);
    fclose(out);
    assert_int_equal(sum.failed_allocs, 0);
    assert_string_equal(sum.mode, mode);
    /* Every mark was checked (plus the check after attach), then the state after the final
     * empty_cache. */
    assert_int_equal(model.checks, nmarks + 1);
    model_check(&model, "after the replay's final empty_cache");
    size_t mapped = 0;
    for (size_t i = 0; i < model.n; i++)
        mapped += model.r[i].len;
    assert_int_equal((int64_t)mapped, sum.reserved_after_empty_cache);
    /* The workload grows and its final empty_cache gives cached memory back: both directions seen. */
    assert_true(model.maps > 0 && model.unmaps > 0);
    print_message("%s, %s: %zu map and %zu unmap events, %zu checks, %zu ranges mapped at the end\n", source,
                  mode, model.maps, model.unmaps, model.checks, model.n);

    assert_int_equal(xseg_detach_segment_observer(observe, &model), XSEG_SUCCESS);
    trace_destroy(&t);
    free(model.r);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "classic") && strcmp(argv[2], "expandable"))) {
        fprintf(stderr, "usage: %s WORKLOAD classic|expandable\n", argv[0]);
        return 2;
    }
    workload = argv[1];
    mode = argv[2];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_observer_replay)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
