/*
 * xseg_pool_malloc_at through the public API: a block placed at an address of a private pool's
 * free block (what cudagraph trees' setCheckpointPoolState needs), in classic and expandable
 * segments. Statistics are checked after every step against a recount of the snapshot by
 * PyTorch's definitions (inactive_split: the free blocks of split classic segments), and the
 * placed blocks against the layout they restore; with history on, the placement is an alloc event
 * with the caller's stack, and its free a free (checked in the JSON snapshot).
 *
 *   test_malloc_at TEST    one test per process (meson passes the name)
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

/* The statistics PyTorch defines over blocks, recounted from a snapshot of device 0. */
struct recount {
    int64_t allocation, allocated_bytes, active, active_bytes, requested_bytes;
    int64_t inactive_split[2], inactive_split_bytes[2]; /* small, large */
    int64_t segment, reserved_bytes;
};

static struct recount recount(void)
{
    struct recount r = {0};
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    for (size_t i = 0; i < snap->nsegments; i++) {
        const xseg_segment_info *s = &snap->segments[i];
        if (!s->is_expandable) {
            r.segment++;
            r.reserved_bytes += (int64_t)s->total_size;
        }
        for (size_t j = 0; j < s->nblocks; j++) {
            const xseg_block_info *b = &s->blocks[j];
            if (b->state == XSEG_BLOCK_ACTIVE_ALLOCATED) {
                r.allocation++;
                r.allocated_bytes += (int64_t)b->size;
            }
            if (b->state != XSEG_BLOCK_INACTIVE) {
                r.active++;
                r.active_bytes += (int64_t)b->size;
                r.requested_bytes += (int64_t)b->requested_size;
            } else if (!s->is_expandable && s->nblocks > 1) {
                r.inactive_split[s->is_large]++;
                r.inactive_split_bytes[s->is_large] += (int64_t)b->size;
            }
        }
    }
    xseg_snapshot_free(snap);
    return r;
}

/* Every statistic the recount covers equals it. */
static void check_stats(const char *where)
{
    struct recount r = recount();
    struct {
        const char *key;
        int64_t want;
    } rows[] = {
        {"allocation.all.current", r.allocation},
        {"allocated_bytes.all.current", r.allocated_bytes},
        {"active.all.current", r.active},
        {"active_bytes.all.current", r.active_bytes},
        {"requested_bytes.all.current", r.requested_bytes},
        {"inactive_split.small_pool.current", r.inactive_split[0]},
        {"inactive_split.large_pool.current", r.inactive_split[1]},
        {"inactive_split.all.current", r.inactive_split[0] + r.inactive_split[1]},
        {"inactive_split_bytes.small_pool.current", r.inactive_split_bytes[0]},
        {"inactive_split_bytes.large_pool.current", r.inactive_split_bytes[1]},
        {"inactive_split_bytes.all.current", r.inactive_split_bytes[0] + r.inactive_split_bytes[1]},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (tu_stat(rows[i].key) != rows[i].want)
            fail_msg("%s: %s is %lld, the blocks say %lld", where, rows[i].key, (long long)tu_stat(rows[i].key),
                     (long long)rows[i].want);
}

/* The state and size of the block at @p addr in the snapshot (state -1: none starts there). */
static int block_at(uintptr_t addr, size_t *size)
{
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    int state = -1;
    for (size_t i = 0; i < snap->nsegments; i++)
        for (size_t j = 0; j < snap->segments[i].nblocks; j++)
            if (snap->segments[i].blocks[j].address == addr) {
                state = (int)snap->segments[i].blocks[j].state;
                *size = snap->segments[i].blocks[j].size;
            }
    xseg_snapshot_free(snap);
    return state;
}

static void *pool_malloc(xseg_pool_id pool, size_t size)
{
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *p = tu_malloc(size, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS); /* the begin's use */
    return p;
}

/* Place [p, p + size) and check the block and the statistics. */
static void place(xseg_pool_id pool, uintptr_t p, size_t size, const char *where)
{
    if (xseg_pool_malloc_at(0, pool, (void *)p, size) != XSEG_SUCCESS)
        fail_msg("%s: xseg_pool_malloc_at(0x%lx, %zu): %s", where, (unsigned long)p, size, xseg_last_error());
    size_t got = 0;
    assert_int_equal(block_at(p, &got), XSEG_BLOCK_ACTIVE_ALLOCATED);
    assert_int_equal(got, size);
    check_stats(where);
}

/* Every current statistic (xseg_stat_key's list), to compare a restored layout with the original. */
#define NKEYS 160
static void currents(int64_t out[NKEYS])
{
    memset(out, 0, NKEYS * sizeof *out);
    const char *key;
    for (size_t i = 0; i < NKEYS && xseg_stat_key(i, &key) == XSEG_SUCCESS && key; i++)
        if (strstr(key, ".current"))
            out[i] = tu_stat(key);
}

static void same_currents(const int64_t a[NKEYS], const int64_t b[NKEYS], const char *where)
{
    const char *key;
    for (size_t i = 0; i < NKEYS && xseg_stat_key(i, &key) == XSEG_SUCCESS && key; i++)
        if (a[i] != b[i])
            fail_msg("%s: %s is %lld, was %lld with the original layout", where, key, (long long)b[i],
                     (long long)a[i]);
}

/* Classic segments of a private pool: a block placed where a freed block was restores the
 * original statistics exactly; placements with a head, a tail, both or neither, in split and
 * unsplit segments of both pools, count inactive_split as PyTorch's splitting does; the frees
 * merge back. */
static void test_classic(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_retain(0, pool), XSEG_SUCCESS); /* a graph's use, as cudagraph trees hold */
    /* A 20 MiB segment: a 2 | b 3 | c 4 | free 11. A 12 MiB segment, one block. A 2 MiB small one:
     * s 100 KiB | free. */
    uintptr_t a = (uintptr_t)pool_malloc(pool, 2 * MiB), b = (uintptr_t)pool_malloc(pool, 3 * MiB);
    uintptr_t c = (uintptr_t)pool_malloc(pool, 4 * MiB), w = (uintptr_t)pool_malloc(pool, 12 * MiB);
    uintptr_t s = (uintptr_t)pool_malloc(pool, 100 * KiB);
    void *outside = tu_malloc(MiB, NULL);
    assert_int_equal(b, a + 2 * MiB);
    assert_int_equal(c, b + 3 * MiB);
    check_stats("the layout");
    int64_t orig[NKEYS], now[NKEYS];
    currents(orig);

    /* Neither head nor tail, in a split segment: b freed and placed again is the layout again. */
    tu_free((void *)b);
    check_stats("b freed");
    place(pool, b, 3 * MiB, "b placed");
    currents(now);
    same_currents(orig, now, "b placed");

    /* Head and tail, in the free end of a split segment: 11 MiB becomes 1 | 2 (placed) | 8. */
    uintptr_t mid = c + 5 * MiB;
    int64_t split = tu_stat("inactive_split.large_pool.current");
    int64_t split_bytes = tu_stat("inactive_split_bytes.large_pool.current");
    place(pool, mid, 2 * MiB, "head and tail");
    assert_int_equal(tu_stat("inactive_split.large_pool.current"), split + 1);
    assert_int_equal(tu_stat("inactive_split_bytes.large_pool.current"), split_bytes - (int64_t)(2 * MiB));
    /* A tail only (at the 1 MiB head's start), a head only (ending at the segment's end). */
    place(pool, c + 4 * MiB, 512 * KiB, "tail only");
    place(pool, c + 14 * MiB, 1 * MiB, "head only");
    size_t got = 0;
    assert_int_equal(block_at(c + 4 * MiB + 512 * KiB, &got), XSEG_BLOCK_INACTIVE);
    assert_int_equal(got, 512 * KiB);
    assert_int_equal(block_at(c + 7 * MiB, &got), XSEG_BLOCK_INACTIVE);
    assert_int_equal(got, 7 * MiB);

    /* An unsplit segment: w freed is one whole free block (not inactive_split); a placement in it
     * splits it (head 2, tail 6: two inactive split blocks), then one in its tail leaves a head. */
    tu_free((void *)w);
    check_stats("w freed");
    split = tu_stat("inactive_split.large_pool.current");
    split_bytes = tu_stat("inactive_split_bytes.large_pool.current");
    place(pool, w + 2 * MiB, 4 * MiB, "unsplit segment");
    assert_int_equal(tu_stat("inactive_split.large_pool.current"), split + 2);
    assert_int_equal(tu_stat("inactive_split_bytes.large_pool.current"), split_bytes + (int64_t)(8 * MiB));
    place(pool, w + 10 * MiB, 2 * MiB, "the tail's end");
    /* The whole segment again: both placed blocks freed, then the whole range placed. */
    tu_free((void *)(w + 2 * MiB));
    tu_free((void *)(w + 10 * MiB));
    check_stats("w's pieces freed");
    assert_int_equal(block_at(w, &got), XSEG_BLOCK_INACTIVE);
    assert_int_equal(got, 12 * MiB);
    place(pool, w, 12 * MiB, "the whole segment");

    /* The small pool: s freed, placed again; a placement in its free rest. */
    tu_free((void *)s);
    place(pool, s, 100 * KiB, "small pool");
    place(pool, s + 512 * KiB, 4 * KiB + 512, "small pool, head and tail");

    /* Refusals, nothing changed: over a live block, across a live block's edge, size 0, outside
     * the pool, the default pool. */
    currents(orig);
    assert_int_equal(xseg_pool_malloc_at(0, pool, (void *)a, MiB), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "allocated"));
    assert_int_equal(xseg_pool_malloc_at(0, pool, (void *)(c + 4 * MiB + 768 * KiB), MiB),
                     XSEG_ERROR_ILLEGAL_STATE);
    assert_int_equal(xseg_pool_malloc_at(0, pool, (void *)(c + 9 * MiB), 0), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_pool_malloc_at(0, pool, outside, MiB), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "is not in a segment of pool"));
    assert_int_equal(xseg_pool_malloc_at(0, (xseg_pool_id){0, 0}, (void *)(c + 9 * MiB), MiB),
                     XSEG_ERROR_INVALID_VALUE);
    currents(now);
    same_currents(orig, now, "after the refusals");

    /* Every block freed: each segment is one free block again, nothing inactive_split. */
    uintptr_t live[] = {a, b, c, mid, c + 4 * MiB, c + 14 * MiB, w, s, s + 512 * KiB};
    for (size_t i = 0; i < sizeof live / sizeof *live; i++)
        tu_free((void *)live[i]);
    tu_free(outside);
    check_stats("all freed");
    assert_int_equal(tu_stat("inactive_split.all.current"), 0);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), 0);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
}

/* Expandable segments: the same placements (no inactive_split there, as PyTorch counts). */
static void test_expandable(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_retain(0, pool), XSEG_SUCCESS); /* a graph's use, as cudagraph trees hold */
    uintptr_t a = (uintptr_t)pool_malloc(pool, 2 * MiB), b = (uintptr_t)pool_malloc(pool, 3 * MiB);
    uintptr_t c = (uintptr_t)pool_malloc(pool, 15 * MiB);
    int64_t orig[NKEYS], now[NKEYS];
    currents(orig);
    tu_free((void *)b);
    place(pool, b, 3 * MiB, "b placed");
    currents(now);
    same_currents(orig, now, "b placed");
    tu_free((void *)c);
    place(pool, c + 2 * MiB, 4 * MiB, "head and tail");
    place(pool, c, MiB, "tail only");
    assert_int_equal(tu_stat("inactive_split.all.current"), 0);
    tu_free((void *)a);
    tu_free((void *)b);
    tu_free((void *)c);
    tu_free((void *)(c + 2 * MiB));
    check_stats("all freed");
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
}

/* The mapped range [*base, *base + *size) of the segment entry that holds @p addr. */
static void segment_of(uintptr_t addr, uintptr_t *base, size_t *size)
{
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    *size = 0;
    for (size_t i = 0; i < snap->nsegments; i++)
        if (snap->segments[i].address <= addr && addr < snap->segments[i].address + snap->segments[i].total_size) {
            *base = (uintptr_t)snap->segments[i].address;
            *size = snap->segments[i].total_size;
        }
    xseg_snapshot_free(snap);
    assert_true(*size > 0);
}

/* xseg_pool_malloc_at(@p p, @p size) is refused with @p want, its message holding @p needle (and
 * @p needle2 unless NULL), nothing changed. */
static void refused(xseg_pool_id pool, uintptr_t p, size_t size, xseg_status want, const char *needle,
                    const char *needle2)
{
    int64_t before[NKEYS], after[NKEYS];
    currents(before);
    xseg_status st = xseg_pool_malloc_at(0, pool, (void *)p, size);
    if (st != want)
        fail_msg("xseg_pool_malloc_at(0x%lx, %zu) returned %d (%s), expected %d", (unsigned long)p, size, (int)st,
                 st ? xseg_last_error() : "success", (int)want);
    if (!strstr(xseg_last_error(), needle) || (needle2 && !strstr(xseg_last_error(), needle2)))
        fail_msg("xseg_pool_malloc_at(0x%lx, %zu): the message lacks '%s'%s%s: %s", (unsigned long)p, size, needle,
                 needle2 ? " or " : "", needle2 ? needle2 : "", xseg_last_error());
    currents(after);
    same_currents(before, after, "after a refusal");
}

/* What a layout's block cannot be is refused, naming what was wrong, with nothing changed: an
 * address off the 512 B grid xseg's blocks start on (1 B at a free block's base + 1 was once
 * placed, and later mallocs returned odd addresses), a size that is not a nonzero multiple of
 * 512 B (xseg's rounding of every request), a size whose end wraps around the address space, an
 * address inside a live block or past the segment, a range over the segment's end. The free
 * block stays whole: a malloc of its size takes it at its aligned base. */
static void refusals(bool expandable)
{
    tu_xseg_init_or_skip(expandable ? "expandable_segments:True" : "expandable_segments:False");
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_retain(0, pool), XSEG_SUCCESS); /* a graph's use, as cudagraph trees hold */
    uintptr_t a = (uintptr_t)pool_malloc(pool, 2 * MiB), b = (uintptr_t)pool_malloc(pool, 3 * MiB);
    assert_int_equal(b, a + 2 * MiB);
    uintptr_t base = 0;
    size_t seg;
    segment_of(a, &base, &seg);
    tu_free((void *)b);
    char hex[32];

    /* Off the grid: the finding's 1 B at base + 1, and 512 B at + 256 (an aligned size). */
    snprintf(hex, sizeof hex, "0x%lx", (unsigned long)(b + 1));
    refused(pool, b + 1, 1, XSEG_ERROR_INVALID_VALUE, hex, "512");
    snprintf(hex, sizeof hex, "0x%lx", (unsigned long)(b + 256));
    refused(pool, b + 256, 512, XSEG_ERROR_INVALID_VALUE, hex, "512");
    /* Sizes that are no block's: 0, 1, 513, one rounding would overflow. */
    refused(pool, b, 0, XSEG_ERROR_INVALID_VALUE, "size 0", "512");
    refused(pool, b + 512, 1, XSEG_ERROR_INVALID_VALUE, "size 1 ", "512");
    refused(pool, b, 513, XSEG_ERROR_INVALID_VALUE, "size 513", "512");
    refused(pool, b, SIZE_MAX, XSEG_ERROR_INVALID_VALUE, "512", NULL);
    /* A block size whose end wraps past the top of the address space. */
    refused(pool, b, SIZE_MAX & ~(size_t)511, XSEG_ERROR_ILLEGAL_STATE, "is not inside one free", NULL);
    /* Inside a live block (not at its start), and over its edge from the free side. */
    refused(pool, a + 512, 512, XSEG_ERROR_ILLEGAL_STATE, "allocated", NULL);
    refused(pool, a + 2 * MiB - 512, MiB, XSEG_ERROR_ILLEGAL_STATE, "allocated", NULL);
    /* Over the end of the segment's range, and past it. */
    refused(pool, base + seg - MiB, 2 * MiB, XSEG_ERROR_ILLEGAL_STATE, "is not inside one free", NULL);
    xseg_status st = xseg_pool_malloc_at(0, pool, (void *)(base + seg), 512);
    /* Classic: the pool's only segment ends there; expandable: its reserved, unmapped range goes on. */
    assert_int_equal(st, expandable ? XSEG_ERROR_ILLEGAL_STATE : XSEG_ERROR_INVALID_VALUE);
    /* The free block is still one, at b: a malloc of 3 MiB takes it there. */
    uintptr_t again = (uintptr_t)pool_malloc(pool, 3 * MiB);
    assert_int_equal(again, b);
    assert_int_equal(again % 512, 0);
    place(pool, b + 3 * MiB, 512, "aligned, after the refusals");
    tu_free((void *)(b + 3 * MiB));
    tu_free((void *)again);
    tu_free((void *)a);
    check_stats("all freed");
    assert_int_equal(tu_stat("allocated_bytes.all.current"), 0);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
}

static void test_refusals_classic(void **state)
{
    (void)state;
    refusals(false);
}

static void test_refusals_expandable(void **state)
{
    (void)state;
    refusals(true);
}

/* Frames from the "interpreter", as Python's callback gives them. */
static int frames_cb(xseg_frame *frames, int max, void *user)
{
    (void)user;
    xseg_frame f = {"cudagraph_trees.py", "restore_checkpoint", 77};
    if (max < 1)
        return 0;
    frames[0] = f;
    return 1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* The JSON snapshot of device 0 now. */
static char *snapshot_json(void)
{
    char path[] = "/tmp/xseg-malloc-at-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(xseg_dump_snapshot_json(0, path), XSEG_SUCCESS);
    char *s = slurp(path);
    unlink(path);
    return s;
}

/* How many events of @p action at @p addr with @p size the snapshot's trace holds. */
static int events(const char *json, const char *action, uintptr_t addr, size_t size)
{
    char want[160];
    snprintf(want, sizeof want, "{\"action\":\"%s\",\"addr\":%llu,\"size\":%zu,", action, (unsigned long long)addr,
             size);
    int n = 0;
    for (const char *p = json; (p = strstr(p, want)); p++)
        n++;
    return n;
}

/* With history on, a placed block is an alloc event with the caller's stack, its state in the
 * snapshot carries that stack, and its free is free_requested + free_completed, as PyTorch
 * records its own placements (alloc_found_block with setCheckpointPoolState's context). */
static void history(const char *config)
{
    tu_xseg_init_or_skip(config);
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_retain(0, pool), XSEG_SUCCESS); /* a graph's use, as cudagraph trees hold */
    uintptr_t a = (uintptr_t)pool_malloc(pool, 2 * MiB), b = (uintptr_t)pool_malloc(pool, 3 * MiB);
    tu_free((void *)b);
    xseg_history_options o = {0};
    o.enabled = 1;
    o.record = XSEG_HISTORY_ALL;
    o.stacks = XSEG_STACKS_CALLBACK;
    o.callback = frames_cb;
    o.clear = 1;
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    place(pool, b, 3 * MiB, "placed with history on");
    char *json = snapshot_json();
    assert_int_equal(events(json, "alloc", b, 3 * MiB), 1);
    char blk[200];
    snprintf(blk, sizeof blk, "{\"address\":%llu,\"size\":%zu,\"requested_size\":%zu,\"state\":\"active_allocated\","
             "\"frames\":[", (unsigned long long)b, 3 * MiB, 3 * MiB);
    const char *at = strstr(json, blk);
    if (!at)
        fail_msg("no active block %s in the snapshot", blk);
    const char *end = strchr(at + strlen(blk), ']');
    assert_non_null(end);
    assert_non_null(memmem(at, (size_t)(end - at), "restore_checkpoint", 18));
    free(json);
    tu_free((void *)b);
    json = snapshot_json();
    assert_int_equal(events(json, "alloc", b, 3 * MiB), 1);
    assert_int_equal(events(json, "free_requested", b, 3 * MiB), 1);
    assert_int_equal(events(json, "free_completed", b, 3 * MiB), 1);
    free(json);
    o = (xseg_history_options){.clear = 1};
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    tu_free((void *)a);
    check_stats("all freed");
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
}

static void test_history_classic(void **state)
{
    (void)state;
    history("expandable_segments:False");
}

static void test_history_expandable(void **state)
{
    (void)state;
    history("expandable_segments:True");
}

int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classic),
        cmocka_unit_test(test_expandable),
        cmocka_unit_test(test_history_classic),
        cmocka_unit_test(test_history_expandable),
        cmocka_unit_test(test_refusals_classic),
        cmocka_unit_test(test_refusals_expandable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
