/*
 * Threads: eight workers allocate, fill, check and free on several streams of two devices (with
 * bursts of malloc/free pairs of one size or cycling four), and hand some blocks to each other to be freed on
 * another thread; alongside, one thread empties the cache of every device and one reads
 * statistics, summaries and snapshots. Checks data
 * integrity, the invariants that hold at any instant, and that everything drains to zero.
 * The one_stream tests put four workers on one stream of device 0 instead, making pairs of four
 * sizes that overlap other workers' pairs (the stream's slot fills and settles between threads),
 * holding blocks across them and handing some to be freed on another thread, beside the same
 * emptier and reader.
 * The one_stream_pairs tests put two workers' overlapping pairs of one size on one stream (the
 * stream is shared: each thread's frees fill a slot of its own, core/device/fast.h): statistics
 * read between the steps are exact (folded, and after a settle-all point: snapshot, empty_cache,
 * peak reset), the pairs stay off the device lock (debug builds count it), and free-running
 * pairs beside an emptier and a reader keep every byte and count. The _mixed_room tests first
 * raise the peaks above the pairs' blocks (a program's earlier steps leave such room), where each
 * size a thread pairs in turn takes a lane of its front (Note [front lane]).
 * Meant to be clean under ThreadSanitizer (meson test --setup tsan).
 * main() sets CUDAEMU_DEVICES=2 (unless already set); on a real machine it uses up to two GPUs.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/device/fast.h"
#include "core/runtime.h"
#include "tests/common/testutil.h"
#include "vmm/driver.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define NWORKERS 8
#define STREAMS_PER_DEV 2
#define MAX_DEVS 2
#define WORKER_LIVE 24
#define MAILBOX 64

struct blk {
    void *ptr;
    size_t size;
    uint32_t tag;
    int dev;
};

static int ndev;
static CUcontext ctxs[MAX_DEVS];
static CUstream streams[MAX_DEVS][STREAMS_PER_DEV + 1]; /* [d][0] = NULL (default stream) */
static atomic_bool stop;
static atomic_int failures;
static atomic_uint_fast32_t next_tag;
/* Successful mallocs and their requested bytes per device: the accumulated counters must add up
 * to them exactly, however the stream slots deferred the counting (core/device/device.h). */
static atomic_uint_fast64_t mallocs_done[MAX_DEVS], requested_done[MAX_DEVS];

static void count_malloc(int d, size_t size)
{
    atomic_fetch_add(&mallocs_done[d], 1);
    atomic_fetch_add(&requested_done[d], size);
}

/* Blocks handed from one worker to another, to be checked and freed there. */
static pthread_mutex_t mailbox_lock = PTHREAD_MUTEX_INITIALIZER;
static struct blk mailbox[MAILBOX];
static size_t nmail;

static char first_failure[512];
static pthread_mutex_t failure_lock = PTHREAD_MUTEX_INITIALIZER;

static void tfail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tfail(const char *fmt, ...)
{
    pthread_mutex_lock(&failure_lock);
    if (!atomic_load(&failures)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(first_failure, sizeof first_failure, fmt, ap);
        va_end(ap);
    }
    atomic_fetch_add(&failures, 1);
    pthread_mutex_unlock(&failure_lock);
    atomic_store(&stop, true);
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Driver calls on a device's memory run with that device's context current. */
static bool use_dev(int d)
{
    if (drv->cuCtxSetCurrent(ctxs[d]) != CUDA_SUCCESS) {
        tfail("cuCtxSetCurrent(device %d) failed", d);
        return false;
    }
    return true;
}

static void check_and_free(struct blk *b, const char *who)
{
    if (!use_dev(b->dev))
        return;
    if (!tu_check((CUdeviceptr)(uintptr_t)b->ptr, b->size, b->tag))
        tfail("%s: block %p (%zu bytes, device %d, tag %" PRIu32 ") lost its content", who, b->ptr,
              b->size, b->dev, b->tag);
    xseg_status st = xseg_free(b->ptr);
    if (st != XSEG_SUCCESS)
        tfail("%s: xseg_free(%p): %s", who, b->ptr, xseg_last_error());
}

/* Hand a random live block to whichever worker empties the mailbox next (none when it is full). */
static void mail_give(struct blk *live, size_t *nlive, uint64_t *rng)
{
    pthread_mutex_lock(&mailbox_lock);
    if (nmail < MAILBOX && *nlive) {
        size_t i = rnd(rng) % *nlive;
        mailbox[nmail++] = live[i];
        live[i] = live[--*nlive];
    }
    pthread_mutex_unlock(&mailbox_lock);
}

/* Take a block from the mailbox and free it after checking its content (none: nothing). */
static void mail_take_free(const char *what)
{
    struct blk b;
    bool got = false;
    pthread_mutex_lock(&mailbox_lock);
    if (nmail) {
        b = mailbox[--nmail];
        got = true;
    }
    pthread_mutex_unlock(&mailbox_lock);
    if (got)
        check_and_free(&b, what);
}

static void *worker(void *arg)
{
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)((intptr_t)arg + 1);
    struct blk live[WORKER_LIVE];
    size_t nlive = 0;
    size_t iters = tu_scaled(3000, 100);
    for (size_t it = 0; it < iters && !atomic_load(&stop); it++) {
        uint64_t r = rnd(&rng) % 100;
        if (r < 45 && nlive < WORKER_LIVE) {
            int d = (int)(rnd(&rng) % (uint64_t)ndev);
            int s = (int)(rnd(&rng) % (STREAMS_PER_DEV + 1));
            size_t size = rnd(&rng) % 4 ? 1 + rnd(&rng) % MiB : MiB + rnd(&rng) % (8 * MiB);
            void *p = NULL;
            xseg_status st = xseg_malloc(&p, size, d, (struct CUstream_st *)streams[d][s]);
            if (st == XSEG_ERROR_OUT_OF_MEMORY)
                continue;
            if (st != XSEG_SUCCESS || !p) {
                tfail("xseg_malloc(%zu, device %d): %s", size, d, xseg_last_error());
                break;
            }
            count_malloc(d, size);
            struct blk b = {p, size, (uint32_t)atomic_fetch_add(&next_tag, 1) + 1, d};
            if (!use_dev(d))
                break;
            CUresult cr = tu_fill((CUdeviceptr)(uintptr_t)p, size, b.tag);
            if (cr != CUDA_SUCCESS) {
                tfail("tu_fill(%p, %zu): %s", p, size, drv_error_name(cr));
                break;
            }
            if (rnd(&rng) % 8 == 0) {
                /* Used on another stream of the same device before it is freed. */
                int other = 1 + (int)(rnd(&rng) % STREAMS_PER_DEV);
                if (xseg_record_stream(p, (struct CUstream_st *)streams[d][other]) != XSEG_SUCCESS)
                    tfail("xseg_record_stream: %s", xseg_last_error());
            }
            live[nlive++] = b;
        } else if (r < 50) {
            /* A burst of malloc/free pairs of one size on one stream (the ping-pong the stream
             * slots serve, core/device/device.h), each block written and checked while the other threads work. */
            int d = (int)(rnd(&rng) % (uint64_t)ndev);
            int s = (int)(rnd(&rng) % (STREAMS_PER_DEV + 1));
            size_t size0 = rnd(&rng) % 2 ? 2048 + rnd(&rng) % 4096 : 2 * MiB + rnd(&rng) % MiB;
            /* Half the bursts cycle four sizes (bench_scale --mixed's pattern: slots widen). */
            bool mixed = rnd(&rng) % 2;
            if (!use_dev(d))
                break;
            for (int k = 0; k < 8; k++) {
                size_t size = mixed ? size0 - (size_t)(k % 4) * 512 : size0;
                struct blk b = {NULL, size, (uint32_t)atomic_fetch_add(&next_tag, 1) + 1, d};
                xseg_status st = xseg_malloc(&b.ptr, size, d, (struct CUstream_st *)streams[d][s]);
                if (st == XSEG_ERROR_OUT_OF_MEMORY)
                    break;
                if (st != XSEG_SUCCESS || !b.ptr) {
                    tfail("xseg_malloc(%zu, device %d): %s", size, d, xseg_last_error());
                    break;
                }
                count_malloc(d, size);
                CUresult cr = tu_fill((CUdeviceptr)(uintptr_t)b.ptr, size, b.tag);
                if (cr != CUDA_SUCCESS) {
                    tfail("tu_fill(%p, %zu): %s", b.ptr, size, drv_error_name(cr));
                    break;
                }
                check_and_free(&b, "ping-pong");
            }
        } else if (r < 85 && nlive) {
            size_t i = rnd(&rng) % nlive;
            struct blk b = live[i];
            live[i] = live[--nlive];
            check_and_free(&b, "worker");
        } else if (r < 92 && nlive) {
            mail_give(live, &nlive, &rng);
        } else {
            mail_take_free("mailbox");
        }
    }
    while (nlive)
        check_and_free(&live[--nlive], "worker drain");
    return NULL;
}

/* A malloc on the shared stream of device 0, filled with a fresh tag (false: the worker stops). */
static bool one_stream_malloc(struct blk *b, size_t size)
{
    *b = (struct blk){NULL, size, (uint32_t)atomic_fetch_add(&next_tag, 1) + 1, 0};
    xseg_status st = xseg_malloc(&b->ptr, size, 0, (struct CUstream_st *)streams[0][1]);
    if (st != XSEG_SUCCESS || !b->ptr) {
        tfail("one stream: xseg_malloc(%zu): %s", size, xseg_last_error());
        return false;
    }
    count_malloc(0, size);
    CUresult cr = tu_fill((CUdeviceptr)(uintptr_t)b->ptr, size, b->tag);
    if (cr != CUDA_SUCCESS) {
        tfail("one stream: tu_fill(%p, %zu): %s", b->ptr, size, drv_error_name(cr));
        return false;
    }
    return true;
}

#define ONE_STREAM_WORKERS 4
#define ONE_STREAM_LIVE 6

/* A worker of the one_stream tests: mostly bursts of pairs (one size, or four in turn), each
 * block checked before its free; between bursts it keeps, frees or mails a block of 512 B to
 * 64 KiB, or now and then of 2 to 3 MiB. */
static void *one_stream_worker(void *arg)
{
    uint64_t rng = 0xD1B54A32D192ED03ull * (uint64_t)((intptr_t)arg + 1);
    static const size_t sizes[4] = {512, 1024, 1536, 2048};
    struct blk live[ONE_STREAM_LIVE];
    size_t nlive = 0;
    if (!use_dev(0))
        return NULL;
    size_t iters = tu_scaled(3000, 100);
    for (size_t it = 0; it < iters && !atomic_load(&stop); it++) {
        uint64_t r = rnd(&rng) % 100;
        if (r < 60) {
            bool mixed = rnd(&rng) % 2;
            size_t k0 = rnd(&rng) % 4, n = 1 + rnd(&rng) % 16;
            for (size_t k = 0; k < n && !atomic_load(&stop); k++) {
                struct blk b;
                if (!one_stream_malloc(&b, sizes[mixed ? (k0 + k) % 4 : k0] - rnd(&rng) % 64))
                    break;
                check_and_free(&b, "one stream pair");
            }
        } else if (r < 75 && nlive < ONE_STREAM_LIVE) {
            size_t size = rnd(&rng) % 16 ? 512 + rnd(&rng) % (64 << 10) : 2 * MiB + rnd(&rng) % MiB;
            if (!one_stream_malloc(&live[nlive], size))
                break;
            nlive++;
        } else if (r < 87 && nlive) {
            size_t i = rnd(&rng) % nlive;
            struct blk b = live[i];
            live[i] = live[--nlive];
            check_and_free(&b, "one stream");
        } else if (r < 93) {
            mail_give(live, &nlive, &rng);
        } else {
            mail_take_free("one stream mailbox");
        }
    }
    while (nlive)
        check_and_free(&live[--nlive], "one stream drain");
    return NULL;
}

static void *emptier(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        xseg_status st = xseg_empty_cache(-1);
        if (st != XSEG_SUCCESS)
            tfail("xseg_empty_cache(-1): %s", xseg_last_error());
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* What must hold in any copy of the stats, whatever the other threads are doing. */
static void check_instant(const xseg_device_stats *st, int d)
{
    const xseg_stat_counter *c = (const xseg_stat_counter *)(const void *)st;
    size_t n = offsetof(xseg_device_stats, num_alloc_retries) / sizeof(xseg_stat_counter);
    for (size_t i = 0; i < n; i++) {
        if (c[i].allocated - c[i].freed != c[i].current || c[i].peak < c[i].current ||
            c[i].current < 0)
            tfail("device %d counter %zu torn: cur %" PRId64 " peak %" PRId64 " alloc %" PRId64
                  " freed %" PRId64,
                  d, i, c[i].current, c[i].peak, c[i].allocated, c[i].freed);
    }
    if (st->allocated_bytes[0].current > st->active_bytes[0].current ||
        st->active_bytes[0].current > st->reserved_bytes[0].current)
        tfail("device %d: allocated %" PRId64 " / active %" PRId64 " / reserved %" PRId64
              " out of order",
              d, st->allocated_bytes[0].current, st->active_bytes[0].current,
              st->reserved_bytes[0].current);
}

static void *reader(void *arg)
{
    (void)arg;
    char *buf = malloc(8192);
    if (!buf)
        return NULL;
    while (!atomic_load(&stop)) {
        for (int d = 0; d < ndev; d++) {
            xseg_device_stats st;
            if (xseg_get_stats(d, &st) != XSEG_SUCCESS) {
                tfail("xseg_get_stats(%d): %s", d, xseg_last_error());
                break;
            }
            check_instant(&st, d);
            int64_t v;
            if (xseg_stat(d, "allocated_bytes.all.current", &v) != XSEG_SUCCESS)
                tfail("xseg_stat: %s", xseg_last_error());
            size_t len;
            if (xseg_memory_summary(d, buf, 8192, &len) != XSEG_SUCCESS)
                tfail("xseg_memory_summary: %s", xseg_last_error());
            xseg_snapshot *snap = NULL;
            if (xseg_take_snapshot(d, &snap) != XSEG_SUCCESS) {
                tfail("xseg_take_snapshot: %s", xseg_last_error());
                break;
            }
            /* A snapshot is consistent in itself: blocks tile each segment. */
            for (size_t s = 0; s < snap->nsegments; s++) {
                const xseg_segment_info *seg = &snap->segments[s];
                uint64_t at = seg->address;
                for (size_t b = 0; b < seg->nblocks; b++) {
                    if (seg->blocks[b].address != at)
                        tfail("snapshot of device %d: segment 0x%" PRIx64 " not tiled", d,
                              seg->address);
                    at += seg->blocks[b].size;
                }
                if (at != seg->address + seg->total_size)
                    tfail("snapshot of device %d: segment 0x%" PRIx64 " blocks cover %" PRIu64
                          " of %zu",
                          d, seg->address, at - seg->address, seg->total_size);
            }
            xseg_snapshot_free(snap);
        }
        if (xseg_reset_peak_stats(-1) != XSEG_SUCCESS)
            tfail("xseg_reset_peak_stats: %s", xseg_last_error());
    }
    free(buf);
    return NULL;
}

/* ---- two threads' overlapping pairs on one stream ---------------------------------------- */

#define PAIR_WORKERS 2
static pthread_barrier_t pair_step; /* the two workers and the checker (main) */
static size_t pair_size[PAIR_WORKERS] = {500, 452}; /* one rounded size (512), two requested sizes */
static size_t pair_count;
static bool pair_free_run; /* no barriers: pairs as fast as they go */
static atomic_uint_fast64_t pair_zero_calls; /* the workers' size-0 mallocs */
static bool pair_expandable; /* the run's mode */
/* The _mixed runs: step i's blocks are of 512 B (i % 4 + 1) rounded, the workers asking 12 and 60
 * bytes less (bench_scale --mixed's sizes, with two requested sizes); else pair_size. */
static bool pair_mixed;
static bool pair_seen_all; /* every size's step ran (the peaks are the largest) */
/* The _room runs: before the pairs, PAIR_ROOM blocks of PAIR_ROOM_SIZE bytes allocated at once
 * and freed, so that the peaks stand above the pairs' blocks, the allocation count's too (a lane
 * that holds a freed block counts it allocated: Note [front lane]). */
#define PAIR_ROOM 16
#define PAIR_ROOM_SIZE 16384
static bool pair_room;
static const size_t pair_less[PAIR_WORKERS] = {12, 60};
static size_t pair_rounded(size_t i) { return pair_mixed ? 512 * (i % 4 + 1) : 512; }
static size_t pair_req(size_t id, size_t i) { return pair_mixed ? pair_rounded(i) - pair_less[id] : pair_size[id]; }

/* A worker: pair_count pairs on the shared stream; with barriers, the checker looks at each
 * step (both blocks live, both freed). */
static void *pair_worker(void *arg)
{
    size_t id = (size_t)(intptr_t)arg;
    if (!use_dev(0))
        return NULL;
    for (size_t i = 0; i < pair_count; i++) {
        struct blk b;
        bool ok = one_stream_malloc(&b, pair_req(id, i));
        if (!pair_free_run) {
            pthread_barrier_wait(&pair_step);
            pthread_barrier_wait(&pair_step);
        }
        if (ok)
            check_and_free(&b, "pair");
        if (ok && i % 4 == 1) {
            /* Size 0 while this thread's front, lane or slot holds its freed block: NULL, nothing
             * counted (the checker's statistics at the next step say so), no block taken. */
            void *z = (void *)1;
            atomic_fetch_add(&pair_zero_calls, 1);
            if (xseg_malloc(&z, 0, 0, (struct CUstream_st *)streams[0][1]) != XSEG_SUCCESS || z != NULL)
                tfail("pair: xseg_malloc(0) gave %p: %s", z, xseg_last_error());
        }
        if (!pair_free_run) {
            pthread_barrier_wait(&pair_step);
            pthread_barrier_wait(&pair_step);
        }
        if (!ok && pair_free_run)
            break;
    }
    return NULL;
}

/* Two threads that come to the shared stream after the workers exited, sizes in turn, each
 * 3 * FRONT_CHECK_HITS pairs, never more than 256 pairs apart (so that neither is alone on the
 * stream for a check period: the mark stays). A failed call stops its thread's operations, not
 * its barrier waits. */
static pthread_barrier_t newcomer_step, holders_done;
/* Holds a joined worker's stack (and with it its thread-local storage, whose address names a
 * front's owner) while the newcomers run, so that they do not take the workers' fronts over. */
static void *stack_holder(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&holders_done);
    return NULL;
}
static void *newcomer(void *arg)
{
    size_t id = (size_t)(intptr_t)arg;
    bool ok = use_dev(0);
    for (size_t i = 0; i < 3 * FRONT_CHECK_HITS; i++) {
        if (i % 256 == 0)
            pthread_barrier_wait(&newcomer_step);
        if (!ok || atomic_load(&failures))
            continue;
        void *p = NULL;
        size_t size = pair_rounded(i + id) - pair_less[id];
        if (xseg_malloc(&p, size, 0, (struct CUstream_st *)streams[0][1]) != XSEG_SUCCESS) {
            tfail("newcomer: xseg_malloc(%zu): %s", size, xseg_last_error());
            ok = false;
            continue;
        }
        count_malloc(0, size);
        if (xseg_free(p) != XSEG_SUCCESS) {
            tfail("newcomer: xseg_free(%p): %s", p, xseg_last_error());
            ok = false;
        }
    }
    return NULL;
}

/* The all-pools rows, exactly: @p n of the workers' blocks of step @p i live (0 or 2); the peaks
 * are those of the steps so far (the blocks of a step live together, a step's freed before the
 * next's). */
#if XSEG_DEBUG_LEVEL >= 1
/* The lanes' hits so far (core/device/fast.h, Note [front lane]): settled fronts' and busy ones',
 * folded (their fronts' lane_hits) or not (their lane slots' reps; read with every worker joined). */
static uint64_t pair_lane_hits(const struct dev_fast *f)
{
    uint64_t n = f->lane_hits;
    for (unsigned k = 0; k < DEV_OWN_SLOTS; k++) {
        if (!(f->busy_slots >> (DEV_STREAM_SLOTS + k) & 1))
            continue;
        n += f->fronts[k].lane_hits;
        for (unsigned j = 0; j < FRONT_LANES; j++)
            n += f->fronts[k].lane[j].reps;
    }
    return n;
}
/* The busy fronts' lane tries that took a lane's lock and served nothing, folded or not. */
static uint64_t pair_lane_misses(const struct dev_fast *f)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < DEV_OWN_SLOTS; k++) {
        if (!(f->busy_slots >> (DEV_STREAM_SLOTS + k) & 1))
            continue;
        n += f->fronts[k].lane_misses;
        for (unsigned j = 0; j < FRONT_LANES; j++)
            n += f->fronts[k].lane[j].misses;
    }
    return n;
}
#endif

static void pair_check_stats(size_t n, size_t i, const char *when)
{
    xseg_device_stats st;
    if (xseg_get_stats(0, &st) != XSEG_SUCCESS) {
        tfail("xseg_get_stats: %s", xseg_last_error());
        return;
    }
    check_instant(&st, 0);
    int64_t req = n ? (int64_t)(pair_req(0, i) + pair_req(1, i)) : 0;
    int64_t peak_bytes = pair_room ? PAIR_ROOM * PAIR_ROOM_SIZE : 0, peak_req = peak_bytes;
    for (size_t j = 0; j < (pair_seen_all ? 4 : i + 1) && j < 4; j++) {
        peak_bytes = (int64_t)(2 * pair_rounded(j)) > peak_bytes ? (int64_t)(2 * pair_rounded(j)) : peak_bytes;
        int64_t r = (int64_t)(pair_req(0, j) + pair_req(1, j));
        peak_req = r > peak_req ? r : peak_req;
    }
    if (st.allocation[0].current != (int64_t)n || st.active[0].current != (int64_t)n ||
        st.allocated_bytes[0].current != (int64_t)(n * pair_rounded(i)) || st.requested_bytes[0].current != req ||
        st.allocation[0].peak != (pair_room ? PAIR_ROOM : 2) || st.allocated_bytes[0].peak != peak_bytes ||
        st.requested_bytes[0].peak != peak_req)
        tfail("%s (step %zu): allocation %" PRId64 " (peak %" PRId64 "), active %" PRId64 ", allocated %" PRId64
              " (peak %" PRId64 ", want %" PRId64 "), requested %" PRId64 " (peak %" PRId64 ", want %" PRId64
              "), want %zu blocks",
              when, i, st.allocation[0].current, st.allocation[0].peak, st.active[0].current,
              st.allocated_bytes[0].current, st.allocated_bytes[0].peak, peak_bytes, st.requested_bytes[0].current,
              st.requested_bytes[0].peak, peak_req, n);
    uint64_t done = atomic_load(&mallocs_done[0]), bytes = atomic_load(&requested_done[0]);
    if ((uint64_t)st.allocation[0].allocated != done || (uint64_t)st.requested_bytes[0].allocated != bytes)
        tfail("%s: %" PRIu64 " mallocs of %" PRIu64 " bytes, counted %" PRId64 " of %" PRId64, when, done,
              bytes, st.allocation[0].allocated, st.requested_bytes[0].allocated);
}

/* A snapshot (a settle-all point): the workers' blocks, exactly @p n live on the stream. */
static void pair_check_snapshot(size_t n, size_t i, const char *when)
{
    xseg_snapshot *snap = NULL;
    if (xseg_take_snapshot(0, &snap) != XSEG_SUCCESS) {
        tfail("xseg_take_snapshot: %s", xseg_last_error());
        return;
    }
    size_t live = 0, req = 0;
    for (size_t s = 0; s < snap->nsegments; s++)
        for (size_t b = 0; b < snap->segments[s].nblocks; b++)
            if (snap->segments[s].blocks[b].state != XSEG_BLOCK_INACTIVE) {
                live++;
                req += snap->segments[s].blocks[b].requested_size;
            }
    if (live != n || req != (n ? pair_req(0, i) + pair_req(1, i) : 0))
        tfail("%s: the snapshot has %zu blocks in use of %zu requested bytes, want %zu", when, live, req, n);
    /* Classic: the snapshot settled every slot (an own slot's free merged), and the statistics
     * read now count the inactive split blocks it shows, exactly (the workers wait). */
    if (!pair_expandable) {
        int64_t split = 0, split_bytes = 0;
        for (size_t s = 0; s < snap->nsegments; s++)
            for (size_t b = 0; b < snap->segments[s].nblocks; b++)
                if (snap->segments[s].nblocks > 1 && snap->segments[s].blocks[b].state == XSEG_BLOCK_INACTIVE) {
                    split++;
                    split_bytes += (int64_t)snap->segments[s].blocks[b].size;
                }
        xseg_device_stats st;
        if (xseg_get_stats(0, &st) != XSEG_SUCCESS)
            tfail("xseg_get_stats: %s", xseg_last_error());
        else if (st.inactive_split[0].current != split || st.inactive_split_bytes[0].current != split_bytes)
            tfail("%s: inactive_split %" PRId64 " of %" PRId64 " bytes, the snapshot shows %" PRId64 " of %" PRId64,
                  when, st.inactive_split[0].current, st.inactive_split_bytes[0].current, split, split_bytes);
    }
    xseg_snapshot_free(snap);
}

static void run_pairs(const char *config, bool expandable, bool mixed, bool room)
{
    if (!tu_gpu_available()) {
        print_message("[  SKIPPED ] no CUDA device: %s\n", tu_last_load_error());
        skip();
    }
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config(config), XSEG_SUCCESS);
    ndev = 1;
    CUdevice dev;
    tu_assert_cu(drv->cuDeviceGet(&dev, 0));
    tu_assert_cu(drv->cuDevicePrimaryCtxRetain(&ctxs[0], dev));
    tu_assert_cu(drv->cuCtxSetCurrent(ctxs[0]));
    streams[0][0] = NULL;
    for (int s = 1; s <= STREAMS_PER_DEV; s++)
        tu_assert_cu(drv->cuStreamCreate(&streams[0][s], CU_STREAM_NON_BLOCKING));
    atomic_store(&stop, false);
    atomic_store(&failures, 0);
    atomic_store(&mallocs_done[0], 0);
    atomic_store(&requested_done[0], 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_reset_accumulated_stats(0), XSEG_SUCCESS);
    assert_int_equal(xseg_reset_peak_stats(0), XSEG_SUCCESS);
    pthread_barrier_init(&pair_step, NULL, PAIR_WORKERS + 1);
    pair_expandable = expandable;
    pair_mixed = mixed;
    pair_seen_all = false;
    pair_room = room;
    if (room) {
        struct blk b[PAIR_ROOM];
        for (int i = 0; i < PAIR_ROOM; i++)
            assert_true(one_stream_malloc(&b[i], PAIR_ROOM_SIZE));
        for (int i = 0; i < PAIR_ROOM; i++)
            check_and_free(&b[i], "room");
    }

    /* Step 1: the statistics read at every step are exact, folded, nothing settled by the
     * reads; the pairs after the first few stay off the device lock. Step 2: the same with a
     * settle-all point at every step. */
    for (int step = 1; step <= 2; step++) {
        pair_count = tu_scaled(step == 1 ? 2000 : 400, 100);
        pair_free_run = false;
#if XSEG_DEBUG_LEVEL >= 1
        const struct dev_fast *f = &rt_device_peek(0)->fast;
        uint64_t locked0 = f->lock_mallocs + f->lock_frees, lanes0 = pair_lane_hits(f);
        uint64_t lane_misses0 = pair_lane_misses(f), zero0 = atomic_load(&pair_zero_calls);
#endif
        pthread_t w[PAIR_WORKERS];
        for (intptr_t i = 0; i < PAIR_WORKERS; i++)
            assert_int_equal(pthread_create(&w[i], NULL, pair_worker, (void *)i), 0);
        for (size_t i = 0; i < pair_count; i++) {
            pthread_barrier_wait(&pair_step); /* both live */
            if (step == 2) {
                switch (i % 3) {
                case 0:
                    pair_check_snapshot(2, i, "both live, snapshot");
                    break;
                case 1:
                    if (xseg_empty_cache(0) != XSEG_SUCCESS)
                        tfail("xseg_empty_cache: %s", xseg_last_error());
                    break;
                default:
                    if (!mixed && xseg_reset_peak_stats(0) != XSEG_SUCCESS) /* mixed: the peaks of all steps */
                        tfail("xseg_reset_peak_stats: %s", xseg_last_error());
                }
            }
            pair_check_stats(2, i, step == 1 ? "both live" : "both live, settled");
            pthread_barrier_wait(&pair_step);
            pthread_barrier_wait(&pair_step); /* both freed */
            pair_check_stats(0, i, step == 1 ? "both freed" : "both freed, settled");
            if (step == 2 && i % 3 == 0)
                pair_check_snapshot(0, i, "both freed, snapshot");
            pthread_barrier_wait(&pair_step);
        }
        for (int i = 0; i < PAIR_WORKERS; i++)
            pthread_join(w[i], NULL);
        pair_seen_all = true;
        /* Each thread's block waits in a slot of its own, in either mode (without them the eager
         * path's best fit puts the two blocks side by side, and then every malloc and free takes
         * the device lock). Debug builds (the sanitizer builds CI runs too) count the lock's
         * takers: at most a quarter of the operations, an eighth with sizes in turn. A front's hit
         * waits for its lock while a device-lock holder (dev_check's walk at debug_level 2, a
         * grant's share-out) holds it, and a hit past its grant takes its front's block under the
         * device lock (fast_lock_hit) rather than another block whose free locks again: before
         * both, sizes in turn locked 17-26 % of the operations at debug_level 1. */
        uint64_t own = rt_device_peek(0)->fast.busy_slots >> DEV_STREAM_SLOTS; /* the workers joined */
        if (step == 1 && __builtin_popcountll(own) != PAIR_WORKERS)
            tfail("%d own slots busy after the pairs, want %d", __builtin_popcountll(own), PAIR_WORKERS);
#if XSEG_DEBUG_LEVEL >= 1
        uint64_t locked = f->lock_mallocs + f->lock_frees - locked0, ops = 2 * PAIR_WORKERS * pair_count;
        if (step == 1 && locked > (mixed ? ops / 8 : ops / 4))
            tfail("%" PRIu64 " of %" PRIu64 " mallocs and frees took the device lock", locked, ops);
        /* One size, or four in turn below peaks with room for their lanes: after a thread's
         * second hit of a size in its front, its pairs of that size are a lane's, a stream slot's
         * cached pair (Note [front lane]): the lanes' hits, folded or still busy, are most of the
         * mallocs. Four in turn at the peaks the pairs make fold their lanes for room. */
        uint64_t lane_hits = pair_lane_hits(f) - lanes0;
        if (step == 1 && (!mixed || room) && lane_hits < ops / 4)
            tfail("%" PRIu64 " of %" PRIu64 " mallocs were lane hits", lane_hits, ops / 2);
        print_message("step %d: %" PRIu64 " of %" PRIu64 " mallocs were lane hits\n", step, lane_hits, ops / 2);
        /* Sizes in turn on lanes: a malloc goes to the lane of its size, not first to the lane of
         * the last size, whose lock it would take and drop for nothing (fast_tls.first): a lane
         * pair takes two slot locks, a stream slot's pair's count. */
        uint64_t lane_misses = pair_lane_misses(f) - lane_misses0;
        /* A size-0 malloc tries the lane of its rounded size 0 (fast_lane_hit), which never
         * serves it: one miss each while the thread's sizes turn (the rule's case; a thread whose
         * last slot is a lane misses there first too), not counted against the rule. */
        uint64_t zero = atomic_load(&pair_zero_calls) - zero0;
        if (step == 1 && mixed && room && lane_misses > ops / 32 + zero)
            tfail("%" PRIu64 " lane tries of %" PRIu64 " mallocs served nothing (%" PRIu64 " of size 0)",
                  lane_misses, ops / 2, zero);
        if (step == 1) /* step 2's settle-all points move busy fronts' misses to the device's slot_misses */
            print_message("step %d: %" PRIu64 " lane tries served nothing (%" PRIu64 " size-0 mallocs)\n", step,
                          lane_misses, zero);
        print_message("step %d: %" PRIu64 " of %" PRIu64 " mallocs and frees took the device lock\n", step, locked,
                      ops);
#endif
        /* Mixed, after step 1 (no settle-all point since the workers met): the workers exited,
         * their fronts busy; two newcomers meet on the stream past two check-ins. The workers'
         * fronts went unused while the stream stayed shared, so they settle (front_check_in):
         * at most the newcomers' two own slots stay busy, not four. */
        if (step == 1 && mixed && !atomic_load(&failures)) {
            pthread_barrier_init(&newcomer_step, NULL, 2);
            pthread_barrier_init(&holders_done, NULL, PAIR_WORKERS + 1);
            pthread_t nc[2], hold[PAIR_WORKERS];
            for (int i = 0; i < PAIR_WORKERS; i++)
                assert_int_equal(pthread_create(&hold[i], NULL, stack_holder, NULL), 0);
            for (intptr_t i = 0; i < 2; i++)
                assert_int_equal(pthread_create(&nc[i], NULL, newcomer, (void *)i), 0);
            for (int i = 0; i < 2; i++)
                pthread_join(nc[i], NULL);
            pthread_barrier_wait(&holders_done);
            for (int i = 0; i < PAIR_WORKERS; i++)
                pthread_join(hold[i], NULL);
            pthread_barrier_destroy(&holders_done);
            pthread_barrier_destroy(&newcomer_step);
            if (!fast_shared(rt_device_peek(0), streams[0][1]))
                tfail("the mark faded while two newcomers met on the stream");
            int busy = __builtin_popcountll(rt_device_peek(0)->fast.busy_slots >> DEV_STREAM_SLOTS);
            if (busy > 2)
                tfail("%d own slots busy after the newcomers' pairs: the exited workers' fronts stayed", busy);
#if XSEG_DEBUG_LEVEL >= 1
            print_message("newcomers: %" PRIu64 " fronts settled unused\n", f->idle_settles);
#endif
        }
        /* Mixed, after step 1 (no settle-all point since the workers met): this thread alone on
         * the stream, sizes in turn, past two check-ins of its front (FRONT_CHECK_HITS): the
         * workers' fronts went unused, so the mark fades and the stream's frees fill its stream
         * slot again (core/device/fast.h, front_check_in). */
        if (step == 1 && mixed && !atomic_load(&failures)) {
            if (!fast_shared(rt_device_peek(0), streams[0][1]))
                tfail("the stream is not marked shared after the workers' pairs");
            for (size_t i = 0; i < 3 * FRONT_CHECK_HITS && !atomic_load(&failures); i++) {
                void *p = NULL;
                size_t size = pair_rounded(i) - 8;
                if (xseg_malloc(&p, size, 0, (struct CUstream_st *)streams[0][1]) != XSEG_SUCCESS) {
                    tfail("alone: xseg_malloc(%zu): %s", size, xseg_last_error());
                    break;
                }
                count_malloc(0, size);
                if (xseg_free(p) != XSEG_SUCCESS)
                    tfail("alone: xseg_free(%p): %s", p, xseg_last_error());
            }
            if (fast_shared(rt_device_peek(0), streams[0][1]))
                tfail("the mark of the stream did not fade with one thread alone on it");
            if (rt_device_peek(0)->fast.busy_slots >> DEV_STREAM_SLOTS)
                tfail("own slots still busy after the mark faded");
        }
        if (atomic_load(&failures))
            break;
    }

    /* Step 3: free-running pairs beside the emptier and the reader (settle-all points and folded
     * reads at any instant); every byte and count kept. */
    if (!atomic_load(&failures)) {
        pair_count = tu_scaled(20000, 1000);
        pair_free_run = true;
        pthread_t w[PAIR_WORKERS], e, r;
        for (intptr_t i = 0; i < PAIR_WORKERS; i++)
            assert_int_equal(pthread_create(&w[i], NULL, pair_worker, (void *)i), 0);
        assert_int_equal(pthread_create(&e, NULL, emptier, NULL), 0);
        assert_int_equal(pthread_create(&r, NULL, reader, NULL), 0);
        for (int i = 0; i < PAIR_WORKERS; i++)
            pthread_join(w[i], NULL);
        atomic_store(&stop, true);
        pthread_join(e, NULL);
        pthread_join(r, NULL);
    }
    pthread_barrier_destroy(&pair_step);
    if (atomic_load(&failures))
        fail_msg("%d failure(s); first: %s", atomic_load(&failures), first_failure);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    xseg_device_stats st;
    assert_int_equal(xseg_get_stats(0, &st), XSEG_SUCCESS);
    uint64_t n = atomic_load(&mallocs_done[0]), req = atomic_load(&requested_done[0]);
    assert_int_equal(st.allocation[0].current, 0);
    assert_int_equal(st.reserved_bytes[0].current, 0);
    assert_int_equal((uint64_t)st.allocation[0].allocated, n);
    assert_int_equal((uint64_t)st.allocation[0].freed, n);
    assert_int_equal((uint64_t)st.requested_bytes[0].allocated, req);
    assert_int_equal((uint64_t)st.requested_bytes[0].freed, req);
    for (int s = 1; s <= STREAMS_PER_DEV; s++)
        drv->cuStreamDestroy(streams[0][s]);
    drv->cuDevicePrimaryCtxRelease(dev);
    tu_ctx_set();
}

static void run(const char *config, bool one_stream)
{
    if (!tu_gpu_available()) {
        print_message("[  SKIPPED ] no CUDA device: %s\n", tu_last_load_error());
        skip();
    }
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config(config), XSEG_SUCCESS);
    assert_int_equal(xseg_device_count(&ndev), XSEG_SUCCESS);
    if (ndev > MAX_DEVS)
        ndev = MAX_DEVS;
    assert_true(ndev >= 1);
    if (tu_emulated() && !strcmp(getenv("CUDAEMU_DEVICES"), "2"))
        assert_int_equal(ndev, 2);
    for (int d = 0; d < ndev; d++) {
        CUdevice dev;
        tu_assert_cu(drv->cuDeviceGet(&dev, d));
        tu_assert_cu(drv->cuDevicePrimaryCtxRetain(&ctxs[d], dev));
        tu_assert_cu(drv->cuCtxSetCurrent(ctxs[d]));
        streams[d][0] = NULL;
        for (int s = 1; s <= STREAMS_PER_DEV; s++)
            tu_assert_cu(drv->cuStreamCreate(&streams[d][s], CU_STREAM_NON_BLOCKING));
    }
    atomic_store(&stop, false);
    atomic_store(&failures, 0);
    for (int d = 0; d < MAX_DEVS; d++) {
        atomic_store(&mallocs_done[d], 0);
        atomic_store(&requested_done[d], 0);
    }
    /* The counters of an earlier run on this device are not this run's. */
    assert_int_equal(xseg_reset_accumulated_stats(-1), XSEG_SUCCESS);
    nmail = 0;

    pthread_t w[NWORKERS], e, r;
    int nworkers = one_stream ? ONE_STREAM_WORKERS : NWORKERS;
    for (intptr_t i = 0; i < nworkers; i++)
        assert_int_equal(pthread_create(&w[i], NULL, one_stream ? one_stream_worker : worker, (void *)i), 0);
    assert_int_equal(pthread_create(&e, NULL, emptier, NULL), 0);
    assert_int_equal(pthread_create(&r, NULL, reader, NULL), 0);
    for (int i = 0; i < nworkers; i++)
        pthread_join(w[i], NULL);
    atomic_store(&stop, true);
    pthread_join(e, NULL);
    pthread_join(r, NULL);
    while (nmail)
        check_and_free(&mailbox[--nmail], "main drain");
    if (atomic_load(&failures))
        fail_msg("%d failure(s); first: %s", atomic_load(&failures), first_failure);

    /* Everything was freed: after empty_cache nothing is allocated or reserved. */
    assert_int_equal(xseg_empty_cache(-1), XSEG_SUCCESS);
    for (int d = 0; d < ndev; d++) {
        xseg_device_stats st;
        assert_int_equal(xseg_get_stats(d, &st), XSEG_SUCCESS);
        if (st.allocation[0].current || st.active[0].current || st.reserved_bytes[0].current)
            fail_msg("device %d after drain: %" PRId64 " allocations, %" PRId64
                     " active, %" PRId64 " bytes reserved",
                     d, st.allocation[0].current, st.active[0].current,
                     st.reserved_bytes[0].current);
        uint64_t n = atomic_load(&mallocs_done[d]), req = atomic_load(&requested_done[d]);
        if ((uint64_t)st.allocation[0].allocated != n || (uint64_t)st.allocation[0].freed != n ||
            (uint64_t)st.requested_bytes[0].allocated != req || (uint64_t)st.requested_bytes[0].freed != req)
            fail_msg("device %d: %" PRIu64 " mallocs of %" PRIu64 " bytes, counted %" PRId64 " / %" PRId64
                     " allocated / freed of %" PRId64 " / %" PRId64 " bytes",
                     d, n, req, st.allocation[0].allocated, st.allocation[0].freed,
                     st.requested_bytes[0].allocated, st.requested_bytes[0].freed);
    }
    for (int d = 0; d < ndev; d++) {
        tu_assert_cu(drv->cuCtxSetCurrent(ctxs[d]));
        for (int s = 1; s <= STREAMS_PER_DEV; s++)
            drv->cuStreamDestroy(streams[d][s]);
        CUdevice dev;
        drv->cuDeviceGet(&dev, d);
        drv->cuDevicePrimaryCtxRelease(dev);
    }
    tu_ctx_set();
}

static void test_threads_expandable(void **state)
{
    (void)state;
    run("expandable_segments:True", false);
}

static void test_threads_classic(void **state)
{
    (void)state;
    run("expandable_segments:False", false);
}

static void test_threads_one_stream_expandable(void **state)
{
    (void)state;
    run("expandable_segments:True", true);
}

static void test_threads_one_stream_classic(void **state)
{
    (void)state;
    run("expandable_segments:False", true);
}

static void test_threads_one_stream_pairs_expandable(void **state)
{
    (void)state;
    run_pairs("expandable_segments:True", true, false, false);
}

static void test_threads_one_stream_pairs_classic(void **state)
{
    (void)state;
    run_pairs("expandable_segments:False", false, false, false);
}

/* Sizes in turn: each thread's front holds a block of every size (Note [slot rule]). */
static void test_threads_one_stream_pairs_mixed_expandable(void **state)
{
    (void)state;
    run_pairs("expandable_segments:True", true, true, false);
}

static void test_threads_one_stream_pairs_mixed_classic(void **state)
{
    (void)state;
    run_pairs("expandable_segments:False", false, true, false);
}

/* Sizes in turn below peaks with room: each size a thread pairs takes a lane (Note [front lane]). */
static void test_threads_one_stream_pairs_mixed_room_expandable(void **state)
{
    (void)state;
    run_pairs("expandable_segments:True", true, true, true);
}

static void test_threads_one_stream_pairs_mixed_room_classic(void **state)
{
    (void)state;
    run_pairs("expandable_segments:False", false, true, true);
}

/* The scenario tests' device 0 under @p config (skipped without a device): the context current,
 * the cache emptied, no failure counted yet. Returns the device, for dev0_end_drained. */
static CUdevice dev0_begin(const char *config)
{
    if (!tu_gpu_available()) {
        print_message("[  SKIPPED ] no CUDA device: %s\n", tu_last_load_error());
        skip();
    }
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config(config), XSEG_SUCCESS);
    CUdevice dev;
    tu_assert_cu(drv->cuDeviceGet(&dev, 0));
    tu_assert_cu(drv->cuDevicePrimaryCtxRetain(&ctxs[0], dev));
    tu_assert_cu(drv->cuCtxSetCurrent(ctxs[0]));
    atomic_store(&failures, 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    return dev;
}

/* Everything was freed: after empty_cache nothing is allocated or reserved on device 0; its
 * context goes back. */
static void dev0_end_drained(CUdevice dev)
{
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    xseg_device_stats st;
    assert_int_equal(xseg_get_stats(0, &st), XSEG_SUCCESS);
    assert_int_equal(st.allocation[0].current, 0);
    assert_int_equal(st.reserved_bytes[0].current, 0);
    drv->cuDevicePrimaryCtxRelease(dev);
    tu_ctx_set();
}

/*
 * Two streams at one slot index (fast_slot_index): stream A shared, its sharing entry held, a
 * front of A busy in a helper thread; then the main thread's free of a block of stream B fills the
 * stream slot they share, and the helper's malloc on B through the device lock finds it filled by
 * another thread. That marks B shared, which displaces A's mark and settles A's fronts, which settle
 * the stream slot of A's index first: the very slot the malloc was about to settle. It must settle
 * once (a second settle read its NULL block and faulted: 1 run in 76 of threads_expandable).
 */
static CUstream idx_a, idx_b;
static pthread_barrier_t idx_step; /* the main thread and the helper, in turn */

/* A malloc and free of @p size on @p stream, its content checked. */
static void idx_pair(CUstream stream, size_t size, const char *who)
{
    struct blk b = {.size = size, .tag = (uint32_t)atomic_fetch_add(&next_tag, 1), .dev = 0};
    if (xseg_malloc(&b.ptr, size, 0, (struct CUstream_st *)stream) != XSEG_SUCCESS) {
        tfail("%s: xseg_malloc(%zu): %s", who, size, xseg_last_error());
        return;
    }
    if (tu_fill((CUdeviceptr)(uintptr_t)b.ptr, size, b.tag) != CUDA_SUCCESS)
        tfail("%s: tu_fill(%p) failed", who, b.ptr);
    check_and_free(&b, who);
}

static void *idx_helper(void *arg)
{
    (void)arg;
    bool ok = use_dev(0);
    pthread_barrier_wait(&idx_step); /* A's slot filled by the main thread */
    if (ok)
        idx_pair(idx_a, 1024, "helper on A"); /* marks A shared; its free fills the helper's front */
    pthread_barrier_wait(&idx_step);
    pthread_barrier_wait(&idx_step); /* the shared slot filled by the main thread's block of B */
    if (ok)
        idx_pair(idx_b, 1024, "helper on B"); /* marks B shared, displacing A */
    pthread_barrier_wait(&idx_step);
    return NULL;
}

/* The busy own slots whose front holds blocks of @p stream. */
static int idx_fronts_of(const struct dev_fast *f, CUstream stream)
{
    int n = 0;
    for (unsigned k = 0; k < DEV_OWN_SLOTS; k++)
        n += (f->busy_slots >> (DEV_STREAM_SLOTS + k) & 1) && f->fronts[k].stream == stream;
    return n;
}

static void run_shared_index(const char *config)
{
    CUdevice dev = dev0_begin(config);

    /* 33 streams over 32 slot indices: two share one (pigeonhole); the rest go. */
    CUstream s[DEV_STREAM_SLOTS + 1];
    int a = -1, b = -1;
    for (int n = 0; n <= DEV_STREAM_SLOTS; n++) {
        tu_assert_cu(drv->cuStreamCreate(&s[n], CU_STREAM_NON_BLOCKING));
        for (int m = 0; m < n && a < 0; m++)
            if (fast_slot_index(s[m]) == fast_slot_index(s[n]))
                a = m, b = n;
    }
    assert_true(a >= 0);
    for (int n = 0; n <= DEV_STREAM_SLOTS; n++)
        if (n != a && n != b)
            tu_assert_cu(drv->cuStreamDestroy(s[n]));
    idx_a = s[a];
    idx_b = s[b];
    unsigned i = fast_slot_index(idx_a);
    const struct dev_fast *f = &rt_device_peek(0)->fast;

    /* Each stream's segment first, so that no malloc below grows one (a malloc that grows
     * settles every front: malloc_slow_body). */
    idx_pair(idx_b, 512, "main on B");
    idx_pair(idx_a, 512, "main on A"); /* the stream slot i: A's block, the main thread's */
    assert_true(f->busy_slots >> i & 1);
    assert_ptr_equal(f->slots[i].blk->stream, idx_a);
    pthread_barrier_init(&idx_step, NULL, 2);
    pthread_t h;
    assert_int_equal(pthread_create(&h, NULL, idx_helper, NULL), 0);
    pthread_barrier_wait(&idx_step);
    pthread_barrier_wait(&idx_step); /* the helper's pair on A */
    assert_true(sharing_is_shared(&f->sharing, i, idx_a));
    assert_int_equal(idx_fronts_of(f, idx_a), 1);
    idx_pair(idx_b, 512, "main on B, again"); /* the stream slot i: B's block, the main thread's */
    assert_true(f->busy_slots >> i & 1);
    assert_ptr_equal(f->slots[i].blk->stream, idx_b);
    assert_int_equal(idx_fronts_of(f, idx_a), 1);
    pthread_barrier_wait(&idx_step);
    pthread_barrier_wait(&idx_step); /* the helper's pair on B */
    pthread_join(h, NULL);
    pthread_barrier_destroy(&idx_step);
    if (atomic_load(&failures))
        fail_msg("%d failure(s); first: %s", atomic_load(&failures), first_failure);
    assert_true(sharing_is_shared(&f->sharing, i, idx_b));
    assert_false(sharing_is_shared(&f->sharing, i, idx_a));
    assert_int_equal(idx_fronts_of(f, idx_a), 0);

    tu_assert_cu(drv->cuStreamDestroy(idx_a));
    tu_assert_cu(drv->cuStreamDestroy(idx_b));
    dev0_end_drained(dev);
}

static void test_threads_shared_index_expandable(void **state)
{
    (void)state;
    run_shared_index("expandable_segments:True");
}

static void test_threads_shared_index_classic(void **state)
{
    (void)state;
    run_shared_index("expandable_segments:False");
}

/*
 * Two threads on one stream taking turns in a fixed order: each step the first mallocs, then the
 * second, then the first frees, then the second (first in, first out), sizes in turn. The second's
 * free of the last block allocated finds the hole of the first's beside it, so no stream slot can
 * keep it: the stream must still be found shared within a few steps, and the pairs served off the
 * device lock after the fronts hold every size. (Expandable streams were never marked in this
 * order: every pair locked.)
 */
#define FIFO_STEPS 64
static pthread_mutex_t fifo_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fifo_cond = PTHREAD_COND_INITIALIZER;
static unsigned fifo_turn; /* step * 4 + (0: first mallocs, 1: second mallocs, 2: first frees, 3: second frees) */
static CUstream fifo_stream;
static atomic_uint_fast64_t fifo_marked_at; /* the first step after which the stream was marked, + 1 */
#if XSEG_DEBUG_LEVEL >= 1
static uint64_t fifo_locked_at[FIFO_STEPS + 1]; /* lock_mallocs + lock_frees before each step */
#endif

static void fifo_wait(unsigned turn)
{
    pthread_mutex_lock(&fifo_lock);
    while (fifo_turn != turn)
        pthread_cond_wait(&fifo_cond, &fifo_lock);
    pthread_mutex_unlock(&fifo_lock);
}

static void fifo_next(void)
{
    pthread_mutex_lock(&fifo_lock);
    fifo_turn++;
    pthread_cond_broadcast(&fifo_cond);
    pthread_mutex_unlock(&fifo_lock);
}

static void *fifo_worker(void *arg)
{
    unsigned id = (unsigned)(intptr_t)arg;
    bool ok = use_dev(0);
    for (unsigned step = 0; step < FIFO_STEPS; step++) {
        struct blk b = {.size = 512 * (step % 4 + 1) - (id ? 60 : 12), .dev = 0};
        b.tag = (uint32_t)atomic_fetch_add(&next_tag, 1);
        fifo_wait(step * 4 + id);
#if XSEG_DEBUG_LEVEL >= 1
        if (id == 0) {
            const struct dev_fast *f = &rt_device_peek(0)->fast;
            fifo_locked_at[step] = f->lock_mallocs + f->lock_frees;
        }
#endif
        if (ok && xseg_malloc(&b.ptr, b.size, 0, (struct CUstream_st *)fifo_stream) != XSEG_SUCCESS) {
            tfail("fifo %u: xseg_malloc(%zu): %s", id, b.size, xseg_last_error());
            ok = false;
        }
        if (ok && tu_fill((CUdeviceptr)(uintptr_t)b.ptr, b.size, b.tag) != CUDA_SUCCESS) {
            tfail("fifo %u: tu_fill failed", id);
            ok = false;
        }
        fifo_next();
        fifo_wait(step * 4 + 2 + id);
        if (ok)
            check_and_free(&b, id ? "fifo second" : "fifo first");
        if (id == 1 && !atomic_load(&fifo_marked_at) && fast_shared(rt_device_peek(0), fifo_stream))
            atomic_store(&fifo_marked_at, step + 1);
        fifo_next();
    }
    return NULL;
}

static void run_fifo(const char *config)
{
    CUdevice dev = dev0_begin(config);
    tu_assert_cu(drv->cuStreamCreate(&fifo_stream, CU_STREAM_NON_BLOCKING));
    atomic_store(&fifo_marked_at, 0);
    fifo_turn = 0;
    pthread_t w[2];
    for (intptr_t i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&w[i], NULL, fifo_worker, (void *)i), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(w[i], NULL);
    if (atomic_load(&failures))
        fail_msg("%d failure(s); first: %s", atomic_load(&failures), first_failure);
    /* The first steps lock (each thread's first block of each size; the probe, then the mark). */
    uint64_t marked = atomic_load(&fifo_marked_at);
    print_message("marked shared after step %" PRIu64 " of %d\n", marked, FIFO_STEPS);
    if (!marked || marked > 4)
        fail_msg("the stream was %s", marked ? "marked shared late" : "never marked shared");
#if XSEG_DEBUG_LEVEL >= 1
    /* From step 16 on, the fronts hold every size: the check-ins aside, no pair locks (each
     * front checks in once per FRONT_CHECK_HITS hits, more than these steps). */
    const struct dev_fast *f = &rt_device_peek(0)->fast;
    uint64_t late = f->lock_mallocs + f->lock_frees - fifo_locked_at[16];
    print_message("steps 16-%d: %" PRIu64 " of %d mallocs and frees took the device lock\n", FIFO_STEPS - 1, late,
                  4 * (FIFO_STEPS - 16));
    if (late > 4)
        fail_msg("%" PRIu64 " of %d mallocs and frees took the device lock after the fronts filled", late,
                 4 * (FIFO_STEPS - 16));
#endif
    tu_assert_cu(drv->cuStreamDestroy(fifo_stream));
    dev0_end_drained(dev);
}

static void test_threads_fifo_expandable(void **state)
{
    (void)state;
    run_fifo("expandable_segments:True");
}

static void test_threads_fifo_classic(void **state)
{
    (void)state;
    run_fifo("expandable_segments:False");
}

/* `test_threads NAME` runs one test (each is its own meson test); no argument runs them all. */
int main(int argc, char **argv)
{
    /* Two emulated devices; read by cudaemu at cuInit, ignored by a real driver. */
    setenv("CUDAEMU_DEVICES", "2", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_expandable),
        cmocka_unit_test(test_threads_classic),
        cmocka_unit_test(test_threads_one_stream_expandable),
        cmocka_unit_test(test_threads_one_stream_classic),
        cmocka_unit_test(test_threads_one_stream_pairs_expandable),
        cmocka_unit_test(test_threads_one_stream_pairs_classic),
        cmocka_unit_test(test_threads_one_stream_pairs_mixed_expandable),
        cmocka_unit_test(test_threads_one_stream_pairs_mixed_classic),
        cmocka_unit_test(test_threads_one_stream_pairs_mixed_room_expandable),
        cmocka_unit_test(test_threads_one_stream_pairs_mixed_room_classic),
        cmocka_unit_test(test_threads_shared_index_expandable),
        cmocka_unit_test(test_threads_shared_index_classic),
        cmocka_unit_test(test_threads_fifo_expandable),
        cmocka_unit_test(test_threads_fifo_classic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
