/*
 * Statistics oracle (after PyTorch's _check_memory_stat_consistency): long seeded random
 * sequences of malloc / free / record_stream with held streams / empty_cache / set_config /
 * reset_peak through the public API; after every step every statistic a snapshot determines is
 * recomputed from xseg_take_snapshot and compared with xseg_get_stats, and the snapshot's
 * structure is checked (blocks tile their segment, nothing overlaps, every live pointer is an
 * allocated block of the right requested size on the right stream).
 *
 * Runs in expandable mode, classic mode and mixed mode (the config switched mid-run).
 * XSEG_TEST_SEED=<n> replays one seed; the seed and the step are printed on failure.
 * main() sets CUDAEMU_TOTAL_MEM=80G (unless already set) before the driver loads: sizes go up to
 * GiBs, and the emulator's memory is sparse, so nothing is touched here (the fuzzer checks data).
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "vmm/driver.h"
#include "xseg.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define NSTREAMS 4   /* stream 0 is the legacy default stream (NULL) */
#define MAX_LIVE 512
#define LIVE_CAP (72 * GiB) /* of the emulated 80 GiB: the OOM and retry paths run too */

enum mode { MODE_EXPANDABLE, MODE_CLASSIC, MODE_MIXED };

struct live {
    void *ptr;
    size_t size;
    int stream;
};

struct oracle {
    enum mode mode;
    uint64_t seed, rng;
    unsigned step;
    const char *what; /* the step's action, for messages */
    CUstream streams[NSTREAMS];
    bool held[NSTREAMS];
    struct live live[MAX_LIVE];
    size_t nlive, live_bytes;
    xseg_device_stats prev;
    int64_t max_seen[64]; /* per counter: the highest current seen since the last peak reset */
    unsigned ooms;
    size_t pending_seen; /* pending-free blocks seen in snapshots: the record_stream paths ran */
};

#define NCOUNTERS (offsetof(xseg_device_stats, num_alloc_retries) / sizeof(xseg_stat_counter))

static uint64_t rnd(struct oracle *o)
{
    /* xorshift64*: small, seedable, good enough for choosing steps. */
    o->rng ^= o->rng >> 12;
    o->rng ^= o->rng << 25;
    o->rng ^= o->rng >> 27;
    return o->rng * 2685821657736338717ull;
}

static uint64_t rnd_below(struct oracle *o, uint64_t n) { return n ? rnd(o) % n : 0; }

#define ofail(o, ...)                                                                           \
    do {                                                                                        \
        print_message("oracle failure: mode %d seed %" PRIu64 " step %u (%s)\n", (int)(o)->mode, \
                      (o)->seed, (o)->step, (o)->what);                                         \
        fail_msg(__VA_ARGS__);                                                                  \
    } while (0)

#define ocheck(o, cond, ...)                                                                    \
    do {                                                                                        \
        if (!(cond))                                                                            \
            ofail(o, __VA_ARGS__);                                                              \
    } while (0)

static const char *pool_name(int p)
{
    return p == XSEG_STAT_ALL ? "all" : p == XSEG_STAT_SMALL_POOL ? "small_pool" : "large_pool";
}

/* A block of the snapshot and the segment entry it came from. */
struct bref {
    const xseg_block_info *blk;
    size_t seg;
};

static int cmp_block(const void *a, const void *b)
{
    const struct bref *x = a, *y = b;
    return x->blk->address < y->blk->address ? -1 : x->blk->address > y->blk->address;
}

static int cmp_seg(const void *a, const void *b)
{
    const xseg_segment_info *x = *(const xseg_segment_info *const *)a,
                            *y = *(const xseg_segment_info *const *)b;
    return x->address < y->address ? -1 : x->address > y->address;
}

struct expect {
    int64_t allocated_bytes[3], reserved_bytes[3], active_bytes[3], requested_bytes[3];
    int64_t allocation[3], active[3], segment[3], inactive_split[3], inactive_split_bytes[3];
};

static void add3(int64_t *a, int pool, int64_t v)
{
    a[XSEG_STAT_ALL] += v;
    a[pool] += v;
}

static void compare3(struct oracle *o, const char *name, const int64_t *want,
                     const xseg_stat_counter *got)
{
    for (int p = 0; p < 3; p++)
        ocheck(o, got[p].current == want[p], "%s.%s.current is %" PRId64 ", snapshot says %" PRId64,
               name, pool_name(p), got[p].current, want[p]);
}

/* Every check that needs no snapshot: counter identities and monotonic scalars. */
static void check_counters(struct oracle *o, const xseg_device_stats *st)
{
    const xseg_stat_counter *c = (const xseg_stat_counter *)(const void *)st;
    for (size_t i = 0; i < NCOUNTERS; i++) {
        ocheck(o, c[i].allocated - c[i].freed == c[i].current,
               "counter %zu: allocated %" PRId64 " - freed %" PRId64 " != current %" PRId64, i,
               c[i].allocated, c[i].freed, c[i].current);
        ocheck(o, c[i].current >= 0, "counter %zu: current %" PRId64 " < 0", i, c[i].current);
        if (c[i].current > o->max_seen[i])
            o->max_seen[i] = c[i].current;
        ocheck(o, c[i].peak >= o->max_seen[i],
               "counter %zu: peak %" PRId64 " below a current seen since reset (%" PRId64 ")", i,
               c[i].peak, o->max_seen[i]);
    }
    const xseg_device_stats *p = &o->prev;
    ocheck(o, st->num_device_alloc >= p->num_device_alloc, "num_device_alloc fell");
    ocheck(o, st->num_device_free >= p->num_device_free, "num_device_free fell");
    ocheck(o, st->num_ooms >= p->num_ooms, "num_ooms fell");
    ocheck(o, st->num_alloc_retries >= p->num_alloc_retries, "num_alloc_retries fell");
    ocheck(o, st->num_sync_all_streams >= p->num_sync_all_streams, "num_sync_all_streams fell");
    ocheck(o, st->allocated_bytes[0].current <= st->active_bytes[0].current,
           "allocated_bytes > active_bytes");
    ocheck(o, st->active_bytes[0].current <= st->reserved_bytes[0].current,
           "active_bytes > reserved_bytes");
    ocheck(o, st->requested_bytes[0].current <= st->active_bytes[0].current,
           "requested_bytes > active_bytes");
}

/* Find the block at @p addr among the blocks sorted by address; NULL when absent. */
static const struct bref *find_block(const struct bref *blocks, size_t n, uint64_t addr)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (blocks[mid].blk->address < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && blocks[lo].blk->address == addr ? &blocks[lo] : NULL;
}

static void check(struct oracle *o)
{
    xseg_device_stats st;
    xseg_snapshot *snap = NULL;
    ocheck(o, xseg_get_stats(0, &st) == XSEG_SUCCESS, "xseg_get_stats: %s", xseg_last_error());
    ocheck(o, xseg_take_snapshot(0, &snap) == XSEG_SUCCESS, "xseg_take_snapshot: %s",
           xseg_last_error());
    check_counters(o, &st);

    struct expect e;
    memset(&e, 0, sizeof e);
    size_t nblocks = 0;
    for (size_t s = 0; s < snap->nsegments; s++)
        nblocks += snap->segments[s].nblocks;
    struct bref *blocks = calloc(nblocks + 1, sizeof *blocks);
    xseg_segment_info **segs = calloc(snap->nsegments + 1, sizeof *segs);
    assert_non_null(blocks);
    assert_non_null(segs);

    size_t nb = 0, nalloc_blocks = 0;
    for (size_t s = 0; s < snap->nsegments; s++) {
        xseg_segment_info *seg = &snap->segments[s];
        segs[s] = seg;
        int pool = seg->is_large ? XSEG_STAT_LARGE_POOL : XSEG_STAT_SMALL_POOL;
        ocheck(o, seg->device == 0, "segment on device %d in a device-0 snapshot", seg->device);
        ocheck(o, seg->total_size > 0 && seg->total_size % (2 * MiB) == 0,
               "segment 0x%" PRIx64 " total_size %zu is not a positive multiple of 2 MiB",
               seg->address, seg->total_size);
        ocheck(o, seg->nblocks > 0, "segment 0x%" PRIx64 " has no blocks", seg->address);
        if (!seg->is_expandable) {
            add3(e.segment, pool, 1);
        }
        add3(e.reserved_bytes, pool, (int64_t)seg->total_size);
        add3(e.allocated_bytes, pool, (int64_t)seg->allocated_size);
        add3(e.active_bytes, pool, (int64_t)seg->active_size);
        add3(e.requested_bytes, pool, (int64_t)seg->requested_size);

        /* The blocks tile the segment in address order. */
        uint64_t at = seg->address;
        size_t alloc_sum = 0, active_sum = 0, req_sum = 0;
        bool split = seg->nblocks > 1;
        for (size_t b = 0; b < seg->nblocks; b++) {
            xseg_block_info *blk = &seg->blocks[b];
            ocheck(o, blk->address == at,
                   "segment 0x%" PRIx64 ": block %zu at 0x%" PRIx64 ", expected 0x%" PRIx64
                   " (blocks must tile the segment)",
                   seg->address, b, blk->address, at);
            ocheck(o, blk->size > 0 && blk->size % 512 == 0, "block 0x%" PRIx64 " size %zu",
                   blk->address, blk->size);
            at += blk->size;
            bool active = blk->state != XSEG_BLOCK_INACTIVE;
            if (blk->state == XSEG_BLOCK_ACTIVE_ALLOCATED) {
                alloc_sum += blk->size;
                add3(e.allocation, pool, 1);
                nalloc_blocks++;
            }
            if (blk->state == XSEG_BLOCK_ACTIVE_PENDING_FREE)
                o->pending_seen++;
            if (active) {
                active_sum += blk->size;
                req_sum += blk->requested_size;
                add3(e.active, pool, 1);
                ocheck(o, blk->requested_size > 0 && blk->requested_size <= blk->size,
                       "active block 0x%" PRIx64 ": requested %zu, size %zu", blk->address,
                       blk->requested_size, blk->size);
                ocheck(o, (blk->requested_size > MiB) == (seg->is_large != 0),
                       "block 0x%" PRIx64 " of %zu requested bytes in the %s pool", blk->address,
                       blk->requested_size, seg->is_large ? "large" : "small");
            } else {
                ocheck(o, blk->requested_size == 0, "inactive block 0x%" PRIx64 " requested %zu",
                       blk->address, blk->requested_size);
                if (split && !seg->is_expandable) {
                    add3(e.inactive_split, pool, 1);
                    add3(e.inactive_split_bytes, pool, (int64_t)blk->size);
                }
            }
            blocks[nb++] = (struct bref){blk, s};
        }
        ocheck(o, at == seg->address + seg->total_size,
               "segment 0x%" PRIx64 ": blocks cover %" PRIu64 " of %zu bytes", seg->address,
               at - seg->address, seg->total_size);
        ocheck(o, alloc_sum == seg->allocated_size, "segment 0x%" PRIx64 ": allocated_size %zu, blocks say %zu",
               seg->address, seg->allocated_size, alloc_sum);
        ocheck(o, active_sum == seg->active_size, "segment 0x%" PRIx64 ": active_size %zu, blocks say %zu",
               seg->address, seg->active_size, active_sum);
        ocheck(o, req_sum == seg->requested_size, "segment 0x%" PRIx64 ": requested_size %zu, blocks say %zu",
               seg->address, seg->requested_size, req_sum);
    }

    /* Segments (mapped ranges) never overlap. */
    qsort(segs, snap->nsegments, sizeof *segs, cmp_seg);
    for (size_t s = 1; s < snap->nsegments; s++)
        ocheck(o, segs[s - 1]->address + segs[s - 1]->total_size <= segs[s]->address,
               "segments 0x%" PRIx64 "+%zu and 0x%" PRIx64 " overlap", segs[s - 1]->address,
               segs[s - 1]->total_size, segs[s]->address);

    /* Every live pointer is an allocated block of its requested size, on its stream. */
    qsort(blocks, nb, sizeof *blocks, cmp_block);
    ocheck(o, nalloc_blocks == o->nlive, "%zu allocated blocks in the snapshot, %zu live pointers",
           nalloc_blocks, o->nlive);
    for (size_t i = 0; i < o->nlive; i++) {
        const struct live *l = &o->live[i];
        const struct bref *ref = find_block(blocks, nb, (uint64_t)(uintptr_t)l->ptr);
        ocheck(o, ref, "live pointer %p (%zu bytes) is not a block of the snapshot", l->ptr, l->size);
        const xseg_block_info *blk = ref->blk;
        ocheck(o, blk->state == XSEG_BLOCK_ACTIVE_ALLOCATED, "live pointer %p in state %d", l->ptr,
               (int)blk->state);
        ocheck(o, blk->requested_size == l->size, "live pointer %p: requested_size %zu, asked %zu",
               l->ptr, blk->requested_size, l->size);
        ocheck(o, blk->size >= l->size, "live pointer %p: block %zu < %zu", l->ptr, blk->size, l->size);
    }
    /* The segment of a live block belongs to the allocation's stream. */
    for (size_t i = 0; i < o->nlive; i++) {
        const struct live *l = &o->live[i];
        const xseg_segment_info *seg = &snap->segments[find_block(blocks, nb, (uint64_t)(uintptr_t)l->ptr)->seg];
        ocheck(o, seg->stream == (struct CUstream_st *)o->streams[l->stream],
               "live pointer %p (%zu bytes, stream %d = %p) lies in segment 0x%" PRIx64
               " (%s, %zu bytes) of stream %p",
               l->ptr, l->size, l->stream, (void *)o->streams[l->stream], seg->address,
               seg->is_expandable ? "expandable" : "classic", seg->total_size, (void *)seg->stream);
    }

    compare3(o, "allocated_bytes", e.allocated_bytes, st.allocated_bytes);
    compare3(o, "reserved_bytes", e.reserved_bytes, st.reserved_bytes);
    compare3(o, "active_bytes", e.active_bytes, st.active_bytes);
    compare3(o, "requested_bytes", e.requested_bytes, st.requested_bytes);
    compare3(o, "allocation", e.allocation, st.allocation);
    compare3(o, "active", e.active, st.active);
    compare3(o, "segment", e.segment, st.segment);
    compare3(o, "inactive_split", e.inactive_split, st.inactive_split);
    compare3(o, "inactive_split_bytes", e.inactive_split_bytes, st.inactive_split_bytes);

    /* The key lookup reads the same struct. */
    int64_t v;
    ocheck(o, xseg_stat(0, "reserved_bytes.all.current", &v) == XSEG_SUCCESS && v == st.reserved_bytes[0].current,
           "xseg_stat(reserved_bytes.all.current) disagrees with xseg_get_stats");

    /* On the emulator, the device memory in use is what xseg says it reserved. */
    if (tu_emulated()) {
        struct cudaemu_live lv;
        if (tu_live(&lv))
            ocheck(o, (int64_t)lv.used_bytes[0] == st.reserved_bytes[0].current,
                   "emulator: %zu bytes of device memory in use, reserved_bytes says %" PRId64,
                   lv.used_bytes[0], st.reserved_bytes[0].current);
    }

    free(blocks);
    free(segs);
    xseg_snapshot_free(snap);
    o->prev = st;
}

/* Sizes from 512 B to GiBs, log-uniform within classes, some not multiples of 512. */
static size_t pick_size(struct oracle *o)
{
    uint64_t r = rnd_below(o, 100);
    size_t lo, hi;
    if (r < 40) {
        lo = 1;
        hi = MiB;
    } else if (r < 75) {
        lo = MiB + 1;
        hi = 64 * MiB;
    } else if (r < 95) {
        lo = 64 * MiB;
        hi = GiB;
    } else {
        lo = GiB;
        hi = 6 * GiB;
    }
    size_t size = lo + (size_t)rnd_below(o, hi - lo + 1);
    if (rnd_below(o, 4) == 0)
        size = (size + 511) & ~(size_t)511;
    return size;
}

static void hold(struct oracle *o, int s, bool on)
{
    if (s == 0 || o->held[s] == on)
        return;
    if (on)
        tu_stream_hold(o->streams[s]);
    else
        tu_stream_release(o->streams[s]);
    o->held[s] = on;
}

static void release_all_holds(struct oracle *o)
{
    for (int s = 1; s < NSTREAMS; s++)
        hold(o, s, false);
}

static void set_config(struct oracle *o, const char *cfg)
{
    ocheck(o, xseg_set_config(cfg) == XSEG_SUCCESS, "xseg_set_config(%s): %s", cfg, xseg_last_error());
}

static void random_config(struct oracle *o)
{
    static const char *const extra[] = {"",
                                        ",max_split_size_mb:64",
                                        ",max_split_size_mb:256",
                                        ",max_split_size_mb:1024,max_non_split_rounding_mb:64",
                                        ",roundup_power2_divisions:4",
                                        ",roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
                                        ",garbage_collection_threshold:0.6"};
    const char *exp = o->mode == MODE_EXPANDABLE ? "True"
                      : o->mode == MODE_CLASSIC  ? "False"
                      : rnd_below(o, 2)          ? "True"
                                                 : "False";
    char cfg[256];
    snprintf(cfg, sizeof cfg, "expandable_segments:%s%s", exp,
             extra[rnd_below(o, sizeof extra / sizeof extra[0])]);
    set_config(o, cfg);
}

static void do_malloc(struct oracle *o)
{
    if (o->nlive == MAX_LIVE)
        return;
    size_t size = pick_size(o);
    if (o->live_bytes + size > LIVE_CAP)
        return;
    int s = (int)rnd_below(o, NSTREAMS);
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, size, 0, (struct CUstream_st *)o->streams[s]);
    if (st == XSEG_ERROR_OUT_OF_MEMORY) {
        o->ooms++;
        ocheck(o, strstr(xseg_last_error(), "out of memory") || strstr(xseg_last_error(), "Out of memory") ||
                   strstr(xseg_last_error(), "OUT_OF_MEMORY"),
               "OOM without an out-of-memory message: %s", xseg_last_error());
        return;
    }
    ocheck(o, st == XSEG_SUCCESS && p, "xseg_malloc(%zu): %s", size, xseg_last_error());
    ocheck(o, ((uintptr_t)p % 512) == 0, "xseg_malloc(%zu) = %p, not 512-aligned", size, p);
    o->live[o->nlive++] = (struct live){p, size, s};
    o->live_bytes += size;
}

static void do_free(struct oracle *o)
{
    if (!o->nlive)
        return;
    size_t i = (size_t)rnd_below(o, o->nlive);
    struct live l = o->live[i];
    /* Sometimes the block was used on other streams, some of them still busy. */
    if (rnd_below(o, 3) == 0) {
        int other = 1 + (int)rnd_below(o, NSTREAMS - 1);
        if (rnd_below(o, 2))
            hold(o, other, true);
        ocheck(o, xseg_record_stream(l.ptr, (struct CUstream_st *)o->streams[other]) == XSEG_SUCCESS,
               "xseg_record_stream: %s", xseg_last_error());
    }
    ocheck(o, xseg_free(l.ptr) == XSEG_SUCCESS, "xseg_free(%p): %s", l.ptr, xseg_last_error());
    o->live[i] = o->live[--o->nlive];
    o->live_bytes -= l.size;
}

static void do_empty_cache(struct oracle *o)
{
    /* Held streams are released first: their pending work completes as the GPU's would. */
    release_all_holds(o);
    xseg_device_stats before, after;
    ocheck(o, xseg_get_stats(0, &before) == XSEG_SUCCESS, "xseg_get_stats");
    ocheck(o, xseg_empty_cache(0) == XSEG_SUCCESS, "xseg_empty_cache: %s", xseg_last_error());
    ocheck(o, xseg_get_stats(0, &after) == XSEG_SUCCESS, "xseg_get_stats");
    ocheck(o, after.num_sync_all_streams == before.num_sync_all_streams + 1,
           "num_sync_all_streams went from %" PRId64 " to %" PRId64 " across one empty_cache",
           before.num_sync_all_streams, after.num_sync_all_streams);
    /* Nothing pending remains after the synchronize: active == allocated. */
    ocheck(o, after.active[0].current == after.allocation[0].current,
           "after empty_cache: %" PRId64 " active blocks, %" PRId64 " allocations",
           after.active[0].current, after.allocation[0].current);
}

static void do_reset_peak(struct oracle *o)
{
    ocheck(o, xseg_reset_peak_stats(0) == XSEG_SUCCESS, "xseg_reset_peak_stats: %s", xseg_last_error());
    xseg_device_stats st;
    ocheck(o, xseg_get_stats(0, &st) == XSEG_SUCCESS, "xseg_get_stats");
    const xseg_stat_counter *c = (const xseg_stat_counter *)(const void *)&st;
    for (size_t i = 0; i < NCOUNTERS; i++) {
        ocheck(o, c[i].peak == c[i].current, "after reset_peak, counter %zu: peak %" PRId64 " current %" PRId64,
               i, c[i].peak, c[i].current);
        o->max_seen[i] = c[i].current;
    }
}

static void run(enum mode mode, uint64_t default_seed)
{
    struct oracle *o = calloc(1, sizeof *o);
    assert_non_null(o);
    o->mode = mode;
    const char *env = getenv("XSEG_TEST_SEED");
    o->seed = env ? strtoull(env, NULL, 0) : default_seed;
    o->rng = o->seed ? o->seed : 1;
    o->what = "setup";
    print_message("oracle: mode %d seed %" PRIu64 "\n", (int)mode, o->seed);
    if (!tu_gpu_available()) {
        free(o);
        print_message("[  SKIPPED ] no CUDA device: %s\n", tu_last_load_error());
        skip();
    }

    assert_int_equal(xseg_init(mode == MODE_CLASSIC ? "expandable_segments:False" : "expandable_segments:True"),
                     XSEG_SUCCESS);
    o->streams[0] = NULL;
    for (int s = 1; s < NSTREAMS; s++)
        assert_int_equal(drv->cuStreamCreate(&o->streams[s], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ocheck(o, xseg_empty_cache(0) == XSEG_SUCCESS, "initial empty_cache");
    do_reset_peak(o);
    ocheck(o, xseg_get_stats(0, &o->prev) == XSEG_SUCCESS, "xseg_get_stats");
    check(o);

    unsigned steps = (unsigned)tu_steps(20000, 1000);
    for (o->step = 0; o->step < steps; o->step++) {
        uint64_t r = rnd_below(o, 1000);
        if (r < 420) {
            o->what = "malloc";
            do_malloc(o);
        } else if (r < 820) {
            o->what = "free";
            do_free(o);
        } else if (r < 870) {
            o->what = "record_stream";
            if (o->nlive) {
                int other = (int)rnd_below(o, NSTREAMS);
                ocheck(o, xseg_record_stream(o->live[rnd_below(o, o->nlive)].ptr,
                                             (struct CUstream_st *)o->streams[other]) == XSEG_SUCCESS,
                       "xseg_record_stream: %s", xseg_last_error());
            }
        } else if (r < 930) {
            o->what = "hold/release";
            int s = 1 + (int)rnd_below(o, NSTREAMS - 1);
            hold(o, s, !o->held[s]);
        } else if (r < 960) {
            o->what = "empty_cache";
            do_empty_cache(o);
        } else if (r < 985) {
            o->what = "set_config";
            random_config(o);
        } else {
            o->what = "reset_peak";
            do_reset_peak(o);
        }
        check(o);
    }

    /* Drain: free everything, release the streams, empty the cache: nothing stays reserved. */
    o->what = "drain";
    while (o->nlive)
        do_free(o);
    release_all_holds(o);
    do_empty_cache(o);
    check(o);
    ocheck(o, o->prev.reserved_bytes[0].current == 0, "%" PRId64 " bytes still reserved after draining",
           o->prev.reserved_bytes[0].current);
    ocheck(o, o->prev.active[0].current == 0, "active blocks after draining");
    print_message("oracle: mode %d: %u steps, %u OOMs, %" PRId64 " retries, %" PRId64
                  " device allocs, %zu pending-free blocks seen\n",
                  (int)mode, steps, o->ooms, o->prev.num_alloc_retries, o->prev.num_device_alloc,
                  o->pending_seen);
    for (int s = 1; s < NSTREAMS; s++)
        drv->cuStreamDestroy(o->streams[s]);
    assert_int_equal(xseg_set_config("expandable_segments:True"), XSEG_SUCCESS);
    free(o);
}

static void test_oracle_expandable(void **state)
{
    (void)state;
    run(MODE_EXPANDABLE, 1);
}

static void test_oracle_classic(void **state)
{
    (void)state;
    run(MODE_CLASSIC, 2);
}

static void test_oracle_mixed(void **state)
{
    (void)state;
    run(MODE_MIXED, 3);
}

/* `test_oracle NAME` runs one test (each mode is its own meson test, so a failure in one
 * cannot leave blocks behind for the next); no argument runs all three. */
int main(int argc, char **argv)
{
    /* An H100-sized emulated device; read by cudaemu at cuInit, ignored by a real driver. */
    setenv("CUDAEMU_TOTAL_MEM", "80G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_expandable),
        cmocka_unit_test(test_oracle_classic),
        cmocka_unit_test(test_oracle_mixed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
