/*
 * Spill: live pages to host memory out of memory, and back (spill.h has the contract).
 */
#include "core/services/spill.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/device/fast.h"
#include "core/device/placement.h"
#include "core/policy/expandable.h"
#include "core/policy/registry.h"
#include "core/process/procstate.h"
#include "vmm/driver.h"
#include "vmm/segment.h"
#include "vmm/stream.h"

/* ---- records ------------------------------------------------------------------------------ */

static struct spill_rec *rec_find(const struct dev_alloc *d, const struct block *b)
{
    if (!b->spill)
        return NULL;
    for (size_t i = 0; i < d->spill.n; i++)
        if (d->spill.v[i].b == b)
            return &d->spill.v[i];
    return NULL;
}

/* The record of @p b, made when missing; NULL on host OOM (nothing changed). */
static struct spill_rec *rec_get(struct dev_alloc *d, struct block *b)
{
    struct spill_rec *r = rec_find(d, b);
    if (r)
        return r;
    if (!VEC_RESERVE(d->spill.v, d->spill.cap, d->spill.n + 1))
        return NULL;
    r = &d->spill.v[d->spill.n++];
    *r = (struct spill_rec){.b = b};
    b->spill = true;
    return r;
}

static void rec_drop(struct dev_alloc *d, struct spill_rec *r)
{
    r->b->spill = false;
    *r = d->spill.v[--d->spill.n];
}

size_t spill_block_host(const struct dev_alloc *d, const struct block *b)
{
    const struct spill_rec *r = rec_find(d, b);
    return r ? r->host : 0;
}

/* ---- what may move ------------------------------------------------------------------------ */

static const struct segrec *seg_of(const struct dev_alloc *d, uintptr_t addr)
{
    for (const struct segrec *s = d->segs; s; s = s->next_seg)
        if (s->vseg && addr >= (uintptr_t)seg_base(s->vseg) && addr - (uintptr_t)seg_base(s->vseg) < s->size)
            return s;
    return NULL;
}

bool spill_pinned(struct dev_alloc *d, uintptr_t addr, size_t size)
{
    lock_assert_held(&d->lock);
    if (atomic_load_explicit(&xseg_rt.obs.count, memory_order_relaxed))
        return true; /* an observer may have registered these pages */
    if (reg_range_registered(d, addr, size))
        return true; /* registered with xseg_register_range (core/policy/registry.h) */
    const struct segrec *s = seg_of(d, addr);
    if (!s || s->handles_out || s->asleep)
        return true;
    for (const struct block *b = s->first; b; b = b->next)
        if (b->addr < addr + size && addr < b->addr + b->size &&
            (b->exported || (b->sided && b->u.side->handle_holds)))
            return true;
    return false;
}

/* Call @p fn for every chunk lying wholly inside @p b, on host memory when @p host, else on the
 * device; stops when @p fn returns false. */
static void each_chunk(const struct block *b, bool host, bool (*fn)(void *ctx, size_t g, size_t bytes), void *ctx)
{
    const struct seg *vs = b->seg->vseg;
    size_t gran = seg_gran(vs), off = b->addr - (uintptr_t)seg_base(vs);
    size_t g = (off + gran - 1) / gran, end = (off + b->size) / gran;
    while (g < end) {
        size_t first = g, n = 1;
        if (!seg_chunk(vs, g, NULL, &first, &n)) {
            g++;
            continue;
        }
        if (first >= (off + gran - 1) / gran && first + n <= end && (seg_gran_is_host(vs, first) != 0) == host &&
            !fn(ctx, first, n * gran))
            return;
        g = first + n;
    }
}

static bool add_bytes(void *ctx, size_t g, size_t bytes)
{
    (void)g;
    *(size_t *)ctx += bytes;
    return true;
}

/* Are all streams that used @p b (its own, record_stream's) known idle (one query each, no wait)? */
static bool block_idle(struct dev_alloc *d, const struct block *b)
{
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS || !vstream_idle(b->stream))
        return false;
    const struct block_side *sd = block_side(b);
    for (unsigned i = 0; sd && i < sd->uses.n; i++)
        if (!vstream_idle(stream_set_get(&sd->uses, i)))
            return false;
    return true;
}

/* Wait for every stream that used @p b (its own, record_stream's): a stream synchronize each. */
static xseg_status wait_block(struct dev_alloc *d, const struct block *b)
{
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    if (st == XSEG_SUCCESS)
        st = vstream_wait(b->stream, "before moving a block's pages between device and host memory");
    const struct block_side *sd = block_side(b);
    for (unsigned i = 0; sd && st == XSEG_SUCCESS && i < sd->uses.n; i++)
        st = vstream_wait(stream_set_get(&sd->uses, i), "before moving a block's pages (a recorded stream)");
    return st;
}

/* ---- spill -------------------------------------------------------------------------------- */

struct cand {
    struct block *b;
    int cls; /* 0 hinted, 1 predicted long-lived, 2 the rest */
};

static int cand_cmp(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    if (a->cls != b->cls)
        return a->cls < b->cls ? -1 : 1;
    if (a->b->size != b->b->size)
        return a->b->size > b->b->size ? -1 : 1;
    return a->b->addr < b->b->addr ? -1 : a->b->addr > b->b->addr;
}

/* Allocated blocks with a whole device chunk inside that may move, in spill order; *n of them. */
static struct cand *candidates(struct dev_alloc *d, size_t *n, size_t *pinned)
{
    size_t cap = 0;
    struct cand *v = NULL;
    *n = *pinned = 0;
    for (struct segrec *s = d->segs; s; s = s->next_seg) {
        if (!s->vseg)
            continue;
        for (struct block *b = s->first; b; b = b->next) {
            size_t movable = 0;
            if (!b->allocated)
                continue;
            each_chunk(b, false, add_bytes, &movable);
            if (!movable)
                continue;
            if (spill_pinned(d, b->addr, b->size)) {
                (*pinned)++;
                continue;
            }
            if (!VEC_RESERVE(v, cap, *n + 1))
                break; /* host OOM: the candidates so far */
            const struct spill_rec *r = rec_find(d, b);
            int cls = r && r->hint ? 0
                      : life_predict_long(&d->life, block_requested(b), b->stream, block_pool(b)) ? 1
                                                                                                 : 2;
            v[(*n)++] = (struct cand){b, cls};
        }
    }
    if (*n)
        qsort(v, *n, sizeof *v, cand_cmp);
    return v;
}

static void why(struct dev_alloc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why(struct dev_alloc *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->spill.why, sizeof d->spill.why, fmt, ap);
    va_end(ap);
}

struct move_ctx {
    struct dev_alloc *d;
    struct block *b;
    struct spill_rec *r;
    bool to_host;
    size_t want, moved, limit;
    xseg_status st;
};

/* Move one chunk (each_chunk's callback); false stops the walk. */
static bool move_one(void *ctx, size_t g, size_t bytes)
{
    struct move_ctx *m = ctx;
    struct dev_alloc *d = m->d;
    if (m->to_host && m->limit && d->spill.host_bytes + bytes > m->limit) {
        why(d, "spill_host_limit_mb (%zu MiB) is reached", m->limit >> 20);
        m->st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s", d->spill.why);
        return false;
    }
    if (!m->to_host && !dev_fraction_allows(d, bytes)) {
        m->st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "the memory fraction leaves no room to promote %zu bytes", bytes);
        return false;
    }
    size_t moved = 0;
    xseg_status st = seg_move_chunk(m->b->seg->vseg, g, m->to_host, &moved);
    if (st != XSEG_SUCCESS) {
        m->st = st;
        return false;
    }
    struct bpool *pool = block_pool(m->b);
    if (m->to_host) {
        dev_count_unmapped(d, pool, moved, 1);
        dev_count_spill(d, moved, 1);
        d->spill.host_bytes += moved;
        m->r->host += moved;
    } else {
        dev_count_mapped(d, pool, moved, 1);
        dev_count_spill(d, moved, -1);
        d->spill.host_bytes -= moved;
        m->r->host -= moved;
    }
    m->moved += moved;
    return m->moved < m->want;
}

/* Can anything move now? Sets the reason when not. */
static bool spill_possible(struct dev_alloc *d)
{
    if (!d->use_expandable) {
        why(d, "its memory is in classic segments (expandable_segments:False, or the device has no VMM)");
        return false;
    }
    if (dev_capture_underway(d)) {
        why(d, "a stream capture is underway on the device");
        return false;
    }
    if (d->cfg.debug_stale_access) {
        why(d, "debug_stale_access is on (its quarantine and canary pages keep every page where it is)");
        return false;
    }
    for (const struct segrec *s = d->segs; s; s = s->next_seg)
        if (s->vseg) {
            if (seg_host_supported(s->vseg))
                return true;
            why(d, "the driver cannot map host memory into device address ranges "
                   "(CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and "
                   "..._HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED are 0)");
            return false;
        }
    why(d, "no expandable segment holds live blocks");
    return false;
}

xseg_status spill_make_room(struct dev_alloc *d, size_t need)
{
    lock_assert_held(&d->lock);
    d->spill.why[0] = '\0';
    if (!d->cfg.spill_to_host)
        return XSEG_ERROR_OUT_OF_MEMORY;
    if (!spill_possible(d))
        return XSEG_ERROR_OUT_OF_MEMORY;
    fast_settle(d, FAST_ALL, NULL); /* a slot's block must not go back to the cache unseen (BLOCK_FREE_SLOW) */
    size_t n, pinned;
    struct cand *v = candidates(d, &n, &pinned);
    size_t moved = 0;
    xseg_status last = XSEG_SUCCESS;
    for (size_t i = 0; i < n && moved < need; i++) {
        struct block *b = v[i].b;
        struct spill_rec *r = rec_get(d, b);
        if (!r) {
            last = err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for spill's records");
            break;
        }
        xseg_status st = wait_block(d, b);
        struct move_ctx m = {d, b, r, true, need - moved, 0, d->cfg.spill_host_limit, XSEG_SUCCESS};
        if (st == XSEG_SUCCESS) {
            each_chunk(b, false, move_one, &m);
            st = m.st;
        }
        if (m.moved && !r->seq)
            r->seq = ++d->spill.seq;
        if (!r->host && !r->hint)
            rec_drop(d, r);
        moved += m.moved;
        if (st != XSEG_SUCCESS) {
            last = st;
            break; /* the driver, the limit or the host refused: the rest would fare no better */
        }
    }
    xs_free(v);
    if (moved)
        return XSEG_SUCCESS;
    if (last != XSEG_SUCCESS && d->spill.why[0])
        ; /* said where it happened (the limit) */
    else if (last != XSEG_SUCCESS)
        why(d, "moving pages to host memory failed (rolled back): %s", xseg_last_error());
    else if (pinned && !n)
        why(d, "every live block with a whole page is pinned (exported over IPC, its handles handed out, or "
               "a segment observer attached)");
    else
        why(d, "no live block holds a whole page of its own that may move (only pages whose every byte belongs "
               "to one live block move)");
    return XSEG_ERROR_OUT_OF_MEMORY;
}

/* ---- promotion ---------------------------------------------------------------------------- */

static int newest_first(const void *pa, const void *pb)
{
    const struct spill_rec *a = pa, *b = pb;
    return a->seq > b->seq ? -1 : a->seq < b->seq;
}

xseg_status spill_promote(struct dev_alloc *d, bool wait)
{
    lock_assert_held(&d->lock);
    if (!d->spill.host_bytes)
        return XSEG_SUCCESS;
    if (dev_capture_underway(d))
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "promote: a stream capture is underway on device %d; %zu bytes "
                       "stay on host memory", d->device, d->spill.host_bytes);
    fast_settle(d, FAST_ALL, NULL);
    /* Records are swapped around as they go: work on a snapshot of the blocks, newest first. */
    size_t n = d->spill.n;
    struct spill_rec *order = xs_malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "promote: out of host memory");
    memcpy(order, d->spill.v, n * sizeof *order);
    qsort(order, n, sizeof *order, newest_first);
    xseg_status st = XSEG_SUCCESS;
    for (size_t i = 0; i < n && st == XSEG_SUCCESS; i++) {
        struct spill_rec *r = rec_find(d, order[i].b);
        if (!r || !r->host)
            continue;
        if (!wait && !block_idle(d, r->b))
            continue; /* its streams still work: the next point */
        if (wait && (st = wait_block(d, r->b)) != XSEG_SUCCESS)
            break;
        struct move_ctx m = {d, r->b, r, false, SIZE_MAX, 0, 0, XSEG_SUCCESS};
        each_chunk(r->b, true, move_one, &m);
        st = m.st;
        if (!r->host) {
            r->seq = 0;
            if (!r->hint)
                rec_drop(d, r);
        }
    }
    xs_free(order);
    if (st != XSEG_SUCCESS)
        err_prefix(st, "promote: %zu bytes stay on host memory of device %d", d->spill.host_bytes, d->device);
    return st;
}

/* ---- free --------------------------------------------------------------------------------- */

bool spill_on_free(struct dev_alloc *d, struct block *b, xseg_status *st)
{
    lock_assert_held(&d->lock);
    *st = XSEG_SUCCESS;
    struct spill_rec *r = rec_find(d, b);
    if (!r) {
        b->spill = false;
        return false;
    }
    bool host = r->host != 0;
    rec_drop(d, r);
    if (!host)
        return false;
    /* The host chunks go once the free merged the block: wait for its streams first, after which
     * its recorded streams need no events (nothing of theirs is left to wait for). During a
     * capture nothing is waited for or unmapped: the pages are stranded (spill_after_free). */
    if (!dev_capture_underway(d))
        *st = wait_block(d, b);
    /* Even after a failed wait (the driver could not say): free bytes must never stay on host
     * memory, so the chunks go with the free all the same, and the failure is reported. */
    struct block_side *sd = block_side(b);
    if (sd)
        stream_set_clear(&sd->uses);
    return true;
}

void spill_after_free(struct dev_alloc *d, struct segrec *s, uintptr_t addr)
{
    lock_assert_held(&d->lock);
    struct block *b = s->first;
    while (b && !(addr >= b->addr && addr < b->addr + b->size))
        b = b->next;
    if (!b || !block_in_free_index(b))
        return; /* cannot be: spill_on_free left it nothing to wait for */
    size_t dropped = 0;
    (void)exp_drop_host(d, b, dev_capture_underway(d), &dropped);
    if (dropped) {
        dev_count_spill(d, dropped, 0);
        d->spill.host_bytes -= dropped;
    }
}

void spill_after_quarantine(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    d->spill.host_bytes = (size_t)d->acct.stats.spilled_bytes.current;
}

/* ---- the public queries ------------------------------------------------------------------- */

xseg_status spill_hint(struct dev_alloc *d, void *ptr, int hint, bool *owned)
{
    lock_assert_held(&d->lock);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)ptr);
    *owned = b != NULL;
    if (!b)
        return XSEG_SUCCESS;
    if (hint != XSEG_SPILL_NONE && hint != XSEG_SPILL_COLD)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_spill_hint: hint %d is neither XSEG_SPILL_NONE (0) nor "
                       "XSEG_SPILL_COLD (1)", hint);
    if (b->addr != (uintptr_t)ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_spill_hint: %p is not the start of a block", ptr);
    if (hint == XSEG_SPILL_NONE) {
        struct spill_rec *r = rec_find(d, b);
        if (r && !r->host)
            rec_drop(d, r);
        else if (r)
            r->hint = false;
        return XSEG_SUCCESS;
    }
    struct spill_rec *r = rec_get(d, b);
    if (!r)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_spill_hint: out of host memory recording the hint of %p", ptr);
    r->hint = true;
    return XSEG_SUCCESS;
}

xseg_status spill_location(struct dev_alloc *d, void *ptr, int *location, size_t *host_bytes, bool *owned)
{
    lock_assert_held(&d->lock);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)ptr);
    *owned = b != NULL;
    if (!b)
        return XSEG_SUCCESS;
    size_t host = spill_block_host(d, b);
    *location = !host ? XSEG_LOCATION_DEVICE : host == b->size ? XSEG_LOCATION_HOST : XSEG_LOCATION_MIXED;
    if (host_bytes)
        *host_bytes = host;
    return XSEG_SUCCESS;
}

void spill_oom_info(const struct dev_alloc *d, char *buf, size_t n)
{
    buf[0] = '\0';
    if (!d->cfg.spill_to_host)
        return;
    char s[32];
    if (d->spill.why[0])
        snprintf(buf, n, " Spill to host memory was not possible: %s (%s spilled now).", d->spill.why,
                 err_format_size(d->spill.host_bytes, s));
    else
        snprintf(buf, n, " %s of live blocks is spilled to host memory.", err_format_size(d->spill.host_bytes, s));
}

