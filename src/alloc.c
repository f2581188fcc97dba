/*
 * The device allocator (see alloc.h): malloc, free, empty_cache, the OOM path, garbage
 * collection, the memory fraction, snapshots. Statistics follow PyTorch's DeviceCachingAllocator
 * exactly, including what it leaves out for expandable blocks (segment.*, inactive_split*).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/alloc.h"
#include "src/error.h"
#include "src/runtime.h"
#include "src/stats.h"
#include "vmm/segment.h"

/* Everything the slow path needs about one request (PyTorch's AllocParams). */
struct alloc_params {
    size_t size;       /* rounded request */
    size_t alloc_size; /* size of a new classic segment */
    CUstream stream;
    struct bpool *pool;
    struct block *block; /* the block found or made */
};

/* ---- block structs ----------------------------------------------------------------------- */

struct block *alloc_block_new(struct dev_alloc *d)
{
    struct block *b = d->spare;
    if (b) {
        d->spare = b->next;
        memset(b, 0, sizeof *b);
        return b;
    }
    return calloc(1, sizeof *b);
}

/* @p b must be in no index and have no pending events; its stream set is cleared here. The
 * split on the fast path relies on this to reuse a spare struct without clearing it. */
void alloc_block_delete(struct dev_alloc *d, struct block *b)
{
    stream_set_clear(&b->uses);
    b->next = d->spare;
    d->spare = b;
}

/* ---- configuration ----------------------------------------------------------------------- */

static void apply_fraction(struct dev_alloc *d, double fraction)
{
    d->fraction = fraction;
    if (fraction < 1.0) {
        d->set_fraction = true;
        d->allowed_memory_maximum = (size_t)(fraction * (double)d->info.total_mem);
    } else {
        d->set_fraction = false;
        d->allowed_memory_maximum = d->info.total_mem;
    }
}

static void refresh_cfg_slow(struct dev_alloc *d)
{
    double old_fraction = d->cfg.per_process_memory_fraction;
    bool first = d->cfg_gen == 0;
    rt_cfg_copy(&d->cfg, &d->cfg_gen);
    d->roundup_any = false;
    for (int i = 0; i < CFG_ROUNDUP_BUCKETS; i++)
        if (d->cfg.roundup_power2_divisions[i] > 1)
            d->roundup_any = true;
    d->use_expandable = d->cfg.expandable_segments && d->info.vmm_supported;
    /* The config key sets the fraction when it changes; xseg_set_memory_fraction overrides it
     * until the key changes again. */
    if (first || d->cfg.per_process_memory_fraction != old_fraction)
        apply_fraction(d, d->cfg.per_process_memory_fraction);
    d->stats.max_split_size =
        d->cfg.max_split_size == SIZE_MAX ? INT64_MAX : (int64_t)d->cfg.max_split_size;
}

static inline void refresh_cfg(struct dev_alloc *d)
{
    if (XSEG_UNLIKELY(rt_cfg_gen() != d->cfg_gen))
        refresh_cfg_slow(d);
}

xseg_status alloc_create(int device, struct dev_alloc **out)
{
    struct dev_alloc *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory creating the allocator of device %d", device);
    xseg_status st = drv_device_query(device, &d->info);
    if (st != XSEG_SUCCESS) {
        free(d);
        return st;
    }
    lock_init(&d->lock);
    d->device = device;
    d->small.is_small = true;
    d->small.stat_index = XSEG_STAT_SMALL_POOL;
    d->large.stat_index = XSEG_STAT_LARGE_POOL;
    refresh_cfg_slow(d);
    if (d->cfg.expandable_segments && !d->info.vmm_supported)
        fprintf(stderr, "xseg: device %d does not support virtual memory management; using classic segments\n",
                device);
    *out = d;
    return XSEG_SUCCESS;
}

/* ---- sizes ------------------------------------------------------------------------------- */

static size_t roundup_power2_next_division(size_t size, unsigned divisions)
{
    if ((size & (size - 1)) == 0)
        return size;
    size_t floor2 = (size_t)1 << (63 - __builtin_clzll((unsigned long long)size));
    size_t step = floor2 >> (31 - __builtin_clz(divisions));
    if (step == 0)
        return floor2 << 1;
    size_t f = size & ~(step - 1);
    return f == size ? size : f + step;
}

static inline size_t round_size(const struct dev_alloc *d, size_t size)
{
    if (size < BLOCK_MIN_SIZE)
        return BLOCK_MIN_SIZE;
    if (XSEG_UNLIKELY(d->roundup_any)) {
        unsigned div = cfg_roundup_divisions(&d->cfg, size);
        if (div > 1 && size > BLOCK_MIN_SIZE * div)
            return roundup_power2_next_division(size, div);
    }
    return xseg_align_up(size, BLOCK_MIN_SIZE);
}

static size_t allocation_size(const struct dev_alloc *d, size_t size)
{
    if (size <= BLOCK_SMALL_SIZE)
        return BLOCK_SMALL_BUFFER;
    if (size < BLOCK_MIN_LARGE_ALLOC)
        return d->cfg.large_segment_size;
    return xseg_align_up(size, BLOCK_ROUND_LARGE);
}

/* ---- segments list ----------------------------------------------------------------------- */

static void seglist_add(struct dev_alloc *d, struct segrec *s)
{
    s->prev_seg = NULL;
    s->next_seg = d->segs;
    if (d->segs)
        d->segs->prev_seg = s;
    d->segs = s;
}

static void seglist_remove(struct dev_alloc *d, struct segrec *s)
{
    if (s->prev_seg)
        s->prev_seg->next_seg = s->next_seg;
    else
        d->segs = s->next_seg;
    if (s->next_seg)
        s->next_seg->prev_seg = s->prev_seg;
}

/* ---- capture ----------------------------------------------------------------------------- */

static int stream_capturing(struct dev_alloc *d, CUstream stream, xseg_status *st)
{
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    *st = XSEG_SUCCESS;
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS) {
        *st = XSEG_ERROR_DRIVER;
        return 0;
    }
    CUresult r = drv->cuStreamIsCapturing(stream, &cs);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuStreamIsCapturing(stream %p) on device %d", (void *)stream, d->device);
        *st = drv_fail(r, what);
        if (*st == XSEG_ERROR_OUT_OF_MEMORY)
            *st = XSEG_ERROR_DRIVER;
        return 0;
    }
    return cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

static void capture_note(struct dev_alloc *d, CUstream stream)
{
    for (size_t i = 0; i < d->ncapturing; i++)
        if (d->capturing[i] == stream)
            return;
    if (d->ncapturing == d->capcapturing) {
        size_t ncap = d->capcapturing ? d->capcapturing * 2 : 4;
        CUstream *p = realloc(d->capturing, ncap * sizeof *p);
        if (!p)
            return; /* only a hint; the slow path re-checks anyway */
        d->capturing = p;
        d->capcapturing = ncap;
    }
    d->capturing[d->ncapturing++] = stream;
    alloc_fast_off(d);
}

bool alloc_capture_underway(struct dev_alloc *d, bool all_streams)
{
    xseg_status st;
    bool any = false;
    if (d->nroutes)
        return true; /* a pool records: take a capture to be underway without asking the driver */
    for (size_t i = 0; i < d->ncapturing;) {
        if (stream_capturing(d, d->capturing[i], &st)) {
            any = true;
            i++;
        } else {
            d->capturing[i] = d->capturing[--d->ncapturing];
        }
    }
    if (!all_streams)
        return any;
    for (struct segrec *s = d->segs; s; s = s->next_seg) {
        if (stream_capturing(d, s->stream, &st)) {
            capture_note(d, s->stream);
            any = true;
        }
    }
    return any;
}

static xseg_status capture_error(CUstream stream)
{
    return err_set(XSEG_ERROR_ILLEGAL_STATE,
                   "allocation on stream %p during stream capture needs a private pool "
                   "(xseg_begin_allocate_to_pool)", (void *)stream);
}

/* ---- statistics helpers ------------------------------------------------------------------ */

static inline void stat_pool(xseg_stat_counter *arr, const struct bpool *p, int64_t delta)
{
    stat_add_pool(arr, p->stat_index, delta);
}

/* ---- free index lookups ------------------------------------------------------------------ */

static inline size_t expandable_size(const struct block *b)
{
    return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
}

/* get_free_block's search past the first fit @p b when it is expandable; NULL when none fits. */
static __attribute__((noinline)) struct block *find_expandable_fit(struct dev_alloc *d, const struct alloc_params *p,
                                                                   struct block *b)
{
    struct bpool *pool = p->pool;
    if (d->use_expandable) {
        /* For best fit, an expandable block counts with the unmapped space after it. */
        struct block *n = bpool_next_free(pool, b);
        while (b->expandable && n && n->stream == p->stream && expandable_size(n) < expandable_size(b)) {
            b = n;
            n = bpool_next_free(pool, b);
        }
    } else {
        /* Expandable segments turned off: honour it by using classic blocks only. */
        do {
            b = bpool_next_free(pool, b);
        } while (b && b->expandable && b->stream == p->stream);
        if (!b || b->stream != p->stream)
            return NULL;
    }
    return b;
}

/* PyTorch's get_free_block: best fit on the same stream, with the max_split_size rules. The block
 * found stays in the free index; *pred is its index predecessor (NULL: none), or *pred_ok is
 * false when the search moved past the first fit and the predecessor is unknown. */
static inline __attribute__((always_inline)) struct block *
find_free_block(struct dev_alloc *d, const struct alloc_params *p, struct block **pred, bool *pred_ok)
{
    struct bpool *pool = p->pool;
    if (XSEG_UNLIKELY(d->set_fraction && d->cfg.garbage_collection_threshold > 0.0))
        pool->get_free_blocks_call_count++;
    struct block *next;
    struct block *b = bpool_fit(pool, p->stream, p->size, pred, &next);
    *pred_ok = true;
    if (!b || b->stream != p->stream)
        return NULL;
    /* An expandable first fit stays the choice unless the next block of the stream counts less
     * with its unmapped tail (find_expandable_fit goes on from there). */
    if (b->expandable &&
        (!d->use_expandable || (next && next->stream == p->stream && expandable_size(next) < expandable_size(b)))) {
        struct block *first = b;
        b = find_expandable_fit(d, p, b);
        if (!b)
            return NULL;
        *pred_ok = b == first;
    }
    size_t msplit = d->cfg.max_split_size;
    if (p->size < msplit && b->size >= msplit)
        return NULL;
    if (p->size >= msplit && b->size >= p->size + d->cfg.max_non_split_rounding)
        return NULL;
    return b;
}
/* get_free_block for the slow path: the block found is taken out of the free index. */
static bool get_free_block(struct dev_alloc *d, struct alloc_params *p)
{
    struct block *pred;
    bool pred_ok;
    struct block *b = find_free_block(d, p, &pred, &pred_ok);
    if (!b)
        return false;
    bpool_remove_free(p->pool, b);
    p->block = b;
    return true;
}

static inline bool should_split(const struct dev_alloc *d, const struct block *b, size_t size)
{
    size_t remaining = b->size - size;
    if (b->pool->is_small || d->use_expandable)
        return remaining >= BLOCK_MIN_SIZE;
    return size < d->cfg.max_split_size && remaining > BLOCK_SMALL_SIZE;
}

/* Insert a free block into its pool's free index (resetting its GC clock). */
static inline void pool_insert_free(struct bpool *pool, struct block *b)
{
    b->gc_count_base = pool->get_free_blocks_call_count;
    bpool_insert_free(pool, b);
}

/* ---- merge / free ------------------------------------------------------------------------ */

size_t alloc_try_merge(struct dev_alloc *d, struct block *dst, struct block *src)
{
    if (!src || src->allocated || src->event_count > 0 || src->uses.n || dst->mapped != src->mapped)
        return 0;
    bpool_unindex(src);
    if (dst->prev == src) {
        dst->addr = src->addr;
        dst->prev = src->prev;
        if (dst->prev)
            dst->prev->next = dst;
        else
            dst->seg->first = dst;
    } else {
        dst->next = src->next;
        if (dst->next)
            dst->next->prev = dst;
        else
            dst->seg->last = dst;
    }
    size_t sub = src->size;
    dst->size += sub;
    alloc_block_delete(d, src);
    return sub;
}

/* The active counters of a block that stops being active (all paths of free_block). */
static inline void account_inactive(struct dev_alloc *d, int si, size_t size, size_t requested)
{
    stat_down_pool(d->stats.active, si, 1);
    stat_down_pool(d->stats.active_bytes, si, (int64_t)size);
    stat_down_pool(d->stats.requested_bytes, si, (int64_t)requested);
}

/* free_block when b has no free neighbour or two: merge through alloc_try_merge, re-index. Out
 * of line so that the common case keeps few registers live. */
static __attribute__((noinline)) void free_block_general(struct dev_alloc *d, struct block *b)
{
    struct bpool *pool = b->pool;
    size_t orig_size = b->size, requested = b->requested_size;
    int64_t net_blocks = 0, net_bytes = 0;
    struct block *cands[2] = {b->prev, b->next};
    for (int i = 0; i < 2; i++) {
        size_t sub = alloc_try_merge(d, b, cands[i]);
        if (sub) {
            net_blocks -= 1;
            net_bytes -= (int64_t)sub;
        }
    }
    b->requested_size = 0;
    pool_insert_free(pool, b);
    if (block_is_split(b)) {
        net_blocks += 1;
        net_bytes += (int64_t)b->size;
    }
    /* inactive_split leaves expandable blocks out: their free pages can always be released. */
    if (!b->expandable) {
        if (net_blocks)
            stat_pool(d->stats.inactive_split, pool, net_blocks);
        if (net_bytes)
            stat_pool(d->stats.inactive_split_bytes, pool, net_bytes);
    }
    account_inactive(d, pool->stat_index, orig_size, requested);
}

static inline __attribute__((always_inline)) void free_block(struct dev_alloc *d, struct block *b)
{
    struct block *prev = b->prev, *next = b->next;
    /* A neighbour in the free index (in_index && mapped) is free, mapped, with no events and no
     * recorded streams: alloc_try_merge's rule holds for it (b is mapped). A mergeable neighbour
     * outside every index does not exist while free_block runs, so "exactly one neighbour in the
     * free index" is "exactly one can merge". */
    bool fp = prev && (prev->in_index & prev->mapped), fn = next && (next->in_index & next->mapped);
    if (XSEG_UNLIKELY(fp == fn)) {
        free_block_general(d, b);
        return;
    }
    /* One free neighbour, in the free index: it absorbs b and stays where it is in the index
     * unless its larger key crosses its successor's (bpool_free_grow). Same result as the general
     * path (the merged block is the same range), with no treap remove/insert. */
    struct bpool *pool = b->pool;
    int si = pool->stat_index;
    size_t orig_size = b->size, requested = b->requested_size;
    struct block *keep = fn ? next : prev;
    size_t keep_size = keep->size;
    if (keep == next) {
        bpool_free_grow(pool, next, b->addr, next->size + b->size);
        next->prev = prev;
        if (prev)
            prev->next = next;
        else
            next->seg->first = next;
    } else {
        bpool_free_grow(pool, prev, prev->addr, prev->size + b->size);
        prev->next = next;
        if (next)
            next->prev = prev;
        else
            prev->seg->last = prev;
    }
    keep->gc_count_base = pool->get_free_blocks_call_count;
    alloc_block_delete(d, b);
    /* free_block_general's accounting with its signs known: keep was an inactive split block of
     * keep_size bytes; the merged one is split (same count, orig_size more bytes) unless it now
     * spans its whole segment. */
    if (!keep->expandable) {
        if (XSEG_LIKELY(block_is_split(keep))) {
            stat_up_pool(d->stats.inactive_split_bytes, si, (int64_t)orig_size);
        } else {
            stat_down_pool(d->stats.inactive_split, si, 1);
            stat_down_pool(d->stats.inactive_split_bytes, si, (int64_t)keep_size);
        }
    }
    account_inactive(d, si, orig_size, requested);
}

void alloc_free_block(struct dev_alloc *d, struct block *b) { free_block(d, b); }

/* ---- classic segments -------------------------------------------------------------------- */

/* cuMemAlloc a new segment for p (PyTorch's alloc_block, classic branch). Returns SUCCESS with
 * p->block set, OUT_OF_MEMORY (recoverable), or another error. The lock may be dropped. */
static xseg_status alloc_classic(struct dev_alloc *d, struct alloc_params *p)
{
    size_t size = p->alloc_size;
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return XSEG_ERROR_DRIVER;
    struct segrec *sr = calloc(1, sizeof *sr);
    struct block *b = alloc_block_new(d);
    if (!sr || !b) {
        free(sr);
        if (b)
            alloc_block_delete(d, b);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for segment metadata");
    }
    CUdeviceptr ptr = 0;
    CUresult r;
    /* During a GLOBAL-mode capture the driver rejects cuMemAlloc (and invalidates the capture)
     * unless this thread is in relaxed mode: switch around the call, as PyTorch's
     * cudaMallocMaybeCapturing does. The mode is per thread, so dropping the lock is fine. */
    bool relax = d->nroutes || d->ncapturing;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (relax && drv->cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS)
        relax = false;
    if (d->cfg.release_lock_on_cudamalloc) {
        lock_release(&d->lock);
        r = drv->cuMemAlloc(&ptr, size);
        lock_acquire(&d->lock);
    } else {
        r = drv->cuMemAlloc(&ptr, size);
    }
    if (relax)
        (void)drv->cuThreadExchangeStreamCaptureMode(&mode);
    if (r != CUDA_SUCCESS) {
        free(sr);
        alloc_block_delete(d, b);
        char what[96];
        snprintf(what, sizeof what, "cuMemAlloc(%zu bytes) on device %d", size, d->device);
        return drv_fail(r, what);
    }
    d->total_allocated_memory += size;
    b->addr = (uintptr_t)ptr;
    b->size = size;
    b->stream = p->stream;
    b->pool = p->pool;
    b->seg = sr;
    b->mapped = true;
    sr->first = b;
    sr->last = b;
    sr->pool = p->pool;
    sr->stream = p->stream;
    sr->size = size;
    seglist_add(d, sr);
    stat_pool(d->stats.segment, p->pool, 1);
    stat_pool(d->stats.reserved_bytes, p->pool, (int64_t)size);
    if (size >= d->cfg.max_split_size) {
        sr->oversize = true;
        stat_add(&d->stats.oversize_segments, 1);
    }
    d->stats.num_device_alloc++;
    p->block = b;
    return XSEG_SUCCESS;
}

/* cuMemFree an unsplit free classic block (in the free index) and its segment. */
static xseg_status release_block(struct dev_alloc *d, struct block *b)
{
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return XSEG_ERROR_DRIVER;
    CUresult r = drv->cuMemFree((CUdeviceptr)b->addr);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuMemFree(0x%" PRIxPTR ") on device %d", b->addr, d->device);
        xseg_status st = drv_fail(r, what);
        return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
    }
    struct segrec *sr = b->seg;
    d->stats.num_device_free++;
    d->total_allocated_memory -= b->size;
    stat_pool(d->stats.segment, b->pool, -1);
    stat_pool(d->stats.reserved_bytes, b->pool, -(int64_t)b->size);
    if (sr->oversize)
        stat_add(&d->stats.oversize_segments, -1);
    bpool_remove_free(b->pool, b);
    seglist_remove(d, sr);
    free(sr);
    alloc_block_delete(d, b);
    return XSEG_SUCCESS;
}

/* PyTorch's alloc_block: the fraction limit, then a new classic segment or expandable room. */
static xseg_status alloc_block(struct dev_alloc *d, struct alloc_params *p, bool is_retry)
{
    if (is_retry)
        d->stats.num_alloc_retries++;
    if (d->use_expandable)
        return exp_allocate(d, p->pool, p->stream, p->size, &p->block);
    if (d->set_fraction && d->total_allocated_memory + p->alloc_size > d->allowed_memory_maximum)
        return XSEG_ERROR_OUT_OF_MEMORY;
    return alloc_classic(d, p);
}

/* ---- releasing cached memory ------------------------------------------------------------- */

static xseg_status release_blocks(struct dev_alloc *d, struct bpool *pool)
{
    struct block **arr;
    size_t n;
    if (!bpool_collect_free(pool, &arr, &n))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory releasing cached blocks");
    xseg_status first = XSEG_SUCCESS;
    /* Classic first: unmapping splits expandable blocks, which changes the index under us. */
    for (size_t i = 0; i < n; i++) {
        struct block *b = arr[i];
        if (!b->expandable && !block_is_split(b)) {
            xseg_status st = release_block(d, b);
            if (st != XSEG_SUCCESS && first == XSEG_SUCCESS)
                first = st;
            arr[i] = NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct block *b = arr[i];
        if (b && b->expandable) {
            xseg_status st = exp_unmap_block(d, b);
            if (st != XSEG_SUCCESS && first == XSEG_SUCCESS)
                first = st;
        }
    }
    free(arr);
    return first;
}

xseg_status alloc_release_blocks(struct dev_alloc *d, struct bpool *pool) { return release_blocks(d, pool); }

/* PyTorch's release_cached_blocks: the default pools, then the private pools nobody uses any
 * more. Nothing is released while a capture is underway on a stream the allocator knows (or a
 * pool records). */
static xseg_status release_cached_blocks(struct dev_alloc *d)
{
    if (alloc_capture_underway(d, true))
        return XSEG_SUCCESS;
    ev_synchronize_all(d);
    xseg_status st1 = release_blocks(d, &d->large);
    xseg_status st2 = release_blocks(d, &d->small);
    xseg_status st3 = d->pools ? pools_release_freeable(d) : XSEG_SUCCESS;
    exp_release_empty_segments(d);
    if (d->pools)
        pools_reap(d);
    return st1 != XSEG_SUCCESS ? st1 : st2 != XSEG_SUCCESS ? st2 : st3;
}

/* PyTorch's release_available_cached_blocks: with a max_split_size, free one oversize cached
 * block that is large enough, else several oversize blocks, largest first. */
static bool release_available_cached_blocks(struct dev_alloc *d, const struct alloc_params *p)
{
    size_t msplit = d->cfg.max_split_size;
    if (msplit == SIZE_MAX)
        return false;
    struct bpool *pool = p->pool;
    size_t key = p->size < msplit ? msplit : p->size;
    struct block *b = bpool_lower_bound(pool, p->stream, key, 0);
    if (!b || b->stream != p->stream || b->expandable) {
        size_t released = 0;
        struct block *c = bpool_prev_free(pool, p->stream, key, 0);
        while (c && released < key && c->size >= msplit && c->stream == p->stream) {
            struct block *prevb = bpool_prev_free(pool, c->stream, c->size, c->addr);
            if (!c->expandable && !block_is_split(c)) {
                size_t sz = c->size;
                if (release_block(d, c) == XSEG_SUCCESS)
                    released += sz;
            }
            c = prevb;
        }
        return released >= key;
    }
    if (block_is_split(b))
        return false;
    return release_block(d, b) == XSEG_SUCCESS;
}

static inline uint64_t gc_age(const struct block *b)
{
    return b->pool->get_free_blocks_call_count - b->gc_count_base;
}

/* PyTorch's garbage_collect_cached_blocks: free aged unsplit classic blocks of the large pool
 * until the reserve is back under threshold × allowed. */
static void garbage_collect_cached_blocks(struct dev_alloc *d)
{
    size_t threshold = (size_t)(d->cfg.garbage_collection_threshold * (double)d->allowed_memory_maximum);
    if (d->total_allocated_memory <= threshold)
        return;
    size_t target = d->total_allocated_memory - threshold, reclaimed = 0;
    struct block **arr;
    size_t n;
    if (!bpool_collect_free(&d->large, &arr, &n))
        return;
    uint64_t total_age = 0;
    size_t freeable = 0;
    for (size_t i = 0; i < n; i++) {
        if (!block_is_split(arr[i]) && !arr[i]->expandable) {
            total_age += gc_age(arr[i]);
            freeable++;
        }
    }
    bool freed = true;
    while (reclaimed < target && freed && freeable > 0) {
        double age_threshold = (double)total_age / (double)freeable;
        freed = false;
        for (size_t i = 0; i < n; i++) {
            struct block *b = arr[i];
            if (!b || block_is_split(b) || b->expandable || (double)gc_age(b) < age_threshold)
                continue;
            uint64_t age = gc_age(b);
            size_t sz = b->size;
            if (release_block(d, b) != XSEG_SUCCESS)
                continue;
            arr[i] = NULL;
            freed = true;
            reclaimed += sz;
            total_age -= age;
            freeable--;
        }
    }
    free(arr);
}

/* ---- malloc ------------------------------------------------------------------------------ */

/* Hand out p->block: split off the remainder, account. @p indexed: the block is still in the free
 * index with index predecessor @p pred (the fast path); else it was taken out of the index. */
static inline __attribute__((always_inline)) struct block *
alloc_found_block(struct dev_alloc *d, struct alloc_params *p, size_t orig_size, bool indexed, const struct block *pred)
{
    struct block *b = p->block;
    struct bpool *pool = p->pool;
    int si = pool->stat_index;
    bool already_split = block_is_split(b);
    bool whole = true;
    if (should_split(d, b, p->size)) {
        /* The allocated front gets a new block struct; b stays the free remainder after it. An
         * indexed b keeps its place in the free index unless its smaller key crosses its
         * predecessor's (bpool_free_take_front): no treap remove/insert in the common case. */
        struct block *a = d->spare;
        if (XSEG_LIKELY(a))
            d->spare = a->next;
        else
            a = calloc(1, sizeof *a);
        if (a) {
            whole = false;
            /* A spare struct (or a calloc'd one) is in no index, has no events and an empty
             * stream set (alloc_block_delete's contract); the index links and GC clock are
             * written when it enters an index, and allocated / requested_size / oversize below.
             * So only the range and its neighbours need writing here. */
            a->addr = b->addr;
            a->size = p->size;
            a->stream = b->stream;
            a->pool = pool;
            a->seg = b->seg;
            a->prev = b->prev;
            a->next = b;
            a->mapped = true;
            a->expandable = b->expandable;
            if (a->prev)
                a->prev->next = a;
            else
                a->seg->first = a;
            b->prev = a;
            b->gc_count_base = pool->get_free_blocks_call_count;
            if (indexed) {
                bpool_free_take_front(pool, b, p->size, pred);
            } else {
                b->addr += p->size;
                b->size -= p->size;
                bpool_insert_free(pool, b);
            }
            if (!b->expandable) {
                if (already_split) {
                    stat_down_pool(d->stats.inactive_split_bytes, si, (int64_t)a->size);
                } else {
                    stat_up_pool(d->stats.inactive_split_bytes, si, (int64_t)b->size);
                    stat_up_pool(d->stats.inactive_split, si, 1);
                }
            }
            b = a;
        }
        /* else no host memory for a split: hand out the whole block */
    }
    if (whole) {
        if (indexed)
            bpool_remove_free(pool, b);
        if (already_split && !b->expandable) {
            stat_down_pool(d->stats.inactive_split_bytes, si, (int64_t)b->size);
            stat_down_pool(d->stats.inactive_split, si, 1);
        }
    }
    b->allocated = true;
    b->requested_size = orig_size;
    stat_up_pool(d->stats.allocation, si, 1);
    stat_up_pool(d->stats.allocated_bytes, si, (int64_t)b->size);
    stat_up_pool(d->stats.active, si, 1);
    stat_up_pool(d->stats.active_bytes, si, (int64_t)b->size);
    stat_up_pool(d->stats.requested_bytes, si, (int64_t)orig_size);
    b->oversize = b->size >= d->cfg.max_split_size;
    if (b->oversize)
        stat_up(&d->stats.oversize_allocations, 1);
    return b;
}

/* The free half of a malloc that could not record its pointer (host OOM): undo the accounting
 * and return the block to the pool. */
static void undo_alloc(struct dev_alloc *d, struct block *b)
{
    b->allocated = false;
    stat_pool(d->stats.allocation, b->pool, -1);
    stat_pool(d->stats.allocated_bytes, b->pool, -(int64_t)b->size);
    if (b->oversize)
        stat_add(&d->stats.oversize_allocations, -1);
    alloc_free_block(d, b);
}

static xseg_status out_of_memory(struct dev_alloc *d, size_t size, size_t alloc_size, xseg_status why)
{
    size_t dfree = 0, dtotal = d->info.total_mem;
    if (drv_ctx_ensure(d->info.primary_ctx) == XSEG_SUCCESS)
        (void)drv->cuMemGetInfo(&dfree, &dtotal);
    d->stats.num_ooms++;
    size_t allocated = (size_t)stats_all_current(d->stats.allocated_bytes);
    size_t reserved = (size_t)stats_all_current(d->stats.reserved_bytes);
    /* PyTorch's "allocated in private pools": what graphs' pools hold cached (reserved for their
     * replays, not releasable), counted with the allocated memory rather than the unallocated. */
    size_t in_private = d->pools ? pools_cached_bytes(d) : 0;
    bool set_fraction = d->set_fraction;
    size_t allowed = d->allowed_memory_maximum;
    bool expandable = d->use_expandable;
    int device = d->device;
    lock_release(&d->lock);

    /* Observers run first: they may call xseg (and overwrite this thread's message). */
    rt_run_oom_observers(device, alloc_size, set_fraction ? allowed : dtotal, dfree);

    char s_req[32], s_tot[32], s_free[32], s_allowed[32], s_alloc[32], s_unalloc[32], s_priv[32];
    char allowed_info[64] = "", over[128] = "", private_info[96] = "";
    if (in_private)
        snprintf(private_info, sizeof private_info, "with %s allocated in private pools (e.g., CUDA Graphs), ",
                 err_format_size(in_private, s_priv));
    if (set_fraction)
        snprintf(allowed_info, sizeof allowed_info, "%s allowed; ", err_format_size(allowed, s_allowed));
    if (size > dtotal)
        snprintf(over, sizeof over, " The request exceeds the device's total memory of %s.",
                 err_format_size(dtotal, s_allowed));
    (void)why;
    return err_set(XSEG_ERROR_OUT_OF_MEMORY,
                   "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of "
                   "which %s is free. %sOf the allocated memory %s is allocated by xseg, %sand %s is "
                   "reserved by xseg but unallocated.%s%s",
                   err_format_size(alloc_size, s_req), device, err_format_size(dtotal, s_tot),
                   err_format_size(dfree, s_free), allowed_info, err_format_size(allocated + in_private, s_alloc),
                   private_info, err_format_size(reserved - allocated - in_private, s_unalloc), over,
                   expandable ? "" : " If reserved but unallocated memory is large try setting "
                                     "expandable_segments:True to avoid fragmentation.");
}

/* Everything after the cache missed. Lock held; on return with an error the lock is released
 * (the OOM path drops it to run observers), on success it is still held. */
static xseg_status malloc_slow(struct dev_alloc *d, struct alloc_params *p, size_t orig_size)
{
    xseg_status st = XSEG_SUCCESS;
    /* A routed allocation may grow its private pool during a capture; an unrouted one may not. */
    if (!alloc_pool_owner(d, p->pool) && stream_capturing(d, p->stream, &st)) {
        capture_note(d, p->stream);
        lock_release(&d->lock);
        return capture_error(p->stream);
    }
    if (st != XSEG_SUCCESS) {
        lock_release(&d->lock);
        return st;
    }
    /* Free-memory callbacks, with the lock released; then search the cache again. */
    if (rt_have_free_memory_callbacks()) {
        lock_release(&d->lock);
        int freed = rt_run_free_memory_callbacks(d->device, p->size);
        lock_acquire(&d->lock);
        if (freed && get_free_block(d, p))
            return XSEG_SUCCESS;
    }
    if (XSEG_UNLIKELY(d->set_fraction && d->cfg.garbage_collection_threshold > 0.0))
        garbage_collect_cached_blocks(d);

    st = alloc_block(d, p, false);
    /* Nothing is freed during a capture: cuMemFree would invalidate it. */
    bool capture = st == XSEG_ERROR_OUT_OF_MEMORY && alloc_capture_underway(d, true);
    if (st == XSEG_ERROR_OUT_OF_MEMORY && !capture && release_available_cached_blocks(d, p))
        st = alloc_block(d, p, false);
    if (st == XSEG_ERROR_OUT_OF_MEMORY && !capture) {
        xseg_status rs = release_cached_blocks(d);
        if (rs == XSEG_SUCCESS || rs == XSEG_ERROR_OUT_OF_MEMORY)
            st = alloc_block(d, p, true);
    }
    if (st == XSEG_SUCCESS)
        return XSEG_SUCCESS;
    if (st != XSEG_ERROR_OUT_OF_MEMORY) {
        lock_release(&d->lock);
        return st;
    }
    return out_of_memory(d, p->size, p->alloc_size, st);
}

/* The end of every malloc once p->block is found (taken out of the index unless @p indexed):
 * split, account, record the pointer, unlock. */
static inline __attribute__((always_inline)) xseg_status malloc_finish(struct dev_alloc *d, struct alloc_params *p,
                                                                       size_t size, bool indexed,
                                                                       const struct block *pred, void **out)
{
    struct block *b = alloc_found_block(d, p, size, indexed, pred);
    if (XSEG_UNLIKELY(!ptrmap_put(&d->live, b->addr, b))) {
        undo_alloc(d, b);
        lock_release(&d->lock);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory recording an allocation");
    }
    lock_release(&d->lock);
    *out = (void *)b->addr;
    return XSEG_SUCCESS;
}

/* A malloc after the first search (lock held): @p b is the block it found with *pred_ok false,
 * or NULL when the cache missed. */
static __attribute__((noinline)) xseg_status malloc_rest(struct dev_alloc *d, struct alloc_params *p,
                                                         struct block *b, size_t size, void **out)
{
    if (b) {
        bpool_remove_free(p->pool, b);
        p->block = b;
    } else {
        p->alloc_size = allocation_size(d, p->size);
        xseg_status st = malloc_slow(d, p, size);
        if (st != XSEG_SUCCESS)
            return st; /* lock already released */
    }
    return malloc_finish(d, p, size, false, NULL, out);
}

/* Everything before the search that a plain malloc does not need (lock held): a new config,
 * streams seen capturing, routes to private pools, pending events, roundup_power2_divisions,
 * sizes too large to round. */
static __attribute__((noinline)) xseg_status malloc_general(struct dev_alloc *d, size_t size, CUstream stream,
                                                            void **out)
{
    refresh_cfg(d);
    struct priv_pool *priv = NULL;
    if (XSEG_UNLIKELY(d->ncapturing || d->nroutes)) {
        xseg_status st = d->nroutes ? pools_select(d, stream, &priv) : XSEG_SUCCESS, ignored;
        if (st == XSEG_SUCCESS && !priv && alloc_capture_underway(d, false) &&
            stream_capturing(d, stream, &ignored)) {
            capture_note(d, stream);
            st = capture_error(stream);
        }
        if (st != XSEG_SUCCESS) {
            lock_release(&d->lock);
            return st;
        }
    }
    if (XSEG_UNLIKELY(d->pending_events || d->ndeferred) && !d->ncapturing && !d->nroutes)
        ev_process(d);
    alloc_fast_update(d);

    /* Sizes near SIZE_MAX cannot be rounded; no device holds them anyway. */
    if (XSEG_UNLIKELY(size > ((size_t)1 << 62)))
        return out_of_memory(d, size, size, XSEG_ERROR_OUT_OF_MEMORY);
    struct alloc_params p;
    p.size = round_size(d, size);
    p.pool = p.size <= BLOCK_SMALL_SIZE ? &d->small : &d->large;
    if (XSEG_UNLIKELY(priv))
        p.pool = p.size <= BLOCK_SMALL_SIZE ? &priv->small : &priv->large;
    p.stream = stream;
    p.block = NULL;
    struct block *pred;
    bool pred_ok;
    struct block *b = find_free_block(d, &p, &pred, &pred_ok);
    if (XSEG_UNLIKELY(!b || !pred_ok))
        return malloc_rest(d, &p, b, size, out);
    p.block = b;
    return malloc_finish(d, &p, size, true, pred, out);
}

/*
 * The fast path is the general one minus its rare conditions, which malloc_general handles: a
 * best-fit search, a split that leaves the remainder in its index place, statistics, one hash
 * insert. No driver call, no allocation (block structs come from the spare list), no atomic
 * read-modify-write besides the lock's compare-exchange.
 */
xseg_status alloc_malloc(struct dev_alloc *d, size_t size, CUstream stream, void **out)
{
    lock_acquire(&d->lock);
    /* fast_gen stands for every rare condition (alloc.h); a moved generation means a new config. */
    if (XSEG_UNLIKELY(rt_cfg_gen() != d->fast_gen || size > ((size_t)1 << 62)))
        return malloc_general(d, size, stream, out);
    struct alloc_params p;
    p.size = size < BLOCK_MIN_SIZE ? BLOCK_MIN_SIZE : xseg_align_up(size, BLOCK_MIN_SIZE);
    p.pool = p.size <= BLOCK_SMALL_SIZE ? &d->small : &d->large;
    p.stream = stream;
    struct block *pred;
    bool pred_ok;
    struct block *b = find_free_block(d, &p, &pred, &pred_ok);
    if (XSEG_UNLIKELY(!b || !pred_ok))
        return malloc_rest(d, &p, b, size, out);
    p.block = b;
    return malloc_finish(d, &p, size, true, pred, out);
}

/* ---- free / record_stream ---------------------------------------------------------------- */

static inline __attribute__((always_inline)) xseg_status free_ptr(struct dev_alloc *d, void *ptr, bool *owned)
{
    lock_acquire(&d->lock);
    struct block *b = ptrmap_take(&d->live, (uintptr_t)ptr);
    if (!b) {
        lock_release(&d->lock);
        *owned = false;
        return XSEG_SUCCESS;
    }
    *owned = true;
    b->allocated = false;
    stat_down_pool(d->stats.allocation, b->pool->stat_index, 1);
    stat_down_pool(d->stats.allocated_bytes, b->pool->stat_index, (int64_t)b->size);
    if (b->oversize) {
        stat_down(&d->stats.oversize_allocations, 1);
        b->oversize = false;
    }
    xseg_status st = XSEG_SUCCESS;
    if (XSEG_UNLIKELY(b->uses.n)) {
        refresh_cfg(d);
        st = ev_insert(d, b);
    } else {
        free_block(d, b);
    }
    lock_release(&d->lock);
    return st;
}

xseg_status alloc_free(struct dev_alloc *d, void *ptr, bool *owned) { return free_ptr(d, ptr, owned); }

xseg_status alloc_free_unknown(void *ptr)
{
    return err_set(XSEG_ERROR_INVALID_VALUE,
                   "xseg_free: pointer %p was not returned by xseg_malloc or was freed already", ptr);
}

xseg_status alloc_free_sole(struct dev_alloc *d, void *ptr)
{
    bool owned;
    xseg_status st = free_ptr(d, ptr, &owned);
    if (XSEG_UNLIKELY(!owned))
        return alloc_free_unknown(ptr);
    return st;
}

xseg_status alloc_record_stream(struct dev_alloc *d, void *ptr, CUstream stream, bool *owned)
{
    lock_acquire(&d->lock);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)ptr);
    if (!b) {
        lock_release(&d->lock);
        *owned = false;
        return XSEG_SUCCESS;
    }
    *owned = true;
    xseg_status st = XSEG_SUCCESS;
    if (stream != b->stream && !stream_set_add(&b->uses, stream))
        st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory recording stream %p", (void *)stream);
    lock_release(&d->lock);
    return st;
}

/* ---- empty_cache, fraction, stats, peers ------------------------------------------------- */

xseg_status alloc_empty_cache(struct dev_alloc *d)
{
    lock_acquire(&d->lock);
    refresh_cfg(d);
    xseg_status st = release_cached_blocks(d);
    lock_release(&d->lock);
    return st;
}

xseg_status alloc_set_fraction(struct dev_alloc *d, double fraction)
{
    lock_acquire(&d->lock);
    refresh_cfg(d);
    apply_fraction(d, fraction);
    lock_release(&d->lock);
    return XSEG_SUCCESS;
}

void alloc_get_stats(struct dev_alloc *d, xseg_device_stats *out)
{
    lock_acquire(&d->lock);
    refresh_cfg(d);
    *out = d->stats;
    lock_release(&d->lock);
    stats_fill_all(out);
}

void alloc_reset_peaks(struct dev_alloc *d)
{
    lock_acquire(&d->lock);
    stats_fill_all(&d->stats);
    stats_reset_peaks(&d->stats);
    lock_release(&d->lock);
}

xseg_status alloc_enable_peer(struct dev_alloc *d, int peer)
{
    lock_acquire(&d->lock);
    for (int i = 0; i < d->npeers; i++) {
        if (d->peers[i] == peer) {
            lock_release(&d->lock);
            return XSEG_SUCCESS;
        }
    }
    xseg_status st = XSEG_SUCCESS;
    for (struct segrec *s = d->segs; s && st == XSEG_SUCCESS; s = s->next_seg)
        if (s->vseg)
            st = seg_add_peer(s->vseg, peer);
    if (st == XSEG_SUCCESS && d->npeers < ALLOC_MAX_DEVICES)
        d->peers[d->npeers++] = peer;
    lock_release(&d->lock);
    return st;
}

/* ---- snapshot ---------------------------------------------------------------------------- */

static xseg_status snap_push(xseg_segment_info **segs, size_t *n, size_t *cap, xseg_segment_info *si)
{
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 16;
        xseg_segment_info *p = realloc(*segs, ncap * sizeof *p);
        if (!p)
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory taking a snapshot");
        *segs = p;
        *cap = ncap;
    }
    (*segs)[(*n)++] = *si;
    return XSEG_SUCCESS;
}

/* One snapshot entry for blocks [from, to) of a segment (to exclusive, may be NULL). */
static xseg_status snap_range(struct dev_alloc *d, struct segrec *s, struct block *from, struct block *to,
                              xseg_segment_info **segs, size_t *n, size_t *cap)
{
    xseg_segment_info si;
    memset(&si, 0, sizeof si);
    size_t nb = 0;
    for (struct block *b = from; b != to; b = b->next)
        nb++;
    si.blocks = calloc(nb ? nb : 1, sizeof *si.blocks);
    if (!si.blocks)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory taking a snapshot");
    si.device = d->device;
    si.address = from->addr;
    si.stream = s->stream;
    si.is_large = !s->pool->is_small;
    si.is_expandable = s->vseg != NULL;
    const struct priv_pool *owner = alloc_pool_owner(d, s->pool);
    if (owner) {
        si.pool_id[0] = owner->id.first;
        si.pool_id[1] = owner->id.second;
    }
    for (struct block *b = from; b != to; b = b->next) {
        xseg_block_info *bi = &si.blocks[si.nblocks++];
        bi->address = b->addr;
        bi->size = b->size;
        si.total_size += b->size;
        if (b->allocated) {
            bi->state = XSEG_BLOCK_ACTIVE_ALLOCATED;
            bi->requested_size = b->requested_size;
            si.allocated_size += b->size;
            si.active_size += b->size;
            si.requested_size += b->requested_size;
        } else if (b->event_count > 0 || b->uses.n) {
            bi->state = XSEG_BLOCK_ACTIVE_PENDING_FREE;
            bi->requested_size = b->requested_size;
            si.active_size += b->size;
            si.requested_size += b->requested_size;
        } else {
            bi->state = XSEG_BLOCK_INACTIVE;
        }
    }
    xseg_status st = snap_push(segs, n, cap, &si);
    if (st != XSEG_SUCCESS)
        free(si.blocks);
    return st;
}

xseg_status alloc_snapshot(struct dev_alloc *d, xseg_segment_info **segs, size_t *n, size_t *cap)
{
    xseg_status st = XSEG_SUCCESS;
    lock_acquire(&d->lock);
    for (struct segrec *s = d->segs; s && st == XSEG_SUCCESS; s = s->next_seg) {
        if (!s->vseg) {
            st = snap_range(d, s, s->first, NULL, segs, n, cap);
            continue;
        }
        /* Expandable: one entry per maximal run of mapped blocks. */
        struct block *b = s->first;
        while (b && st == XSEG_SUCCESS) {
            if (!b->mapped) {
                b = b->next;
                continue;
            }
            struct block *e = b;
            while (e && e->mapped)
                e = e->next;
            st = snap_range(d, s, b, e, segs, n, cap);
            b = e;
        }
    }
    lock_release(&d->lock);
    return st;
}
