/*
 * Sleep and wake (core/services/sleep.h). The driver work is in vmm/: the pages (vmm/segment.c's
 * seg_sleep_* / seg_wake_*), the pinned host memory and the copies (vmm/host.c).
 *
 * Sleep, in order, so that any failure can be undone with nothing lost:
 *   1. checks (known pool, awake, no capture, no block exported over IPC or with handles handed
 *      out by xseg_block_handles, expandable segments only) — nothing changes;
 *   2. wait for every stream that may use the pool and, under sleep_wait_device (the default), for
 *      the whole context (RELAXED capture mode; a capture xseg knows of refused the sleep at 1 and
 *      is rechecked after), so work on streams xseg never saw is done before any copy or unmap;
 *      then return completed record_stream frees;
 *   3. OFFLOAD: queue the copy of each run of live blocks to pinned host memory (a block of the
 *      host cache, core/services/hostalloc.c) in chunks of sleep_copy_chunk_mb (64 MiB), round robin over the copy
 *      streams xseg owns (d->sleep.copy), and record an event per stream used after each segment;
 *      runs shorter than sleep_copy_batch_kb go in cuMemcpyBatchAsync batches instead, where the
 *      driver has the call (issue 74 item 7: one call per 512 runs and segment, flushed before the
 *      segment's events, so the waits below cover them as they cover chunks);
 *   4. segment after segment: wait for its own chunks (its events), then unmap its mapped pages,
 *      keeping the handles, while the later segments' chunks still copy; a failure maps every
 *      unmapped page back with its own handle and memory;
 *   5. release the handles: the memory goes back to the driver. Books: reserved_bytes drops.
 * Why release only after every chunk is copied: cuMemRelease is the one step that loses bytes, so
 * until it runs any failure is undone with the pool's own pages (no restore from the host copy,
 * which could fail in turn); it costs ~2 % of the copy time (docs/benchmarks.md#services).
 * OFFLOAD under sleep_backup_checksum: a keyed sum of each segment's backup once its copies are
 * done (after step 4), checked by the wake before it maps a page (a mismatch: the pool stays
 * asleep, nothing changed).
 * Wake: map every asleep page (new memory) and restore (copy back or fill: sleep_discard_fill) in chunks round robin
 * over the copy streams, segment after segment (a segment's chunks overlap the next one's
 * mapping), wait, then give the host memory back (to the host cache under sleep_keep_host_backup,
 * else to the driver). A failure before the end waits for the copies it queued, then unmaps what
 * it mapped (if that wait fails too, the pages stay mapped), and the pool stays asleep with its
 * host copy, ready for a retry. OFFLOAD_FILE: the sleep keeps a checksum of each chunk it writes
 * in host memory (keyed with a key drawn for the sleep, kept beside the sums: base/checksum.h),
 * the wake reads whole chunks and checks each before copying any of it, so a file changed while
 * asleep fails the wake as a file cut short does (host memory is the process's own: its backups
 * are not checked).
 *
 * Why wait on the host (not order on the GPU): unmapping needs every use of the pages finished,
 * and freeing the pinned memory needs the copies finished; a sleep or wake moves gigabytes, so a
 * synchronize costs little next to it.
 *
 * Locking: the long steps run without the device lock (step_out / step_in): the waits for the
 * pool's streams and for the copies, the host backups' allocation, the file's creation, writes
 * and reads. Mallocs and frees of the device's other pools go on meanwhile (a 10 GiB file sleep
 * on a slow disk would otherwise stop them all). What keeps everyone else off the pool: its
 * struct pool_sleep is in its slot from the first check to the end (phase SLEEPING, ASLEEP,
 * WAKING), so a malloc from it, a second sleep or wake of it and a release of the pool are refused
 * (sleep_refuse names the phase), and its segments are marked asleep from the start, so no reclaim,
 * export or snapshot touches them. A free of one of its blocks only changes the books, as while
 * it sleeps: the runs to copy were taken under the lock, and a copy into a freed block is harmless
 * (nothing can allocate it). Pages are mapped and unmapped, and the books changed, only under the
 * lock, and reserved_bytes follows each segment's pages as they go (dev_check may run between).
 * What others may start meanwhile is checked again where the lock is retaken: a capture before the
 * sleep queries an event or unmaps (capture_recheck), the fraction and budgets before the wake
 * maps a segment (wake_room). A malloc that gave the lock back itself (free-memory callbacks, the
 * group's give-way, release_lock_on_cudamalloc) refuses its pool if it fell asleep meanwhile
 * (alloc.c). Safe without more: frees and completed record_stream events of the pool's blocks
 * (books only; the runs were taken before), reclaim, trim, the group's responder and defrag (they
 * skip asleep segments), export and block handles (refused on asleep segments), a release of the
 * pool (kept while it has a sleep struct), xseg_shutdown (refused while one is underway), peer
 * access (granted on mapped runs; a wake maps with the list in force). The thread running the
 * sleep or wake owns the rest of the struct; other threads read only its phase and, once asleep,
 * its statistics.
 */
#include "core/services/sleep.h"
#include "core/services/spill.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/backfile.h"
#include "base/checksum.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/device/check.h"
#include "core/policy/events.h"
#include "core/services/hostalloc.h"
#include "core/policy/pools.h"
#include "core/policy/registry.h"
#include "vmm/event.h"
#include "vmm/host.h"
#include "vmm/segment.h"
#include "vmm/stream.h"

/* One run of live bytes of a segment at the sleep: [off, off + len) of the segment, kept at
 * host + host_off (OFFLOAD). */
struct sleep_run {
    size_t off, len, host_off;
};

/* A segment of a sleeping pool. */
struct sleep_seg {
    struct segrec *s;
    unsigned used;                    /* the copy streams its chunks ran on (bit k: streams[k]) */
    CUevent ev[SLEEP_COPY_STREAMS];   /* a sleep: recorded after its chunks on each used stream, or 0 */
    void *host;          /* OFFLOAD: the live bytes (host_bytes), NULL otherwise */
    uint64_t file_off;   /* OFFLOAD_FILE: where its host_bytes start in the file */
    size_t host_bytes;
    struct sleep_run *runs;
    size_t nruns, capruns;
    size_t live0, chunks0; /* its mapped bytes and chunks when the running wake began (a failed sleep's) */
    bool kept; /* a failed sleep left all its pages mapped: they hold the bytes, the wake copies none */
    uint64_t sum; /* sleep_backup_checksum: the sum of its host backup under ps->sum_key */
};

/* Copies per cuMemcpyBatchAsync of a sleep or wake (the arrays live in struct pool_sleep). */
#define SLEEP_BATCH_MAX 512

/* Where a pool's sleep stands; awake is no struct in the slot. */
enum sleep_phase {
    PHASE_SLEEPING, /* an xseg_sleep of it runs */
    PHASE_ASLEEP,
    PHASE_WAKING, /* an xseg_wake of it runs */
};

/* A wake's copy into a segment: [dev, dev + len) from byte @p from of its backup (or zeros). */
struct sleep_copy {
    CUdeviceptr dev;
    size_t from, len;
};

struct pool_sleep {
    enum sleep_phase phase; /* written under the device lock; read by other threads */
    unsigned flags;
    bool keep_backup; /* sleep_keep_host_backup when this sleep or wake began (read unlocked) */
    CUstream streams[SLEEP_COPY_STREAMS]; /* the running sleep's or wake's copy streams */
    unsigned nstreams, next;              /* their count; the round robin's cursor */
    unsigned used;                        /* the streams any chunk of this sleep or wake ran on (bits) */
    size_t chunk;                         /* sleep_copy_chunk_mb in bytes */
    /* Runs of fewer than batch_below bytes (sleep_copy_batch_kb; 0: off, or the driver lacks
     * cuMemcpyBatchAsync, or no copy stream: the call refuses the legacy stream) are not a call
     * each: they collect here, one direction at a time, and go as one cuMemcpyBatchAsync per
     * SLEEP_BATCH_MAX copies and at the end of each segment (batch_flush), round robin over the
     * streams like the chunks. */
    size_t batch_below;
    size_t nbat;
    CUdeviceptr bat_dst[SLEEP_BATCH_MAX], bat_src[SLEEP_BATCH_MAX];
    size_t bat_len[SLEEP_BATCH_MAX];
    unsigned char fill;                   /* a DISCARD wake's byte (sleep_discard_fill) */
    /* OFFLOAD_FILE: the file, and a running sleep's or wake's two bounce buffers (slot j on
     * streams[j % nstreams]) with what each holds: bytes [boff, boff + blen) of the file. */
    struct backfile file;
    void *bounce[2];
    size_t bounce_bytes;
    bool busy[2];
    uint64_t boff[2];
    size_t blen[2];
    CUdeviceptr bdev[2];
    unsigned slot;
    size_t bsum[2]; /* a sleep: where in sums each slot's chunk is */
    /* OFFLOAD_FILE: the file's chunks as the sleep wrote them, in file order and contiguous from 0,
     * each at most file_chunk bytes: where it ends and its checksum (base/checksum.h) under
     * sum_key, a key drawn for this sleep. Both kept in host memory, never in the file: the wake
     * reads and checks whole chunks, so bytes changed while the pool slept fail the wake (as a
     * file cut short does) instead of being restored, even when whoever changed them can read the
     * file (the sum of what they write cannot be computed without the key). */
    struct file_sum {
        uint64_t end, sum;
    } *sums;
    size_t nsums, capsums;
    struct checksum_key sum_key;
    size_t file_chunk;
    struct sleep_seg *segs;
    size_t nsegs, capsegs;
    struct sleep_copy *plan; /* a wake: the copies of the segment being restored */
    size_t nplan, capplan;
    size_t released; /* bytes the sleep unmapped (reserved_bytes given back) */
    size_t live;     /* bytes of live blocks at the sleep: offloaded or discarded */
    bool summed;     /* OFFLOAD under sleep_backup_checksum: each segment's backup has its sum */
};

static bool active(const struct block *b) { return b->allocated || block_event_count(b) > 0 || block_uses_n(b); }

/* Free @p ps and give its backups to the host cache: kept there under sleep_keep_host_backup
 * (the next sleep of as many live bytes allocates no pinned memory), else back to the driver.
 * With @p copies_may_run (a failed sleep), its copy stream is waited for first (else the block
 * waits for an event), so no cached block is reused under a copy still running. */
static xseg_status wait_all(struct pool_sleep *ps, const char *why);
static xseg_status wait_streams_in(struct pool_sleep *ps, unsigned mask, const char *why);
static void drop_events(struct sleep_seg *ss);

static void state_free(struct dev_alloc *d, struct pool_sleep *ps, bool copies_may_run)
{
    if (!ps)
        return;
    bool waited = !copies_may_run || wait_all(ps, "for the copies of a failed sleep") == XSEG_SUCCESS;
    for (size_t i = 0; i < ps->nsegs; i++) {
        struct sleep_seg *ss = &ps->segs[i];
        drop_events(ss);
        xs_free(ss->runs);
        if (!ss->host)
            continue;
        bool recorded = true;
        for (unsigned k = 0; !waited && k < ps->nstreams && recorded; k++)
            recorded = !(ss->used & (1u << k)) ||
                       hostalloc_record_stream(ss->host, d->info.primary_ctx, ps->streams[k]) == XSEG_SUCCESS;
        if (!recorded)
            continue; /* neither waited nor recorded: kept allocated rather than reused under a copy */
        (void)hostalloc_free(ss->host, !ps->keep_backup);
    }
    backfile_close(&ps->file);
    checksum_key_forget(&ps->sum_key);
    xs_free(ps->plan);
    xs_free(ps->sums);
    xs_free(ps->segs);
    xs_free(ps);
}

static const char *pool_name(const struct priv_pool *pp, char buf[64])
{
    if (!pp)
        return "the default pool";
    snprintf(buf, 64, "pool {%" PRIu64 ", %" PRIu64 "}", pp->id.first, pp->id.second);
    return buf;
}

/* The private pool @p id (NULL for {0, 0}); INVALID_VALUE when @p d does not know it. */
static xseg_status find_pool(struct dev_alloc *d, const char *fn, xseg_pool_id id, struct priv_pool **out)
{
    lock_assert_held(&d->lock);
    *out = NULL;
    if (!id.first && !id.second)
        return XSEG_SUCCESS;
    *out = pools_find(d, id);
    if (!*out)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: no pool {%" PRIu64 ", %" PRIu64 "} on device %d", fn, id.first,
                       id.second, d->device);
    return XSEG_SUCCESS;
}

static struct pool_sleep **slot(struct dev_alloc *d, struct priv_pool *pp)
{
    lock_assert_held(&d->lock);
    return pp ? &pp->sleep : &d->sleep.sleep_default;
}

/* What a pool not awake is doing, for the messages of the calls it refuses. */
static const char *phase_words(const struct pool_sleep *ps)
{
    switch (ps->phase) {
    case PHASE_SLEEPING:
        return "is going to sleep (an xseg_sleep of it is underway)";
    case PHASE_WAKING:
        return "is waking up (an xseg_wake of it is underway)";
    default:
        return "is asleep (xseg_sleep)";
    }
}

/* The device lock given back around a long step of a sleep or wake, and taken again (see the top:
 * the pool's phase and asleep segments keep the others off it). The state must be whole at
 * step_out (dev_unlock may check it); after step_in nothing of the device but the pool's own
 * segments and blocks is trusted as before. */
static void step_out(struct dev_alloc *d) { dev_unlock(d); }
static void step_in(struct dev_alloc *d) { dev_lock(d, DEV_NEED_SLOTS); }

xseg_status sleep_refuse(const struct dev_alloc *d, const struct priv_pool *pp)
{
    lock_assert_held(&d->lock);
    const struct pool_sleep *ps = pp ? pp->sleep : d->sleep.sleep_default;
    char buf[64];
    return err_set(XSEG_ERROR_ILLEGAL_STATE, "cannot allocate from %s on device %d: it %s; %s", pool_name(pp, buf),
                   d->device, phase_words(ps), ps->phase == PHASE_ASLEEP ? "xseg_wake it first"
                                                                         : "allocate once that call has returned");
}

size_t sleep_allocated_bytes(const struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    if (!d->sleep.nasleep)
        return 0;
    size_t bytes = 0;
    for (const struct segrec *s = d->segs; s; s = s->next_seg) {
        if (!s->asleep)
            continue;
        /* Only blocks whose pages are gone (a sleep underway unmaps segment after segment). */
        uintptr_t base = (uintptr_t)seg_base(s->vseg);
        for (const struct block *b = s->first; b; b = b->next)
            if (b->allocated && seg_gran_is_asleep(s->vseg, (b->addr - base) / seg_gran(s->vseg)))
                bytes += b->size;
    }
    return bytes;
}

/* ---- streams ----------------------------------------------------------------------------- */

static xseg_status capture_recheck(struct dev_alloc *d);

struct stream_list {
    CUstream *v;
    size_t n, cap;
};

static bool stream_add(struct stream_list *l, CUstream s)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i] == s)
            return true;
    if (!VEC_RESERVE(l->v, l->cap, l->n + 1))
        return false;
    l->v[l->n++] = s;
    return true;
}

/* Wait for every stream that may still use the blocks of pool @p pp (@p ps's segments): theirs,
 * the streams recorded for their live blocks, and the pending record_stream events on its blocks.
 * A program's stream is named only while a live block keeps it alive (vmm/stream.h): a segment's
 * stream when the segment holds an allocated block, a live block's recorded streams; pending frees
 * are waited for by their events (xseg's own), and a segment whose blocks are all freed, on a
 * stream that may be gone, by a wait for the whole context, as is every sleep under
 * sleep_wait_device (work on a stream no block names). Lock held; given back while waiting
 * for streams and events. */
static xseg_status wait_streams(struct dev_alloc *d, const struct priv_pool *pp, const struct pool_sleep *ps,
                                const char *why)
{
    lock_assert_held(&d->lock);
    struct stream_list l = {0};
    struct event_list {
        CUevent *v;
        size_t n, cap;
    } evs = {0};
    /* sleep_wait_device (the default): the whole device's work too, so that work queued on a
     * stream xseg was never told about (no block names it) finishes before a page goes. */
    bool ok = true, ctx = d->cfg.sleep_wait_device;
    for (size_t i = 0; i < ps->nsegs && ok; i++) {
        const struct segrec *s = ps->segs[i].s;
        bool live = false;
        for (const struct block *b = s->first; b && ok; b = b->next) {
            live = live || b->allocated;
            for (unsigned k = 0; b->allocated && k < block_uses_n(b) && ok; k++)
                ok = stream_add(&l, stream_set_get(&b->u.side->uses, k));
        }
        if (live || vstream_default(s->stream))
            ok = ok && stream_add(&l, s->stream);
        else
            ctx = true;
    }
    for (size_t q = 0; q < d->ev.nevq && ok; q++) {
        const struct ev_queue *eq = &d->ev.evq[q];
        for (size_t k = 0; k < eq->count && ok; k++) {
            const struct ev_item *it = &eq->items[(eq->head + k) % eq->cap];
            if (dev_pool_owner(d, block_pool(it->block)) == pp) {
                ok = VEC_RESERVE(evs.v, evs.cap, evs.n + 1);
                if (ok)
                    evs.v[evs.n++] = it->event;
            }
        }
    }
    xseg_status st = ok ? XSEG_SUCCESS : err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory", why);
    /* The context is waited for under the lock, so that no capture of xseg's begins meanwhile (a
     * context wait would invalidate it); the streams and events with the lock given back. */
    if (st == XSEG_SUCCESS && ctx)
        st = vctx_wait_relaxed(why);
    step_out(d);
    for (size_t i = 0; i < l.n && st == XSEG_SUCCESS; i++)
        st = vstream_wait(l.v[i], why);
    bool lost = false; /* an event that cannot be waited for: the context is */
    for (size_t i = 0; i < evs.n && st == XSEG_SUCCESS && !lost; i++)
        lost = !vevent_wait(evs.v[i]);
    step_in(d);
    if (st == XSEG_SUCCESS && lost && (st = capture_recheck(d)) == XSEG_SUCCESS)
        st = vctx_wait_relaxed(why);
    xs_free(l.v);
    xs_free(evs.v);
    return st;
}

/* ---- chunks over the copy streams --------------------------------------------------------- */

/* The streams of this sleep's or wake's chunks: xseg's own copy streams, created the first time
 * (non-blocking, so user work on the legacy stream never serializes them; destroyed by
 * sleep_teardown). Where the driver refuses one, fewer; none: every chunk on the legacy stream.
 * The pool's streams were waited for before any chunk is queued, and sleep and wake wait for their
 * chunks before returning, so no ordering between the streams is needed. */
static void pick_streams(struct dev_alloc *d, struct pool_sleep *ps)
{
    lock_assert_held(&d->lock);
    struct sleep_state *sl = &d->sleep;
    bool failed = false;
    while (sl->ncopy < SLEEP_COPY_STREAMS && !failed) {
        failed = vstream_create(&sl->copy[sl->ncopy]) != XSEG_SUCCESS;
        sl->ncopy += !failed;
    }
    if (failed)
        err_clear(); /* fewer streams only cost overlap; the next sleep tries again */
    ps->nstreams = sl->ncopy ? sl->ncopy : 1;
    for (unsigned k = 0; k < ps->nstreams; k++)
        ps->streams[k] = sl->ncopy ? sl->copy[k] : NULL;
    ps->next = 0;
    ps->used = 0;
    ps->chunk = d->cfg.sleep_copy_chunk;
    ps->batch_below = sl->ncopy && vhost_batch_supported() ? (size_t)d->cfg.sleep_copy_batch_kb << 10 : 0;
    ps->nbat = 0;
    ps->fill = (unsigned char)d->cfg.sleep_discard_fill;
}

void sleep_teardown(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    for (unsigned k = 0; k < d->sleep.ncopy; k++)
        vstream_destroy(d->sleep.copy[k]);
    memset(d->sleep.copy, 0, sizeof d->sleep.copy);
    d->sleep.ncopy = 0;
}

enum chunk_op { CHUNK_DTOH, CHUNK_HTOD, CHUNK_ZERO };

/* Queue the copies collected in @p ps as one cuMemcpyBatchAsync on the next stream; @p ss notes
 * the stream. The collection is emptied, queued or not: a failure fails the sleep or wake, whose
 * rollback waits for every stream as after a failed chunk. */
static xseg_status batch_flush(struct pool_sleep *ps, struct sleep_seg *ss)
{
    if (!ps->nbat)
        return XSEG_SUCCESS;
    unsigned k = ps->next++ % ps->nstreams;
    size_t n = ps->nbat;
    ps->nbat = 0;
    xseg_status st = vhost_copy_batch(ps->bat_dst, ps->bat_src, ps->bat_len, n, ps->streams[k]);
    if (st != XSEG_SUCCESS)
        return st;
    ss->used |= 1u << k;
    ps->used |= 1u << k;
    return XSEG_SUCCESS;
}

/* Queue the copy of [dev, dev + len) to @p host (DTOH), from it (HTOD), or its clearing (ZERO), in
 * chunks of at most ps->chunk bytes, round robin over @p ps's streams; @p ss notes the streams.
 * A copy of fewer than ps->batch_below bytes joins the batch instead (the caller flushes it before
 * the segment's event or wait: batch_flush). A sleep's copies all go one way, a wake's the other,
 * so one collection never mixes directions; the driver tells them apart by address anyway. */
static xseg_status queue_chunks(struct pool_sleep *ps, struct sleep_seg *ss, enum chunk_op op, CUdeviceptr dev,
                                char *host, size_t len)
{
    if (op != CHUNK_ZERO && len && len < ps->batch_below) {
        if (ps->nbat == SLEEP_BATCH_MAX) {
            xseg_status st = batch_flush(ps, ss);
            if (st != XSEG_SUCCESS)
                return st;
        }
        CUdeviceptr h = (CUdeviceptr)(uintptr_t)host;
        ps->bat_dst[ps->nbat] = op == CHUNK_DTOH ? h : dev;
        ps->bat_src[ps->nbat] = op == CHUNK_DTOH ? dev : h;
        ps->bat_len[ps->nbat++] = len;
        return XSEG_SUCCESS;
    }
    for (size_t done = 0; done < len;) {
        size_t n = len - done < ps->chunk ? len - done : ps->chunk;
        unsigned k = ps->next++ % ps->nstreams;
        CUstream s = ps->streams[k];
        xseg_status st = op == CHUNK_DTOH   ? vhost_copy_dtoh(host + done, dev + done, n, s)
                         : op == CHUNK_HTOD ? vhost_copy_htod(dev + done, host + done, n, s)
                                            : vhost_fill(dev + done, ps->fill, n, s);
        if (st != XSEG_SUCCESS)
            return st;
        ss->used |= 1u << k;
        ps->used |= 1u << k;
        done += n;
    }
    return XSEG_SUCCESS;
}

/* Wait for every chunk queued on @p ps's streams (all of them, even after a failure: a rollback
 * must know its copies are done); the first failure is returned. */
static xseg_status wait_all(struct pool_sleep *ps, const char *why)
{
    return wait_streams_in(ps, ~0u, why);
}

/* Wait for the streams of @p mask (bit k: ps->streams[k]); the first failure is returned. A
 * successful wake waits only for the streams its chunks ran on (ps->used): a wake of less than a
 * chunk waits once, one with nothing to restore not at all (8f0fcc4's wake waited for both). */
static xseg_status wait_streams_in(struct pool_sleep *ps, unsigned mask, const char *why)
{
    xseg_status first = XSEG_SUCCESS;
    for (unsigned k = 0; k < ps->nstreams; k++) {
        if (!(mask & (1u << k)))
            continue;
        xseg_status st = vstream_wait(ps->streams[k], why);
        if (st != XSEG_SUCCESS && first == XSEG_SUCCESS)
            first = st;
    }
    return first;
}

/* A sleep: an event after @p ss's chunks on each stream they used, so step 4 waits for this
 * segment alone. An event the driver refuses is left 0: wait_seg waits for the stream then. */
static void mark_seg(struct pool_sleep *ps, struct sleep_seg *ss)
{
    for (unsigned k = 0; k < ps->nstreams; k++) {
        if (!(ss->used & (1u << k)))
            continue;
        if (vevent_create(&ss->ev[k]) != XSEG_SUCCESS) {
            ss->ev[k] = NULL;
            err_clear();
        } else if (!vevent_record(ss->ev[k], ps->streams[k])) {
            vevent_destroy(ss->ev[k]);
            ss->ev[k] = NULL;
        }
    }
}

static xseg_status wait_seg(struct pool_sleep *ps, struct sleep_seg *ss, const char *why)
{
    for (unsigned k = 0; k < ps->nstreams; k++) {
        if (!(ss->used & (1u << k)) || (ss->ev[k] && vevent_wait(ss->ev[k])))
            continue;
        xseg_status st = vstream_wait(ps->streams[k], why);
        if (st != XSEG_SUCCESS)
            return st;
    }
    return XSEG_SUCCESS;
}

static void drop_events(struct sleep_seg *ss)
{
    for (unsigned k = 0; k < SLEEP_COPY_STREAMS; k++)
        if (ss->ev[k]) {
            vevent_destroy(ss->ev[k]);
            ss->ev[k] = NULL;
        }
}

/* ---- sleep ------------------------------------------------------------------------------- */

/* The runs of live blocks of @p ss (maximal sequences of active blocks) and their bytes. */
static bool collect_runs(struct sleep_seg *ss, size_t *bytes)
{
    uintptr_t base = (uintptr_t)seg_base(ss->s->vseg);
    *bytes = 0;
    for (const struct block *b = ss->s->first; b; b = b->next) {
        if (!active(b))
            continue;
        size_t off = b->addr - base;
        struct sleep_run *last = ss->nruns ? &ss->runs[ss->nruns - 1] : NULL;
        if (last && last->off + last->len == off) {
            last->len += b->size;
        } else {
            if (!VEC_RESERVE(ss->runs, ss->capruns, ss->nruns + 1))
                return false;
            ss->runs[ss->nruns++] = (struct sleep_run){off, b->size, *bytes};
        }
        *bytes += b->size;
    }
    return true;
}

/* Step 3: queue the copy of every run of live blocks to pinned host memory (step 4 waits). Lock
 * not held: the backups come from the host cache (its own lock), the runs were taken before. */
static xseg_status offload(struct dev_alloc *d, struct pool_sleep *ps)
{
    for (size_t i = 0; i < ps->nsegs; i++) {
        struct sleep_seg *ss = &ps->segs[i];
        if (!ss->host_bytes)
            continue;
        xseg_status st = hostalloc_malloc(d->info.primary_ctx, ss->host_bytes, &ss->host);
        if (st != XSEG_SUCCESS)
            return err_prefix(st, "xseg_sleep: pinned host memory for %zu bytes of live blocks", ss->host_bytes);
        uintptr_t base = (uintptr_t)seg_base(ss->s->vseg);
        for (size_t r = 0; r < ss->nruns; r++) {
            const struct sleep_run *run = &ss->runs[r];
            st = queue_chunks(ps, ss, CHUNK_DTOH, (CUdeviceptr)(base + run->off), (char *)ss->host + run->host_off,
                              run->len);
            if (st != XSEG_SUCCESS)
                return err_prefix(st, "xseg_sleep: offloading live blocks");
        }
        if ((st = batch_flush(ps, ss)) != XSEG_SUCCESS)
            return err_prefix(st, "xseg_sleep: offloading live blocks");
        mark_seg(ps, ss);
    }
    return XSEG_SUCCESS;
}

/* ---- OFFLOAD_FILE: the file through two bounce buffers ------------------------------------- */

/* Two pinned bounce buffers from the host cache of @p bytes each: a sleep's, the largest chunk a
 * run needs (at most sleep_copy_chunk_mb); a wake's, the largest chunk the sleep wrote (it reads
 * whole chunks, whatever sleep_copy_chunk_mb says now). */
static xseg_status bounce_get(struct dev_alloc *d, struct pool_sleep *ps, size_t bytes, const char *fn)
{
    ps->bounce_bytes = bytes;
    ps->slot = 0;
    ps->busy[0] = ps->busy[1] = false;
    ps->blen[0] = ps->blen[1] = 0;
    for (int j = 0; j < 2 && ps->bounce_bytes; j++) {
        xseg_status st = hostalloc_malloc(d->info.primary_ctx, ps->bounce_bytes, &ps->bounce[j]);
        if (st != XSEG_SUCCESS)
            return err_prefix(st, "%s: a pinned bounce buffer of %zu bytes for the file", fn, ps->bounce_bytes);
    }
    return XSEG_SUCCESS;
}

/* Give the bounce buffers back; after a failure (@p copies_may_run) once their copies are done. */
static void bounce_put(struct dev_alloc *d, struct pool_sleep *ps, bool copies_may_run)
{
    bool waited = !copies_may_run || wait_all(ps, "for the copies of a failed sleep or wake") == XSEG_SUCCESS;
    for (int j = 0; j < 2; j++) {
        if (!ps->bounce[j])
            continue;
        bool recorded = true;
        for (unsigned k = 0; !waited && k < ps->nstreams && recorded; k++)
            recorded = hostalloc_record_stream(ps->bounce[j], d->info.primary_ctx, ps->streams[k]) == XSEG_SUCCESS;
        if (recorded) /* else kept allocated rather than reused under a copy */
            (void)hostalloc_free(ps->bounce[j], !ps->keep_backup);
        ps->bounce[j] = NULL;
    }
}

static CUstream slot_stream(const struct pool_sleep *ps, unsigned j) { return ps->streams[j % ps->nstreams]; }

/* The checksum of one chunk of the file, [@p p, @p p + @p n), under this sleep's key: taken of the
 * bytes the sleep writes and of the bytes the wake reads back, here and nowhere else. */
static uint64_t chunk_sum(const struct pool_sleep *ps, const void *p, size_t n)
{
    return checksum64(&ps->sum_key, p, n);
}

/* A chunk's sum taken on a thread of its own while the sleep writes the same bytes. */
struct sum_job {
    const struct pool_sleep *ps;
    const void *p;
    size_t n;
    uint64_t sum;
};

static void *sum_run(void *arg)
{
    struct sum_job *job = arg;
    job->sum = chunk_sum(job->ps, job->p, job->n);
    return NULL;
}

/* From this size a chunk's sum runs beside its write (a thread costs tens of microseconds; the
 * sum of 1 MiB a few hundred). */
#define SUM_THREAD_MIN ((size_t)1 << 20)

/* Sleep: finish slot @p j: wait for its copy to the bounce buffer, then sum it and write it to
 * the file at once (the sum on a thread of its own, both reading the buffer, which nothing
 * writes until this returns): the sum is of the very bytes written, and a chunk costs the longer
 * of the two, not both. The other slot's copy runs meanwhile. Without a thread, one after the
 * other. */
static xseg_status file_flush(struct pool_sleep *ps, unsigned j)
{
    if (!ps->busy[j])
        return XSEG_SUCCESS;
    ps->busy[j] = false;
    xseg_status st = vstream_wait(slot_stream(ps, j), "for a copy to the bounce buffer");
    if (st != XSEG_SUCCESS)
        return err_prefix(st, "xseg_sleep_ex: offloading live blocks");
    struct sum_job job = {ps, ps->bounce[j], ps->blen[j], 0};
    pthread_t t;
    bool beside = job.n >= SUM_THREAD_MIN && pthread_create(&t, NULL, sum_run, &job) == 0;
    st = backfile_write(&ps->file, ps->bounce[j], ps->blen[j], ps->boff[j], "xseg_sleep_ex");
    if (beside)
        pthread_join(t, NULL);
    else
        sum_run(&job);
    ps->sums[ps->bsum[j]].sum = job.sum;
    return st;
}

/* Sleep: the device bytes [dev, dev + len) to the file at @p off, chunk by chunk; a chunk's copy
 * into one buffer runs while the other buffer's chunk is written. */
static xseg_status file_out(struct pool_sleep *ps, CUdeviceptr dev, uint64_t off, size_t len)
{
    for (size_t done = 0; done < len;) {
        size_t n = len - done < ps->bounce_bytes ? len - done : ps->bounce_bytes;
        unsigned j = ps->slot;
        ps->slot ^= 1;
        xseg_status st = file_flush(ps, j);
        if (st != XSEG_SUCCESS)
            return st;
        if ((st = vhost_copy_dtoh(ps->bounce[j], dev + done, n, slot_stream(ps, j))) != XSEG_SUCCESS)
            return err_prefix(st, "xseg_sleep_ex: offloading live blocks");
        ps->busy[j] = true;
        ps->used |= 1u << (j % ps->nstreams);
        ps->boff[j] = off + done;
        ps->blen[j] = n;
        xseg_assert(ps->nsums < ps->capsums); /* counted by offload_file */
        ps->bsum[j] = ps->nsums;
        ps->sums[ps->nsums++].end = off + done + n;
        done += n;
    }
    return XSEG_SUCCESS;
}

/* Step 3 with XSEG_SLEEP_OFFLOAD_FILE: every run of live blocks into the file (all written when it
 * returns successfully: no page is unmapped before). Lock not held. */
static xseg_status offload_file(struct dev_alloc *d, struct pool_sleep *ps)
{
    size_t big = 0;
    for (size_t i = 0; i < ps->nsegs; i++)
        for (size_t r = 0; r < ps->segs[i].nruns; r++)
            big = ps->segs[i].runs[r].len > big ? ps->segs[i].runs[r].len : big;
    xseg_status st = XSEG_SUCCESS;
    if (!checksum_key_new(&ps->sum_key))
        st = err_set(XSEG_ERROR_NOT_SUPPORTED, "xseg_sleep_ex: no random bytes for the key of the file's checksums "
                     "(getrandom and /dev/urandom failed: %s); nothing was written", strerror(errno));
    if (st == XSEG_SUCCESS)
        st = bounce_get(d, ps, big < ps->chunk ? big : ps->chunk, "xseg_sleep_ex");
    ps->file_chunk = ps->bounce_bytes;
    /* A checksum per chunk, room for all of them first (file_out splits each run in chunks). */
    size_t nchunks = 0;
    for (size_t i = 0; i < ps->nsegs && ps->bounce_bytes; i++)
        for (size_t r = 0; r < ps->segs[i].nruns; r++)
            nchunks += (ps->segs[i].runs[r].len + ps->bounce_bytes - 1) / ps->bounce_bytes;
    if (st == XSEG_SUCCESS && nchunks && !VEC_RESERVE(ps->sums, ps->capsums, nchunks))
        st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_sleep_ex: out of host memory (the checksums of %zu chunks)",
                     nchunks);
    for (size_t i = 0; i < ps->nsegs && st == XSEG_SUCCESS; i++) {
        struct sleep_seg *ss = &ps->segs[i];
        uintptr_t base = (uintptr_t)seg_base(ss->s->vseg);
        for (size_t r = 0; r < ss->nruns && st == XSEG_SUCCESS; r++)
            st = file_out(ps, (CUdeviceptr)(base + ss->runs[r].off), ss->file_off + ss->runs[r].host_off,
                          ss->runs[r].len);
    }
    for (unsigned k = 0; k < 2 && st == XSEG_SUCCESS; k++) /* the older slot first */
        st = file_flush(ps, ps->slot ^ k);
    bounce_put(d, ps, st != XSEG_SUCCESS);
    return st;
}

/* Wake: the index of the file chunk holding byte @p off (the first whose end lies past it). */
static size_t sum_find(const struct pool_sleep *ps, uint64_t off)
{
    size_t lo = 0, hi = ps->nsums;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ps->sums[mid].end <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Wake: read chunk @p c of the file whole into slot @p j and check it against the sleep's sum. */
static xseg_status chunk_read(struct pool_sleep *ps, unsigned j, size_t c)
{
    uint64_t start = c ? ps->sums[c - 1].end : 0;
    size_t n = (size_t)(ps->sums[c].end - start);
    xseg_status st = backfile_read(&ps->file, ps->bounce[j], n, start, "reading the sleep's file back");
    if (st != XSEG_SUCCESS)
        return st;
    if (chunk_sum(ps, ps->bounce[j], n) != ps->sums[c].sum)
        return err_set(XSEG_ERROR_INVALID_VALUE, "the sleep's file '%s' changed while the pool slept: chunk %zu of "
                       "%zu (bytes %" PRIu64 " to %" PRIu64 ") does not match the checksum the sleep took of it, so "
                       "nothing of it is restored (put the file's bytes back)", ps->file.path, c + 1, ps->nsums,
                       start, start + n);
    ps->boff[j] = start;
    ps->blen[j] = n;
    return XSEG_SUCCESS;
}

/* Wake: the file's bytes [off, off + len) to [dev, dev + len). The file is read in the chunks the
 * sleep wrote, each whole and checked before any of its bytes is copied, one into a buffer while
 * the other buffer's copy to the device runs. Blocks freed while asleep leave ranges inside a
 * chunk: a range in the chunk the last buffer holds copies from it again, no second read. */
static xseg_status file_in(struct pool_sleep *ps, CUdeviceptr dev, uint64_t off, size_t len)
{
    size_t c = sum_find(ps, off);
    for (size_t done = 0; done < len; c++) {
        if (c >= ps->nsums) /* the plan lies inside the runs the sums cover */
            return err_set(XSEG_ERROR_ILLEGAL_STATE, "byte %" PRIu64 " of the sleep's file was never written",
                           off + done);
        uint64_t start = c ? ps->sums[c - 1].end : 0;
        unsigned j = ps->slot ^ 1; /* the slot used last */
        xseg_status st = XSEG_SUCCESS;
        if (!ps->blen[j] || ps->boff[j] != start) {
            j = ps->slot;
            ps->slot ^= 1;
            if (ps->busy[j]) /* its last copy to the device read the buffer: done first */
                st = vstream_wait(slot_stream(ps, j), "for a copy from the bounce buffer (xseg_wake)");
            ps->busy[j] = false;
            ps->blen[j] = 0;
            if (st == XSEG_SUCCESS)
                st = chunk_read(ps, j, c);
        }
        uint64_t at = off + done;
        size_t n = (size_t)(ps->sums[c].end - at) < len - done ? (size_t)(ps->sums[c].end - at) : len - done;
        if (st == XSEG_SUCCESS)
            st = vhost_copy_htod(dev + done, (char *)ps->bounce[j] + (at - start), n, slot_stream(ps, j));
        if (st != XSEG_SUCCESS)
            return st;
        ps->busy[j] = true;
        ps->used |= 1u << (j % ps->nstreams);
        done += n;
    }
    return XSEG_SUCCESS;
}

/* History: every mapped range of the pool's segments, as segment_unmap (or _map) events. */
static void hist_ranges(struct dev_alloc *d, const struct pool_sleep *ps, int action)
{
    lock_assert_held(&d->lock);
    if (XSEG_LIKELY(!hist_mode()))
        return;
    for (size_t i = 0; i < ps->nsegs; i++) {
        const struct segrec *s = ps->segs[i].s;
        for (const struct block *b = s->first; b;) {
            if (!b->mapped) {
                b = b->next;
                continue;
            }
            uintptr_t start = b->addr;
            size_t len = 0;
            for (; b && b->mapped; b = b->next)
                len += b->size;
            hist_record(action, d->device, start, len, (uintptr_t)s->stream, NULL);
        }
    }
}

/* The capture xseg knows of on @p d (dev_capture_underway said one is underway), in words for a
 * refusal: the capturing stream, or the pool that records. Lock held. */
static const char *capture_words(const struct dev_alloc *d, char *buf, size_t size)
{
    lock_assert_held(&d->lock);
    const struct pool_route *r = d->priv.nroutes ? &d->priv.routes[d->priv.nroutes - 1] : NULL;
    char pool[64];
    if (r && r->by_capture)
        snprintf(buf, size, "stream %p captures into %s (xseg_capture_begin)", (void *)r->capture_stream,
                 pool_name(r->pool, pool));
    else if (r)
        snprintf(buf, size, "%s records (xseg_begin_allocate_to_pool)", pool_name(r->pool, pool));
    else if (d->cap.ncapturing)
        snprintf(buf, size, "stream %p captures (cuStreamBeginCapture)", (void *)d->cap.capturing[0]);
    else
        snprintf(buf, size, "a stream captures");
    return buf;
}

/* A capture another thread began while the sleep had given the lock back (the admit's check is
 * stale then): rechecked each time the sleep retakes the lock before it queries an event or unmaps
 * a page. Refused rather than carried on: the driver allows cuMemUnmap beside a capture (measured
 * on an H100: docs/gpu-h100), but not cuEventQuery (a GLOBAL capture is invalidated), and the
 * commit's cuMemRelease was never measured there; xseg releases nothing during a capture
 * elsewhere either. The undo maps the pool's own pages back (cuMemMap and cuMemSetAccess: allowed
 * in a capture). Message without the function's name: the callers add it. */
static xseg_status capture_recheck(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    if (!dev_capture_underway(d))
        return XSEG_SUCCESS;
    char cap[160];
    return err_set(XSEG_ERROR_ILLEGAL_STATE, "a stream capture began on device %d while the sleep ran (%s); the "
                   "sleep is refused rather than end that capture, and the pool stays awake: sleep after the "
                   "capture ends (cuStreamEndCapture, xseg_capture_end, xseg_end_allocate_to_pool)", d->device,
                   capture_words(d, cap, sizeof cap));
}

/* Step 4 for segment @p k: wait for its own chunks (the later segments' may still run) with the
 * lock given back, then unmap its pages, keeping the handles. reserved_bytes drops by the bytes
 * now, so the books match the pages whenever the lock is given back (its chunks count in
 * num_device_free at the commit). */
static xseg_status unmap_seg(struct dev_alloc *d, struct pool_sleep *ps, size_t k)
{
    lock_assert_held(&d->lock);
    struct sleep_seg *ss = &ps->segs[k];
    xseg_status st = XSEG_SUCCESS;
    if (ss->used) {
        step_out(d);
        st = wait_seg(ps, ss, "for the copies of a sleep (xseg_sleep)");
        drop_events(ss);
        step_in(d);
    }
    size_t un = 0;
    if (st == XSEG_SUCCESS)
        st = capture_recheck(d);
    if (st == XSEG_SUCCESS)
        st = seg_sleep_unmap(ss->s->vseg, &un);
    if (un) /* a failed unmap keeps what it unmapped asleep (and held) */
        dev_count_unmapped(d, ss->s->pool, un, 0);
    return st;
}

/* A failed step 4: map segments [0, @p k) back with their own handles, bytes intact. True when
 * every page is back; *left: the bytes that could not be mapped back. */
static bool unmap_undo(struct dev_alloc *d, struct pool_sleep *ps, size_t k, size_t *left)
{
    lock_assert_held(&d->lock);
    bool all = true;
    *left = 0;
    for (size_t j = 0; j < k; j++) {
        struct segrec *s = ps->segs[j].s;
        size_t re;
        all &= seg_sleep_undo(s->vseg, &re) == XSEG_SUCCESS;
        if (re)
            dev_count_mapped(d, s->pool, re, 0);
        *left += seg_asleep_bytes(s->vseg);
    }
    return all;
}

/* Step 4, segment after segment. On a failed unmap everything is mapped back; only if that fails
 * too does the pool sleep (*asleep, with every byte recoverable: held pages, or the host copy). */
static xseg_status unmap_all(struct dev_alloc *d, struct pool_sleep *ps, bool *asleep)
{
    lock_assert_held(&d->lock);
    *asleep = false;
    size_t k = 0;
    xseg_status st = XSEG_SUCCESS;
    while (k < ps->nsegs && st == XSEG_SUCCESS)
        st = unmap_seg(d, ps, k++);
    if (st == XSEG_SUCCESS) {
        *asleep = true;
        return st;
    }
    struct err_kept first = err_keep(); /* the undo may write its own failure */
    size_t left;
    if (unmap_undo(d, ps, k, &left))
        return err_set(st, "xseg_sleep: %s; every page is mapped back with its data", first.msg);
    /* Pages that could not be mapped back: the pool sleeps now, with nothing lost once the later
     * segments' chunks are copied (their pages stay mapped, and a wake restores them). */
    struct err_kept undo = err_keep(); /* the wait may write its own failure */
    step_out(d);
    (void)wait_all(ps, "for the copies of a sleep (xseg_sleep)");
    step_in(d);
    *asleep = true; /* segments [k, n) keep their pages: a wake restores them all the same */
    return err_set(st, "xseg_sleep: %s; mapping the pages back failed too (%s): %zu bytes stay unmapped, so the "
                       "pool is asleep now; xseg_wake brings it back", first.msg, undo.msg, left);
}

/* sleep_backup_checksum: the sum of each segment's host backup (its copies done), with the lock
 * given back (a sum reads ~10 GB/s). Lock held on entry and return. */
static void backup_sum(struct dev_alloc *d, struct pool_sleep *ps)
{
    lock_assert_held(&d->lock);
    step_out(d);
    for (size_t i = 0; i < ps->nsegs; i++)
        if (ps->segs[i].host)
            ps->segs[i].sum = checksum64(&ps->sum_key, ps->segs[i].host, ps->segs[i].host_bytes);
    step_in(d);
}

/* A wake under sleep_backup_checksum: every host backup checked against the sleep's sum before a
 * page is mapped, with the lock given back (the pool is WAKING: nobody else touches it). A
 * mismatch is XSEG_ERROR_INVALID_VALUE naming the pool, the segment and the bytes; nothing changed.
 * Lock held on entry and return. */
static xseg_status backup_check(struct dev_alloc *d, const struct priv_pool *pp, struct pool_sleep *ps)
{
    lock_assert_held(&d->lock);
    size_t bad = SIZE_MAX;
    step_out(d);
    for (size_t i = 0; i < ps->nsegs && bad == SIZE_MAX; i++) {
        const struct sleep_seg *ss = &ps->segs[i];
        if (ss->host && !ss->kept && checksum64(&ps->sum_key, ss->host, ss->host_bytes) != ss->sum)
            bad = i;
    }
    step_in(d);
    if (bad == SIZE_MAX)
        return XSEG_SUCCESS;
    char buf[64], sz[32];
    const struct sleep_seg *ss = &ps->segs[bad];
    return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_wake: the host backup of %s on device %d changed while it slept "
                   "(sleep_backup_checksum): segment %zu of %zu (at 0x%" PRIxPTR ", %s of live bytes at host %p) "
                   "does not match the checksum the sleep took, so nothing is restored and the pool stays asleep "
                   "with its backup; a host write went astray into pinned memory (to restore the backup as it is, "
                   "turn sleep_backup_checksum off and wake again)", pool_name(pp, buf), d->device, bad + 1,
                   ps->nsegs, (uintptr_t)seg_base(ss->s->vseg), err_format_size(ss->host_bytes, sz), ss->host);
}

/* Step 5 and the books: the handles go back to the driver and the pool is asleep. */
static void sleep_commit(struct dev_alloc *d, struct pool_sleep *ps)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < ps->nsegs; i++) {
        struct segrec *s = ps->segs[i].s;
        size_t bytes = seg_asleep_bytes(s->vseg), chunks = seg_asleep_chunks(s->vseg);
        /* Copies of a segment whose pages stayed mapped may not have completed (its wait failed):
         * its pages, not the backup, hold the bytes. */
        ps->segs[i].kept = !bytes;
        seg_sleep_commit(s->vseg);
        ps->released += bytes;
        if (chunks)
            dev_count_unmapped(d, s->pool, 0, chunks);
    }
    hist_ranges(d, ps, HIST_SEGMENT_UNMAP);
    ps->phase = PHASE_ASLEEP;
    d->sleep.num_sleeps++;
}

/* Importers map the exported chunks' own memory: a sleep would give it back and the wake map new
 * memory there, so the two processes would part silently. Refused while any lives; handles handed
 * out by xseg_block_handles likewise, until released (or the block freed). */
static xseg_status refuse_lent(struct dev_alloc *d, struct priv_pool *pp)
{
    lock_assert_held(&d->lock);
    size_t nexported = 0, nheld = 0, spilled = 0;
    const struct block *held = NULL;
    char buf[64], sz[32];
    for (const struct segrec *s = d->segs; s; s = s->next_seg)
        if (s->vseg && dev_pool_owner(d, s->pool) == pp)
            for (const struct block *b = s->first; b; b = b->next) {
                nexported += b->exported;
                spilled += spill_block_host(d, b);
                if (b->sided && b->u.side->handle_holds && !nheld++)
                    held = b;
            }
    /* Spilled pages (core/services/spill.h) sit on host memory already; a sleep keeps device pages. */
    if (spilled)
        return err_set(XSEG_ERROR_ILLEGAL_STATE,
                       "xseg_sleep: %s on device %d holds %s of live blocks spilled to host memory "
                       "(spill_to_host); xseg_promote(%d) them back first",
                       pool_name(pp, buf), d->device, err_format_size(spilled, sz), d->device);
    if (nexported)
        return err_set(XSEG_ERROR_ILLEGAL_STATE,
                       "xseg_sleep: %s on device %d holds %zu block%s exported over IPC (xseg_ipc_export): another "
                       "process may map their memory, which a sleep would give back; xseg_free them (once every "
                       "importer has closed them) first",
                       pool_name(pp, buf), d->device, nexported, nexported == 1 ? "" : "s");
    if (nheld)
        return err_set(XSEG_ERROR_ILLEGAL_STATE,
                       "xseg_sleep: %s on device %d holds %zu block%s whose physical handles were handed out by "
                       "xseg_block_handles, the first at 0x%" PRIxPTR " (%u hand-out%s): whoever holds them would "
                       "keep the old memory while the wake maps new memory there; call "
                       "xseg_block_handles_release(0x%" PRIxPTR ") once per hand-out when the handles are no longer "
                       "used (or xseg_free the block) first",
                       pool_name(pp, buf), d->device, nheld, nheld == 1 ? "" : "s", held->addr,
                       held->u.side->handle_holds, held->u.side->handle_holds == 1 ? "" : "s", held->addr);
    /* A registration still in force (its before callback did not release it: xseg_sleep's
     * before pass ran first) pins its pages (core/policy/registry.h). */
    for (const struct segrec *s = d->segs; s; s = s->next_seg) {
        uintptr_t lo, hi, base = s->vseg ? (uintptr_t)seg_base(s->vseg) : 0;
        if (s->vseg && dev_pool_owner(d, s->pool) == pp &&
            reg_first_registered(d, base, base + seg_va_size(s->vseg), &lo, &hi))
            return err_set(XSEG_ERROR_ILLEGAL_STATE,
                           "xseg_sleep: %s on device %d holds a registration in force at [0x%" PRIxPTR ", 0x%" PRIxPTR
                           ") (%s): a sleep would give its pages back under the registrant; nothing changed",
                           pool_name(pp, buf), d->device, lo, hi, reg_span_words(d, lo, hi));
    }
    return XSEG_SUCCESS;
}

/* Step 1's checks: @p id names a pool of @p d that is awake (no sleep or wake of it underway), no
 * capture, nothing of it lent out. Nothing changes on a refusal. */
static xseg_status sleep_admit(struct dev_alloc *d, xseg_pool_id id, struct priv_pool **pp)
{
    lock_assert_held(&d->lock);
    char buf[64];
    xseg_status st = find_pool(d, "xseg_sleep", id, pp);
    if (st != XSEG_SUCCESS)
        return st;
    const struct pool_sleep *ps = *slot(d, *pp);
    if (ps && ps->phase == PHASE_ASLEEP)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_sleep: %s on device %d is asleep already (xseg_wake it first)",
                       pool_name(*pp, buf), d->device);
    if (ps)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_sleep: %s on device %d %s%s", pool_name(*pp, buf), d->device,
                       phase_words(ps), ps->phase == PHASE_SLEEPING ? ": a second sleep of it is refused"
                                                                    : "; sleep it once that call has returned");
    char cap[160];
    if (dev_capture_underway(d))
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_sleep: a stream capture is underway on device %d (%s): a "
                       "sleep waits for the device's work, which would end that capture, so it is refused and "
                       "nothing changed; sleep after the capture ends (cuStreamEndCapture, xseg_capture_end, "
                       "xseg_end_allocate_to_pool)", d->device, capture_words(d, cap, sizeof cap));
    return refuse_lent(d, *pp);
}

xseg_status sleep_check(struct dev_alloc *d, xseg_pool_id id)
{
    lock_assert_held(&d->lock);
    struct priv_pool *pp;
    xseg_status st = sleep_admit(d, id, &pp);
    if (st != XSEG_SUCCESS)
        return st;
    char buf[64];
    for (const struct segrec *s = d->segs; s; s = s->next_seg)
        if (!s->vseg && dev_pool_owner(d, s->pool) == pp)
            return err_set(XSEG_ERROR_NOT_SUPPORTED, "xseg_sleep: %s on device %d holds classic (cuMemAlloc) "
                           "segments; only expandable segments can sleep (expandable_segments:True)",
                           pool_name(pp, buf), d->device);
    return XSEG_SUCCESS;
}

enum sleep_where sleep_where(struct dev_alloc *d, xseg_pool_id id, bool *exists)
{
    lock_assert_held(&d->lock);
    struct priv_pool *pp = NULL;
    *exists = (!id.first && !id.second) || (pp = pools_find(d, id)) != NULL;
    const struct pool_sleep *ps = *exists ? *slot(d, pp) : NULL;
    return !ps ? SLEEP_AWAKE : ps->phase == PHASE_ASLEEP ? SLEEP_ASLEEP : SLEEP_BUSY;
}

/* Step 1's end: a struct for the pool listing its segments with mapped pages (a classic segment
 * refuses the sleep), in the pool's slot (SLEEPING), its segments marked asleep: from here on the
 * pool refuses mallocs and no reclaim touches it, with the lock given back or not. */
static xseg_status sleep_begin(struct dev_alloc *d, struct priv_pool *pp, unsigned flags, struct pool_sleep **out)
{
    lock_assert_held(&d->lock);
    char buf[64];
    struct pool_sleep *ps = xs_calloc(1, sizeof *ps);
    if (!ps)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_sleep: out of host memory");
    *ps = (struct pool_sleep){.phase = PHASE_SLEEPING, .flags = flags, .file.fd = -1,
                              .keep_backup = d->cfg.sleep_keep_host_backup};
    for (struct segrec *s = d->segs; s; s = s->next_seg) {
        if (dev_pool_owner(d, s->pool) != pp)
            continue;
        if (!s->vseg) {
            state_free(d, ps, false);
            return err_set(XSEG_ERROR_NOT_SUPPORTED,
                           "xseg_sleep: %s on device %d holds classic (cuMemAlloc) segments, whose addresses cannot "
                           "survive giving their memory back; only expandable segments can sleep "
                           "(expandable_segments:True)", pool_name(pp, buf), d->device);
        }
        if (!seg_mapped_bytes(s->vseg))
            continue; /* nothing to give back (and it holds no live block) */
        if (!VEC_RESERVE(ps->segs, ps->capsegs, ps->nsegs + 1)) {
            state_free(d, ps, false);
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_sleep: out of host memory");
        }
        ps->segs[ps->nsegs++] = (struct sleep_seg){.s = s};
    }
    for (size_t i = 0; i < ps->nsegs; i++)
        ps->segs[i].s->asleep = true;
    *slot(d, pp) = ps;
    d->sleep.nasleep++;
    dev_fast_off(d);
    *out = ps;
    return XSEG_SUCCESS;
}

/* A sleep that failed with every page of the pool mapped: awake again, its struct freed once no
 * other thread can reach it (the file removed; with @p copies_may_run, after its copies). */
static void sleep_abort(struct dev_alloc *d, struct priv_pool *pp, struct pool_sleep *ps, bool copies_may_run)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < ps->nsegs; i++)
        ps->segs[i].s->asleep = false;
    *slot(d, pp) = NULL;
    d->sleep.nasleep--;
    step_out(d);
    state_free(d, ps, copies_may_run);
    step_in(d);
}

/* Steps 2 and 3: wait for the pool's streams, take the runs of live bytes, copy them (to host
 * memory or the file; DISCARD: nothing). *copies: some may have been queued. The waits, the file
 * and the copies run with the lock given back. */
static xseg_status sleep_backup(struct dev_alloc *d, struct priv_pool *pp, struct pool_sleep *ps, const char *path,
                                bool *copies)
{
    lock_assert_held(&d->lock);
    *copies = false;
    /* 2. Every use of the pages on the GPU finishes first; completed frees go back to the pool. */
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    if (st == XSEG_SUCCESS && ps->nsegs)
        st = wait_streams(d, pp, ps, "before a sleep (xseg_sleep)");
    if (st == XSEG_SUCCESS && capture_recheck(d) != XSEG_SUCCESS) /* before ev_process queries events */
        st = err_prefix(XSEG_ERROR_ILLEGAL_STATE, "xseg_sleep");
    if (st != XSEG_SUCCESS)
        return st;
    if (ev_waiting(d))
        ev_process(d);
    /* 3. What the wake restores. Its plan gets room for a copy per block now (nothing is allocated
     * in the pool until the wake ends, so a segment's blocks only merge): a wake allocates no host
     * memory, as before the plan existed. */
    size_t most = 0;
    for (size_t i = 0; i < ps->nsegs; i++) {
        size_t nb = 0;
        for (const struct block *b = ps->segs[i].s->first; b; b = b->next)
            nb++;
        most = nb > most ? nb : most;
    }
    if (!VEC_RESERVE(ps->plan, ps->capplan, most))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_sleep: out of host memory");
    for (size_t i = 0; i < ps->nsegs; i++) {
        struct sleep_seg *ss = &ps->segs[i];
        size_t bytes;
        if (!collect_runs(ss, &bytes))
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_sleep: out of host memory");
        if (ps->flags != XSEG_SLEEP_DISCARD)
            ss->host_bytes = bytes;
        ss->file_off = ps->live;
        ps->live += bytes;
    }
    if (ps->flags == XSEG_SLEEP_DISCARD)
        return XSEG_SUCCESS;
    /* sleep_backup_checksum: the key first, so that nothing is copied when none can be drawn. */
    if (ps->flags == XSEG_SLEEP_OFFLOAD && d->cfg.sleep_backup_checksum) {
        if (!checksum_key_new(&ps->sum_key))
            return err_set(XSEG_ERROR_NOT_SUPPORTED, "xseg_sleep: no random bytes for the key of the backups' "
                           "checksums (sleep_backup_checksum; getrandom and /dev/urandom failed: %s); nothing "
                           "changed", strerror(errno));
        ps->summed = true;
    }
    pick_streams(d, ps);
    step_out(d);
    if (ps->flags == XSEG_SLEEP_OFFLOAD_FILE)
        st = backfile_create(&ps->file, path, "xseg_sleep_ex");
    if (st == XSEG_SUCCESS) {
        *copies = true;
        st = ps->flags == XSEG_SLEEP_OFFLOAD_FILE ? offload_file(d, ps) : offload(d, ps);
    }
    step_in(d);
    return st;
}

xseg_status sleep_pool_locked(struct dev_alloc *d, xseg_pool_id id, unsigned flags, const char *path)
{
    lock_assert_held(&d->lock);
    struct priv_pool *pp;
    struct pool_sleep *ps = NULL;
    xseg_status st = sleep_admit(d, id, &pp);
    if (st == XSEG_SUCCESS)
        st = sleep_begin(d, pp, flags, &ps);
    if (st != XSEG_SUCCESS)
        return st;
    bool copies, asleep = false;
    st = sleep_backup(d, pp, ps, path, &copies);
    if (st == XSEG_SUCCESS)
        st = unmap_all(d, ps, &asleep);
    if (asleep && st == XSEG_SUCCESS && ps->summed)
        backup_sum(d, ps); /* every copy is done: unmap_all waited for each segment's */
    else
        ps->summed = false;
    if (!asleep)
        sleep_abort(d, pp, ps, copies); /* a failed copy removes the file; later chunks may still run */
    else
        sleep_commit(d, ps);
    return st;
}

/* ---- wake -------------------------------------------------------------------------------- */

/* Books: reserved_bytes follows each segment's mapped bytes since the wake began, up or down (a
 * failed wake's undo), each time before the lock is given back. */
static void count_woken(struct dev_alloc *d, struct pool_sleep *ps)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < ps->nsegs; i++) {
        struct segrec *s = ps->segs[i].s;
        size_t now = seg_mapped_bytes(s->vseg), was = ps->segs[i].live0;
        if (now > was)
            dev_count_mapped(d, s->pool, now - was, 0);
        else if (now < was)
            dev_count_unmapped(d, s->pool, was - now, 0);
        ps->segs[i].live0 = now;
    }
}

/* Books: the chunks the wake left mapped count in num_device_alloc (at its end). */
static void count_chunks(struct dev_alloc *d, struct pool_sleep *ps)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < ps->nsegs; i++) {
        struct segrec *s = ps->segs[i].s;
        size_t chunks = seg_live_chunks(s->vseg);
        if (chunks > ps->segs[i].chunks0)
            dev_count_mapped(d, s->pool, 0, chunks - ps->segs[i].chunks0);
        ps->segs[i].chunks0 = chunks;
    }
}

/* Put the pages of every segment back to sleep after a failed wake (each wake_map succeeded).
 * A page whose unmap fails stays mapped, and is counted: the books follow the driver. */
static void undo_maps(struct dev_alloc *d, struct pool_sleep *ps, size_t n)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < n; i++)
        (void)seg_wake_undo(ps->segs[i].s->vseg);
    count_woken(d, ps);
}

/* Room was made at the sleep (sleep_backup); the check only guards that bound. */
static bool plan_add(struct pool_sleep *ps, CUdeviceptr dev, size_t from, size_t len)
{
    if (!VEC_RESERVE(ps->plan, ps->capplan, ps->nplan + 1))
        return false;
    ps->plan[ps->nplan++] = (struct sleep_copy){dev, from, len};
    return true;
}

/* The restore of segment @p ss into ps->plan (lock held: it walks the blocks): the backup of every
 * run of blocks still active, or zeros on every mapped range (DISCARD). */
static xseg_status restore_plan(struct pool_sleep *ps, struct sleep_seg *ss)
{
    const struct segrec *s = ss->s;
    uintptr_t base = (uintptr_t)seg_base(s->vseg);
    bool discard = ps->flags == XSEG_SLEEP_DISCARD;
    ps->nplan = 0;
    if (ss->kept && !discard)
        return XSEG_SUCCESS;
    /* Nothing was allocated while asleep, so each run of blocks still active lies inside one run
     * of the sleep (blocks only merged or were freed since). */
    size_t r = 0;
    for (const struct block *b = s->first; b;) {
        if (discard ? !b->mapped : !active(b)) {
            b = b->next;
            continue;
        }
        size_t off = b->addr - base, len = 0;
        for (; b && (discard ? b->mapped : active(b)); b = b->next)
            len += b->size;
        size_t from = 0;
        if (!discard) {
            while (r < ss->nruns && ss->runs[r].off + ss->runs[r].len <= off)
                r++;
            if (r == ss->nruns || off < ss->runs[r].off || off + len > ss->runs[r].off + ss->runs[r].len)
                return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_wake: live bytes at offset %zu of a segment were "
                               "not live at the sleep", off);
            from = ss->runs[r].host_off + (off - ss->runs[r].off); /* in the segment's backup */
        }
        if (!plan_add(ps, (CUdeviceptr)(base + off), from, len))
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_wake: out of host memory");
    }
    return XSEG_SUCCESS;
}

/* Queue ps->plan for segment @p ss (lock not held: only the pool's own mapped pages are written,
 * and a block freed meanwhile cannot be handed out before the wake ends). */
static xseg_status restore_run(struct pool_sleep *ps, struct sleep_seg *ss)
{
    xseg_status st = XSEG_SUCCESS;
    for (size_t i = 0; i < ps->nplan && st == XSEG_SUCCESS; i++) {
        const struct sleep_copy *c = &ps->plan[i];
        st = ps->flags == XSEG_SLEEP_DISCARD        ? queue_chunks(ps, ss, CHUNK_ZERO, c->dev, NULL, c->len)
             : ps->flags == XSEG_SLEEP_OFFLOAD_FILE ? file_in(ps, c->dev, ss->file_off + c->from, c->len)
                                                    : queue_chunks(ps, ss, CHUNK_HTOD, c->dev,
                                                                   (char *)ss->host + c->from, c->len);
    }
    if (st == XSEG_SUCCESS)
        st = batch_flush(ps, ss);
    ps->nbat = 0; /* a failed wake queues no more: what it collected is dropped */
    return st;
}

/* Room for the pages of segments [@p k, n) of the waking pool: within the memory fraction and
 * @p limit, the budgets' cap on total_allocated_memory (alloc.c measures it at the wake's start;
 * SIZE_MAX: none), counting what other threads hold now. Checked at the start and again before each
 * segment is mapped: another pool may have grown while the lock was given back. Lock held. */
static xseg_status wake_room(struct dev_alloc *d, const struct pool_sleep *ps, size_t k, size_t limit)
{
    lock_assert_held(&d->lock);
    size_t need = 0;
    for (size_t i = k; i < ps->nsegs; i++)
        need += seg_asleep_bytes(ps->segs[i].s->vseg);
    size_t total = d->acct.total_allocated_memory;
    if (!need || (dev_fraction_allows(d, need) && total + need <= limit))
        return XSEG_SUCCESS;
    char s1[32], s2[32], s3[32];
    bool fraction = d->acct.set_fraction && total + need > d->acct.allowed_memory_maximum;
    return err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s more needed on device %d for its pages, over %s of %s (%s in use%s)",
                   err_format_size(need, s1), d->device,
                   fraction ? "the memory fraction's limit" : "the memory budget's limit (memory_budget_mb or the "
                   "group's)", err_format_size(fraction ? d->acct.allowed_memory_maximum : limit, s2),
                   err_format_size(total, s3), k ? ", after another thread's growth while this wake ran" : "");
}

/* Segment after segment: map its pages (lock held), then queue its restore with the lock given
 * back, so a segment's chunks (and the file's reads) run while the next one maps. *k: segments
 * mapped (or tried). */
static xseg_status wake_segments(struct dev_alloc *d, struct pool_sleep *ps, size_t limit, size_t *k)
{
    lock_assert_held(&d->lock);
    xseg_status st = XSEG_SUCCESS;
    for (*k = 0; *k < ps->nsegs && st == XSEG_SUCCESS;) {
        if ((st = wake_room(d, ps, *k, limit)) != XSEG_SUCCESS)
            break;
        struct sleep_seg *ss = &ps->segs[(*k)++];
        size_t mapped;
        st = seg_wake_map(ss->s->vseg, &mapped);
        count_woken(d, ps); /* a failed map's own rollback may have left a page mapped */
        if (st == XSEG_SUCCESS)
            st = restore_plan(ps, ss);
        if (st != XSEG_SUCCESS || !ps->nplan)
            continue;
        step_out(d);
        st = restore_run(ps, ss);
        step_in(d);
    }
    return st;
}

/* The checks of a wake: @p id names a pool of @p d that is asleep (no sleep or wake of it
 * underway), no capture, the fraction and @p limit have room for its pages. Nothing changes on a
 * refusal. */
static xseg_status wake_admit(struct dev_alloc *d, xseg_pool_id id, size_t limit, struct priv_pool **pp,
                              struct pool_sleep **out)
{
    lock_assert_held(&d->lock);
    char buf[64];
    xseg_status st = find_pool(d, "xseg_wake", id, pp);
    if (st != XSEG_SUCCESS)
        return st;
    struct pool_sleep *ps = *slot(d, *pp);
    if (!ps)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_wake: %s on device %d is not asleep", pool_name(*pp, buf),
                       d->device);
    if (ps->phase != PHASE_ASLEEP)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_wake: %s on device %d %s%s", pool_name(*pp, buf), d->device,
                       phase_words(ps), ps->phase == PHASE_WAKING ? ": a second wake of it is refused"
                                                                  : "; wake it once that call has returned");
    char cap[160];
    if (dev_capture_underway(d))
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_wake: a stream capture is underway on device %d (%s); "
                       "nothing changed, wake after the capture ends", d->device, capture_words(d, cap, sizeof cap));
    if ((st = wake_room(d, ps, 0, limit)) != XSEG_SUCCESS)
        return err_prefix(st, "xseg_wake: %s", pool_name(*pp, buf));
    *out = ps;
    if ((st = drv_ctx_ensure(d->info.primary_ctx)) != XSEG_SUCCESS)
        return err_prefix(st, "xseg_wake: %s on device %d is still asleep, nothing changed (retry the wake)",
                          pool_name(*pp, buf), d->device);
    return XSEG_SUCCESS;
}

/* A failed wake (the first failure's status @p st, message current; @p k segments mapped or
 * tried): the pool stays asleep with its backup, ready for a retry. A copy already queued may
 * still write into the pages: they are unmapped only once it is done; if even that wait fails
 * they stay mapped (counted), and a retry reuses them. */
static xseg_status wake_fail(struct dev_alloc *d, struct pool_sleep *ps, xseg_status st, size_t k)
{
    lock_assert_held(&d->lock);
    struct err_kept first = err_keep(); /* the wait, bounce_put and the undo may write theirs */
    step_out(d);
    xseg_status wst = wait_all(ps, "for the copies of a failed wake (xseg_wake)");
    struct err_kept wait = err_keep();
    bounce_put(d, ps, wst != XSEG_SUCCESS);
    step_in(d);
    if (wst == XSEG_SUCCESS)
        undo_maps(d, ps, k);
    else
        count_chunks(d, ps);
    ps->phase = PHASE_ASLEEP; /* last: another thread may wake it as soon as the lock goes */
    if (wst != XSEG_SUCCESS)
        return err_set(st, "xseg_wake: %s; the pool is still asleep; its copies could not be waited for (%s), so "
                           "the pages this wake mapped stay mapped (retry the wake)", first.msg, wait.msg);
    return err_set(st, "xseg_wake: %s; the pool is still asleep (the pages this wake mapped are given back; retry "
                       "the wake)", first.msg);
}

/* The end of a successful wake: the books, the pool awake, its struct freed (the host backups to
 * the host cache, the file removed) once no other thread can reach it. */
static void wake_commit(struct dev_alloc *d, struct priv_pool *pp, struct pool_sleep *ps)
{
    lock_assert_held(&d->lock);
    count_woken(d, ps);
    count_chunks(d, ps);
    for (size_t i = 0; i < ps->nsegs; i++) {
        struct segrec *s = ps->segs[i].s;
        seg_wake_commit(s->vseg);
        s->asleep = false;
    }
    hist_ranges(d, ps, HIST_SEGMENT_MAP);
    *slot(d, pp) = NULL;
    d->sleep.nasleep--;
    d->sleep.num_wakes++;
    step_out(d);
    bounce_put(d, ps, false);
    state_free(d, ps, false);
    step_in(d);
}

xseg_status wake_pool_locked(struct dev_alloc *d, xseg_pool_id id, size_t limit)
{
    lock_assert_held(&d->lock);
    struct priv_pool *pp;
    struct pool_sleep *ps = NULL;
    xseg_status st = wake_admit(d, id, limit, &pp, &ps);
    if (st != XSEG_SUCCESS)
        return st;
    for (size_t i = 0; i < ps->nsegs; i++) {
        ps->segs[i].live0 = seg_mapped_bytes(ps->segs[i].s->vseg);
        ps->segs[i].chunks0 = seg_live_chunks(ps->segs[i].s->vseg);
    }
    ps->phase = PHASE_WAKING;
    if (ps->summed && d->cfg.sleep_backup_checksum && (st = backup_check(d, pp, ps)) != XSEG_SUCCESS) {
        ps->phase = PHASE_ASLEEP;
        return st;
    }
    ps->keep_backup = d->cfg.sleep_keep_host_backup;
    pick_streams(d, ps);
    if (ps->flags == XSEG_SLEEP_OFFLOAD_FILE) {
        step_out(d);
        st = bounce_get(d, ps, ps->file_chunk, "xseg_wake");
        if (st != XSEG_SUCCESS) {
            bounce_put(d, ps, false);
            st = err_suffix(st, "; the pool is still asleep (retry the wake)");
        }
        step_in(d);
        if (st != XSEG_SUCCESS) {
            ps->phase = PHASE_ASLEEP;
            return st;
        }
    }
    size_t k = 0;
    st = wake_segments(d, ps, limit, &k);
    if (st == XSEG_SUCCESS) {
        step_out(d);
        st = wait_streams_in(ps, ps->used, "for the copies of a wake (xseg_wake)");
        step_in(d);
    }
    if (st != XSEG_SUCCESS)
        return wake_fail(d, ps, st, k);
    wake_commit(d, pp, ps);
    return XSEG_SUCCESS;
}

/* ---- statistics -------------------------------------------------------------------------- */

static void add_stats(const struct pool_sleep *ps, xseg_sleep_stats *out)
{
    if (!ps || ps->phase == PHASE_SLEEPING) /* asleep once its sleep has returned */
        return;
    out->asleep++;
    out->flags = ps->flags;
    out->released_bytes += ps->released;
    if (ps->flags != XSEG_SLEEP_DISCARD)
        out->offloaded_bytes += ps->live;
    else
        out->discarded_bytes += ps->live;
}

xseg_status sleep_stats(struct dev_alloc *d, const xseg_pool_id *pool, xseg_sleep_stats *out)
{
    memset(out, 0, sizeof *out);
    dev_lock(d, DEV_NEED_OP);
    xseg_status st = XSEG_SUCCESS;
    if (pool) {
        struct priv_pool *pp;
        st = find_pool(d, "xseg_get_sleep_stats", *pool, &pp);
        if (st == XSEG_SUCCESS)
            add_stats(*slot(d, pp), out);
    } else {
        add_stats(d->sleep.sleep_default, out);
        for (const struct priv_pool *pp = d->priv.pools; pp; pp = pp->next)
            add_stats(pp->sleep, out);
        out->flags = 0;
    }
    out->num_sleeps = d->sleep.num_sleeps;
    out->num_wakes = d->sleep.num_wakes;
    dev_unlock(d);
    return st;
}
