/*
 * Expandable segments beneath the block pools (PyTorch's find_expandable_block, map_block,
 * unmap_block, release_expandable_segment), over vmm/segment.h.
 *
 * Invariants, for every expandable segment (all under the device lock):
 *   - its blocks tile [base, base + VA size); unmapped blocks start and end on page boundaries;
 *   - two neighbours are never both free-and-mapped, nor both unmapped (they merge);
 *   - a block is mapped iff every page it overlaps is mapped;
 *   - reserved_bytes counts exactly the mapped bytes; each page mapped (unmapped) counts one
 *     num_device_alloc (num_device_free); segment.* and inactive_split* ignore these blocks.
 * Growth first reuses unmapped holes (oldest segment, lowest offset first, with a free block just
 * before them), then grows a segment of the same (pool, stream) at its end (seg_grow), then creates a segment.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "base/error.h"
#include "core/stats.h"
#include "vmm/segment.h"
#include "vmm/ipc.h"
#include "core/ipc.h"

static inline bool allocatable(const struct block *b)
{
    return b && !b->allocated && b->event_count == 0 && b->uses.n == 0;
}

static inline size_t seg_page(const struct segrec *s) { return seg_page_size(s->vseg); }

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
    struct block *b = alloc_block_new(d);
    if (!b)
        return NULL;
    b->addr = addr;
    b->size = size;
    b->stream = s->stream;
    b->pool = s->pool;
    b->seg = s;
    b->expandable = true;
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

/* An unmapped hole with room for @p size (PyTorch's search of pool->unmapped), the first in
 * seg_order_less order, so the choice is the same on every run and every driver. */
static struct block *find_hole(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size)
{
    lock_assert_held(&d->lock);
    (void)d;
    struct block *best = NULL, *best_hole = NULL;
    for (struct block *u = bpool_unmapped_lower_bound(pool, stream, 0); u && u->stream == stream;
         u = bpool_unmapped_lower_bound(pool, stream, u->addr + 1)) {
        if (best_hole && !seg_order_less(u, best_hole))
            continue;
        struct block *c = u;
        if (allocatable(c->prev))
            c = c->prev;
        if (chain_bytes(c, size) >= size) {
            best = c;
            best_hole = u;
        }
    }
    return best;
}

/* Grow a segment of (pool, stream) at its end so that its allocatable tail holds @p size. */
static struct block *grow_segment(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size)
{
    lock_assert_held(&d->lock);
    for (struct segrec *s = d->segs; s; s = s->next_seg) {
        if (!s->vseg || s->pool != pool || s->stream != stream || s->first == NULL)
            continue;
        if (s->vseg && seg_page(s) != (pool->is_small ? BLOCK_SMALL_BUFFER : d->cfg.expandable_page_size))
            continue;
        struct block *t = s->last, *c = NULL;
        size_t avail = 0;
        for (struct block *b = t; allocatable(b); b = b->prev) {
            c = b;
            avail += b->size;
        }
        size_t page = seg_page(s);
        size_t old_va = seg_va_size(s->vseg);
        size_t want = old_va + page_up(size - XSEG_MIN(avail, size), page);
        struct block *tail_new = NULL;
        if (!(allocatable(t) && !t->mapped)) {
            tail_new = new_unmapped(d, s, 0, 0);
            if (!tail_new)
                return NULL;
        }
        if (seg_grow(s->vseg, want) != XSEG_SUCCESS) {
            if (tail_new)
                alloc_block_delete(d, tail_new);
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
        /* Issue 15: shareable pages (xseg_ipc_export) and map/unmap observers. */
        .handle_types = d->cfg.expandable_segments_ipc ? ipc_handle_types(d->device, d->info.dev) : 0,
        .observe = obs_segment_hook,
        .observe_user = d,
    };
    struct segrec *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for segment metadata");
    struct seg *vseg = NULL;
    xseg_status st = seg_create(&params, page_up(size, page), &vseg);
    if (st != XSEG_SUCCESS) {
        free(s);
        return st;
    }
    s->vseg = vseg;
    s->pool = pool;
    s->stream = stream;
    s->size = seg_va_size(vseg);
    s->seq = ++d->seg_seq;
    struct block *b = new_unmapped(d, s, (uintptr_t)seg_base(vseg), s->size);
    if (!b) {
        (void)seg_destroy(vseg);
        free(s);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for segment metadata");
    }
    s->first = s->last = b;
    bpool_insert_unmapped(pool, b);
    alloc_seglist_add(d, s);
    *out = b;
    return XSEG_SUCCESS;
}

/* Map the first @p len bytes (a page multiple, or the whole block) of unmapped block @p b. */
static xseg_status map_block(struct dev_alloc *d, struct block *b, size_t len)
{
    lock_assert_held(&d->lock);
    struct segrec *s = b->seg;
    struct bpool *pool = b->pool;
    size_t page = seg_page(s);
    struct block *r = NULL;
    if (len < b->size) {
        r = new_unmapped(d, s, b->addr + len, b->size - len);
        if (!r)
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for block metadata");
    }
    size_t mapped = 0;
    xseg_status st = seg_map(s->vseg, b->addr - (uintptr_t)seg_base(s->vseg), len, &mapped);
    if (st != XSEG_SUCCESS) {
        if (r)
            alloc_block_delete(d, r);
        return st;
    }
    if (XSEG_UNLIKELY(hist_mode()))
        hist_record(HIST_SEGMENT_MAP, d->device, b->addr, len, (uintptr_t)s->stream, d->hist_cur);
    bpool_remove_unmapped(pool, b);
    if (r) {
        block_link_after(b, r);
        bpool_insert_unmapped(pool, r);
    }
    b->size = len;
    b->mapped = true;
    alloc_try_merge(d, b, b->prev);
    alloc_try_merge(d, b, b->next);
    b->gc_count_base = pool->get_free_blocks_call_count;
    bpool_insert_free(pool, b);
    alloc_count_mapped(d, pool, mapped, mapped / page);
    return XSEG_SUCCESS;
}

static size_t whole_page_bytes(const struct block *b);
static xseg_status unmap_pages(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle);

/* A free block whose whole pages may be recycled, with its sort keys. */
struct victim {
    struct block *b;
    size_t bytes;   /* whole-page bytes inside it */
    bool same_page; /* same page size as the pages about to be mapped */
};

/* Same page size first (exact exchange, no rounding); then the largest free runs first: each
 * costs one stream synchronization, and small gaps between live blocks are the likeliest to be
 * filled again by the next small request. Ties go to the older segment, then the lower offset in
 * it: never to the virtual address, which the driver (and the emulator's mmap) places
 * differently from run to run, so a replay would not repeat its own figures. */
static int victim_cmp(const void *pa, const void *pb)
{
    const struct victim *a = pa, *b = pb;
    if (a->same_page != b->same_page)
        return a->same_page ? -1 : 1;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    if (a->b == b->b)
        return 0;
    return seg_order_less(a->b, b->b) ? -1 : 1;
}

/* May free block @p v give up pages while the chain [first, last] is about to be mapped?
 * Unmapping re-tiles v and merges its unmapped pieces into unmapped neighbours (deleting them),
 * so v must be neither in the chain nor next to it. */
static bool victim_ok(const struct block *v, const struct block *first, const struct block *last)
{
    if (!v->expandable || v->seg != first->seg)
        return v->expandable;
    if (v->addr >= first->addr && v->addr <= last->addr)
        return false;
    return v->next != first && v->prev != last;
}

/*
 * Recycling (expandable_segments_recycle): reserved memory should be the pages in use, so before
 * @p need bytes of @p page-sized pages get mapped for the chain [first, last], unmap as many
 * bytes of fully free pages elsewhere on the device (any stream, either default pool): pages of
 * the same size first, then smaller pages (never a larger page than what is still needed, so
 * reserved never drops below the live data's pages plus what is mapped now). Nothing happens
 * while a capture is underway. Failures only end the recycling early: unmap_pages leaves
 * correct bookkeeping, and the caller maps new pages as it would have anyway.
 */
static void recycle_pages(struct dev_alloc *d, const struct block *first, const struct block *last,
                          size_t page, size_t need)
{
    lock_assert_held(&d->lock);
    struct block **arr[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    struct bpool *pools[2] = {&d->large, &d->small};
    for (int k = 0; k < 2; k++)
        if (!bpool_collect_free(pools[k], &arr[k], &n[k]))
            goto out; /* host memory is short: simply map new pages */
    struct victim *v = malloc((n[0] + n[1] + 1) * sizeof *v);
    if (!v)
        goto out;
    size_t nv = 0;
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < n[k]; i++) {
            struct block *b = arr[k][i];
            if (!victim_ok(b, first, last) || b->seg->asleep) /* asleep: core/sleep.h */
                continue;
            size_t bytes = whole_page_bytes(b);
            size_t vpage = seg_page(b->seg);
            if (bytes == 0 || (vpage != page && vpage > need))
                continue;
            v[nv++] = (struct victim){b, bytes, vpage == page};
        }
    }
    if (nv && !alloc_capture_underway(d, true)) {
        qsort(v, nv, sizeof *v, victim_cmp);
        size_t got = 0;
        for (size_t i = 0; i < nv && got < need; i++) {
            size_t before = d->total_allocated_memory;
            if (unmap_pages(d, v[i].b, need - got, false) != XSEG_SUCCESS) {
                got += before - d->total_allocated_memory;
                break;
            }
            got += before - d->total_allocated_memory;
        }
    }
    free(v);
out:
    free(arr[0]);
    free(arr[1]);
}

xseg_status exp_allocate(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                         struct block **out)
{
    lock_assert_held(&d->lock);
    struct block *c = find_hole(d, pool, stream, size);
    if (!c)
        c = grow_segment(d, pool, stream, size);
    if (!c) {
        xseg_status st = create_segment(d, pool, stream, size, &c);
        if (st != XSEG_SUCCESS)
            return st;
    }
    size_t page = seg_page(c->seg);

    /* What would be mapped, for the fraction limit (checked before touching the driver). */
    size_t need = 0, covered = 0;
    const struct block *chain_last = c;
    for (const struct block *b = c; covered < size; b = b->next) {
        chain_last = b;
        if (b->mapped) {
            covered += b->size;
        } else {
            size_t len = XSEG_MIN(b->size, page_up(size - covered, page));
            need += len;
            covered += len;
        }
    }
    if (need && d->cfg.expandable_segments_recycle)
        recycle_pages(d, c, chain_last, page, need);
    if (!alloc_fraction_allows(d, need)) {
        exp_release_empty_segments(d);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "memory fraction limit reached");
    }

    struct block *cur = c;
    while (!cur->mapped || cur->size < size) {
        struct block *to_map = cur->mapped ? cur->next : cur;
        size_t remaining = size - (cur->mapped ? cur->size : 0);
        size_t len = XSEG_MIN(to_map->size, page_up(remaining, page));
        xseg_status st = map_block(d, to_map, len);
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
    size_t page = seg_page(b->seg);
    size_t off = b->addr - (uintptr_t)seg_base(b->seg->vseg);
    size_t lo = page_up(off, page), hi = page_down(off + b->size, page);
    return lo < hi ? hi - lo : 0;
}

/*
 * Unmap whole pages inside free block @p b (in the free index): all of them, or only the highest
 * ones covering at most @p max_bytes (rounded down to pages; SIZE_MAX = all). The block is
 * re-tiled by the pages' actual state afterwards, so a partly failed unmap leaves correct
 * bookkeeping. Only unmapped neighbours of @p b can be merged away (and deleted) here. With
 * @p idle the caller knows the segment's stream has completed its work: no synchronize.
 */
static xseg_status unmap_pages(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle)
{
    lock_assert_held(&d->lock);
    struct segrec *s = b->seg;
    struct bpool *pool = b->pool;
    size_t page = seg_page(s);
    uintptr_t base = (uintptr_t)seg_base(s->vseg);
    size_t off = b->addr - base;
    size_t lo = page_up(off, page), hi = page_down(off + b->size, page);
    if (lo >= hi)
        return XSEG_SUCCESS;
    if (max_bytes / page * page < hi - lo) {
        if (max_bytes < page)
            return XSEG_SUCCESS;
        lo = hi - max_bytes / page * page;
    }

    /* The usual outcome has three pieces (head, hole, tail): get their structs first so that a
     * host allocation failure cannot strike after the driver has unmapped. */
    struct block *spare[2] = {alloc_block_new(d), alloc_block_new(d)};
    if (!spare[0] || !spare[1]) {
        for (int i = 0; i < 2; i++)
            if (spare[i])
                alloc_block_delete(d, spare[i]);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for block metadata");
    }
    int nspare = 2;

    bpool_remove_free(pool, b);
    size_t unmapped = 0;
    xseg_status st = (idle ? seg_unmap_idle : seg_unmap)(s->vseg, lo, hi - lo, &unmapped);
    if (unmapped) {
        if (XSEG_UNLIKELY(hist_mode()))
            hist_record(HIST_SEGMENT_UNMAP, d->device, base + lo, unmapped, (uintptr_t)s->stream, d->hist_cur);
        alloc_count_unmapped(d, pool, unmapped, unmapped / page);
    }

    /* Re-tile [b->addr, end) by mapped state: head (mapped), pages lo..hi as the driver left
     * them (all unmapped on success), tail (mapped). b becomes the first piece. */
    uintptr_t end = b->addr + b->size;
    struct block *orig_prev = b->prev, *orig_next = b->next;
    struct block *cur = NULL;
    uintptr_t pos = b->addr;
    while (pos < end) {
        size_t poff = pos - base;
        bool m;
        uintptr_t run_end;
        if (poff < lo) {
            m = true;
            run_end = base + lo;
        } else if (poff >= hi) {
            m = true;
            run_end = end;
        } else {
            m = seg_page_is_mapped(s->vseg, poff / page) != 0;
            size_t q = poff + page;
            while (q < hi && (seg_page_is_mapped(s->vseg, q / page) != 0) == m)
                q += page;
            run_end = base + q;
        }
        if (cur && cur->mapped == m) {
            /* Same state as the piece before (the head, or pages a failed unmap left mapped
             * next to it): one block, or two free neighbours would sit unmerged. */
            cur->size += run_end - pos;
            pos = run_end;
            continue;
        }
        struct block *piece;
        if (!cur) {
            piece = b;
        } else {
            piece = nspare ? spare[--nspare] : alloc_block_new(d);
            if (!piece)
                abort(); /* host memory exhausted after a partial driver unmap: cannot recover */
            piece->stream = b->stream;
            piece->pool = pool;
            piece->seg = s;
            piece->expandable = true;
            block_link_after(cur, piece);
        }
        piece->addr = pos;
        piece->size = run_end - pos;
        piece->mapped = m;
        piece->requested_size = 0;
        cur = piece;
        pos = run_end;
    }
    while (nspare)
        alloc_block_delete(d, spare[--nspare]);

    /* Pieces merge with the original neighbours where the states match (an unmapped hole next
     * to an unmapped neighbour); then everything goes into its index. */
    struct block *first = b, *last = cur;
    if (orig_prev)
        alloc_try_merge(d, first, orig_prev);
    if (orig_next)
        alloc_try_merge(d, last, orig_next);
    for (struct block *p = first;; p = p->next) {
        if (p->mapped) {
            p->gc_count_base = pool->get_free_blocks_call_count;
            bpool_insert_free(pool, p);
        } else {
            bpool_insert_unmapped(pool, p);
        }
        if (p == last)
            break;
    }
    return st;
}

xseg_status exp_unmap_block(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    return unmap_pages(d, b, SIZE_MAX, false);
}

xseg_status exp_unmap_pages(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle)
{
    return unmap_pages(d, b, max_bytes, idle);
}

size_t exp_whole_page_bytes(const struct block *b) { return whole_page_bytes(b); }

bool exp_block_older(const struct block *a, const struct block *b) { return seg_order_less(a, b); }

void exp_release_empty_segments(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    struct segrec *s = d->segs;
    while (s) {
        struct segrec *next = s->next_seg;
        struct block *b = s->first;
        if (s->vseg && b && !b->mapped && !b->next) {
            bpool_unindex(b);
            alloc_block_delete(d, b);
            (void)seg_destroy(s->vseg);
            alloc_seglist_remove(d, s);
            free(s);
        }
        s = next;
    }
}

xseg_status exp_reclaim_leftovers(struct dev_alloc *d)
{
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
