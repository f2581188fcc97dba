/*
 * Spill: live pages of declared blocks to host memory out of memory, and back (spill.h has the
 * contract).
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
#include "core/device/fast.h"
#include "core/device/placement.h"
#include "core/policy/expandable.h"
#include "core/policy/registry.h"
#include "core/policy/release.h"
#include "core/process/procstate.h"
#include "vmm/driver.h"
#include "vmm/event.h"
#include "vmm/segment.h"
#include "vmm/stream.h"

/* ---- records: a table keyed by the block, so a hint and a free cost O(1) however many blocks
 * are declared ---------------------------------------------------------------------------------- */

static size_t rec_slot(const struct block *b, size_t cap)
{
    return (size_t)(((uint64_t)(uintptr_t)b * 0x9e3779b97f4a7c15ull) >> 32) & (cap - 1);
}

static struct spill_rec *rec_find(const struct dev_alloc *d, const struct block *b)
{
    if (!b->spill || !d->spill.cap)
        return NULL;
    for (size_t i = rec_slot(b, d->spill.cap);; i = (i + 1) & (d->spill.cap - 1)) {
        struct spill_rec *r = &d->spill.tab[i];
        if (r->b == b)
            return r;
        if (!r->b)
            return NULL;
    }
}

/* Room for one more record (a table at most 3/4 full); false on host OOM (nothing changed). */
static bool rec_reserve(struct dev_alloc *d)
{
    struct spill_state *sp = &d->spill;
    if ((sp->n + 1) * 4 <= sp->cap * 3)
        return true;
    size_t cap = sp->cap ? sp->cap * 2 : 64;
    struct spill_rec *tab = xs_calloc(cap, sizeof *tab);
    if (!tab)
        return false;
    for (size_t i = 0; i < sp->cap; i++) {
        if (!sp->tab[i].b)
            continue;
        size_t j = rec_slot(sp->tab[i].b, cap);
        while (tab[j].b)
            j = (j + 1) & (cap - 1);
        tab[j] = sp->tab[i];
    }
    xs_free(sp->tab);
    sp->tab = tab;
    sp->cap = cap;
    return true;
}

/* The record of @p b, made when missing; NULL on host OOM (nothing changed). Moves records: a
 * pointer from before is stale after it. */
static struct spill_rec *rec_get(struct dev_alloc *d, struct block *b)
{
    struct spill_rec *r = rec_find(d, b);
    if (r)
        return r;
    if (!rec_reserve(d))
        return NULL;
    size_t i = rec_slot(b, d->spill.cap);
    while (d->spill.tab[i].b)
        i = (i + 1) & (d->spill.cap - 1);
    r = &d->spill.tab[i];
    *r = (struct spill_rec){.b = b};
    d->spill.n++;
    b->spill = true;
    return r;
}

static void order_remove(struct dev_alloc *d, struct spill_rec *r);
static void host_unlink(struct dev_alloc *d, struct spill_rec *r);

/* ---- a declaration's events --------------------------------------------------------------- */

static void decl_events_free(struct spill_rec *r)
{
    for (unsigned i = 0; i < r->nev; i++)
        vevent_destroy(r->ev[i]);
    xs_free(r->ev);
    r->ev = NULL;
    r->nev = 0;
}

/* At the declaration of live block @p b: an event recorded on its stream and on each of its
 * record_stream streams (alive: the block is), so that the work queued on it before the
 * declaration can be waited for without waiting for the context. All or nothing: on a failure
 * nothing is left and the status names the call. */
static xseg_status decl_events(struct dev_alloc *d, const struct block *b, CUevent **out, unsigned *nout)
{
    *out = NULL;
    *nout = 0;
    const struct block_side *sd = block_side(b);
    unsigned n = 1 + (sd ? sd->uses.n : 0);
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    if (st != XSEG_SUCCESS)
        return st;
    CUevent *ev = xs_calloc(n, sizeof *ev);
    if (!ev)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for the events of a declaration");
    unsigned made = 0;
    for (; made < n; made++) {
        CUstream s = made ? stream_set_get(&sd->uses, made - 1) : b->stream;
        if ((st = vevent_create(&ev[made])) != XSEG_SUCCESS)
            break;
        if (!vevent_record(ev[made], s)) {
            made++;
            st = err_set(XSEG_ERROR_DRIVER, "cuEventRecord on stream %p (the block's work before its "
                         "declaration) failed", (void *)s);
            break;
        }
    }
    if (st != XSEG_SUCCESS) {
        struct spill_rec tmp = {.ev = ev, .nev = made};
        decl_events_free(&tmp);
        return st;
    }
    *out = ev;
    *nout = n;
    return XSEG_SUCCESS;
}

/* Remove @p r (backward shift: no tombstones), out of the spill order and the host list first.
 * Moves records: pointers from before are stale. */
static void rec_drop(struct dev_alloc *d, struct spill_rec *r)
{
    struct spill_state *sp = &d->spill;
    if (r->decl)
        sp->ndecl--;
    decl_events_free(r);
    order_remove(d, r);
    host_unlink(d, r);
    size_t mask = sp->cap - 1, hole = (size_t)(r - sp->tab);
    r->b->spill = false;
    for (size_t j = (hole + 1) & mask; sp->tab[j].b; j = (j + 1) & mask) {
        size_t home = rec_slot(sp->tab[j].b, sp->cap);
        /* The entry at j may fill the hole unless its home lies cyclically in (hole, j]. */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            sp->tab[hole] = sp->tab[j];
            hole = j;
        }
    }
    sp->tab[hole] = (struct spill_rec){0};
    sp->n--;
}

/* ---- the spill order: declared blocks in a binary heap, predicted long-lived first, then
 * largest first, then lowest address (a block's key never changes while it is declared) ------- */

static bool ent_before(struct spill_ent a, struct spill_ent b)
{
    if (a.lives != b.lives)
        return a.lives;
    if (a.b->size != b.b->size)
        return a.b->size > b.b->size;
    return a.b->addr < b.b->addr;
}

static void order_put(struct dev_alloc *d, size_t i, struct spill_ent e)
{
    d->spill.order[i] = e;
    rec_find(d, e.b)->at = i + 1;
}

static void order_up(struct dev_alloc *d, size_t i)
{
    struct spill_ent e = d->spill.order[i];
    while (i && ent_before(e, d->spill.order[(i - 1) / 2])) {
        order_put(d, i, d->spill.order[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    order_put(d, i, e);
}

static void order_down(struct dev_alloc *d, size_t i)
{
    struct spill_ent e = d->spill.order[i];
    for (size_t n = d->spill.norder, c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && ent_before(d->spill.order[c + 1], d->spill.order[c]))
            c++;
        if (!ent_before(d->spill.order[c], e))
            break;
        order_put(d, i, d->spill.order[c]);
    }
    order_put(d, i, e);
}

/* Room in the order for every declared block and @p more (false on host OOM, nothing changed). */
static bool order_reserve(struct dev_alloc *d, size_t more)
{
    struct spill_state *sp = &d->spill;
    if (sp->ndecl + more <= sp->ncap)
        return true;
    size_t cap = sp->ncap ? sp->ncap * 2 : 64;
    while (cap < sp->ndecl + more)
        cap *= 2;
    struct spill_ent *v = xs_realloc(sp->order, cap * sizeof *v);
    if (!v)
        return false;
    sp->order = v;
    sp->ncap = cap;
    return true;
}

/* Declared @p r's block joins the order (room reserved at its declaration: never allocates). */
static void order_add(struct dev_alloc *d, struct spill_rec *r)
{
    xseg_assert(r->decl && !r->at && d->spill.norder < d->spill.ncap);
    size_t i = d->spill.norder++;
    d->spill.order[i] = (struct spill_ent){r->b, r->lives};
    order_up(d, i);
}

static void order_remove(struct dev_alloc *d, struct spill_rec *r)
{
    if (!r->at)
        return;
    size_t i = r->at - 1;
    xseg_assert(i < d->spill.norder && d->spill.order[i].b == r->b);
    r->at = 0;
    struct spill_ent last = d->spill.order[--d->spill.norder];
    if (i == d->spill.norder)
        return;
    order_put(d, i, last);
    order_up(d, i);
    order_down(d, (size_t)(rec_find(d, last.b)->at - 1));
}

/* The front of the order leaves it, and is kept just past its end (order[norder] after the call):
 * a spill takes blocks this way, then puts back those that stay (order_restore). */
static struct block *order_take(struct dev_alloc *d)
{
    struct spill_state *sp = &d->spill;
    struct spill_ent e = sp->order[0];
    rec_find(d, e.b)->at = 0;
    struct spill_ent last = sp->order[--sp->norder];
    if (sp->norder) {
        order_put(d, 0, last);
        order_down(d, 0);
    }
    sp->order[sp->norder] = e;
    return e.b;
}

/* The @p n blocks order_take kept past the order's end go back, those @p stays says yes of. */
static void order_restore(struct dev_alloc *d, size_t n, bool (*stays)(struct dev_alloc *, struct block *))
{
    struct spill_state *sp = &d->spill;
    for (size_t i = sp->norder, end = sp->norder + n; i < end; i++) {
        struct spill_ent e = sp->order[i]; /* the heap below grows to i at most: read before */
        if (!stays(d, e.b))
            continue;
        size_t k = sp->norder++;
        sp->order[k] = e;
        order_up(d, k);
    }
}

/* ---- the host list: records with host chunks, oldest first spill to newest ---------------- */

static void host_link(struct dev_alloc *d, struct spill_rec *r)
{
    struct spill_state *sp = &d->spill;
    r->seq = ++sp->seq;
    r->older = sp->newest;
    r->newer = NULL;
    if (sp->newest)
        rec_find(d, sp->newest)->newer = r->b;
    else
        sp->oldest = r->b;
    sp->newest = r->b;
}

static void host_unlink(struct dev_alloc *d, struct spill_rec *r)
{
    struct spill_state *sp = &d->spill;
    if (!r->seq)
        return;
    if (r->older)
        rec_find(d, r->older)->newer = r->newer;
    else
        sp->oldest = r->newer;
    if (r->newer)
        rec_find(d, r->newer)->older = r->older;
    else
        sp->newest = r->older;
    r->seq = 0;
    r->older = r->newer = NULL;
}

/* debug_level 2: the order is a heap whose places the records know, every declared block with
 * no host pages is in it, ndecl counts the declared, and the host list holds exactly the records
 * with host pages, newest first. O(records): spill's calls only. */
static void spill_check(struct dev_alloc *d)
{
    if (!XSEG_CHECK_EXPENSIVE)
        return;
    const struct spill_state *sp = &d->spill;
    xseg_assert(sp->norder <= sp->ncap && sp->ndecl <= sp->ncap);
    size_t ndecl = 0, nhost = 0;
    for (size_t i = 0; i < sp->cap; i++) {
        const struct spill_rec *r = &sp->tab[i];
        if (!r->b)
            continue;
        ndecl += r->decl != 0;
        nhost += r->host != 0;
        xseg_assert(r->b->spill && (r->seq != 0) == (r->host != 0));
        xseg_assert(!r->at || (r->decl && r->at <= sp->norder && sp->order[r->at - 1].b == r->b));
        xseg_assert(!r->decl || r->host || r->at);
    }
    xseg_assert(ndecl == sp->ndecl);
    for (size_t i = 1; i < sp->norder; i++)
        xseg_assert(!ent_before(sp->order[i], sp->order[(i - 1) / 2]));
    uint64_t seq = UINT64_MAX;
    for (const struct block *b = sp->newest; b;) {
        const struct spill_rec *r = rec_find(d, b);
        xseg_assert(r && r->seq && r->seq < seq && (r->older || sp->oldest == b));
        seq = r->seq;
        nhost--;
        b = r->older;
    }
    xseg_assert(nhost == 0);
}

size_t spill_block_host(const struct dev_alloc *d, const struct block *b)
{
    const struct spill_rec *r = rec_find(d, b);
    return r ? r->host : 0;
}

int spill_numa_node(const struct dev_alloc *d)
{
    return d->spill.placed && d->spill.where.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? d->spill.where.id : -1;
}

/* ---- what may move ------------------------------------------------------------------------ */

enum pin {
    PIN_OBSERVER = 1,   /* a segment observer is attached */
    PIN_REGISTERED = 2, /* xseg_register_range */
    PIN_EXPORTED = 4,   /* xseg_ipc_export, while the block lives */
    PIN_HANDLES = 8,    /* xseg_block_handles, until released or the block's free */
    PIN_ASLEEP = 16,    /* its pool sleeps */
};

/* Why the pages of allocated block @p b must stay (PIN_* bits; 0: they may move). */
static unsigned block_pins(struct dev_alloc *d, const struct block *b)
{
    unsigned pins = 0;
    if (atomic_load_explicit(&xseg_rt.obs.count, memory_order_relaxed))
        pins |= PIN_OBSERVER; /* an observer may have registered these pages */
    if (!b->exported && reg_range_registered(d, b->addr, b->size))
        pins |= PIN_REGISTERED; /* an export's own ledger entry (issue 76) is named as the export */
    if (b->exported)
        pins |= PIN_EXPORTED; /* importers map these very chunks */
    if (b->sided && b->u.side->handle_holds)
        pins |= PIN_HANDLES;
    if (b->seg->asleep)
        pins |= PIN_ASLEEP;
    return pins;
}

bool spill_pinned(struct dev_alloc *d, uintptr_t addr, size_t size)
{
    lock_assert_held(&d->lock);
    if (atomic_load_explicit(&xseg_rt.obs.count, memory_order_relaxed) || reg_range_registered(d, addr, size))
        return true;
    struct block *b = ptrmap_get(&d->live, addr);
    for (const struct segrec *s = d->segs; !b && s; s = s->next_seg)
        if (s->vseg && addr >= (uintptr_t)seg_base(s->vseg) && addr - (uintptr_t)seg_base(s->vseg) < s->size)
            for (struct block *x = s->first; x; x = x->next)
                if (x->addr <= addr && addr < x->addr + x->size)
                    b = x;
    if (!b || !b->allocated || addr + size > b->addr + b->size)
        return true; /* only pages inside one live block ever move */
    return block_pins(d, b) != 0;
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

/* Make every declaration made so far covered: the events each recorded at its declaration on
 * the block's streams are waited for (RELAXED capture mode), never the context: a context
 * synchronize would invalidate a capture another thread may run, which xseg cannot see. Nothing
 * is queued on the declared blocks since their declarations, so their pages are still from then
 * on. A declaration whose events cannot be waited for leaves the cover where it was: nothing
 * moves, and the status says why. */
static xseg_status spill_quiesce(struct dev_alloc *d, uint64_t upto, const char *why)
{
    if (upto <= d->spill.synced)
        return XSEG_SUCCESS;
    uint64_t epoch = d->spill.epoch;
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    for (size_t i = 0; i < d->spill.cap && st == XSEG_SUCCESS; i++) {
        struct spill_rec *r = &d->spill.tab[i];
        if (!r->b || !r->decl || r->decl <= d->spill.synced)
            continue;
        for (unsigned k = 0; k < r->nev && st == XSEG_SUCCESS; k++)
            if (!vevent_wait_relaxed(r->ev[k]))
                st = err_set(XSEG_ERROR_DRIVER, "cuEventSynchronize of the event recorded at the declaration of "
                             "%p failed %s; the context is not waited for instead, since that would break a "
                             "stream capture another thread may run: nothing moves", (void *)r->b->addr, why);
    }
    if (st == XSEG_SUCCESS)
        d->spill.synced = epoch;
    return st;
}

/* Wait for the work queued on live block @p b (its stream and record_stream streams, alive: the
 * block is), in RELAXED capture mode (vstream_wait): a block whose declaration ended may have been
 * used since. */
static xseg_status block_streams_wait(struct dev_alloc *d, const struct block *b, const char *why)
{
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    if (st == XSEG_SUCCESS)
        st = vstream_wait(b->stream, why);
    const struct block_side *sd = block_side(b);
    for (unsigned i = 0; sd && i < sd->uses.n && st == XSEG_SUCCESS; i++)
        st = vstream_wait(stream_set_get(&sd->uses, i), why);
    return st;
}

/* Spill's own stream for its copies, made at the first move. */
static xseg_status spill_stream(struct dev_alloc *d)
{
    if (d->spill.copy)
        return XSEG_SUCCESS;
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    if (st == XSEG_SUCCESS)
        st = vstream_create(&d->spill.copy);
    return st == XSEG_SUCCESS ? st : err_prefix(st, "spill's copy stream");
}

/* ---- spill -------------------------------------------------------------------------------- */

static void why(struct dev_alloc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why(struct dev_alloc *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->spill.why, sizeof d->spill.why, fmt, ap);
    va_end(ap);
}

/* "exported over IPC, ..." for the PIN_* bits of @p pins. */
static void pin_words(unsigned pins, char *buf, size_t n)
{
    static const struct {
        unsigned bit;
        const char *words;
    } w[] = {
        {PIN_EXPORTED, "exported over IPC (xseg_ipc_export; until the block's free)"},
        {PIN_HANDLES, "its handles handed out (xseg_block_handles; until xseg_block_handles_release)"},
        {PIN_REGISTERED, "registered (xseg_register_range)"},
        {PIN_OBSERVER, "a segment observer is attached"},
        {PIN_ASLEEP, "its pool sleeps (xseg_sleep)"},
    };
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if ((pins & w[i].bit) && len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "; " : "", w[i].words);
}

struct move_ctx {
    struct dev_alloc *d;
    struct block *b;
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
    xseg_status st = seg_move_chunk(m->b->seg->vseg, g, m->to_host ? &d->spill.where : NULL, d->spill.copy, &moved);
    if (st != XSEG_SUCCESS) {
        m->st = st;
        return false;
    }
    struct spill_rec *r = rec_find(d, m->b);
    struct bpool *pool = block_pool(m->b);
    if (m->to_host) {
        dev_count_unmapped(d, pool, moved, 1);
        dev_count_spill(d, moved, 1);
        d->spill.host_bytes += moved;
        r->host += moved;
    } else {
        dev_count_mapped(d, pool, moved, 1);
        dev_count_spill(d, moved, -1);
        d->spill.host_bytes -= moved;
        r->host -= moved;
    }
    m->moved += moved;
    return m->moved < m->want;
}

/* Move @p b's chunks (to host memory: up to @p want bytes) and keep its record's books. */
static xseg_status move_block(struct dev_alloc *d, struct block *b, bool to_host, size_t want, size_t *moved)
{
    struct move_ctx m = {d, b, to_host, want, 0, to_host ? d->cfg.spill_host_limit : 0, XSEG_SUCCESS};
    each_chunk(b, !to_host, move_one, &m);
    struct spill_rec *r = rec_find(d, b);
    if (to_host && m.moved && !r->seq)
        host_link(d, r);
    if (!to_host && m.moved && r->decl && !r->at)
        order_add(d, r); /* its pages may spill again */
    if (!r->host) {
        host_unlink(d, r);
        if (!r->decl)
            rec_drop(d, r);
    }
    *moved = m.moved;
    return m.st;
}

/* Where host memory goes, decided once (the first segment's device is the device). Sets the
 * reason when the device maps no host memory. */
static bool spill_place(struct dev_alloc *d)
{
    if (d->spill.placed)
        return true;
    for (const struct segrec *s = d->segs; s; s = s->next_seg)
        if (s->vseg) {
            enum seg_host_rule rule;
            if (!seg_host_location(s->vseg, &d->spill.where, &rule)) {
                why(d, "the driver cannot map host memory into device address ranges "
                       "(CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and "
                       "..._HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED are 0)");
                return false;
            }
            d->spill.placed = true;
            dev_note_spill_place(d, spill_numa_node(d), rule == SEG_HOST_OWN_NODE ? 0 : rule == SEG_HOST_ANY_NODE ? 1 : 2);
            return true;
        }
    why(d, "no expandable segment holds live blocks");
    return false;
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
    return spill_place(d);
}

/* Declared blocks a spill looks at and leaves (pinned, or without a whole page on the device of
 * their own) before it gives up: the walk costs what it moves and at most this many more. */
#define SPILL_SKIP_MAX 64

static size_t device_movable(const struct block *b)
{
    size_t movable = 0;
    if (b->expandable)
        each_chunk(b, false, add_bytes, &movable);
    return movable;
}

/* Is declared @p b in the spill order? Unless pages of it went to host memory and none that may
 * move is left on the device (a promotion brings it back: move_block). */
static bool in_order(struct dev_alloc *d, struct block *b)
{
    return !rec_find(d, b)->host || device_movable(b) != 0;
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
    /* From the front of the order until the need is covered: each block taken leaves the order
     * and goes back after (order_restore) unless no page of it may move any more. */
    size_t moved = 0, taken = 0, skipped = 0, npinned = 0, nmovable = 0;
    unsigned pins = 0;
    xseg_status last = XSEG_SUCCESS;
    while (last == XSEG_SUCCESS && moved < need && d->spill.norder && skipped < SPILL_SKIP_MAX) {
        struct block *b = order_take(d);
        taken++;
        unsigned why = 0;
        if (!device_movable(b) || (why = block_pins(d, b))) {
            pins |= why;
            npinned += why != 0;
            skipped++;
            continue;
        }
        nmovable++;
        if ((last = spill_stream(d)) != XSEG_SUCCESS)
            break;
        /* The first block declared since the last wait waits for the device's work: one context
         * synchronize covers every declaration made so far (blocks declared long ago mostly go
         * first, largest first, and need none). */
        size_t m = 0;
        if ((last = spill_quiesce(d, rec_find(d, b)->decl, "before moving pages of blocks declared cold")) ==
            XSEG_SUCCESS)
            last = move_block(d, b, true, need - moved, &m);
        moved += m;
        /* On failure the driver, the limit or the host refused: the rest would fare no better. */
    }
    bool unseen = d->spill.norder != 0; /* declared blocks the walk did not reach */
    order_restore(d, taken, in_order);
    spill_check(d);
    if (moved)
        return XSEG_SUCCESS;
    char words[384];
    if (last != XSEG_SUCCESS && d->spill.why[0])
        ; /* said where it happened (the limit) */
    else if (last != XSEG_SUCCESS)
        why(d, "moving pages to host memory failed (rolled back): %s", err_message());
    else if (!d->spill.ndecl)
        why(d, "no live block is declared cold (xseg_spill_hint(ptr, XSEG_SPILL_COLD), xseg.torch.mark_cold): only "
               "blocks the program promised not to touch move");
    else if (skipped == SPILL_SKIP_MAX && unseen) {
        pin_words(pins, words, sizeof words);
        why(d, "the %d blocks declared cold that come first in spill order (predicted long-lived, then largest) %s%s%s "
               "hold no whole page of their own that may move, and one allocation looks at no more",
            SPILL_SKIP_MAX, npinned ? "are pinned (" : "", npinned ? words : "", npinned ? ") or" : "");
    } else if (!taken && d->spill.host_bytes) {
        why(d, "every block declared cold is on host memory already, but for pages it shares with other blocks");
    } else if (npinned && !nmovable) {
        pin_words(pins, words, sizeof words);
        why(d, "every block declared cold with a whole page of its own is pinned (%s)", words);
    } else
        why(d, "no block declared cold holds a whole page of its own that may move (only pages whose every byte "
               "belongs to one live block move)");
    return XSEG_ERROR_OUT_OF_MEMORY;
}

/* ---- promotion ---------------------------------------------------------------------------- */

/* @p r's declaration ends: it leaves the spill order (the record stays). */
static void decl_end(struct dev_alloc *d, struct spill_rec *r)
{
    if (!r->decl)
        return;
    decl_events_free(r);
    order_remove(d, r);
    r->decl = 0;
    d->spill.ndecl--;
}

/* Promote allocated block @p b (its record has host bytes): its pins, the copy stream, the move. */
static xseg_status promote_block(struct dev_alloc *d, struct block *b)
{
    unsigned pins = block_pins(d, b) & ~(unsigned)PIN_OBSERVER; /* the observer hears the move */
    if (pins) {
        char words[384];
        pin_words(pins, words, sizeof words);
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "block %p is pinned (%s)", (void *)b->addr, words);
    }
    xseg_status st = spill_stream(d);
    size_t moved;
    return st != XSEG_SUCCESS ? st : move_block(d, b, false, SIZE_MAX, &moved);
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
    /* The host list, newest spill first: its length is the blocks with pages on host memory. */
    uint64_t upto = 0;
    for (const struct block *b = d->spill.newest; b;) {
        const struct spill_rec *r = rec_find(d, b);
        if (r->decl > upto && r->host)
            upto = r->decl;
        b = r->older;
    }
    xseg_status st = XSEG_SUCCESS, pinned = XSEG_SUCCESS;
    if (wait && upto)
        st = spill_quiesce(d, upto, "before promoting blocks declared cold");
    for (struct block *b = d->spill.newest, *older; b && st == XSEG_SUCCESS; b = older) {
        struct spill_rec *r = rec_find(d, b);
        older = r->older; /* the promotion below changes b's record only */
        if (!r->host || !r->decl || r->decl > d->spill.synced)
            continue; /* the idle pass: declared after the last synchronize, not waited for */
        st = promote_block(d, b);
        if (st == XSEG_ERROR_ILLEGAL_STATE) {
            pinned = st; /* it stays; the others go on */
            st = XSEG_SUCCESS;
        }
    }
    spill_check(d);
    if (st == XSEG_SUCCESS)
        st = pinned;
    if (st != XSEG_SUCCESS)
        err_prefix(st, "promote: %zu bytes stay on host memory of device %d", d->spill.host_bytes, d->device);
    return st;
}

/* xseg_spill_hint(NONE) of allocated block @p b with host chunks: the work queued on it before
 * this call is waited for (a declaration a synchronize covers: none), the declaration ends, then
 * its pages come back; where the device has no room, the cache goes back to the driver, then other
 * declared blocks spill, once each. No room after that: its pages stay, valid, on host memory. */
static xseg_status promote_own(struct dev_alloc *d, struct block *b)
{
    struct spill_rec *r = rec_find(d, b);
    if (dev_capture_underway(d)) {
        decl_end(d, r); /* not now: its pages stay valid on host memory */
        return XSEG_SUCCESS;
    }
    xseg_status st = r->decl ? spill_quiesce(d, r->decl, "before promoting a block whose declaration ends")
                             : block_streams_wait(d, b, "before promoting a block whose declaration ended");
    decl_end(d, r); /* not a candidate of the spills below */
    for (int attempt = 0; st == XSEG_SUCCESS && attempt < 3; attempt++) {
        st = promote_block(d, b);
        r = rec_find(d, b);
        if (st != XSEG_ERROR_OUT_OF_MEMORY || !r)
            break;
        if (attempt == 0)
            (void)release_cached_blocks(d, NULL);
        else if (spill_make_room(d, r->host) != XSEG_SUCCESS)
            break;
    }
    return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_SUCCESS : st;
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
    bool host = r->host != 0, still = r->decl && r->decl <= d->spill.synced;
    rec_drop(d, r);
    spill_check(d);
    if (!host)
        return false;
    /* The host chunks go once the free merged the block. Declared since before the last
     * synchronize: nothing touched it since, nothing to wait for. Otherwise the device's work is
     * waited for (its streams may be gone). During a capture nothing is waited for or unmapped:
     * the pages are stranded (spill_after_free). */
    if (!still && !dev_capture_underway(d)) {
        *st = drv_ctx_ensure(d->info.primary_ctx);
        if (*st == XSEG_SUCCESS)
            *st = vctx_wait("before dropping the host pages of a freed block");
    }
    /* Even after a failed wait (the driver could not say): free bytes must never stay on host
     * memory, so the chunks go with the free all the same, and the failure is reported. Its
     * recorded streams' work is done: no events. */
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

void spill_teardown(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    xseg_assert(!d->spill.n);
    vstream_destroy(d->spill.copy);
    d->spill.copy = NULL;
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
        xseg_status st = r && r->host ? promote_own(d, b) : XSEG_SUCCESS;
        if ((r = rec_find(d, b))) { /* the declaration ends whatever happened */
            decl_end(d, r);
            if (!r->host)
                rec_drop(d, r);
        }
        spill_check(d);
        return st == XSEG_SUCCESS ? st
                                  : err_prefix(st, "xseg_spill_hint(%p, XSEG_SPILL_NONE): the declaration ended, "
                                               "but pages stay on host memory (valid at their address)", ptr);
    }
    struct spill_rec *r = rec_find(d, b);
    CUevent *ev = NULL;
    unsigned nev = 0;
    if (!r || !r->decl) {
        xseg_status st = decl_events(d, b, &ev, &nev);
        if (st != XSEG_SUCCESS)
            return err_prefix(st, "xseg_spill_hint(%p, XSEG_SPILL_COLD): not declared", ptr);
    }
    if (!order_reserve(d, 1) || !(r = rec_get(d, b))) {
        struct spill_rec tmp = {.ev = ev, .nev = nev};
        decl_events_free(&tmp);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_spill_hint: out of host memory recording the hint of %p", ptr);
    }
    if (!r->decl) {
        r->ev = ev;
        r->nev = nev;
        r->decl = ++d->spill.epoch;
        r->lives = life_predict_long(&d->life, block_requested(b), b->stream, block_pool(b));
        d->spill.ndecl++;
        if (in_order(d, b))
            order_add(d, r);
    }
    spill_check(d);
    return XSEG_SUCCESS;
}

xseg_status spill_location(struct dev_alloc *d, void *ptr, int *location, size_t *host_bytes, int *numa_node,
                           bool *owned)
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
    if (numa_node)
        *numa_node = host ? spill_numa_node(d) : -1;
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
