/* The stale-access debug mode: quarantine, pattern, checks and findings (quarantine.h). */
#include "core/device/quarantine.h"
#include "core/device/blockops.h"
#include "core/device/retile.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/process/settings.h"
#include "vmm/event.h"
#include "vmm/host.h"
#include "vmm/kernel.h"
#include "vmm/segment.h"
#include "vmm/stream.h"

#define QUAR_CHECK_CHUNK ((size_t)1 << 20) /* bytes read back a copy */
#define QUAR_FRAME_TEXT 256             /* a C frame's symbol text (hist_frame_info) */

/* Is a capture underway, or does @p stream (a block's, at its free: alive) capture (then no
 * driver call may be queued on it)? */
static bool capturing(struct dev_alloc *d, CUstream stream)
{
    if (cap_underway(d))
        return true;
    xseg_status st;
    bool c = dev_stream_capturing(d, stream, &st);
    return c || st != XSEG_SUCCESS;
}

/*
 * The quarantine's own stream. A block's stream is the program's, which may destroy it once the
 * block is freed (a driver call with a destroyed stream is undefined: vmm/stream.h), while the
 * quarantine works on the block long after. So every fill and check is queued on this stream
 * (created at first use, non-blocking; the legacy stream where the driver refuses one), ordered
 * after the block's last use by a join at the free (quar_join: an event recorded on the block's
 * stream, waited for by this one), and checks wait for the whole context first, so that they see
 * every write queued before them on any stream. Context current.
 */
static CUstream work(struct dev_alloc *d)
{
    if (!d->quar.work_tried) {
        d->quar.work_tried = true;
        if (vstream_create(&d->quar.work) != XSEG_SUCCESS) {
            d->quar.work = NULL;
            err_clear();
        } else if (vevent_create(&d->quar.join_ev) != XSEG_SUCCESS) {
            d->quar.join_ev = NULL; /* joins wait for the block's stream instead (vstream_join) */
            err_clear();
        }
    }
    return d->quar.work;
}

/* Order the quarantine's stream after the work queued on @p stream so far (the stream of a block
 * being freed: alive now). The legacy stream lives as long as the context: its join waits for the
 * next flush (one for all the blocks freed on it meanwhile, so a program on the default stream
 * makes no driver call per free). Where a join fails, or during a capture (a join would pull the
 * quarantine's stream into it), the next flush waits for the whole context first (quar.unjoined). */
static void join(struct dev_alloc *d, CUstream stream, bool cap)
{
    if (!cap && (!stream || stream == CU_STREAM_LEGACY)) {
        d->quar.join_legacy = true;
        return;
    }
    if (cap || drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS ||
        vstream_join(work(d), d->quar.join_ev, stream, "debug_stale_access: before a freed block's fill") !=
            XSEG_SUCCESS) {
        err_clear();
        d->quar.unjoined = true;
    }
}

/* Order @p stream (a block's, at its free: alive) after the fills just queued on the quarantine's
 * stream, so that what the program queues there after this free meets the pattern (with
 * debug_stale_fill_batch:1 the exact window); an event, no host wait (a wait of the quarantine's
 * stream where the event cannot be had). Blocks freed on other streams meet it once the fill runs. */
static void join_back(struct dev_alloc *d, CUstream stream)
{
    if (vstream_join(stream, d->quar.join_ev, work(d), "debug_stale_access: after a free's fills") != XSEG_SUCCESS)
        err_clear(); /* the stream is not ordered after the fills: a stale access there may meet the old bytes */
}

/* The ranges of @p it that hold the pattern, as (offset, length): the bytes before a canary
 * span, one page of it (every granule of the span maps that page), the bytes after. */
static int ranges(const struct dev_alloc *d, const struct quar_item *it, size_t off[3], size_t len[3])
{
    if (it->swap_lo == it->swap_hi) {
        off[0] = 0;
        len[0] = it->size;
        return 1;
    }
    off[0] = 0, len[0] = it->swap_lo;
    off[1] = it->swap_lo, len[1] = it->stuck ? 0 : d->info.granularity; /* stuck: the canary is not whole */
    off[2] = it->swap_hi, len[2] = it->size - it->swap_hi;
    return 3;
}

/* Queue the pattern over @p it's bytes on its stream (after everything queued there before), a
 * driver memset per range: the fallback when the allocator's kernels do not run, or when host
 * memory for a batch is lacking. Context current. */
static xseg_status fill(struct dev_alloc *d, struct quar_item *it)
{
    size_t off[3], len[3];
    int n = ranges(d, it, off, len);
    for (int i = 0; i < n; i++) {
        xseg_status st = len[i] ? vhost_fill((CUdeviceptr)(it->addr + off[i]), (unsigned char)QUAR_POISON, len[i],
                                             work(d))
                                : XSEG_SUCCESS;
        if (st != XSEG_SUCCESS)
            return st;
    }
    it->filled = true;
    d->quar.unfilled -= 1;
    return XSEG_SUCCESS;
}

/* ---- batches for the allocator's kernels (vmm/kernel.h) ----
 *
 * A block entering the quarantine is not filled at once: it waits (unfilled) until the device
 * holds debug_stale_fill_batch of them, or until a check or xseg_stale_flush; then each stream's
 * waiting blocks are filled by one vkern_fill over all their ranges (flush_fills). The window
 * this opens is the batch's trade (docs/troubleshooting.md): a stale access queued after a free
 * and before its flush reads the old bytes (still quarantined, never another tensor's), a write
 * then is overwritten by the fill. Checks compare on the device too: one vkern_check per stream
 * over whole blocks. When the kernels do not run (NOT_SUPPORTED) both fall back to the driver's
 * memsets and sampled read-backs. The host scratch is kept for the device's life. */
struct quar_pend {
    CUstream s;
    uintptr_t addr;
    size_t item; /* index into q from head */
};

struct quar_batchbuf {
    struct quar_pend *p;
    size_t capp;
    struct vkern_range *r;
    size_t *first, *owner; /* per range: the first changed offset (checks), its entry of p */
    size_t capr, capfirst, capowner;
    int kern; /* 0: not asked yet, 1: the kernels run, -1: they do not (the fallback) */
};

static struct quar_batchbuf *batchbuf(struct dev_alloc *d)
{
    if (!d->quar.bb)
        d->quar.bb = xs_calloc(1, sizeof *d->quar.bb);
    return d->quar.bb;
}

/* Do the allocator's kernels run on @p d (asked once a device; vkern_ready remembers its context's
 * answer too)? Context current. */
static bool kern_on(struct quar_batchbuf *bb)
{
    if (!bb->kern)
        bb->kern = vkern_ready() == XSEG_SUCCESS ? 1 : -1;
    return bb->kern > 0;
}

static int pend_cmp(const void *a, const void *b)
{
    const struct quar_pend *x = a, *y = b;
    if (x->s != y->s)
        return (uintptr_t)x->s < (uintptr_t)y->s ? -1 : 1;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Room for @p np entries of p and @p nr ranges (with their offsets and owners) in @p bb. */
static bool batch_room(struct quar_batchbuf *bb, size_t np, size_t nr)
{
    return VEC_RESERVE(bb->p, bb->capp, np) && VEC_RESERVE(bb->r, bb->capr, nr) &&
           VEC_RESERVE(bb->first, bb->capfirst, nr) && VEC_RESERVE(bb->owner, bb->capowner, nr);
}

/* The ranges of pending entries p[from, to) (one stream) into bb->r, their owners in bb->owner:
 * the count. */
static size_t pend_ranges(const struct dev_alloc *d, struct quar_batchbuf *bb, size_t from, size_t to)
{
    size_t nr = 0;
    for (size_t k = from; k < to; k++) {
        const struct quar_item *it = &d->quar.q[d->quar.head + bb->p[k].item];
        size_t off[3], len[3];
        int n = ranges(d, it, off, len);
        for (int j = 0; j < n; j++)
            if (len[j]) {
                bb->owner[nr] = k;
                bb->r[nr++] = (struct vkern_range){(CUdeviceptr)(it->addr + off[j]), len[j]};
            }
    }
    return nr;
}

/* Queue the pattern over every waiting (unfilled) block on the quarantine's stream: one
 * vkern_fill, or the per-range fallback. Never during a capture; after a block whose join failed
 * (or was freed during a capture), only once the whole context was waited for. The first failure
 * is returned; the blocks it left unfilled wait for the next flush (never reported meanwhile). */
static xseg_status flush_fills(struct dev_alloc *d)
{
    if (!d->quar.unfilled || cap_underway(d))
        return XSEG_SUCCESS;
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    if (st != XSEG_SUCCESS)
        return st;
    if (d->quar.unjoined) {
        if ((st = vctx_wait("debug_stale_access: before filling blocks freed during a capture or without a join")) !=
            XSEG_SUCCESS)
            return st;
        d->quar.unjoined = false;
        d->quar.join_legacy = false;
    }
    CUstream w = work(d);
    if (d->quar.join_legacy) {
        if ((st = vstream_join(w, d->quar.join_ev, NULL, "debug_stale_access: before filling blocks freed on the "
                                                          "legacy stream")) != XSEG_SUCCESS)
            return st;
        d->quar.join_legacy = false;
    }
    /* The waiting blocks: the newest ones, and those freed during a capture (scanned from the
     * end until every unfilled one is seen, so a flush costs its batch, not the FIFO). */
    struct quar_batchbuf *bb = batchbuf(d);
    size_t np = 0, want = d->quar.unfilled;
    if (bb && batch_room(bb, want, 3 * want)) {
        for (size_t i = d->quar.n; i-- > 0 && np < want;) {
            const struct quar_item *it = &d->quar.q[d->quar.head + i];
            if (!it->filled)
                bb->p[np++] = (struct quar_pend){w, it->addr, i};
        }
        if (np > 1)
            qsort(bb->p, np, sizeof *bb->p, pend_cmp);
    } else { /* no host memory for a batch: a memset per range, as with batches of one */
        for (size_t i = 0; i < d->quar.n && d->quar.unfilled; i++) {
            struct quar_item *it = &d->quar.q[d->quar.head + i];
            if (!it->filled) {
                xseg_status s = fill(d, it);
                st = st == XSEG_SUCCESS ? s : st;
            }
        }
        return st;
    }
    /* Every waiting block in one vkern_fill on the quarantine's stream (the fallback: a memset each). */
    xseg_status s = XSEG_ERROR_NOT_SUPPORTED;
    if (np && kern_on(bb)) {
        size_t nr = pend_ranges(d, bb, 0, np);
        s = vkern_fill(bb->r, nr, (unsigned char)QUAR_POISON, w);
        if (s == XSEG_ERROR_NOT_SUPPORTED)
            bb->kern = -1; /* e.g. a forked child's context: the fallback from now on */
        for (size_t j = 0; s == XSEG_SUCCESS && j < np; j++) {
            d->quar.q[d->quar.head + bb->p[j].item].filled = true;
            d->quar.unfilled -= 1;
        }
    }
    for (size_t j = 0; s == XSEG_ERROR_NOT_SUPPORTED && j < np; j++) {
        xseg_status f = fill(d, &d->quar.q[d->quar.head + bb->p[j].item]);
        if (f != XSEG_SUCCESS)
            s = f;
    }
    if (s != XSEG_SUCCESS && s != XSEG_ERROR_NOT_SUPPORTED && st == XSEG_SUCCESS)
        st = s;
    return st;
}

/* Give the whole chunks inside expandable block @p b back (to the device's kept handles while a
 * malloc recycles them, else to the driver) and map a canary page over them (vmm/segment.h), so
 * that reserved memory drops by them while the block waits and its fill and check touch one page
 * there; host chunks (spill, switched on before this mode) go the same way. Not for a segment
 * whose handles were handed out (importers map them). The two block structs its leave re-tiles
 * with are had first: without them there is no swap (the block is filled whole). */
static void swap(struct dev_alloc *d, struct block *b, struct quar_item *it)
{
    if (!b->expandable || b->seg->handles_out)
        return;
    struct seg *vs = b->seg->vseg;
    size_t g = d->info.granularity, base = (size_t)seg_base(vs);
    size_t lo = (b->addr - base + g - 1) / g * g, hi = (b->addr + b->size - base) / g * g;
    if (hi <= lo)
        return;
    struct block *spare[2] = {dev_block_new(d), dev_block_new(d)};
    struct seg_canary c = {0};
    if (spare[0] && spare[1])
        (void)seg_canary_swap(vs, lo, hi - lo, d->exp.keep_handles ? &d->exp.handles : NULL, &c);
    if (c.end == c.first) { /* nothing given back (a failure: the block is filled whole) */
        for (int i = 0; i < 2; i++)
            if (spare[i])
                dev_block_delete(d, spare[i]);
        return;
    }
    it->swap_lo = base + c.first - b->addr;
    it->swap_hi = base + c.end - b->addr;
    it->canary = c.canary;
    it->spare[0] = spare[0];
    it->spare[1] = spare[1];
    if (c.bytes)
        dev_count_unmapped(d, block_pool(b), c.bytes, c.chunks);
    if (c.host_bytes)
        dev_count_spill(d, c.host_bytes, 0); /* spill's own count follows (spill_after_quarantine) */
    if (!c.whole) { /* the canary could not be mapped whole: the span faults; never filled there nor checked */
        it->stuck = true;
        d->quar.stuck++;
    } else if (drv_ctx_ensure(d->info.primary_ctx) == XSEG_SUCCESS) {
        /* The canary is new memory (any bytes: a dead block's among them), poisoned now rather than
         * at its batch's flush, so that a read in the batch's window never sees them (a failure
         * leaves it to the flush). */
        (void)vhost_fill((CUdeviceptr)(it->addr + it->swap_lo), (unsigned char)QUAR_POISON, g, work(d));
    }
}

/* A finding from @p it (its stacks referenced again: the finding outlives the item), marking it
 * reported; past QUAR_MAX_FINDINGS only counted (dropped). false: no host memory for it, nothing
 * changed (@p it stays unreported: the next check finds it again), *@p st the failure if none yet. */
static bool add_finding(struct dev_alloc *d, struct quar_item *it, size_t off, const char *when, xseg_status *st)
{
    if (d->quar.nfound >= QUAR_MAX_FINDINGS) {
        it->reported = true;
        d->quar.dropped++;
        return true;
    }
    if (!VEC_RESERVE(d->quar.found, d->quar.capfound, d->quar.nfound + 1)) {
        if (*st == XSEG_SUCCESS)
            *st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory to record a stale access at block "
                          "0x%" PRIxPTR " (found again at the next check)", when, it->addr);
        return false;
    }
    it->reported = true;
    struct quar_item f = *it;
    f.b = NULL;
    f.first_offset = off;
    f.found_us = hist_now_us();
    f.when = when;
    f.delivered = false;
    hist_stack_ref(f.alloc_stack);
    hist_stack_ref(f.free_stack);
    d->quar.found[d->quar.nfound++] = f;
    return true;
}

/* ---- the checks: batched and sampled read-backs ----
 *
 * Blocks are checked in batches (those leaving the FIFO together, or all of them for a check):
 * the ranges to read are sorted by stream and address, ranges of one segment that touch (or, in a
 * classic segment, lie within QUAR_MERGE_GAP of each other: all mapped there) go in one copy, the copies
 * fill one host buffer of QUAR_BATCH_BUF queued on their streams, and the buffer is checked
 * after one wait of its stream: a wait per stream and buffer, not per block. Sampled (the
 * default, debug_stale_full_check off): a range up to QUAR_WHOLE is read whole; a longer one
 * only its first and last QUAR_PROBE bytes and a probe of QUAR_PROBE at every QUAR_PROBE_STEP
 * (a kernel's stale write normally covers a tensor's whole range or its start). A canary span
 * is sampled as one granule: a write near the span's start or end lands near its page's. */
#define QUAR_WHOLE ((size_t)256 << 10)
#define QUAR_PROBE ((size_t)4 << 10)
#define QUAR_PROBE_STEP ((size_t)4 << 20)
#define QUAR_MERGE_GAP ((size_t)256 << 10)
#define QUAR_BATCH_BUF ((size_t)4 << 20)

struct qrange {
    CUstream s;
    const void *seg; /* the block's segment */
    bool classic;
    uintptr_t addr;
    size_t len, item, boff; /* item: index into q from head; boff: where it lies in the buffer */
};

struct qranges {
    struct qrange *v;
    size_t n, cap;
    bool oom;
};

static void add_range(struct qranges *r, CUstream w, const struct quar_item *it, size_t item, size_t off,
                      size_t len)
{
    for (size_t at = off; at < off + len; at += QUAR_CHECK_CHUNK) {
        if (!VEC_RESERVE(r->v, r->cap, r->n + 1)) {
            r->oom = true;
            return;
        }
        size_t l = off + len - at < QUAR_CHECK_CHUNK ? off + len - at : QUAR_CHECK_CHUNK;
        r->v[r->n++] = (struct qrange){w, it->b->seg, !it->expandable, it->addr + at, l, item, 0};
    }
}

/* The ranges of item @p i (index from head) that its check reads. */
static void item_ranges(const struct dev_alloc *d, CUstream w, const struct quar_item *it, size_t i, struct qranges *r)
{
    size_t off[3], len[3];
    int n = ranges(d, it, off, len);
    for (int k = 0; k < n; k++) {
        if (!len[k])
            continue;
        if (d->cfg.debug_stale_full_check || len[k] <= QUAR_WHOLE) {
            add_range(r, w, it, i, off[k], len[k]);
            continue;
        }
        size_t o = off[k], e = off[k] + len[k];
        add_range(r, w, it, i, o, QUAR_PROBE);
        for (size_t p = o + QUAR_PROBE_STEP; p + QUAR_PROBE <= e - QUAR_PROBE; p += QUAR_PROBE_STEP)
            add_range(r, w, it, i, p, QUAR_PROBE);
        add_range(r, w, it, i, e - QUAR_PROBE, QUAR_PROBE);
    }
}

static int range_cmp(const void *a, const void *b)
{
    const struct qrange *x = a, *y = b;
    if (x->s != y->s)
        return (uintptr_t)x->s < (uintptr_t)y->s ? -1 : 1;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The first byte of @p p[0, n) that is not the pattern, or n (quarantine.h). */
size_t quar_first_changed(const unsigned char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w != UINT64_MAX)
            break;
    }
    while (i < n && p[i] == QUAR_POISON)
        i++;
    return i;
}

/* Wait for the copies of ranges [from, to) (one stream) and check them: a finding for each item
 * at its first changed byte (its ranges come in address order). Returns the findings. */
static size_t flush(struct dev_alloc *d, struct qrange *v, size_t from, size_t to, const unsigned char *buf,
                    const char *when, xseg_status *st)
{
    if (from == to)
        return 0;
    xseg_status s = vstream_wait(v[from].s, "debug_stale_access: reading quarantined blocks back");
    if (s != XSEG_SUCCESS) {
        if (*st == XSEG_SUCCESS)
            *st = s;
        return 0;
    }
    size_t found = 0;
    const struct quar_item *lost = NULL; /* its finding lacked host memory: not a later range's offset */
    for (size_t r = from; r < to; r++) {
        struct quar_item *it = &d->quar.q[d->quar.head + v[r].item];
        if (it->reported || it == lost)
            continue;
        size_t f = quar_first_changed(buf + v[r].boff, v[r].len);
        if (f >= v[r].len)
            continue;
        if (add_finding(d, it, v[r].addr - it->addr + f, when, st))
            found++; /* in the canary page: the offset in the first page of the span */
        else
            lost = it;
    }
    return found;
}

/* The read-back buffer: pinned host memory, so that a batch's copies run asynchronously until
 * its one wait (pageable memory would make each copy wait), else host memory. Context current. */
static unsigned char *batch_buffer(struct dev_alloc *d)
{
    if (!d->quar.buf) {
        void *p = NULL;
        d->quar.buf_pinned = vhost_alloc(QUAR_BATCH_BUF, &p) == XSEG_SUCCESS;
        d->quar.buf = d->quar.buf_pinned ? p : xs_malloc(QUAR_BATCH_BUF);
    }
    return d->quar.buf;
}

/* check_batch on the device: one vkern_check over the whole blocks, on the quarantine's stream
 * @p w (no sampling: only an offset per range comes back). false: the kernels do not run or no host memory for the batch
 * (the caller reads back instead); else the findings in *@p found. */
static bool check_on_device(struct dev_alloc *d, CUstream w, size_t i0, size_t n, const char *when,
                            xseg_status *st, size_t *found)
{
    struct quar_batchbuf *bb = batchbuf(d);
    if (!bb || !kern_on(bb))
        return false;
    size_t np = 0;
    for (size_t i = i0; i < i0 + n; i++) {
        const struct quar_item *it = &d->quar.q[d->quar.head + i];
        if (it->filled && !it->reported && !it->stuck) {
            if (!batch_room(bb, np + 1, 3 * (np + 1)))
                return false;
            bb->p[np++] = (struct quar_pend){w, it->addr, i};
        }
    }
    if (np > 1)
        qsort(bb->p, np, sizeof *bb->p, pend_cmp);
    *found = 0;
    d->quar.checked += np;
    for (size_t k = 0; k < np;) {
        size_t e = k + 1;
        while (e < np && bb->p[e].s == bb->p[k].s)
            e++;
        size_t nr = pend_ranges(d, bb, k, e);
        xseg_status s = vkern_check(bb->r, nr, (unsigned char)QUAR_POISON, bb->p[k].s, bb->first);
        if (s != XSEG_SUCCESS) { /* these blocks stay unreported; other streams are still checked */
            if (*st == XSEG_SUCCESS)
                *st = err_prefix(s, "%s: debug_stale_access: comparing quarantined blocks on the device", when);
            k = e;
            continue;
        }
        const struct quar_item *lost = NULL; /* its finding lacked host memory: not a later range's offset */
        for (size_t j = 0; j < nr; j++) { /* a block's ranges come in address order: its first change */
            struct quar_item *it = &d->quar.q[d->quar.head + bb->p[bb->owner[j]].item];
            if (it->reported || it == lost || bb->first[j] >= bb->r[j].len)
                continue;
            /* in a canary span: the offset in its first page, as read back */
            if (add_finding(d, it, (uintptr_t)bb->r[j].addr - it->addr + bb->first[j], when, st))
                (*found)++;
            else
                lost = it;
        }
        k = e;
    }
    return true;
}

/* Check items [i0, i0 + n) of the FIFO (index from head) that are filled and not reported yet.
 * Returns the findings; *@p st: the first failure (the blocks not read stay unreported). */
static size_t check_batch(struct dev_alloc *d, size_t i0, size_t n, const char *when, xseg_status *st)
{
    bool any = false;
    for (size_t i = i0; i < i0 + n && !any; i++) {
        const struct quar_item *it = &d->quar.q[d->quar.head + i];
        any = it->filled && !it->reported && !it->stuck;
    }
    if (!any)
        return 0;
    /* Every write queued so far, on any stream, lands before the check reads (the blocks' streams
     * may be gone: the check runs on the quarantine's own). */
    xseg_status w0 = drv_ctx_ensure(d->info.primary_ctx);
    if (w0 == XSEG_SUCCESS)
        w0 = vctx_wait("debug_stale_access: before checking quarantined blocks");
    if (w0 != XSEG_SUCCESS) {
        if (*st == XSEG_SUCCESS)
            *st = err_prefix(w0, "%s: debug_stale_access: quarantined blocks stay unchecked", when);
        return 0;
    }
    CUstream w = work(d);
    size_t kfound = 0;
    if (check_on_device(d, w, i0, n, when, st, &kfound))
        return kfound;
    struct qranges r = {0};
    size_t items = 0;
    for (size_t i = i0; i < i0 + n && !r.oom; i++) {
        struct quar_item *it = &d->quar.q[d->quar.head + i];
        if (it->filled && !it->reported && !it->stuck) {
            item_ranges(d, w, it, i, &r);
            items++;
        }
    }
    xseg_status s = r.n ? drv_ctx_ensure(d->info.primary_ctx) : XSEG_SUCCESS;
    unsigned char *buf = r.n && s == XSEG_SUCCESS ? batch_buffer(d) : NULL;
    if (r.oom || (r.n && s == XSEG_SUCCESS && !buf)) {
        xs_free(r.v);
        if (*st == XSEG_SUCCESS)
            *st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory to read quarantined blocks back", when);
        return 0;
    }
    d->quar.checked += items;
    size_t found = 0;
    if (s != XSEG_SUCCESS)
        *st = *st == XSEG_SUCCESS ? s : *st;
    if (r.n)
        qsort(r.v, r.n, sizeof *r.v, range_cmp);
    size_t used = 0, pend = 0; /* ranges [pend, k) are queued into buf[0, used) */
    for (size_t k = 0; s == XSEG_SUCCESS && k < r.n;) {
        /* One copy: ranges k.. of one segment (a copy never spans two allocations) that touch,
         * or lie close in a classic segment (all of it mapped). */
        size_t e = k + 1;
        uintptr_t lo = r.v[k].addr, hi = lo + r.v[k].len;
        while (e < r.n && r.v[e].s == r.v[k].s && r.v[e].seg == r.v[k].seg && r.v[e].addr >= hi &&
               (r.v[e].addr == hi || (r.v[e].classic && r.v[e].addr - hi <= QUAR_MERGE_GAP)) &&
               r.v[e].addr + r.v[e].len - lo <= QUAR_CHECK_CHUNK) {
            hi = r.v[e].addr + r.v[e].len;
            e++;
        }
        if (pend < k && (r.v[pend].s != r.v[k].s || used + (hi - lo) > QUAR_BATCH_BUF)) {
            found += flush(d, r.v, pend, k, buf, when, &s);
            pend = k;
            used = 0;
        }
        if (s != XSEG_SUCCESS)
            break;
        s = vhost_copy_dtoh(buf + used, (CUdeviceptr)lo, hi - lo, r.v[k].s);
        for (size_t j = k; j < e; j++)
            r.v[j].boff = used + (r.v[j].addr - lo);
        used += hi - lo;
        k = e;
        if (s == XSEG_SUCCESS && k == r.n)
            found += flush(d, r.v, pend, k, buf, when, &s);
    }
    if (s != XSEG_SUCCESS && *st == XSEG_SUCCESS)
        *st = s;
    xs_free(r.v);
    return found;
}

/* The oldest block leaves (checked already, or leaving unchecked), back to its pool. A canary
 * span is unmapped first and left so: the block returns as free address space there, mapped
 * anew by the malloc that needs it (re-tiled with the structs its swap put aside: no memory is
 * needed). When the canary's mappings cannot be unmapped (a driver failure), it stays
 * quarantined instead: moved to the FIFO's end, marked stuck (never checked again), tried again
 * when it next leaves. */
static void leave_oldest(struct dev_alloc *d, xseg_status *st)
{
    struct quar_item *it = &d->quar.q[d->quar.head];
    struct block *b = it->b;
    size_t at = 0;
    if (it->swap_lo != it->swap_hi) {
        at = b->addr - (size_t)seg_base(b->seg->vseg);
        xseg_status s = seg_canary_release(b->seg->vseg, at + it->swap_lo, at + it->swap_hi, it->canary);
        if (s != XSEG_SUCCESS) {
            if (*st == XSEG_SUCCESS)
                *st = err_prefix(s, "debug_stale_access: block 0x%" PRIxPTR " (%zu bytes) stays quarantined, "
                                    "tried again at its next exit or empty_cache", it->addr, it->size);
            struct quar_item keep = *it;
            if (!keep.stuck)
                d->quar.stuck++;
            keep.stuck = true;
            d->quar.head++;
            if (d->quar.head + d->quar.n - 1 == d->quar.cap) { /* room at the end: compact */
                memmove(d->quar.q, d->quar.q + d->quar.head, (d->quar.n - 1) * sizeof *d->quar.q);
                d->quar.head = 0;
            }
            d->quar.q[d->quar.head + d->quar.n - 1] = keep;
            return;
        }
    }
    if (it->stuck)
        d->quar.stuck--;
    struct block_side *sd = block_side(b);
    xseg_assert(sd && sd->event_count == 1);
    sd->event_count = 0;
    if (!it->filled)
        d->quar.unfilled -= 1;
    d->quar.bytes -= it->size;
    hist_stack_unref(it->alloc_stack);
    hist_stack_unref(it->free_stack);
    size_t lo = it->swap_lo, hi = it->swap_hi;
    struct block *spare[2] = {it->spare[0], it->spare[1]};
    d->quar.head++;
    if (--d->quar.n == 0)
        d->quar.head = 0;
    dev_pending_add(d, b, -1);
    /* Host chunks (spill) its swap did not give back (a failure) go now: no free byte stays on
     * host memory; one whose unmap fails is stranded (unmapped for the books, reclaimed later). */
    size_t g = d->info.granularity, dropped = 0, glo = at + lo, ghi = at + hi;
    if (b->expandable && seg_host_bytes(b->seg->vseg)) {
        size_t off = b->addr - (size_t)seg_base(b->seg->vseg);
        size_t wlo = (off + g - 1) / g * g, whi = (off + b->size) / g * g;
        if (wlo < whi)
            (void)seg_drop_host(b->seg->vseg, wlo, whi - wlo, false, &dropped);
        if (dropped) {
            dev_count_spill(d, dropped, 0);
            glo = wlo, ghi = whi; /* the whole chunks' range: host holes and the span alike */
        }
    }
    if (lo == hi && !dropped) {
        dev_free_block(d, b);
        return;
    }
    /* Free with its neighbours, then the span becomes an unmapped hole (as empty_cache leaves one). */
    uintptr_t base = (uintptr_t)seg_base(b->seg->vseg);
    struct segrec *s = b->seg;
    struct block *fb = dev_free_block_keeper(b);
    dev_free_block(d, b);
    xseg_assert(block_in_free_index(fb) && fb->addr <= base + glo && base + ghi <= fb->addr + fb->size);
    bpool_remove_free(block_pool(fb), fb);
    retile_free_block(d, fb, glo, ghi, spare);
    if (XSEG_UNLIKELY(hist_mode()) && lo != hi)
        hist_record(HIST_SEGMENT_UNMAP, d->device, base + at + lo, hi - lo, (uintptr_t)s->stream, d->hist_cur);
}

/* When the quarantine passes its bound, the oldest blocks leave together down to this many
 * eighths of it (half). Each exit batch costs per stream a compare launch, its copies and a wait,
 * so larger, rarer batches cost less; the bound itself is never passed either way, but a block's
 * stay (the time a stale write can be caught) shortens. On the recorded training trace
 * (benchmarks/stale_cost.sh, STALE_SCALE=32) 7/8 made 271 exit batches and 1.77x the modelled
 * driver time off (expandable), 1/2 makes 92 and 1.47x, 1/4 64 and 1.43x: half takes most of the
 * gain and keeps blocks held for between half and all of the bound's worth of frees (unless a growth
 * empties the quarantine first: quar_before_growth). */
#ifndef QUAR_EXIT_LOW_EIGHTHS /* a build may set another to measure it (-DQUAR_EXIT_LOW_EIGHTHS=N) */
#define QUAR_EXIT_LOW_EIGHTHS 4
#endif

/* Keep the bound (never during a capture): when the bytes (or blocks) pass it, the oldest leave
 * as one batch, checked together, down to QUAR_EXIT_LOW_EIGHTHS of it. @p check: flush the
 * waiting fills and check them first (a block whose check failed leaves unreported). */
static xseg_status trim(struct dev_alloc *d, size_t bound, bool check)
{
    if ((d->quar.bytes <= bound && d->quar.n <= QUAR_MAX_BLOCKS) || cap_underway(d))
        return XSEG_SUCCESS;
    size_t low = bound / 8 * QUAR_EXIT_LOW_EIGHTHS + bound % 8 * QUAR_EXIT_LOW_EIGHTHS / 8;
    size_t lown = QUAR_MAX_BLOCKS / 8 * QUAR_EXIT_LOW_EIGHTHS;
    size_t k = 0, bytes = d->quar.bytes;
    while (k < d->quar.n && (bytes > low || d->quar.n - k > lown))
        bytes -= d->quar.q[d->quar.head + k++].size;
    xseg_status st = XSEG_SUCCESS;
    if (check) {
        /* The leaving blocks' waiting fills go first (all of them: one launch a stream); the
         * oldest are usually filled already (their batch was full), and then nothing is queued. */
        bool waiting = false;
        for (size_t i = 0; i < k && d->quar.unfilled && !waiting; i++)
            waiting = !d->quar.q[d->quar.head + i].filled;
        if (waiting)
            st = flush_fills(d); /* a block whose fill failed leaves unchecked */
        (void)check_batch(d, 0, k, "quarantine exit", &st);
    }
    for (size_t i = 0; i < k && d->quar.n; i++)
        leave_oldest(d, &st); /* a stuck block goes to the end: each leaves (or is tried) once */
    return st;
}

/* Before a malloc grows reserved memory (a new segment, new pages), a quarantine holding more than
 * QUAR_GROW_EIGHTHS of its bound empties: every block leaves, checked as one exit batch, and the
 * malloc searches the cache again. Why: a held block costs more than its bytes. The off run would
 * have reused it; the on run grows instead, and what grew stays reserved as cache after the block
 * leaves, often in a shape later requests cannot use (another pool, stream or size): the excess
 * accumulates (+230 MiB at a 128 MiB bound on the training trace, benchmarks/stale_cost.sh). So
 * the mode forces growth only while it holds at most a quarter of the bound, as a cache is given
 * back before growth. The trade: during growth (a first step) blocks leave early, some at once;
 * once reserved memory stops growing they stay their bound's worth of frees. Measured at scales
 * 32 and 8 (bounds 32 and 128 MiB): a quarter +8 / +4 and +66 / +56 MiB (expandable / classic)
 * and 1.50 / 1.34x off; emptying at any growth +2 / +2 MiB but 1.96 / 1.59x (an exit batch a
 * growth); a half +34 / +24 and +110 / +122 MiB. */
#ifndef QUAR_GROW_EIGHTHS /* a build may set another to measure it (-DQUAR_GROW_EIGHTHS=N) */
#define QUAR_GROW_EIGHTHS 2
#endif

bool quar_before_growth(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    size_t bound = d->cfg.debug_quarantine;
    size_t most = bound / 8 * QUAR_GROW_EIGHTHS + bound % 8 * QUAR_GROW_EIGHTHS / 8;
    if (!d->cfg.debug_stale_access || d->quar.bytes <= most || d->quar.n == d->quar.stuck || cap_underway(d))
        return false;
    size_t n0 = d->quar.n, stuck0 = d->quar.stuck;
    (void)trim(d, 0, true); /* a failed check leaves its blocks unreported, as at any exit */
    return d->quar.n < n0 || d->quar.stuck != stuck0; /* some went back to their pools */
}

void quar_keep_free_stack(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct block_side *sd = block_side(b);
    if (!sd || !d->quar.free_stack || b->private_pool) /* a private pool's block is not quarantined */
        return;
    hist_stack_unref(sd->free_stack);
    sd->free_stack = d->quar.free_stack;
    d->quar.free_stack = NULL;
}

bool quar_enter(struct dev_alloc *d, struct block *b, bool pending)
{
    lock_assert_held(&d->lock);
    /* The stack of a free that waited for events travels in the side struct (quar_keep_free_stack). */
    struct hstack *waited = NULL;
    if (b->sided && b->u.side->free_stack) {
        waited = b->u.side->free_stack;
        b->u.side->free_stack = NULL;
    }
    bool fits = d->cfg.debug_stale_access && !b->private_pool && b->size <= d->cfg.debug_quarantine;
    if (fits && d->quar.head + d->quar.n == d->quar.cap && d->quar.head) {
        memmove(d->quar.q, d->quar.q + d->quar.head, d->quar.n * sizeof *d->quar.q);
        d->quar.head = 0;
    }
    struct block_side *sd = NULL;
    if (!fits || !VEC_RESERVE(d->quar.q, d->quar.cap, d->quar.n + 1) || !(sd = block_side_get(b))) {
        hist_stack_unref(waited);
        return false;
    }
    xseg_assert(sd->event_count == 0 && sd->uses.n == 0);
    sd->event_count = 1; /* the quarantine's hold: no merge takes it, dev_check counts it pending */
    if (!pending)
        dev_pending_add(d, b, 1);
    struct quar_item it = {
        .b = b,
        .addr = b->addr,
        .size = b->size,
        .requested = sd->requested_size,
        .stream = b->stream,
        .pool = b->small_pool ? XSEG_STAT_SMALL_POOL : XSEG_STAT_LARGE_POOL,
        .expandable = b->expandable,
        .alloc_stack = sd->hist_stack,
        .free_stack = waited ? waited : d->quar.free_stack,
        .freed_us = hist_now_us(),
    };
    hist_stack_ref(it.alloc_stack);
    if (!waited)
        d->quar.free_stack = NULL; /* the entry took the free's reference */
    d->quar.unfilled++; /* its fill waits for the batch (flush_fills) */
    /* Entering at its free (its stream alive), the quarantine's stream joins the block's; entering
     * after record_stream's events, it was joined at the free (quar_join) and its stream is not
     * asked again: the program may have destroyed it since. */
    bool cap = pending ? cap_underway(d) : capturing(d, b->stream);
    if (!pending)
        join(d, b->stream, cap);
    if (!cap)
        swap(d, b, &it);
    d->quar.q[d->quar.head + d->quar.n++] = it;
    d->quar.bytes += it.size;
    d->quar.entered++;
    if (!cap) {
        if (d->quar.unfilled >= d->cfg.debug_stale_fill_batch && flush_fills(d) == XSEG_SUCCESS && !pending)
            join_back(d, b->stream); /* a failed fill leaves its blocks unfilled: filled at the next flush */
        (void)trim(d, d->cfg.debug_quarantine, true); /* a failed check leaves its blocks unreported */
    }
    return true;
}

void quar_join(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    if (d->cfg.debug_stale_access && !b->private_pool && b->size <= d->cfg.debug_quarantine)
        join(d, b->stream, capturing(d, b->stream));
}

void quar_begin_free(struct dev_alloc *d, struct hstack *free_stack)
{
    lock_assert_held(&d->lock);
    hist_stack_unref(d->quar.free_stack);
    d->quar.free_stack = free_stack;
}

void quar_end_free(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    hist_stack_unref(d->quar.free_stack);
    d->quar.free_stack = NULL;
}

xseg_status quar_check_all(struct dev_alloc *d, const char *when, bool drain, size_t *found)
{
    lock_assert_held(&d->lock);
    if (found)
        *found = 0;
    if (dev_capture_underway(d))
        return err_set(XSEG_ERROR_ILLEGAL_STATE,
                       "%s: a capture is underway on device %d: quarantined blocks are checked once it ends "
                       "(a check would synchronize the captured streams)",
                       when, d->device);
    if (!d->quar.n)
        return XSEG_SUCCESS;
    xseg_status st = flush_fills(d); /* the waiting fills go before the check */
    size_t n = check_batch(d, 0, d->quar.n, when, &st);
    if (found)
        *found = n;
    xseg_status st2 = trim(d, drain || !d->cfg.debug_stale_access ? 0 : d->cfg.debug_quarantine, false);
    return st != XSEG_SUCCESS ? st : st2;
}

xseg_status quar_flush(struct dev_alloc *d, const char *when)
{
    lock_assert_held(&d->lock);
    if (dev_capture_underway(d))
        return err_set(XSEG_ERROR_ILLEGAL_STATE,
                       "%s: a capture is underway on device %d: blocks freed now wait unfilled until it ends "
                       "(a fill would join the captured graph)",
                       when, d->device);
    bool waiting = d->quar.unfilled != 0;
    xseg_status st = flush_fills(d);
    /* The fills run on the quarantine's stream, which nothing the program queues later waits for
     * (a replay on its own stream would race them: a stale write landing before its block's fill
     * is overwritten and missed, a stale read gets the old bytes); so a flush returns once they
     * are done, and whatever is queued after it, on any stream, meets the pattern. */
    if (st == XSEG_SUCCESS && waiting) /* the legacy stream where there is none of its own */
        st = vstream_wait(d->quar.work, "debug_stale_access: the fills of xseg_stale_flush");
    return st == XSEG_SUCCESS ? st : err_prefix(st, "%s: debug_stale_access: filling quarantined blocks", when);
}

size_t quar_count(const struct dev_alloc *d, size_t *bytes)
{
    if (bytes)
        *bytes = d->quar.bytes;
    return d->quar.n;
}

void quar_take(struct dev_alloc *d, struct quar_batch *out)
{
    lock_assert_held(&d->lock);
    *out = (struct quar_batch){d->device, NULL, 0};
    size_t n = d->quar.nfound - d->quar.ndelivered;
    if (!n)
        return;
    out->v = xs_malloc(n * sizeof *out->v);
    if (!out->v)
        return; /* kept undelivered: the next operation tries again */
    for (size_t i = 0; i < n; i++) {
        struct quar_item *f = &d->quar.found[d->quar.ndelivered + i];
        f->delivered = true;
        out->v[i] = *f;
        hist_stack_ref(f->alloc_stack);
        hist_stack_ref(f->free_stack);
    }
    out->n = n;
    d->quar.ndelivered += n;
}

/* @p s's frames into @p fr (at most @p max) with their text in @p text (QUAR_FRAME_TEXT each). */
static int frames_of(const struct hstack *s, xseg_frame *fr, char *text, int max)
{
    int n = 0;
    for (uint32_t i = 0; s && i < s->n && n < max; i++, n++) {
        const char *file, *name;
        int line;
        hist_frame_info(s->f[i], text + (size_t)n * QUAR_FRAME_TEXT, QUAR_FRAME_TEXT, &file, &name, &line);
        fr[n] = (xseg_frame){file, name, line};
    }
    return n;
}

/* Append @p fmt to @p buf (@p size, *@p len used), truncating. */
static void put(char *buf, size_t size, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (k > 0)
        *len = *len + (size_t)k < size ? *len + (size_t)k : size - 1;
}

static void put_frames(char *buf, size_t size, size_t *len, const char *what, const xseg_frame *fr, int n)
{
    put(buf, size, len, "  %s:%s\n", what, n ? "" : " (no frames recorded: history was off or kept no stack)");
    for (int i = 0; i < n; i++)
        put(buf, size, len, "    %s (%s:%d)\n", fr[i].name ? fr[i].name : "??", fr[i].filename ? fr[i].filename : "??",
            fr[i].line);
}

void quar_deliver(struct quar_batch *b)
{
    enum { MAXF = 256, MSG = 1 << 15 };
    xseg_frame *fa = xs_malloc(2 * MAXF * sizeof *fa);
    char *text = xs_malloc((size_t)2 * MAXF * QUAR_FRAME_TEXT);
    char *msg = xs_malloc(MSG);
    for (size_t i = 0; i < b->n; i++) {
        const struct quar_item *f = &b->v[i];
        int na = 0, nf = 0;
        if (fa && text) {
            na = frames_of(f->alloc_stack, fa, text, MAXF);
            nf = frames_of(f->free_stack, fa + MAXF, text + (size_t)MAXF * QUAR_FRAME_TEXT, MAXF);
        }
        size_t len = 0;
        bool host = f->pool == QUAR_POOL_HOST; /* a pinned host block (hostquar.h) */
        const char *pool = host ? "host" : f->pool == XSEG_STAT_SMALL_POOL ? "small" : "large";
        if (msg) {
            msg[0] = 0;
            if (host)
                put(msg, MSG, &len, "xseg: stale access in pinned host memory: block 0x%" PRIxPTR
                    " (%zu bytes, %zu requested, xseg_host_malloc's cache)", f->addr, f->size, f->requested);
            else
                put(msg, MSG, &len, "xseg: stale access on device %d: block 0x%" PRIxPTR
                    " (%zu bytes, %zu requested, stream %p, %s pool, %s segment)", b->device, f->addr, f->size,
                    f->requested, (void *)f->stream, pool, f->expandable ? "expandable" : "classic");
            put(msg, MSG, &len,
                " was written after its free: first changed byte at offset %zu (found at %s, %.3f s after the free)\n",
                f->first_offset, f->when, (double)(f->found_us - f->freed_us) / 1e6);
            put_frames(msg, MSG, &len, "allocated at", fa, na);
            put_frames(msg, MSG, &len, "freed at", fa ? fa + MAXF : NULL, nf);
        }
        xseg_stale_report r = {
            .device = host ? -1 : b->device,
            .addr = f->addr,
            .size = f->size,
            .requested = f->requested,
            .stream = f->stream,
            .pool = pool,
            .expandable = f->expandable,
            .first_offset = f->first_offset,
            .freed_us = f->freed_us,
            .found_us = f->found_us,
            .when = f->when,
            .alloc_frames = fa,
            .n_alloc_frames = na,
            .free_frames = fa ? fa + MAXF : NULL,
            .n_free_frames = nf,
            .message = msg ? msg : "xseg: stale access (no host memory to describe it)\n",
        };
        if (!settings_run_stale_observers(&r))
            fputs(r.message, stderr);
        hist_stack_unref(f->alloc_stack);
        hist_stack_unref(f->free_stack);
    }
    xs_free(fa);
    xs_free(text);
    xs_free(msg);
    xs_free(b->v);
    *b = (struct quar_batch){0};
}

void quar_destroy(struct dev_alloc *d)
{
    xseg_assert(!d->quar.n);
    for (size_t i = 0; i < d->quar.nfound; i++) {
        hist_stack_unref(d->quar.found[i].alloc_stack);
        hist_stack_unref(d->quar.found[i].free_stack);
    }
    hist_stack_unref(d->quar.free_stack);
    if (d->quar.buf_pinned)
        vhost_free(d->quar.buf, d->info.dev);
    else
        xs_free(d->quar.buf);
    vkern_release(d->info.primary_ctx); /* the kernels' module and result buffer, if they were loaded */
    vstream_destroy(d->quar.work);      /* the driver finishes work still queued on it */
    if (d->quar.join_ev)
        vevent_destroy(d->quar.join_ev);
    if (d->quar.bb) {
        xs_free(d->quar.bb->p);
        xs_free(d->quar.bb->r);
        xs_free(d->quar.bb->first);
        xs_free(d->quar.bb->owner);
        xs_free(d->quar.bb);
    }
    xs_free(d->quar.q);
    xs_free(d->quar.found);
    d->quar = (struct quar_state){0};
}
