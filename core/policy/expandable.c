/*
 * Expandable segments beneath the block pools (PyTorch's find_expandable_block, map_block,
 * unmap_block, release_expandable_segment), over vmm/segment.h.
 *
 * Invariants, for every expandable segment (all under the device lock):
 *   - its blocks tile [base, base + VA size); unmapped blocks start and end on granule
 *     boundaries, and no mapped chunk reaches into one;
 *   - two neighbours are never both free-and-mapped, nor both unmapped (they merge);
 *   - a block is mapped iff every granule it overlaps is mapped;
 *   - reserved_bytes counts exactly the mapped bytes; each chunk mapped (unmapped) counts one
 *     num_device_alloc (num_device_free); segment.* and inactive_split* ignore these blocks.
 * Growth maps page multiples (PyTorch's reserved figures) in chunks that end where the new
 * block ends (vmm/segment.h), so that memory freed later can be given back up to the block's
 * edges, not only in whole pages.
 * Growth first reuses unmapped holes (oldest segment, lowest offset first, with a free block just
 * before them), then grows a segment of the same (pool, stream) at its end (seg_grow), then creates a segment.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/policy/expandable.h"
#include "base/assert.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/device/blockops.h"
#include "core/device/retile.h"
#include "core/index/stats.h"
#include "vmm/segment.h"
#include "vmm/ipc.h"
#include "core/policy/ipc.h"
#include "core/policy/observe.h"
#include "core/policy/registry.h"
#include "core/device/placement.h"

static inline bool allocatable(const struct block *b)
{
    return b && !b->allocated && !block_side(b); /* a side: events, streams or a stack */
}

static inline size_t seg_page(const struct segrec *s) { return seg_page_size(s->vseg); }
static inline size_t seg_g(const struct segrec *s) { return seg_gran(s->vseg); }
static inline size_t seg_off(const struct block *b) { return b->addr - (uintptr_t)seg_base(b->seg->vseg); }

/* Page sizes need not be powers of two (20 MiB): plain division, not masks. */
static inline size_t page_up(size_t n, size_t page) { return (n + page - 1) / page * page; }
static inline size_t page_down(size_t n, size_t page) { return n / page * page; }

/* Bytes available from @p c on through allocatable blocks (stops once @p size is reached). */
static size_t chain_bytes(const struct block *c, size_t size)
{
    size_t bytes = 0;
    while (bytes < size && allocatable(c)) {
        bytes += c->size;
        c = c->next;
    }
    return bytes;
}

static struct block *new_unmapped(struct dev_alloc *d, struct segrec *s, uintptr_t addr, size_t size)
{
    lock_assert_held(&d->lock);
    struct block *b = dev_block_new(d);
    if (!b)
        return NULL;
    b->addr = addr;
    b->size = size;
    b->stream = s->stream;
    block_set_seg(b, s);
    b->mapped = false;
    return b;
}

/* Stable order of blocks of expandable segments: older segment first, then lower offset in it.
 * Virtual addresses are not stable: the driver (and cudaemu's mmap) places segments
 * differently from run to run and from driver to driver (rising or falling addresses). */
static bool seg_order_less(const struct block *a, const struct block *b)
{
    if (a->seg->seq != b->seg->seq)
        return a->seg->seq < b->seg->seq;
    return a->addr - (uintptr_t)seg_base(a->seg->vseg) < b->addr - (uintptr_t)seg_base(b->seg->vseg);
}

/* Is a capture underway, or a pool recording (the cheap test first)? */
static bool exp_capture_holds(struct dev_alloc *d) { return cap_underway(d) && dev_capture_underway(d); }

/* Would mapping @p size bytes from @p c (whole pages) unmap a stranded chunk first (seg_map)?
 * During a capture that must not happen: a chunk set aside by a spilled block's free in the
 * capture (seg_drop_host's strand) may still be read by work its streams queued before it, and
 * nothing can be waited for until the capture ends (xseg.h: while a pool records, nothing is
 * unmapped). Such a range is passed over then; the reclaim after the capture gives it back. */
static bool covers_set_aside(const struct block *c, size_t size)
{
    const struct seg *vs = c->seg->vseg;
    size_t off = c->addr - (uintptr_t)seg_base(vs);
    return seg_stranded_bytes(vs) && seg_stranded_within(vs, off, page_up(size, seg_page_size(vs)));
}

/* An unmapped hole with room for @p size (PyTorch's search of pool->unmapped), the first in
 * seg_order_less order, so the choice is the same on every run and every driver; with
 * @p capture, none whose mapping would unmap a set-aside chunk (covers_set_aside). */
static struct block *find_hole(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size, bool capture)
{
    lock_assert_held(&d->lock);
    struct block *best = NULL, *best_hole = NULL;
    for (struct block *u = bpool_unmapped_lower_bound(pool, stream, 0); u && u->stream == stream;
         u = bpool_unmapped_lower_bound(pool, stream, u->addr + 1)) {
        if ((best_hole && !seg_order_less(u, best_hole)) || !place_seg_ok(d, u->seg))
            continue;
        struct block *c = u;
        if (allocatable(c->prev))
            c = c->prev;
        if (chain_bytes(c, size) >= size && !(capture && covers_set_aside(c, size))) {
            best = c;
            best_hole = u;
        }
    }
    return best;
}

/* Order of d->exp.by_stream: (pool, stream, seq). */
static int by_stream_cmp(const struct bpool *pool, CUstream stream, uint64_t seq, const struct segrec *s)
{
    if (pool != s->pool)
        return (uintptr_t)pool < (uintptr_t)s->pool ? -1 : 1;
    if (stream != s->stream)
        return (uintptr_t)stream < (uintptr_t)s->stream ? -1 : 1;
    return seq < s->seq ? -1 : seq > s->seq;
}

/* The first index of d->exp.by_stream not below (pool, stream, seq). */
static size_t by_stream_lower(const struct dev_alloc *d, const struct bpool *pool, CUstream stream, uint64_t seq)
{
    lock_assert_held(&d->lock);
    size_t lo = 0, hi = d->exp.nby_stream;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (by_stream_cmp(pool, stream, seq, d->exp.by_stream[mid]) > 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Insert @p s (room reserved by the caller: nby_stream < capby_stream). */
static void by_stream_add(struct dev_alloc *d, struct segrec *s)
{
    lock_assert_held(&d->lock);
    size_t i = by_stream_lower(d, s->pool, s->stream, s->seq);
    memmove(&d->exp.by_stream[i + 1], &d->exp.by_stream[i], (d->exp.nby_stream - i) * sizeof *d->exp.by_stream);
    d->exp.by_stream[i] = s;
    d->exp.nby_stream++;
}

static void by_stream_remove(struct dev_alloc *d, struct segrec *s)
{
    lock_assert_held(&d->lock);
    size_t i = by_stream_lower(d, s->pool, s->stream, s->seq);
    xseg_assert(i < d->exp.nby_stream && d->exp.by_stream[i] == s);
    memmove(&d->exp.by_stream[i], &d->exp.by_stream[i + 1], (d->exp.nby_stream - i - 1) * sizeof *d->exp.by_stream);
    d->exp.nby_stream--;
}

/* Grow a segment of (pool, stream) at its end so that its allocatable tail holds @p size. The
 * newest segment first; with @p capture, none whose tail holds a set-aside chunk. */
static struct block *grow_segment(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                                  bool capture)
{
    lock_assert_held(&d->lock);
    size_t lo = by_stream_lower(d, pool, stream, 0), hi = by_stream_lower(d, pool, stream, UINT64_MAX);
    for (size_t k = hi; k-- > lo;) {
        struct segrec *s = d->exp.by_stream[k];
        if (s->first == NULL || !place_seg_ok(d, s))
            continue;
        if (s->vseg && seg_page(s) != (pool->is_small ? BLOCK_SMALL_BUFFER : d->cfg.expandable_page_size))
            continue;
        struct block *t = s->last, *c = NULL;
        size_t avail = 0;
        for (struct block *b = t; allocatable(b); b = b->prev) {
            c = b;
            avail += b->size;
        }
        if (capture && c && covers_set_aside(c, size))
            continue;
        size_t page = seg_page(s);
        size_t old_va = seg_va_size(s->vseg);
        size_t want = old_va + page_up(size - XSEG_MIN(avail, size), page);
        /* The free tail already holds it (the cache passed it over, e.g. an oversize block under
         * max_split_size; PyTorch's find_expandable_block takes such a tail too): no growth. */
        if (want <= old_va)
            return c;
        struct block *tail_new = NULL;
        if (!(allocatable(t) && !t->mapped)) {
            tail_new = new_unmapped(d, s, 0, 0);
            if (!tail_new)
                return NULL;
        }
        if (seg_grow(s->vseg, want) != XSEG_SUCCESS) {
            if (tail_new)
                dev_block_delete(d, tail_new);
            continue;
        }
        size_t delta = seg_va_size(s->vseg) - old_va;
        s->size += delta;
        if (!tail_new) {
            t->size += delta; /* the unmapped index key (stream, addr) does not change */
        } else {
            tail_new->addr = (uintptr_t)seg_base(s->vseg) + old_va;
            tail_new->size = delta;
            block_link_after(t, tail_new);
            bpool_insert_unmapped(pool, tail_new);
            if (!c)
                c = tail_new;
        }
        return c;
    }
    return NULL;
}

static xseg_status create_segment(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                                  struct block **out)
{
    lock_assert_held(&d->lock);
    size_t page = pool->is_small ? BLOCK_SMALL_BUFFER : d->cfg.expandable_page_size;
    struct seg_params params = {
        .device = d->device,
        .cudev = d->info.dev,
        .stream = stream,
        .page_size = page,
        .peers = d->peers,
        .npeers = d->npeers,
        /* Shareable chunks (xseg_ipc_export) and map/unmap observers. */
        .handle_types = d->cfg.expandable_segments_ipc ? ipc_handle_types(d->device, d->info.dev) : 0,
        .observe = obs_segment_hook,
        .observe_user = d,
        .require_rdma = d->cfg.gpu_direct_rdma, /* docs/registrations.md */
        .rdma_off = !d->cfg.expandable_segments_rdma,
    };
    struct segrec *s = xs_calloc(1, sizeof *s);
    /* The segment's reference on its bins: indexing its blocks later never allocates. */
    if (!s || !VEC_RESERVE(d->exp.by_stream, d->exp.capby_stream, d->exp.nby_stream + 1) || !bpool_bins_acquire(pool, stream)) {
        xs_free(s);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for segment metadata");
    }
    struct seg *vseg = NULL;
    xseg_status st = seg_create(&params, page_up(size, page), &vseg);
    if (st != XSEG_SUCCESS) {
        bpool_bins_release(pool, stream);
        xs_free(s);
        return st;
    }
    s->vseg = vseg;
    s->pool = pool;
    s->stream = stream;
    s->size = seg_va_size(vseg);
    s->seq = ++d->exp.seg_seq;
    s->cls = place_seg_class(d);
    struct block *b = new_unmapped(d, s, (uintptr_t)seg_base(vseg), s->size);
    if (!b) {
        (void)seg_destroy(vseg);
        bpool_bins_release(pool, stream);
        xs_free(s);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for segment metadata");
    }
    s->first = s->last = b;
    bpool_insert_unmapped(pool, b);
    dev_seglist_add(d, s);
    by_stream_add(d, s);
    *out = b;
    return XSEG_SUCCESS;
}

/* Map the first @p len bytes (a granule multiple) of unmapped block @p b, in chunks of at most
 * @p max_chunk bytes that do not cross segment offset @p cut (vmm/segment.h). */
static xseg_status map_block(struct dev_alloc *d, struct block *b, size_t len, size_t max_chunk, size_t cut)
{
    lock_assert_held(&d->lock);
    struct segrec *s = b->seg;
    struct bpool *pool = block_pool(b);
    struct block *r = NULL;
    if (len < b->size) {
        r = new_unmapped(d, s, b->addr + len, b->size - len);
        if (!r)
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for block metadata");
    }
    size_t mapped = 0, chunks = 0;
    xseg_status st = seg_map_from(s->vseg, seg_off(b), len, max_chunk, cut, d->exp.keep_handles ? &d->exp.handles : NULL,
                                  &mapped, &chunks);
    if (st != XSEG_SUCCESS) {
        if (r)
            dev_block_delete(d, r);
        return st;
    }
    if (XSEG_UNLIKELY(hist_mode()))
        hist_record(HIST_SEGMENT_MAP, d->device, b->addr, len, (uintptr_t)s->stream, d->hist_cur);
    reg_note_mapped(d, b->addr, len); /* a released registration's pages may be whole again */
    bpool_remove_unmapped(pool, b);
    if (r) {
        block_link_after(b, r);
        bpool_insert_unmapped(pool, r);
    }
    b->size = len;
    b->mapped = true;
    dev_try_merge(d, b, b->prev);
    dev_try_merge(d, b, b->next);
    block_set_gc_base(b, pool->get_free_blocks_call_count);
    bpool_insert_free(pool, b);
    dev_count_mapped(d, pool, mapped, chunks);
    return XSEG_SUCCESS;
}

static size_t whole_page_bytes(const struct block *b);
static xseg_status unmap_pages(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle);

xseg_status exp_allocate(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                         struct block **out)
{
    lock_assert_held(&d->lock);
    bool capture = exp_capture_holds(d);
    struct block *c = find_hole(d, pool, stream, size, capture);
    if (!c)
        c = grow_segment(d, pool, stream, size, capture);
    if (!c) {
        xseg_status st = create_segment(d, pool, stream, size, &c);
        if (st != XSEG_SUCCESS)
            return st;
    }
    size_t page = seg_page(c->seg), gran = seg_g(c->seg);
    /* Growth maps whole pages (PyTorch's reserved figures). Under pressure (a retry after the
     * reclaim, exp_recycle_begin), when whole pages do not fit, only the granules the request
     * needs: the rest of a page may be what the device no longer has (the 103 MiB CNN of
     * docs/benchmarks-replay.md needs a 20 MiB page for a 7.5 MiB request otherwise). */
    size_t round = d->exp.keep_handles ? gran : page;

    /* What would be mapped, for the fraction limit (checked before touching the driver). */
    for (;;) {
        size_t need = 0, covered = 0;
        for (const struct block *b = c; covered < size; b = b->next) {
            if (b->mapped) {
                covered += b->size;
            } else {
                size_t len = XSEG_MIN(b->size, page_up(size - covered, round));
                need += len;
                covered += len;
            }
        }
        if (dev_fraction_allows(d, need))
            break;
        if (!d->exp.keep_handles || round == gran) {
            exp_release_empty_segments(d);
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "memory fraction or budget limit reached");
        }
        round = gran;
    }

    /* Chunks smaller than the page also end where the new block ends (rounded up to the
     * granule), so that the slack after it is given back up to the block's edge. */
    size_t max_chunk = place_chunk_limit(d, pool, page, gran, size);
    size_t cut = max_chunk < page ? page_up(seg_off(c) + size, gran) : SIZE_MAX;
    struct block *cur = c;
    while (!cur->mapped || cur->size < size) {
        struct block *to_map = cur->mapped ? cur->next : cur;
        size_t remaining = size - (cur->mapped ? cur->size : 0);
        size_t len = XSEG_MIN(to_map->size, page_up(remaining, round));
        xseg_status st = map_block(d, to_map, len, max_chunk, cut);
        if (st == XSEG_ERROR_OUT_OF_MEMORY && d->exp.keep_handles && round != gran) {
            round = gran; /* the failed map changed nothing: again, in granules */
            continue;
        }
        if (st != XSEG_SUCCESS) {
            /* What was mapped so far stays as cached free pages; a segment that never got a
             * page goes away again. */
            exp_release_empty_segments(d);
            return st;
        }
        cur = to_map;
    }
    bpool_remove_free(pool, cur);
    *out = cur;
    return XSEG_SUCCESS;
}

/* Bytes of whole pages inside free expandable block @p b (pages that share no byte with
 * another block). */
static size_t whole_page_bytes(const struct block *b)
{
    size_t gran = seg_g(b->seg), off = seg_off(b), lo, hi;
    size_t a = page_up(off, gran), e = page_down(off + b->size, gran);
    if (a >= e)
        return 0;
    seg_inner_range(b->seg->vseg, a, e - a, &lo, &hi);
    return hi - lo;
}

/* The range [*lo, *hi) (offsets in its segment) of the whole chunks inside free block @p b: all
 * of them, or the highest ones, as few as cover at least @p max_bytes (SIZE_MAX = all); false
 * when there is none. */
static bool unmap_range(const struct block *b, size_t max_bytes, size_t *lo, size_t *hi)
{
    const struct segrec *s = b->seg;
    size_t gran = seg_g(s), off = b->addr - (uintptr_t)seg_base(s->vseg);
    size_t a = page_up(off, gran), e = page_down(off + b->size, gran);
    if (a >= e)
        return false;
    seg_inner_range(s->vseg, a, e - a, lo, hi);
    if (*lo >= *hi)
        return false;
    if (max_bytes < *hi - *lo) {
        /* The highest chunks first, down to at least max_bytes. */
        size_t from = *hi;
        while (from > *lo && *hi - from < max_bytes) {
            size_t first = 0, n = 0;
            if (!seg_chunk(s->vseg, from / gran - 1, NULL, &first, &n))
                first = from / gran - 1;
            from = XSEG_MAX(first * gran, *lo);
        }
        *lo = from;
    }
    return true;
}

/* Unmap [lo, hi) of free block @p b's segment, the handles kept for this malloc's retries when
 * the stream is known @p idle and the device keeps handles; what went is recorded and counted. */
static xseg_status unmap_chunks(struct dev_alloc *d, struct block *b, size_t lo, size_t hi, bool idle)
{
    struct segrec *s = b->seg;
    size_t unmapped = 0, chunks = 0;
    xseg_status st;
    if (idle && d->exp.keep_handles && !s->handles_out)
        st = seg_unmap_keep(s->vseg, lo, hi - lo, &d->exp.handles, &unmapped, &chunks);
    else
        st = (idle ? seg_unmap_idle : seg_unmap)(s->vseg, lo, hi - lo, &unmapped, &chunks);
    if (unmapped) {
        if (XSEG_UNLIKELY(hist_mode()))
            hist_record(HIST_SEGMENT_UNMAP, d->device, (uintptr_t)seg_base(s->vseg) + lo, unmapped,
                        (uintptr_t)s->stream, d->hist_cur);
        dev_count_unmapped(d, block_pool(b), unmapped, chunks);
    }
    return st;
}

/* unmap_chunks over [lo, hi) (whole chunks) except the chunks holding pages of a registration
 * in force (core/policy/registry.h): those stay mapped, and retile follows the granules' state. */
static xseg_status unmap_unregistered(struct dev_alloc *d, struct block *b, size_t lo, size_t hi, bool idle)
{
    struct segrec *s = b->seg;
    uintptr_t base = (uintptr_t)seg_base(s->vseg), plo, phi;
    if (XSEG_LIKELY(!reg_first_registered(d, base + lo, base + hi, &plo, &phi)))
        return unmap_chunks(d, b, lo, hi, idle);
    xseg_status first = XSEG_SUCCESS;
    size_t gran = seg_g(s), cur = lo;
    while (cur < hi) {
        size_t end = hi, next = hi, c0, n;
        if (reg_first_registered(d, base + cur, base + hi, &plo, &phi)) {
            size_t a = plo > base + cur ? plo - base : cur, z = XSEG_MIN(phi - base, hi) - 1;
            if (!seg_chunk(s->vseg, a / gran, NULL, &c0, &n))
                c0 = a / gran;
            end = XSEG_MAX(c0 * gran, cur);
            if (!seg_chunk(s->vseg, z / gran, NULL, &c0, &n)) {
                c0 = z / gran;
                n = 1;
            }
            next = XSEG_MIN((c0 + n) * gran, hi);
        }
        size_t ilo, ihi;
        if (end > cur) {
            seg_inner_range(s->vseg, cur, end - cur, &ilo, &ihi);
            xseg_status st = ilo < ihi ? unmap_chunks(d, b, ilo, ihi, idle) : XSEG_SUCCESS;
            if (first == XSEG_SUCCESS)
                first = st;
        }
        cur = next > cur ? next : hi;
    }
    return first;
}

/*
 * Unmap the whole chunks inside free block @p b (in the free index): all of them, or only the
 * highest ones, as few as cover at least @p max_bytes (SIZE_MAX = all). The block is re-tiled by
 * the granules' actual state afterwards, so a partly failed unmap leaves correct bookkeeping.
 * Only unmapped neighbours of @p b can be merged away (and deleted) here. With @p idle the caller
 * knows the segment's stream has completed its work: no synchronize.
 */
static xseg_status unmap_pages_how(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle,
                                   size_t *host, bool strand);

static xseg_status unmap_pages(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle)
{
    return unmap_pages_how(d, b, max_bytes, idle, NULL, false);
}

/* unmap_pages; with @p host, the host chunks (spill) inside b go instead, their bytes added there
 * (with @p strand, stranded with no driver call: seg_drop_host). */
static xseg_status unmap_pages_how(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle,
                                   size_t *host, bool strand)
{
    lock_assert_held(&d->lock);
    struct bpool *pool = block_pool(b);
    size_t lo, hi;
    if (host) {
        size_t gran = seg_g(b->seg), off = seg_off(b);
        lo = page_up(off, gran);
        hi = page_down(off + b->size, gran);
        if (lo >= hi)
            return XSEG_SUCCESS;
    } else if (!unmap_range(b, max_bytes, &lo, &hi)) {
        return XSEG_SUCCESS;
    }
    /* The usual outcome has three pieces (head, hole, tail): get their structs first so that a
     * host allocation failure cannot strike after the driver has unmapped. */
    struct block *spare[2] = {dev_block_new(d), dev_block_new(d)};
    if (!spare[0] || !spare[1]) {
        for (int i = 0; i < 2; i++)
            if (spare[i])
                dev_block_delete(d, spare[i]);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for block metadata");
    }
    bpool_remove_free(pool, b);
    xseg_status st = host ? seg_drop_host(b->seg->vseg, lo, hi - lo, strand, host) : unmap_unregistered(d, b, lo, hi, idle);
    retile_free_block(d, b, lo, hi, spare);
    return st;
}

xseg_status exp_unmap_pages(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle)
{
    lock_assert_held(&d->lock);
    return unmap_pages(d, b, max_bytes, idle);
}

size_t exp_whole_page_bytes(const struct block *b) { return whole_page_bytes(b); }

xseg_status exp_drop_host(struct dev_alloc *d, struct block *b, bool strand, size_t *dropped)
{
    lock_assert_held(&d->lock);
    *dropped = 0;
    return unmap_pages_how(d, b, SIZE_MAX, true, dropped, strand);
}

void exp_recycle_begin(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    d->exp.keep_handles = true;
    d->exp.fine_chunks = true;
}


void exp_pressure_reset(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    d->exp.fine_chunks = false;
}

void exp_recycle_end(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    d->exp.keep_handles = false;
    if (d->exp.handles.n && drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        err_clear(); /* the releases need no context; a failed one waits in the leftovers */
    seg_spares_drain(&d->exp.handles);
}

bool exp_block_older(const struct block *a, const struct block *b) { return seg_order_less(a, b); }

void exp_release_empty_segments(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    struct segrec *s = d->segs;
    int capture = -1; /* asked once, where a segment holds set-aside chunks */
    while (s) {
        struct segrec *next = s->next_seg;
        struct block *b = s->first;
        if (s->vseg && b && !b->mapped && !b->next && seg_stranded_bytes(s->vseg) && capture < 0)
            capture = exp_capture_holds(d);
        if (s->vseg && b && !b->mapped && !b->next && !(seg_stranded_bytes(s->vseg) && capture == 1)) {
            bpool_unindex(b);
            dev_block_delete(d, b);
            (void)seg_destroy(s->vseg);
            dev_seglist_remove(d, s);
            by_stream_remove(d, s);
            bpool_bins_release(s->pool, s->stream);
            xs_free(s);
        }
        s = next;
    }
}

xseg_status exp_reclaim_leftovers(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    xseg_status first = XSEG_SUCCESS;
    for (struct segrec *s = d->segs; s; s = s->next_seg) {
        if (!s->vseg || !seg_stranded_bytes(s->vseg))
            continue;
        xseg_status st = seg_reclaim(s->vseg);
        if (st != XSEG_SUCCESS && first == XSEG_SUCCESS)
            first = st;
    }
    xseg_status st = seg_leftovers_retry();
    return first != XSEG_SUCCESS ? first : st;
}

/* A chunk exp_defragment may re-back: its segment, first granule, granules, free granules. */
struct defrag_cand {
    struct segrec *s;
    size_t first, n, nfree;
};

static int defrag_cmp(const void *pa, const void *pb)
{
    const struct defrag_cand *a = pa, *b = pb;
    if (a->nfree != b->nfree)
        return a->nfree > b->nfree ? -1 : 1;
    if (a->s->seq != b->s->seq)
        return a->s->seq < b->s->seq ? -1 : 1;
    return a->first < b->first ? -1 : a->first > b->first;
}

/* Per granule of @p s: 1 where a mapped block that is not free for reuse (allocated, waiting for
 * events or streams) overlaps it. NULL on host memory exhaustion. */
static unsigned char *defrag_keep_map(struct segrec *s)
{
    size_t G = seg_g(s), ng = seg_ngran(s->vseg);
    unsigned char *keep = xs_calloc(ng ? ng : 1, 1);
    if (!keep)
        return NULL;
    for (struct block *b = s->first; b; b = b->next) {
        if (!b->mapped || allocatable(b))
            continue;
        size_t off = seg_off(b);
        for (size_t g = off / G; g < (off + b->size + G - 1) / G && g < ng; g++)
            keep[g] = 1;
    }
    return keep;
}

/* After seg_refine gave back granules of [lo, hi) (bytes of segment @p s), re-tile the free
 * blocks there by the granules' state (unmap_pages: nothing is left to unmap in them, so it only
 * re-tiles). unmap_pages may merge and delete unmapped neighbours: each block is looked up again
 * by its address (free mapped blocks never touch, so their addresses stay). */
static void defrag_retile(struct dev_alloc *d, struct segrec *s, size_t lo, size_t hi)
{
    uintptr_t base = (uintptr_t)seg_base(s->vseg);
    uintptr_t addrs[64];
    size_t n = 0;
    uintptr_t after = 0; /* later rounds: blocks starting above it */
    for (;;) {
        n = 0;
        for (struct block *b = s->first; b && b->addr < base + hi && n < 64; b = b->next)
            if (b->addr + b->size > base + lo && (!after || b->addr > after) && b->mapped && allocatable(b) &&
                b->in_index)
                addrs[n++] = b->addr;
        if (!n)
            return;
        for (size_t k = 0; k < n; k++)
            for (struct block *b = s->first; b; b = b->next)
                if (b->addr == addrs[k]) {
                    if (b->mapped && allocatable(b) && b->in_index)
                        (void)unmap_pages(d, b, SIZE_MAX, true);
                    break;
                }
        if (n < 64)
            return;
        after = addrs[n - 1];
    }
}

/* The chunks exp_defragment may re-back, most free granules first (then by segment and place):
 * chunks of several granules with free ones, in the default large pool only. Fewer when host
 * memory runs out. */
static size_t defrag_candidates(struct dev_alloc *d, struct defrag_cand **out)
{
    struct defrag_cand *cand = NULL;
    size_t ncand = 0, cap = 0;
    for (struct segrec *s = d->segs; s; s = s->next_seg) {
        /* A private pool's free blocks may still be a captured graph's memory
         * (release_cached_blocks leaves pools in use alone too); small-pool pages are one
         * granule already. */
        if (!s->vseg || s->pool != &d->large || s->asleep || s->handles_out || seg_asleep_bytes(s->vseg))
            continue;
        unsigned char *keep = defrag_keep_map(s);
        if (!keep)
            break;
        size_t ng = seg_ngran(s->vseg);
        for (size_t g = 0; g < ng;) {
            size_t first, n;
            if (!seg_chunk(s->vseg, g, NULL, &first, &n)) {
                g++;
                continue;
            }
            size_t kept = 0;
            for (size_t i = first; i < first + n; i++)
                kept += keep[i];
            /* A registered range's pages keep their physical memory (core/policy/registry.h). */
            if (n > 1 && kept < n && !reg_range_registered(d, (uintptr_t)seg_base(s->vseg) + first * seg_g(s), n * seg_g(s))) {
                if (!VEC_RESERVE(cand, cap, ncand + 1))
                    break;
                cand[ncand++] = (struct defrag_cand){s, first, n, n - kept};
            }
            g = first + n;
        }
        xs_free(keep);
    }
    if (ncand > 1) /* qsort with a null base is undefined even for zero elements */
        qsort(cand, ncand, sizeof *cand, defrag_cmp);
    *out = cand;
    return ncand;
}

/* Re-back candidate @p c (seg_refine) and account for it: @p freed the bytes given back (0 when
 * it failed), @p created the new chunks. @return false when host memory ran out (no more). */
static bool defrag_one(struct dev_alloc *d, const struct defrag_cand *c, size_t *freed, size_t *created)
{
    struct segrec *s = c->s;
    /* The map again: an earlier re-backing in this segment changed nothing of this chunk's
     * blocks, but this keeps the rule in one place. */
    unsigned char *keep = defrag_keep_map(s);
    if (!keep)
        return false;
    size_t G = seg_g(s);
    /* Staged on the device (the old chunk kept until the new ones hold the bytes); through the
     * host only when the device (or the memory fraction) has no room for the new chunks beside
     * the old one. */
    bool host = !dev_fraction_allows(d, (c->n - c->nfree) * G);
    xseg_status st = seg_refine(s->vseg, c->first, keep + c->first, host, freed, created);
    if (st == XSEG_ERROR_OUT_OF_MEMORY && !host)
        st = seg_refine(s->vseg, c->first, keep + c->first, true, freed, created);
    xs_free(keep);
    if (st != XSEG_SUCCESS || !*freed)
        return true;
    dev_count_unmapped(d, s->pool, *freed, 1);
    dev_count_mapped(d, s->pool, 0, *created);
    if (XSEG_UNLIKELY(hist_mode()))
        hist_record(HIST_SEGMENT_UNMAP, d->device, (uintptr_t)seg_base(s->vseg) + c->first * G, *freed,
                    (uintptr_t)s->stream, d->hist_cur);
    defrag_retile(d, s, c->first * G, (c->first + c->n) * G);
    return true;
}

size_t exp_defragment(struct dev_alloc *d, size_t need, bool *more)
{
    lock_assert_held(&d->lock);
    struct defrag_cand *cand = NULL;
    size_t ncand = defrag_candidates(d, &cand), got = 0;
    need = page_up(need, d->cfg.expandable_page_size); /* what a growth maps */
    size_t i = 0, live_done = 0;
    for (; i < ncand && got < need; i++) {
        size_t freed = 0, created = 0;
        if (!defrag_one(d, &cand[i], &freed, &created))
            break;
        got += freed;
        live_done += freed && created != 0;
    }
    /* Another round may help only if this one re-backed a page holding live bytes (those never
     * come back as candidates) and such pages are left: the rounds end. A round of wholly free
     * chunks only (what a failed retry left mapped) is the last. */
    bool left = false;
    for (; i < ncand && !left; i++)
        left = cand[i].nfree < cand[i].n;
    *more = live_done && left;
    xs_free(cand);
    if (got)
        err_clear();
    return got;
}
