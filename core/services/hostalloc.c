/*
 * The pinned host caching allocator (core/services/hostalloc.h).
 *
 * Segments: a request rounded to 512 B (xseg's device rounding; PyTorch's host allocator rounds
 * to a power of two, pytorch#150517) is served from a free block of its size class, small
 * (<= 1 MiB: carved from 2 MiB segments) or large (a 20 MiB segment up to 10 MiB, else the
 * request rounded to 2 MiB), best fit by (size, address), split like a device block (a small
 * remainder from 512 B, a large one above 1 MiB); freed blocks merge with free neighbours.
 * A block used on streams (record_stream) is pending after its free: an event is recorded on
 * each stream, and it returns to the cache once every event completed. Events are queried by the
 * next malloc that finds no cached block, by empty_cache, or every millisecond by a thread under
 * pinned_use_background_threads (then a malloc makes no driver call but the new segment's).
 */
#include "core/services/hostalloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "base/witness.h"
#include "core/process/config.h"
#include "core/process/history.h"
#include "core/process/procstate.h"
#include "core/process/settings.h"
#include "core/services/hostquar.h"
#include "vmm/event.h"
#include "vmm/host.h"
#include "vmm/stream.h"

#define HC_ROUND 512u                  /* request rounding: the device allocator's kMinBlockSize */
#define HC_SMALL_MAX (1u << 20)        /* small requests: <= 1 MiB */
#define HC_SMALL_SEG (2u << 20)        /* a small segment */
#define HC_LARGE_SEG (20u << 20)       /* the segment of a 1-10 MiB request */
#define HC_LARGE_ALONE (10u << 20)     /* above this a request gets a segment of its own size */
#define HC_LARGE_ROUND (2u << 20)      /* which is rounded to 2 MiB */
#define HC_TOUCH_MIN (16u << 20)       /* register path: pages touched by threads from this size */

struct hc_use {
    CUcontext ctx;
    CUstream stream;
};

struct hc_seg;

struct hc_block {
    char *ptr;
    size_t size;
    struct hc_seg *seg;
    struct hc_block *prev, *next; /* neighbours in the segment, in address order */
    bool allocated;               /* handed out (or pending: freed, events outstanding) */
    unsigned nevents;             /* events outstanding since its free */
    struct hc_use *uses;          /* streams recorded while allocated */
    size_t nuses, capuses;
    /* debug_stale_access (core/services/hostquar.h): */
    size_t requested;                        /* what its malloc asked for */
    struct hstack *alloc_stack, *free_stack; /* history's, while allocated or pending (NULL: none) */
    bool quar;                               /* freed with the mode on: quarantined once its events are done */
};

struct hc_seg {
    char *base;
    size_t size;
    bool small;
    bool registered; /* mmap + cuMemHostRegister, else cuMemHostAlloc */
};

struct hc_event {
    CUevent ev;
    CUcontext ctx;
    struct hc_block *b; /* NULL in the pool of spare events */
};

/* This module's state is xseg_rt.host (core/process/procstate.h), written only here (layering.sh): `hc`
 * names it, so that this file reads as it did before the state moved into the process object. */
#define hc xseg_rt.host
FORK_MUTEX_AT(FORK_RANK_HOSTALLOC, hc_lock, hc.lock)

/* ---- statistics ------------------------------------------------------------------------ */

static void ctr_add(struct hc_counter *c, int64_t d)
{
    c->current += d;
    if (d > 0) {
        c->allocated += d;
        if (c->current > c->peak)
            c->peak = c->current;
    } else {
        c->freed -= d;
    }
}

static void dur_add(struct hc_duration *d, int64_t us)
{
    d->total += us;
    d->max = us > d->max ? us : d->max;
    d->min = !d->count || us < d->min ? us : d->min;
    d->count++;
}

/* ---- the live map ------------------------------------------------------------------------ */

static size_t map_home(const void *p, size_t cap) { return (size_t)(((uintptr_t)p >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

static bool map_grow(void)
{
    if ((hc.mapn + 1) * 2 <= hc.mapcap)
        return true;
    size_t cap = hc.mapcap ? hc.mapcap * 2 : 64;
    struct hc_block **m = xs_calloc(cap, sizeof *m);
    if (!m)
        return false;
    for (size_t i = 0; i < hc.mapcap; i++) {
        if (!hc.map[i])
            continue;
        size_t j = map_home(hc.map[i]->ptr, cap);
        while (m[j])
            j = (j + 1) & (cap - 1);
        m[j] = hc.map[i];
    }
    xs_free(hc.map);
    hc.map = m;
    hc.mapcap = cap;
    return true;
}

/* Insert @p b (room reserved by map_grow). */
static void map_put(struct hc_block *b)
{
    size_t j = map_home(b->ptr, hc.mapcap);
    while (hc.map[j])
        j = (j + 1) & (hc.mapcap - 1);
    hc.map[j] = b;
    hc.mapn++;
}

static size_t map_find(const void *p)
{
    if (!hc.mapcap)
        return SIZE_MAX;
    for (size_t j = map_home(p, hc.mapcap);; j = (j + 1) & (hc.mapcap - 1)) {
        if (!hc.map[j])
            return SIZE_MAX;
        if (hc.map[j]->ptr == p)
            return j;
    }
}

static void map_del(size_t j)
{
    size_t mask = hc.mapcap - 1;
    hc.map[j] = NULL;
    hc.mapn--;
    for (size_t k = (j + 1) & mask; hc.map[k]; k = (k + 1) & mask) {
        size_t h = map_home(hc.map[k]->ptr, hc.mapcap);
        /* Move k back to the hole when its home is not in (j, k] (cyclically). */
        if (((k - h) & mask) >= ((k - j) & mask)) {
            hc.map[j] = hc.map[k];
            hc.map[k] = NULL;
            j = k;
        }
    }
}

/* ---- the free index ---------------------------------------------------------------------- */

static bool fr_less(const struct hc_block *a, size_t size, const char *ptr)
{
    return a->size < size || (a->size == size && a->ptr < ptr);
}

/* First index whose block is not below (size, ptr). */
static size_t fr_lower(const struct hc_free *f, size_t size, const char *ptr)
{
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (fr_less(f->v[mid], size, ptr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool fr_reserve(struct hc_free *f, size_t extra) { return VEC_RESERVE(f->v, f->cap, f->n + extra); }

/* Insert @p b (room reserved by fr_reserve). */
static void fr_insert(struct hc_block *b)
{
    struct hc_free *f = &hc.fr[b->seg->small];
    size_t i = fr_lower(f, b->size, b->ptr);
    memmove(&f->v[i + 1], &f->v[i], (f->n - i) * sizeof *f->v);
    f->v[i] = b;
    f->n++;
}

static void fr_remove(struct hc_block *b)
{
    struct hc_free *f = &hc.fr[b->seg->small];
    size_t i = fr_lower(f, b->size, b->ptr);
    memmove(&f->v[i], &f->v[i + 1], (f->n - i - 1) * sizeof *f->v);
    f->n--;
}

/* ---- segments ---------------------------------------------------------------------------- */

struct touch_job {
    volatile char *p;
    size_t len, page;
};

static void *touch_main(void *arg)
{
    struct touch_job *j = arg;
    for (size_t o = 0; o < j->len; o += j->page)
        j->p[o] = 0;
    return NULL;
}

/* Fault in the pages of [p, p + len) with @p nthreads threads (the caller is one of them), so
 * that cuMemHostRegister pins resident pages (PyTorch's pinned_num_register_threads). A thread
 * that cannot start leaves its share to the caller. */
static void touch_pages(char *p, size_t len, unsigned nthreads)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (nthreads > 64)
        nthreads = 64;
    if (nthreads < 2 || len < HC_TOUCH_MIN) {
        touch_main(&(struct touch_job){p, len, page});
        return;
    }
    size_t share = (len / nthreads + page - 1) / page * page;
    pthread_t tid[64];
    bool started[64] = {false};
    struct touch_job jobs[64];
    for (unsigned t = 0; t < nthreads; t++) {
        size_t off = XSEG_MIN((size_t)t * share, len);
        jobs[t] = (struct touch_job){p + off, XSEG_MIN(share, len - off), page};
        if (t)
            started[t] = pthread_create(&tid[t], NULL, touch_main, &jobs[t]) == 0;
    }
    for (unsigned t = 0; t < nthreads; t++)
        if (!started[t])
            touch_main(&jobs[t]);
    for (unsigned t = 1; t < nthreads; t++)
        if (started[t])
            pthread_join(tid[t], NULL);
}

/* Pinned memory for a segment of @p size bytes, with @p ctx current. */
static xseg_status seg_pin(CUcontext ctx, size_t size, const struct cfg *c, struct hc_seg *s)
{
    xseg_status st = drv_ctx_ensure(ctx);
    if (st != XSEG_SUCCESS)
        return st;
    int64_t t0 = clock_mono_us();
    s->size = size;
    s->registered = c->pinned_use_cuda_host_register;
    if (!s->registered) {
        void *p;
        st = vhost_alloc(size, &p);
        s->base = p;
    } else {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "mmap of %zu bytes to pin (pinned_use_cuda_host_register): %s",
                           size, strerror(errno));
        touch_pages(p, size, c->pinned_num_register_threads);
        st = vhost_register(p, size);
        if (st != XSEG_SUCCESS)
            munmap(p, size);
        s->base = p;
    }
    if (st == XSEG_SUCCESS) {
        dur_add(&hc.alloc_time, clock_mono_us() - t0);
        hc.num_host_alloc++;
    }
    return st;
}

/* Give segment @p s's memory back (its context need not be current: PORTABLE). A failed
 * cuMemFreeHost is kept by vmm/host.c for its retry; a failed unregister is returned (the caller
 * keeps the segment cached, for the next empty_cache). */
static xseg_status seg_unpin(struct hc_seg *s)
{
    int64_t t0 = clock_mono_us();
    xseg_status st = XSEG_SUCCESS;
    if (!s->registered)
        vhost_free(s->base, 0);
    else if ((st = vhost_unregister(s->base)) == XSEG_SUCCESS)
        munmap(s->base, s->size);
    if (st == XSEG_SUCCESS) {
        dur_add(&hc.free_time, clock_mono_us() - t0);
        hc.num_host_free++;
    }
    return st;
}

static size_t seg_size_for(size_t rounded)
{
    if (rounded <= HC_SMALL_MAX)
        return HC_SMALL_SEG;
    if (rounded <= HC_LARGE_ALONE)
        return HC_LARGE_SEG;
    return (rounded + HC_LARGE_ROUND - 1) / HC_LARGE_ROUND * HC_LARGE_ROUND;
}

/* A new segment for a request of @p rounded bytes, whole as one free block (in the index). */
static xseg_status seg_new(CUcontext ctx, size_t rounded, const struct cfg *c, struct hc_block **out)
{
    struct hc_seg *s = xs_calloc(1, sizeof *s);
    struct hc_block *b = xs_calloc(1, sizeof *b);
    bool small = rounded <= HC_SMALL_MAX;
    if (!s || !b || !fr_reserve(&hc.fr[small], hc.nblocks[small] + 1 - hc.fr[small].n)) {
        xs_free(s);
        xs_free(b);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory");
    }
    s->small = rounded <= HC_SMALL_MAX;
    xseg_status st = seg_pin(ctx, seg_size_for(rounded), c, s);
    if (st != XSEG_SUCCESS) {
        xs_free(s);
        xs_free(b);
        return st;
    }
    *b = (struct hc_block){.ptr = s->base, .size = s->size, .seg = s};
    hc.nblocks[small]++;
    ctr_add(&hc.segment, 1);
    ctr_add(&hc.reserved_bytes, (int64_t)s->size);
    fr_insert(b);
    *out = b;
    return XSEG_SUCCESS;
}

static bool seg_whole_free(const struct hc_block *b)
{
    return !b->allocated && !b->prev && !b->next;
}

/* Release the segment of free block @p b (its only block, in the index). */
static xseg_status seg_release(struct hc_block *b)
{
    struct hc_seg *s = b->seg;
    xseg_status st = seg_unpin(s);
    if (st != XSEG_SUCCESS)
        return st; /* still pinned: stays cached, whole and free */
    fr_remove(b);
    hc.nblocks[s->small]--;
    ctr_add(&hc.segment, -1);
    ctr_add(&hc.reserved_bytes, -(int64_t)s->size);
    xs_free(s);
    xs_free(b->uses);
    xs_free(b);
    return st;
}

/* ---- blocks ------------------------------------------------------------------------------ */

/* Free block @p b back to the index, merged with its free neighbours (room reserved). */
static void block_return(struct hc_block *b)
{
    b->allocated = false;
    b->nuses = 0;
    for (int side = 0; side < 2; side++) {
        struct hc_block *n = side ? b->next : b->prev;
        if (!n || n->allocated)
            continue;
        fr_remove(n);
        if (side) {
            b->size += n->size;
            b->next = n->next;
            if (n->next)
                n->next->prev = b;
        } else {
            b->ptr = n->ptr;
            b->size += n->size;
            b->prev = n->prev;
            if (n->prev)
                n->prev->next = b;
        }
        xs_free(n->uses);
        xs_free(n);
        hc.nblocks[b->seg->small]--;
    }
    fr_insert(b);
}

/* A block that left the host quarantine goes back to the index (room reserved). */
static void hq_release(void *blk)
{
    struct hc_block *b = blk;
    b->quar = false;
    block_return(b);
}

/* Freed block @p b's streams are done (where the cache would make it reusable): into the
 * quarantine when it was freed with debug_stale_access on (filled there), else back to the index. */
static void block_done(struct hc_block *b)
{
    if (b->quar && hostquar_enter(&hc.quar, hc.quar_bound, b, b->ptr, b->size, b->requested, b->alloc_stack,
                                  b->free_stack, hq_release)) {
        b->alloc_stack = b->free_stack = NULL; /* the entry took their references */
        return;
    }
    hist_stack_unref(b->alloc_stack);
    hist_stack_unref(b->free_stack);
    b->alloc_stack = b->free_stack = NULL;
    b->quar = false;
    block_return(b);
}

/* The host quarantine's undelivered findings, taken under the lock for quar_deliver after it. */
static struct quar_batch hq_take(void)
{
    struct quar_batch q = {0};
    if (hc.quar.nfound)
        hostquar_take(&hc.quar, &q);
    return q;
}

static void hq_deliver(struct quar_batch *q)
{
    if (q->n)
        quar_deliver(q);
}

/* Take @p rounded bytes from the front of free block @p b: split when the rest is worth keeping
 * (a small remainder from 512 B, a large one above 1 MiB, as for device blocks). */
static xseg_status block_take(struct hc_block *b, size_t rounded, struct hc_block **out)
{
    size_t rest = b->size - rounded;
    bool split = b->seg->small ? rest >= HC_ROUND : rest > HC_SMALL_MAX;
    struct hc_block *r = NULL;
    struct hc_free *f = &hc.fr[b->seg->small];
    if (split && (!(r = xs_calloc(1, sizeof *r)) || !fr_reserve(f, hc.nblocks[b->seg->small] + 1 - f->n))) {
        xs_free(r);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory");
    }
    if (!map_grow()) {
        xs_free(r);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory");
    }
    fr_remove(b);
    if (split) {
        *r = (struct hc_block){.ptr = b->ptr + rounded, .size = rest, .seg = b->seg, .prev = b, .next = b->next};
        if (b->next)
            b->next->prev = r;
        b->next = r;
        b->size = rounded;
        hc.nblocks[b->seg->small]++;
        fr_insert(r);
    }
    b->allocated = true;
    map_put(b);
    ctr_add(&hc.allocation, 1);
    ctr_add(&hc.allocated_bytes, (int64_t)b->size);
    *out = b;
    return XSEG_SUCCESS;
}

/* Best fit for @p rounded bytes, or NULL. */
static struct hc_block *best_fit(size_t rounded)
{
    struct hc_free *f = &hc.fr[rounded <= HC_SMALL_MAX];
    size_t i = fr_lower(f, rounded, NULL);
    return i < f->n ? f->v[i] : NULL;
}

/* ---- events ------------------------------------------------------------------------------ */

/* Return the blocks whose events all completed. With @p wait, wait for each instead (an event
 * that cannot be waited for keeps its block pending). Each query with its context current. */
static void process_events(bool wait)
{
    size_t keep = 0;
    for (size_t i = 0; i < hc.npending; i++) {
        struct hc_event e = hc.pending[i];
        bool done = drv_ctx_ensure(e.ctx) == XSEG_SUCCESS && (wait ? vevent_wait(e.ev) : vevent_done(e.ev));
        if (!done) {
            hc.pending[keep++] = e;
            continue;
        }
        hc.spare[hc.nspare++] = (struct hc_event){e.ev, e.ctx, NULL};
        if (--e.b->nevents == 0)
            block_done(e.b);
    }
    hc.npending = keep;
}

/* An event of context @p ctx: a spare one, else a new one. */
static xseg_status event_get(CUcontext ctx, CUevent *ev)
{
    for (size_t i = hc.nspare; i-- > 0;) {
        if (hc.spare[i].ctx == ctx) {
            *ev = hc.spare[i].ev;
            hc.spare[i] = hc.spare[--hc.nspare];
            return XSEG_SUCCESS;
        }
    }
    if (!VEC_RESERVE(hc.spare, hc.capspare, hc.nevents + 1))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory");
    xseg_status st = vevent_create(ev);
    if (st == XSEG_SUCCESS)
        hc.nevents++;
    return st;
}

/* ---- the entry points -------------------------------------------------------------------- */

/* hostalloc_malloc; @p user: the program's (xseg_host_malloc), whose stack history records for
 * debug_stale_access's reports. */
static xseg_status malloc_block(CUcontext ctx, size_t size, void **out, bool user)
{
    *out = NULL;
    if (size > SIZE_MAX - HC_LARGE_ROUND)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "pinned host memory: %zu bytes is more than can be allocated", size);
    size_t rounded = size ? (size + HC_ROUND - 1) / HC_ROUND * HC_ROUND : HC_ROUND;
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    /* debug_stale_access: the allocation's stack (history), for a finding (taken with no lock held) */
    struct hstack *as = user && c.debug_stale_access && hist_mode() ? hist_capture() : NULL;
    mutex_lock(&hc.lock);
    hc.quar_bound = c.debug_quarantine;
    if (!map_grow()) { /* before any pinning: the map's room for the block */
        mutex_unlock(&hc.lock);
        hist_stack_unref(as);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory");
    }
    struct hc_block *b = best_fit(rounded);
    if (!b && hc.npending && !__atomic_load_n(&hc.running, __ATOMIC_RELAXED)) {
        process_events(false);
        b = best_fit(rounded);
    }
    xseg_status st = XSEG_SUCCESS;
    bool fresh = !b;
    if (!b && (st = seg_new(ctx, rounded, &c, &b)) == XSEG_ERROR_OUT_OF_MEMORY) {
        /* Pinned memory is scarce: give the free cached segments back and try once more (the
         * message is the last attempt's, whose status is returned). The host quarantine first
         * drains (checked), its blocks back in the cache, one of which may serve. */
        if (hc.quar.n) {
            (void)hostquar_check_all(&hc.quar, "quarantine exit", true, hq_release);
            if ((b = best_fit(rounded)) != NULL) {
                st = XSEG_SUCCESS;
                fresh = false;
            }
        }
        size_t released = 0;
        for (int k = 0; k < 2 && !b; k++)
            for (size_t i = hc.fr[k].n; i-- > 0;)
                if (seg_whole_free(hc.fr[k].v[i])) {
                    (void)seg_release(hc.fr[k].v[i]);
                    released++;
                }
        if (!b && released && (st = seg_new(ctx, rounded, &c, &b)) != XSEG_SUCCESS)
            st = err_suffix(st, " (after giving back every free cached segment)");
    }
    if (st == XSEG_SUCCESS) {
        struct hc_block *whole = b;
        if ((st = block_take(b, rounded, &b)) == XSEG_SUCCESS) {
            *out = b->ptr;
            b->requested = size;
            b->alloc_stack = as;
            as = NULL;
        } else if (fresh) {
            (void)seg_release(whole); /* the segment made for this call goes back: nothing held */
        }
    }
    /* Findings go out from the program's calls only: sleep's may hold a device lock. */
    struct quar_batch found = user ? hq_take() : (struct quar_batch){0};
    mutex_unlock(&hc.lock);
    hist_stack_unref(as);
    hq_deliver(&found);
    return st;
}

xseg_status hostalloc_malloc(CUcontext ctx, size_t size, void **out) { return malloc_block(ctx, size, out, false); }

xseg_status hostalloc_malloc_user(CUcontext ctx, size_t size, void **out) { return malloc_block(ctx, size, out, true); }

/* The allocated block at @p p, else INVALID_VALUE naming it (lock held). */
static xseg_status find_block(const void *p, const char *fn, size_t *slot)
{
    *slot = map_find(p);
    if (*slot == SIZE_MAX)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: %p is not a block of xseg's host allocator (xseg_host_malloc) "
                       "or was freed already", fn, p);
    return XSEG_SUCCESS;
}

/* Free @p p; @p quar: quarantine it (debug_stale_access, bound @p bound) once its events are
 * done, with the free's stack @p fs (its reference taken, or released on failure). */
static xseg_status free_block(void *p, bool release, bool quar, size_t bound, struct hstack *fs)
{
    mutex_lock(&hc.lock);
    size_t slot;
    xseg_status st = find_block(p, "xseg_host_free", &slot);
    if (st != XSEG_SUCCESS) {
        mutex_unlock(&hc.lock);
        hist_stack_unref(fs);
        return st;
    }
    struct hc_block *b = hc.map[slot];
    if (quar) {
        hc.quar_bound = bound;
        b->quar = true;
        b->free_stack = fs;
    } else {
        hist_stack_unref(fs);
    }
    /* Nothing below allocates: the index and pending room was reserved (see hc.nblocks). */
    map_del(slot);
    hc.nuses -= b->nuses;
    ctr_add(&hc.allocation, -1);
    ctr_add(&hc.allocated_bytes, -(int64_t)b->size);
    for (size_t i = 0; i < b->nuses; i++) {
        const struct hc_use *u = &b->uses[i];
        CUevent ev;
        bool ok = drv_ctx_ensure(u->ctx) == XSEG_SUCCESS && event_get(u->ctx, &ev) == XSEG_SUCCESS;
        if (ok && !vevent_record(ev, u->stream)) {
            hc.spare[hc.nspare++] = (struct hc_event){ev, u->ctx, NULL};
            ok = false;
        }
        if (ok) {
            hc.pending[hc.npending++] = (struct hc_event){ev, u->ctx, b};
            b->nevents++;
        } else {
            /* No event: wait for the stream here, the one host-blocking path (a driver failure). */
            (void)vstream_wait(u->stream, "xseg_host_free: for a stream that used the block");
        }
    }
    if (!b->nevents) {
        block_done(b);
        if (release && seg_whole_free(b)) /* b absorbed its free neighbours */
            st = seg_release(b);
    }
    struct quar_batch found = quar ? hq_take() : (struct quar_batch){0}; /* as malloc_block's */
    mutex_unlock(&hc.lock);
    hq_deliver(&found);
    return st;
}

xseg_status hostalloc_free(void *p, bool release)
{
    return p ? free_block(p, release, false, 0, NULL) : XSEG_SUCCESS;
}

xseg_status hostalloc_free_user(void *p)
{
    if (!p)
        return XSEG_SUCCESS;
    if (!settings_stale_on()) /* the mode off: one relaxed load */
        return free_block(p, false, false, 0, NULL);
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    struct hstack *fs = c.debug_stale_access && hist_mode() ? hist_capture() : NULL; /* no lock held */
    return free_block(p, false, c.debug_stale_access, c.debug_quarantine, fs);
}

xseg_status hostalloc_record_stream(void *p, CUcontext ctx, CUstream stream)
{
    mutex_lock(&hc.lock);
    size_t slot;
    xseg_status st = find_block(p, "xseg_host_record_stream", &slot);
    if (st == XSEG_SUCCESS) {
        struct hc_block *b = hc.map[slot];
        bool seen = false;
        for (size_t i = 0; i < b->nuses && !seen; i++)
            seen = b->uses[i].ctx == ctx && b->uses[i].stream == stream;
        if (!seen && (!VEC_RESERVE(b->uses, b->capuses, b->nuses + 1) ||
                      !VEC_RESERVE(hc.pending, hc.cappending, hc.npending + hc.nuses + 1)))
            st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_host_record_stream: out of host memory");
        else if (!seen) {
            b->uses[b->nuses++] = (struct hc_use){ctx, stream};
            hc.nuses++;
        }
    }
    mutex_unlock(&hc.lock);
    return st;
}

/* xseg_host_empty_cache's part, the quarantine checked on occasion @p when (drained with the mode off). */
static xseg_status empty_cache(const char *when)
{
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    mutex_lock(&hc.lock);
    hc.quar_bound = c.debug_quarantine;
    process_events(false);
    if (hc.quar.n) /* before the segments go: drained blocks may leave whole segments free */
        (void)hostquar_check_all(&hc.quar, when, !c.debug_stale_access, hq_release);
    for (size_t i = 0; i < hc.nspare; i++)
        if (drv_ctx_ensure(hc.spare[i].ctx) == XSEG_SUCCESS)
            vevent_destroy(hc.spare[i].ev);
    hc.nevents -= hc.nspare;
    hc.nspare = 0;
    xseg_status first = XSEG_SUCCESS;
    for (int k = 0; k < 2; k++)
        for (size_t i = hc.fr[k].n; i-- > 0;)
            if (seg_whole_free(hc.fr[k].v[i])) {
                xseg_status st = seg_release(hc.fr[k].v[i]);
                if (st != XSEG_SUCCESS && first == XSEG_SUCCESS)
                    first = st;
            }
    struct quar_batch found = hq_take();
    mutex_unlock(&hc.lock);
    hq_deliver(&found);
    return first == XSEG_SUCCESS ? first : err_prefix(first, "xseg_host_empty_cache");
}

xseg_status hostalloc_empty_cache(void) { return empty_cache("xseg_host_empty_cache"); }

xseg_status hostalloc_check_stale(const char *when, bool drain, size_t *found)
{
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    mutex_lock(&hc.lock);
    hc.quar_bound = c.debug_quarantine;
    if (hc.npending) /* frees whose streams are done enter the quarantine first */
        process_events(false);
    size_t n = hc.quar.n ? hostquar_check_all(&hc.quar, when, drain || !c.debug_stale_access, hq_release) : 0;
    struct quar_batch batch = hq_take();
    mutex_unlock(&hc.lock);
    hq_deliver(&batch);
    if (found)
        *found = n;
    return XSEG_SUCCESS;
}

/* ---- statistics -------------------------------------------------------------------------- */

static const char *const hc_keys[] = {
#define HC_CTR_KEYS(n) n ".current", n ".peak", n ".allocated", n ".freed"
    HC_CTR_KEYS("allocation"), HC_CTR_KEYS("segment"), HC_CTR_KEYS("allocated_bytes"), HC_CTR_KEYS("reserved_bytes"),
#define HC_DUR_KEYS(n) n ".total", n ".max", n ".min", n ".count", n ".avg"
    HC_DUR_KEYS("host_alloc_time"), HC_DUR_KEYS("host_free_time"), "num_host_alloc", "num_host_free",
};
#define HC_NKEYS (sizeof hc_keys / sizeof hc_keys[0])

const char *hostalloc_stat_key(size_t index) { return index < HC_NKEYS ? hc_keys[index] : NULL; }

/* The value of key @p i (lock held). */
static int64_t stat_value(size_t i)
{
    const struct hc_counter *ctr[] = {&hc.allocation, &hc.segment, &hc.allocated_bytes, &hc.reserved_bytes};
    if (i < 16) {
        const struct hc_counter *c = ctr[i / 4];
        const int64_t v[] = {c->current, c->peak, c->allocated, c->freed};
        return v[i % 4];
    }
    i -= 16;
    if (i < 10) {
        const struct hc_duration *d = i < 5 ? &hc.alloc_time : &hc.free_time;
        const int64_t v[] = {d->total, d->max, d->min, d->count, d->count ? d->total / d->count : 0};
        return v[i % 5];
    }
    return i == 10 ? hc.num_host_alloc : hc.num_host_free;
}

xseg_status hostalloc_stat(const char *key, int64_t *value)
{
    for (size_t i = 0; i < HC_NKEYS; i++) {
        if (strcmp(key, hc_keys[i]))
            continue;
        mutex_lock(&hc.lock);
        *value = stat_value(i);
        mutex_unlock(&hc.lock);
        return XSEG_SUCCESS;
    }
    return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_host_stat: unknown key '%s' (xseg_host_stat_key lists them)", key);
}

void hostalloc_reset_peaks(void)
{
    mutex_lock(&hc.lock);
    struct hc_counter *ctr[] = {&hc.allocation, &hc.segment, &hc.allocated_bytes, &hc.reserved_bytes};
    for (size_t i = 0; i < 4; i++)
        ctr[i]->peak = ctr[i]->current;
    hc.alloc_time.max = hc.alloc_time.min = hc.free_time.max = hc.free_time.min = 0;
    mutex_unlock(&hc.lock);
}

void hostalloc_reset_accumulated(void)
{
    mutex_lock(&hc.lock);
    struct hc_counter *ctr[] = {&hc.allocation, &hc.segment, &hc.allocated_bytes, &hc.reserved_bytes};
    for (size_t i = 0; i < 4; i++)
        ctr[i]->allocated = ctr[i]->freed = 0;
    hc.alloc_time.total = hc.alloc_time.count = hc.free_time.total = hc.free_time.count = 0;
    hc.num_host_alloc = hc.num_host_free = 0;
    mutex_unlock(&hc.lock);
}

/* ---- the event thread (pinned_use_background_threads) ------------------------------------- */

FORK_MUTEX_AT(FORK_RANK_HOSTALLOC_CTL, hc_ctl_lock, hc.ctl_lock)

static void *hc_main(void *arg)
{
    (void)arg;
    mutex_lock(&hc.lock);
    while (!hc.stop) {
        if (hc.npending)
            process_events(false);
        struct timespec until = clock_deadline(CLOCK_MONOTONIC, 1000000); /* every millisecond */
        while (!hc.stop && pthread_cond_timedwait(&hc.cond, &hc.lock, &until) != ETIMEDOUT)
            ;
    }
    mutex_unlock(&hc.lock);
    return NULL;
}

static void hc_stop_locked(void)
{
    if (!hc.running)
        return;
    mutex_lock(&hc.lock);
    hc.stop = true;
    pthread_cond_signal(&hc.cond);
    mutex_unlock(&hc.lock);
    pthread_join(hc.tid, NULL);
    __atomic_store_n(&hc.running, false, __ATOMIC_RELAXED);
}

static void hc_atexit(void)
{
    mutex_lock(&hc.ctl_lock);
    hc_stop_locked();
    mutex_unlock(&hc.ctl_lock);
}

static void hc_cond_make(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&hc.cond, &a);
    pthread_condattr_destroy(&a);
}

static void hc_init(void)
{
    hc_cond_make();
    hc.cond_ready = true;
    atexit(hc_atexit);
}

/* A forked child has no thread (the parent's is not copied). */
static void hc_fork_child(void)
{
    __atomic_store_n(&hc.running, false, __ATOMIC_RELAXED);
    if (hc.cond_ready)
        hc_cond_make();
}
FORK_CHILD(FORK_RANK_HOSTALLOC_CTL, hc_fork_child)

void hostalloc_sync_thread(void)
{
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    /* hc.running is read without the lock as a hint; the decision is made under it. */
    if (c.pinned_use_background_threads == __atomic_load_n(&hc.running, __ATOMIC_RELAXED))
        return;
    pthread_once(&hc.once, hc_init);
    mutex_lock(&hc.ctl_lock);
    settings_copy(&c, &gen);
    if (!c.pinned_use_background_threads) {
        hc_stop_locked();
    } else if (!hc.running) {
        hc.stop = false;
        /* Without a thread the mallocs process the events themselves: nothing is lost. */
        __atomic_store_n(&hc.running, pthread_create(&hc.tid, NULL, hc_main, NULL) == 0, __ATOMIC_RELAXED);
    }
    mutex_unlock(&hc.ctl_lock);
}

/* ---- xseg_shutdown ------------------------------------------------------------------------ */

xseg_status hostalloc_shutdown(void)
{
    hc_atexit(); /* the event thread stopped and joined */
    mutex_lock(&hc.lock);
    process_events(true);
    /* debug_stale_access: the host quarantine is checked and drains (xseg_shutdown checked it
     * already while the observers were attached: this catches what entered since) */
    if (hc.quar.n)
        (void)hostquar_check_all(&hc.quar, "xseg_shutdown", true, hq_release);
    struct quar_batch found = hq_take();
    hostquar_destroy(&hc.quar);
    mutex_unlock(&hc.lock);
    hq_deliver(&found);
    xseg_status st = empty_cache("xseg_shutdown");
    if (st != XSEG_SUCCESS)
        return st;
    mutex_lock(&hc.lock);
    if (!hc.nblocks[0] && !hc.nblocks[1] && !hc.npending) {
        /* Nothing left in the cache: its arrays go and it starts again as a fresh load's. */
        for (int k = 0; k < 2; k++) {
            xs_free(hc.fr[k].v);
            hc.fr[k] = (struct hc_free){0};
        }
        xs_free(hc.map);
        xs_free(hc.pending);
        xs_free(hc.spare);
        hc.map = NULL;
        hc.pending = hc.spare = NULL;
        hc.mapcap = hc.mapn = hc.npending = hc.cappending = hc.nspare = hc.capspare = 0;
        hc.nuses = hc.nevents = 0;
        hc.allocation = hc.segment = hc.allocated_bytes = hc.reserved_bytes = (struct hc_counter){0};
        hc.alloc_time = hc.free_time = (struct hc_duration){0};
        hc.num_host_alloc = hc.num_host_free = 0;
    }
    mutex_unlock(&hc.lock);
    return XSEG_SUCCESS;
}
