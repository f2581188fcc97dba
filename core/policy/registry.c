/*
 * The registration ledger (core/policy/registry.h, xseg_register_range).
 *
 * A registration is in force (its registrant holds a registration of the current pages) or
 * released (its before callback returned 0). Pages of a registration in force are never unmapped
 * or re-backed: every unmap site asks reg_range_registered under the device lock. Callbacks never
 * run under a lock of xseg, so they may call xseg, and a pass holds a reference on each entry it
 * calls, so an xseg_unregister_range from inside the callback (or from another thread meanwhile)
 * takes the entry out of the list at once and frees it when the last reference goes.
 *
 * A pass: under the device lock and the ledger's lock, the entries it concerns are marked busy
 * (a busy entry is skipped by other passes: one callback of an entry at a time) and referenced;
 * both locks are dropped; each callback runs, on the calling thread, or, with timeout_ms, on a
 * thread of its own that the pass waits for at most that long; the result is settled under the
 * ledger's lock. A callback that has not returned by then keeps its entry busy and in force (its
 * pages stay mapped); its thread settles the entry when it does return.
 *
 * Lock order: a device lock, then xseg_rt.reg.lock; neither is held across a callback.
 */
#include "core/policy/registry.h"

#include <errno.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/fork.h"
#include "base/strbuf.h"
#include "base/hostmem.h"
#include "base/witness.h"
#include "core/device/check.h"
#include "core/policy/pools.h"
#include "vmm/driver.h"
#include "vmm/segment.h"

struct reg_entry {
    struct reg_entry *next;
    int device;
    uintptr_t addr;
    size_t size;
    xseg_range_callbacks cb;
    void *ctx;
    bool released; /* before returned 0 (or no before): the registrant holds no registration */
    bool busy;     /* a callback of it runs */
    bool gone;     /* unregistered: out of the list, freed with its last reference */
    unsigned refs; /* the list's (until gone), each pass's and each callback thread's */
    enum reg_owner owner; /* REG_OWNER_USER, or one of xseg's own (reg_own_locked) */
    /* The classic segment holding the range (NULL: expandable). Counted in its reg_held from the
     * entry's making (device lock held) until it leaves the list (entry_gone_locked), so the
     * segment outlives the entry: release_block skips a held segment. */
    struct segrec *cseg;
};

/* What an entry of xseg's own is about (its ctx, freed with the entry). */
struct reg_own {
    enum reg_owner owner;
    int fd;          /* REG_OWNER_DMABUF: the descriptor handed out, -1 otherwise */
    dev_t fd_dev;    /* its identity when handed out: a descriptor number reused for another */
    ino_t fd_ino;    /* file does not count as the dma-buf still open */
    /* REG_OWNER_NCCL: the communicator, NCCL's handle, the id xseg handed out (shared by the
     * entries of one call), and whether an xseg_nccl_deregister is at work on it */
    void *comm, *nccl;
    uint64_t id;
    bool closing;
};

FORK_MUTEX_AT(FORK_RANK_REGISTRY, reg_lock, xseg_rt.reg.lock)

static bool overlaps(const struct reg_entry *e, uintptr_t lo, uintptr_t hi)
{
    return e->addr < hi && lo < e->addr + e->size;
}

/* Is @p s's reg_held the number of entries of the list inside it? The ledger's invariant for the
 * holds on classic segments, checked at every change of a count (debug level 2: it walks the
 * list). xseg_rt.reg.lock held. */
static bool held_recount_ok(const struct segrec *s)
{
    unsigned n = 0;
    for (const struct reg_entry *e = xseg_rt.reg.list; e; e = e->next)
        if (e->cseg == s) {
            xseg_assert(!s->vseg && e->addr >= s->first->addr && e->addr + e->size <= s->first->addr + s->size);
            n++;
        }
    return atomic_load_explicit(&((struct segrec *)s)->reg_held, memory_order_relaxed) == n;
}

/* @p e, just unlinked from the list, is gone: the ledger's count and its classic segment's hold
 * drop (the segment may be released from now on). xseg_rt.reg.lock held; the device lock need
 * not be (the hold kept the segment alive until this store). */
static void entry_gone_locked(struct reg_entry *e)
{
    e->gone = true;
    atomic_fetch_sub_explicit(&xseg_rt.reg.count, 1, memory_order_relaxed);
    if (e->cseg) {
        atomic_fetch_sub_explicit(&e->cseg->reg_held, 1, memory_order_relaxed);
        xseg_assert_expensive(held_recount_ok(e->cseg));
        e->cseg = NULL;
    }
}

/* Link @p e (filled in) at the head of the list; its classic segment (if any) is held from now.
 * Device lock and xseg_rt.reg.lock held. */
static void entry_link_locked(struct reg_entry *e)
{
    e->next = xseg_rt.reg.list;
    xseg_rt.reg.list = e;
    atomic_fetch_add_explicit(&xseg_rt.reg.count, 1, memory_order_relaxed);
    if (e->cseg) {
        atomic_fetch_add_explicit(&e->cseg->reg_held, 1, memory_order_relaxed);
        xseg_assert_expensive(held_recount_ok(e->cseg));
    }
}

/* Drop a reference. xseg_rt.reg.lock held. */
static void unref_locked(struct reg_entry *e)
{
    if (--e->refs == 0) {
        if (e->owner != REG_OWNER_USER)
            xs_free(e->ctx);
        xs_free(e);
    }
}

/* The expandable segment of @p d holding all of [addr, addr + size), or NULL. Device lock held. */
static struct segrec *find_seg(struct dev_alloc *d, uintptr_t addr, size_t size, bool *classic)
{
    if (classic)
        *classic = false;
    for (struct segrec *s = d->segs; s; s = s->next_seg) {
        if (s->vseg) {
            uintptr_t base = (uintptr_t)seg_base(s->vseg);
            if (addr >= base && size <= seg_va_size(s->vseg) && addr - base <= seg_va_size(s->vseg) - size)
                return s;
        } else if (classic && s->first && addr >= s->first->addr && addr - s->first->addr < s->size) {
            *classic = true;
        }
    }
    return NULL;
}

/* The classic segment of @p d holding all of [addr, addr + size), or NULL. Device lock held. */
static struct segrec *find_classic(struct dev_alloc *d, uintptr_t addr, size_t size)
{
    for (struct segrec *s = d->segs; s; s = s->next_seg)
        if (!s->vseg && s->first && addr >= s->first->addr && size <= s->size && addr - s->first->addr <= s->size - size)
            return s;
    return NULL;
}


/* Every page of [addr, addr + size) in @p s is mapped and awake. Device lock held. */
static bool all_mapped(const struct segrec *s, uintptr_t addr, size_t size)
{
    if (s->asleep)
        return false;
    uintptr_t base = (uintptr_t)seg_base(s->vseg);
    size_t g = seg_gran(s->vseg), first = (addr - base) / g, last = (addr - base + size - 1) / g;
    for (size_t i = first; i <= last; i++)
        if (!seg_gran_is_mapped(s->vseg, i) || seg_gran_is_asleep(s->vseg, i))
            return false;
    return true;
}

xseg_status reg_add(struct dev_alloc *d, uintptr_t addr, size_t size, const xseg_range_callbacks *cb, void *ctx,
                    bool *mine)
{
    dev_lock(d, DEV_NEED_SLOTS);
    bool classic;
    struct segrec *s = find_seg(d, addr, size, &classic);
    *mine = s || classic;
    /* A classic segment's pages never move: the entry only holds the segment off every release. */
    struct segrec *cs = !s && classic ? find_classic(d, addr, size) : NULL;
    if (!s && !cs) {
        dev_unlock(d);
        return classic ? err_set(XSEG_ERROR_INVALID_VALUE, "xseg_register_range: [%p, +%zu) runs past the end of "
                                 "its classic (cuMemAlloc) segment on device %d; register a range inside one segment",
                                 (void *)addr, size, d->device)
                       : XSEG_SUCCESS;
    }
    if (s && !all_mapped(s, addr, size)) {
        dev_unlock(d);
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_register_range: [%p, +%zu) of device %d is not all mapped now (free pages given back, "
                       "or its pool sleeps); register memory that is mapped", (void *)addr, size, d->device);
    }
    mutex_lock(&xseg_rt.reg.lock);
    for (struct reg_entry *e = xseg_rt.reg.list; e; e = e->next)
        if (e->addr == addr && e->size == size && e->ctx == ctx) {
            mutex_unlock(&xseg_rt.reg.lock);
            dev_unlock(d);
            return err_set(XSEG_ERROR_INVALID_VALUE,
                           "xseg_register_range: [%p, +%zu) is registered already with this ctx", (void *)addr, size);
        }
    struct reg_entry *e = xs_calloc(1, sizeof *e);
    if (!e) {
        mutex_unlock(&xseg_rt.reg.lock);
        dev_unlock(d);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_register_range: out of host memory");
    }
    *e = (struct reg_entry){.device = d->device, .addr = addr, .size = size, .cb = *cb, .ctx = ctx, .refs = 1,
                            .cseg = cs};
    entry_link_locked(e);
    mutex_unlock(&xseg_rt.reg.lock);
    dev_unlock(d);
    return XSEG_SUCCESS;
}

xseg_status reg_remove(uintptr_t addr, size_t size, void *ctx)
{
    mutex_lock(&xseg_rt.reg.lock);
    for (struct reg_entry **pe = &xseg_rt.reg.list; *pe; pe = &(*pe)->next) {
        struct reg_entry *e = *pe;
        if (e->addr != addr || e->size != size || e->ctx != ctx)
            continue;
        *pe = e->next;
        entry_gone_locked(e);
        unref_locked(e);
        mutex_unlock(&xseg_rt.reg.lock);
        return XSEG_SUCCESS;
    }
    mutex_unlock(&xseg_rt.reg.lock);
    return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_unregister_range: no registration of [%p, +%zu) with ctx %p",
                   (void *)addr, size, ctx);
}

bool reg_first_registered(struct dev_alloc *d, uintptr_t lo, uintptr_t hi, uintptr_t *plo, uintptr_t *phi)
{
    lock_assert_held(&d->lock);
    if (!atomic_load_explicit(&xseg_rt.reg.count, memory_order_relaxed))
        return false;
    bool any = false;
    mutex_lock(&xseg_rt.reg.lock);
    for (const struct reg_entry *e = xseg_rt.reg.list; e; e = e->next) {
        if (e->device != d->device || e->released || !overlaps(e, lo, hi))
            continue;
        if (!any || e->addr < *plo) {
            *plo = e->addr;
            *phi = e->addr + e->size;
        }
        any = true;
    }
    if (any) { /* extend over in-force neighbours that overlap it */
        for (bool grew = true; grew;) {
            grew = false;
            for (const struct reg_entry *e = xseg_rt.reg.list; e; e = e->next)
                if (e->device == d->device && !e->released && overlaps(e, *plo, *phi + 1) &&
                    e->addr + e->size > *phi) {
                    *phi = e->addr + e->size;
                    grew = true;
                }
        }
    }
    mutex_unlock(&xseg_rt.reg.lock);
    return any;
}

bool reg_range_registered(struct dev_alloc *d, uintptr_t addr, size_t size)
{
    uintptr_t lo, hi;
    return reg_first_registered(d, addr, addr + size, &lo, &hi);
}

void reg_note_mapped(struct dev_alloc *d, uintptr_t addr, size_t size)
{
    lock_assert_held(&d->lock);
    if (!atomic_load_explicit(&xseg_rt.reg.count, memory_order_relaxed))
        return;
    mutex_lock(&xseg_rt.reg.lock);
    for (const struct reg_entry *e = xseg_rt.reg.list; e; e = e->next)
        if (e->device == d->device && e->released && overlaps(e, addr, addr + size))
            atomic_store_explicit(&d->reg_due, true, memory_order_relaxed);
    mutex_unlock(&xseg_rt.reg.lock);
}

/* ---- xseg's own entries (a dma-buf or an IPC export handed out, register_blocks_above_mb) ---- */

/* The before callback of xseg's own entries: no registrant can be asked, so the pages stay
 * (the ledger's rule for a registrant that does not release), except at shutdown, which ends
 * every promise xseg made itself, and for a dma-buf whose descriptor is closed (or now names
 * another file): its entry goes then. */
static int own_before(const xseg_range_event *ev, void *ctx)
{
    const struct reg_own *o = ctx;
    if (o->owner == REG_OWNER_NCCL) /* NCCL holds the pages until xseg_nccl_deregister, shutdown or not */
        return 1;
    if (ev->reason == XSEG_RANGE_SHUTDOWN)
        return 0;
    if (o->owner == REG_OWNER_DMABUF) {
        struct stat sb;
        if (fstat(o->fd, &sb) != 0 || sb.st_dev != o->fd_dev || sb.st_ino != o->fd_ino) {
            (void)reg_remove((uintptr_t)ev->ptr, ev->size, ctx);
            return 0;
        }
    }
    return 1;
}

static const char *owner_words(enum reg_owner o)
{
    switch (o) {
    case REG_OWNER_DMABUF:
        return "a dma-buf of the range handed out by xseg_range_dmabuf, still open";
    case REG_OWNER_EXPORT:
        return "the block exported with xseg_ipc_export, until its free";
    case REG_OWNER_BLOCK:
        return "register_blocks_above_mb: a live block that large, until its free";
    case REG_OWNER_NCCL:
        return "ncclCommRegister through xseg_nccl_register, until xseg_nccl_deregister";
    default:
        return "";
    }
}

/* Mark (@p delta 1) or unmark (-1) the allocated blocks of @p s overlapping [lo, hi): false on
 * host OOM for a side struct (the blocks marked so far stay marked: the caller unmarks). */
static bool mark_blocks(struct segrec *s, uintptr_t lo, uintptr_t hi, int delta, size_t *marked)
{
    for (struct block *b = s->first; b; b = b->next) {
        if (!b->allocated || b->addr >= hi || b->addr + b->size <= lo)
            continue;
        if (delta < 0) {
            if (!*marked)
                return true;
            --*marked;
            b->u.side->ledger--;
            block_side_drop(b);
            continue;
        }
        struct block_side *sd = block_side_get(b);
        if (!sd)
            return false;
        sd->ledger++;
        ++*marked;
    }
    return true;
}

xseg_status reg_own_locked(struct dev_alloc *d, uintptr_t addr, size_t size, enum reg_owner owner, int fd)
{
    lock_assert_held(&d->lock);
    struct segrec *s = find_seg(d, addr, size, NULL);
    if (!s)
        return XSEG_SUCCESS; /* classic memory: freed whole, never re-backed */
    if (owner == REG_OWNER_EXPORT || owner == REG_OWNER_BLOCK) { /* one of a kind a block */
        mutex_lock(&xseg_rt.reg.lock);
        for (struct reg_entry *e = xseg_rt.reg.list; e; e = e->next)
            if (e->owner == owner && e->device == d->device && e->addr == addr && e->size == size) {
                mutex_unlock(&xseg_rt.reg.lock);
                return XSEG_SUCCESS;
            }
        mutex_unlock(&xseg_rt.reg.lock);
    }
    struct reg_own *o = xs_calloc(1, sizeof *o);
    struct reg_entry *e = o ? xs_calloc(1, sizeof *e) : NULL;
    size_t marked = 0;
    if (!e || !mark_blocks(s, addr, addr + size, 1, &marked)) {
        size_t n = marked;
        (void)mark_blocks(s, addr, addr + size, -1, &n);
        xs_free(e);
        xs_free(o);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "registration ledger: out of host memory recording [%p, +%zu) of "
                       "device %d (%s)", (void *)addr, size, d->device, owner_words(owner));
    }
    *o = (struct reg_own){.owner = owner, .fd = fd};
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0) {
        o->fd_dev = sb.st_dev;
        o->fd_ino = sb.st_ino;
    }
    static const xseg_range_callbacks own_cb = {own_before, NULL, 0};
    mutex_lock(&xseg_rt.reg.lock);
    *e = (struct reg_entry){.device = d->device, .addr = addr, .size = size, .cb = own_cb, .ctx = o, .refs = 1,
                            .owner = owner};
    entry_link_locked(e);
    mutex_unlock(&xseg_rt.reg.lock);
    return XSEG_SUCCESS;
}

const char *reg_span_words(struct dev_alloc *d, uintptr_t lo, uintptr_t hi)
{
    lock_assert_held(&d->lock);
    enum reg_owner owner = REG_OWNER_USER;
    bool user = false;
    mutex_lock(&xseg_rt.reg.lock);
    for (const struct reg_entry *e = xseg_rt.reg.list; e; e = e->next)
        if (e->device == d->device && !e->released && overlaps(e, lo, hi)) {
            if (e->owner == REG_OWNER_USER)
                user = true;
            else if (owner == REG_OWNER_USER)
                owner = e->owner;
        }
    mutex_unlock(&xseg_rt.reg.lock);
    return user || owner == REG_OWNER_USER ? "xseg_register_range; its before callback did not release it"
                                           : owner_words(owner);
}

void reg_disown_locked(struct dev_alloc *d, uintptr_t addr, size_t size)
{
    lock_assert_held(&d->lock);
    mutex_lock(&xseg_rt.reg.lock);
    for (struct reg_entry **pe = &xseg_rt.reg.list; *pe;) {
        struct reg_entry *e = *pe;
        if (e->owner == REG_OWNER_USER || e->owner == REG_OWNER_NCCL || e->device != d->device ||
            !overlaps(e, addr, addr + size)) {
            pe = &e->next;
            continue;
        }
        *pe = e->next;
        entry_gone_locked(e);
        unref_locked(e);
    }
    mutex_unlock(&xseg_rt.reg.lock);
}

/* ---- NCCL's registrations through xseg (xseg_nccl_register) ---------------------------------- */

uint64_t reg_nccl_next_id(void)
{
    mutex_lock(&xseg_rt.reg.lock);
    uint64_t id = ++xseg_rt.reg.nccl_ids;
    mutex_unlock(&xseg_rt.reg.lock);
    return id;
}

/* Make one NCCL entry. Device lock held (the pages cannot go meanwhile). */
static xseg_status nccl_entry_locked(struct dev_alloc *d, uintptr_t addr, size_t size, void *comm, uint64_t id,
                                     struct segrec *cseg)
{
    struct reg_own *o = xs_calloc(1, sizeof *o);
    struct reg_entry *e = o ? xs_calloc(1, sizeof *e) : NULL;
    if (!e) {
        xs_free(o);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "registration ledger: out of host memory recording [%p, +%zu) of "
                       "device %d for ncclCommRegister", (void *)addr, size, d->device);
    }
    *o = (struct reg_own){.owner = REG_OWNER_NCCL, .fd = -1, .comm = comm, .id = id};
    static const xseg_range_callbacks own_cb = {own_before, NULL, 0};
    mutex_lock(&xseg_rt.reg.lock);
    *e = (struct reg_entry){.device = d->device, .addr = addr, .size = size, .cb = own_cb, .ctx = o, .refs = 1,
                            .owner = REG_OWNER_NCCL, .cseg = cseg};
    entry_link_locked(e);
    mutex_unlock(&xseg_rt.reg.lock);
    return XSEG_SUCCESS;
}

/* Unlink the NCCL entries of @p id (every one with @p addr 0, else that one). reg lock held. */
static void nccl_drop_locked(uint64_t id, uintptr_t addr)
{
    for (struct reg_entry **pe = &xseg_rt.reg.list; *pe;) {
        struct reg_entry *e = *pe;
        const struct reg_own *o = e->ctx;
        if (e->owner != REG_OWNER_NCCL || o->id != id || (addr && e->addr != addr)) {
            pe = &e->next;
            continue;
        }
        *pe = e->next;
        entry_gone_locked(e);
        unref_locked(e);
    }
}

xseg_status reg_nccl_own(struct dev_alloc *d, uintptr_t addr, size_t size, void *comm, uint64_t id, bool *mine)
{
    dev_lock(d, DEV_NEED_SLOTS);
    bool classic;
    struct segrec *s = find_seg(d, addr, size, &classic);
    *mine = s || classic;
    xseg_status st = XSEG_SUCCESS;
    /* A classic segment's pages never move: the entry holds it off every release until deregistered. */
    struct segrec *cs = !s && classic ? find_classic(d, addr, size) : NULL;
    if (!s && classic && !cs)
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_nccl_register: [%p, +%zu) runs past the end of its classic "
                     "(cuMemAlloc) segment on device %d; register a range inside one segment", (void *)addr, size,
                     d->device);
    else if (cs)
        st = nccl_entry_locked(d, addr, size, comm, id, cs);
    else if (s && !all_mapped(s, addr, size))
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_nccl_register: [%p, +%zu) of device %d is not all mapped now "
                     "(free pages given back, or its pool sleeps); register memory that is mapped", (void *)addr,
                     size, d->device);
    else if (s)
        st = nccl_entry_locked(d, addr, size, comm, id, NULL);
    dev_unlock(d);
    return st;
}

xseg_status reg_nccl_own_pool(struct dev_alloc *d, xseg_pool_id pool, void *comm, uint64_t id, size_t *n)
{
    *n = 0;
    dev_lock(d, DEV_NEED_SLOTS);
    bool dflt = !pool.first && !pool.second;
    const struct priv_pool *pp = dflt ? NULL : pools_find(d, pool);
    if (!dflt && !pp) { /* a pool this device never allocated for: it maps nothing here */
        dev_unlock(d);
        return XSEG_SUCCESS;
    }
    xseg_status st = XSEG_SUCCESS;
    for (struct segrec *s = d->segs; s && st == XSEG_SUCCESS; s = s->next_seg) { /* refusals first */
        if (dev_pool_owner(d, s->pool) != pp)
            continue;
        if (s->asleep)
            st = err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_nccl_register_pool: the pool sleeps on device %d (wake it "
                         "first: its pages have no memory now)", d->device);
    }
    for (struct segrec *s = d->segs; s && st == XSEG_SUCCESS; s = s->next_seg) {
        if (dev_pool_owner(d, s->pool) != pp)
            continue;
        if (!s->vseg) { /* a classic segment: one range, its whole allocation (held off release) */
            if ((st = nccl_entry_locked(d, s->first->addr, s->size, comm, id, s)) == XSEG_SUCCESS)
                ++*n;
            continue;
        }
        uintptr_t base = (uintptr_t)seg_base(s->vseg);
        size_t g = seg_gran(s->vseg), ng = seg_va_size(s->vseg) / g;
        for (size_t i = 0; i < ng && st == XSEG_SUCCESS;) { /* a run of mapped, awake granules */
            size_t j = i;
            while (j < ng && seg_gran_is_mapped(s->vseg, j) && !seg_gran_is_asleep(s->vseg, j))
                j++;
            if (j > i && (st = nccl_entry_locked(d, base + i * g, (j - i) * g, comm, id, NULL)) == XSEG_SUCCESS)
                ++*n;
            i = j > i ? j : i + 1;
        }
    }
    if (st != XSEG_SUCCESS) {
        mutex_lock(&xseg_rt.reg.lock);
        nccl_drop_locked(id, 0);
        mutex_unlock(&xseg_rt.reg.lock);
        *n = 0;
    }
    dev_unlock(d);
    return st;
}

bool reg_nccl_set(uint64_t id, uintptr_t addr, void *nccl)
{
    bool found = false;
    mutex_lock(&xseg_rt.reg.lock);
    for (struct reg_entry *e = xseg_rt.reg.list; e && !found; e = e->next) {
        struct reg_own *o = e->ctx;
        if (e->owner == REG_OWNER_NCCL && o->id == id && e->addr == addr) {
            o->nccl = nccl;
            found = true;
        }
    }
    mutex_unlock(&xseg_rt.reg.lock);
    return found;
}

xseg_status reg_nccl_claim(uint64_t id, void *comm, struct reg_nccl_item **items, size_t *n)
{
    *items = NULL;
    *n = 0;
    size_t k = 0, closing = 0;
    void *other = NULL;
    mutex_lock(&xseg_rt.reg.lock);
    for (struct reg_entry *e = xseg_rt.reg.list; e; e = e->next) {
        const struct reg_own *o = e->ctx;
        if (e->owner != REG_OWNER_NCCL || o->id != id)
            continue;
        if (o->comm != comm)
            other = o->comm;
        else if (o->closing)
            closing++;
        else
            k++;
    }
    xseg_status st = XSEG_SUCCESS;
    if (other)
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_nccl_deregister: handle %#llx was registered with comm %p, not "
                     "%p", (unsigned long long)id, other, comm);
    else if (!k && closing)
        st = err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_nccl_deregister: handle %#llx is being deregistered by another "
                     "call now", (unsigned long long)id);
    else if (!k)
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_nccl_deregister: unknown handle %#llx (not one "
                     "xseg_nccl_register or xseg_nccl_register_pool returned, or deregistered already)",
                     (unsigned long long)id);
    else if (!(*items = xs_malloc(k * sizeof **items)))
        st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_nccl_deregister: out of host memory (nothing deregistered)");
    for (struct reg_entry *e = xseg_rt.reg.list; e && st == XSEG_SUCCESS; e = e->next) {
        struct reg_own *o = e->ctx;
        if (e->owner != REG_OWNER_NCCL || o->id != id || o->closing)
            continue;
        o->closing = true;
        (*items)[(*n)++] = (struct reg_nccl_item){e->device, e->addr, e->size, o->nccl};
    }
    mutex_unlock(&xseg_rt.reg.lock);
    return st;
}

void reg_nccl_settle(uint64_t id, uintptr_t addr, bool drop)
{
    mutex_lock(&xseg_rt.reg.lock);
    if (drop) {
        nccl_drop_locked(id, addr);
    } else {
        for (struct reg_entry *e = xseg_rt.reg.list; e; e = e->next) {
            struct reg_own *o = e->ctx;
            if (e->owner == REG_OWNER_NCCL && o->id == id && e->addr == addr)
                o->closing = false;
        }
    }
    mutex_unlock(&xseg_rt.reg.lock);
}

/* ---- calling back ------------------------------------------------------------------------ */

/* One callback run on a thread of its own (timeout_ms): whoever comes last frees it. */
struct reg_call {
    pthread_mutex_t m;
    pthread_cond_t cv;
    struct reg_entry *e;
    xseg_range_event ev;
    bool before, done, abandoned;
    int rc;
};

/* Record the result of a callback of @p e (busy until now) and drop the caller's reference. */
static void settle(struct reg_entry *e, bool before, int rc, bool count)
{
    mutex_lock(&xseg_rt.reg.lock);
    e->busy = false;
    if (before) {
        if (rc == 0 || e->gone) {
            e->released = true;
        } else if (count) {
            xseg_rt.reg.failures[e->device]++;
            xseg_rt.reg.kept_bytes[e->device] += e->size;
        }
    } else if (!e->gone) {
        if (rc == 0)
            e->released = false;
        else if (count)
            xseg_rt.reg.failures[e->device]++;
    }
    unref_locked(e);
    mutex_unlock(&xseg_rt.reg.lock);
}

static int run_callback(struct reg_entry *e, bool before, const xseg_range_event *ev)
{
    int (*fn)(const xseg_range_event *, void *) = before ? e->cb.before : e->cb.after;
    return fn ? fn(ev, e->ctx) : 0;
}

static void *call_main(void *arg)
{
    struct reg_call *c = arg;
    int rc = run_callback(c->e, c->before, &c->ev);
    pthread_mutex_lock(&c->m);
    c->done = true;
    c->rc = rc;
    bool abandoned = c->abandoned;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->m);
    if (abandoned) { /* the pass gave up on it: this thread settles the entry and cleans up */
        settle(c->e, c->before, rc, false); /* counted when the pass gave up */
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->m);
        xs_free(c);
    }
    return NULL;
}

/* Run one callback of busy entry @p e and settle it. *timed_out: it did not return within
 * timeout_ms (it still runs; its thread settles it). */
static int call_one(struct reg_entry *e, bool before, const xseg_range_event *ev, bool *timed_out)
{
    *timed_out = false;
    struct reg_call *c = e->cb.timeout_ms ? xs_calloc(1, sizeof *c) : NULL;
    pthread_condattr_t ca;
    bool ready = c && pthread_condattr_init(&ca) == 0;
    if (ready) {
        (void)pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        ready = pthread_cond_init(&c->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
        if (ready && pthread_mutex_init(&c->m, NULL) != 0) {
            pthread_cond_destroy(&c->cv);
            ready = false;
        }
    }
    pthread_t t;
    if (ready) {
        c->e = e;
        c->ev = *ev;
        c->before = before;
        if (pthread_create(&t, NULL, call_main, c) != 0) {
            pthread_cond_destroy(&c->cv);
            pthread_mutex_destroy(&c->m);
            ready = false;
        }
    }
    if (!ready) { /* no timeout asked, or no thread to be had: on this thread (documented) */
        xs_free(c);
        int rc = run_callback(e, before, ev);
        settle(e, before, rc, true);
        return rc;
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += e->cb.timeout_ms / 1000;
    until.tv_nsec += (long)(e->cb.timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->m);
    while (!c->done && pthread_cond_timedwait(&c->cv, &c->m, &until) != ETIMEDOUT) {
    }
    bool done = c->done;
    int rc = c->rc;
    if (!done)
        c->abandoned = true;
    pthread_mutex_unlock(&c->m);
    if (!done) {
        pthread_detach(t);
        *timed_out = true;
        return -1;
    }
    pthread_join(t, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->m);
    xs_free(c);
    settle(e, before, rc, true);
    return rc;
}

/* ---- passes ------------------------------------------------------------------------------ */

struct reg_pass {
    enum reg_scope scope;
    xseg_pool_id pool_id;          /* REG_SCOPE_POOL */
    const struct priv_pool *pool;  /* found from pool_id under the device lock */
    bool pool_known;
    uintptr_t lo, hi; /* REG_SCOPE_RANGE */
};

/* Whether an operation of @p p may take pages of @p e. Device lock held. */
static bool in_scope(struct dev_alloc *d, const struct reg_entry *e, const struct reg_pass *p)
{
    if (p->scope == REG_SCOPE_ALL)
        return true;
    if (p->scope == REG_SCOPE_RANGE)
        return overlaps(e, p->lo, p->hi);
    struct segrec *s = find_seg(d, e->addr, e->size, NULL);
    if (!s)
        return false;
    if (p->scope == REG_SCOPE_POOL)
        return p->pool_known && dev_pool_owner(d, s->pool) == p->pool;
    if (s->asleep)
        return false;
    /* REG_SCOPE_FREE: a free mapped block overlaps it (pages it shares with a live block stay,
     * so this may ask for more than goes: the after pass gives those back at once). */
    for (const struct block *b = s->first; b; b = b->next)
        if (!b->allocated && b->mapped && overlaps(e, b->addr, b->addr + b->size))
            return true;
    return false;
}

/* A released entry's pages are all mapped again. Device lock held. */
static bool all_mapped_entry(struct dev_alloc *d, const struct reg_entry *e)
{
    if (e->cseg) /* a classic segment's pages never go while the entry holds it */
        return true;
    const struct segrec *s = find_seg(d, e->addr, e->size, NULL);
    return s && all_mapped(s, e->addr, e->size);
}

/* Collect (busy, referenced) the entries of @p d that @p want picks; *n of them. Device lock
 * and xseg_rt.reg.lock held. NULL with *n == 0 when none, or host memory ran out (*oom). */
static struct reg_entry **collect_locked(struct dev_alloc *d, bool before, struct reg_pass *p, size_t *n,
                                         bool *oom, size_t *busy_left)
{
    size_t k = 0;
    *n = 0;
    *oom = false;
    *busy_left = 0;
    for (struct reg_entry *e = xseg_rt.reg.list; e; e = e->next)
        k += e->device == d->device;
    if (p->scope == REG_SCOPE_POOL) {
        p->pool = p->pool_id.first || p->pool_id.second ? pools_find(d, p->pool_id) : NULL;
        p->pool_known = p->pool || (!p->pool_id.first && !p->pool_id.second);
    }
    struct reg_entry **v = k ? xs_malloc(k * sizeof *v) : NULL;
    if (k && !v) {
        *oom = true;
        return NULL;
    }
    for (struct reg_entry *e = xseg_rt.reg.list; e; e = e->next) {
        if (e->device != d->device || e->released != !before)
            continue;
        bool want = before ? in_scope(d, e, p) : all_mapped_entry(d, e);
        if (!want)
            continue;
        if (e->busy) {
            *busy_left += before;
            continue;
        }
        e->busy = true;
        e->refs++;
        v[(*n)++] = e;
    }
    return v;
}

static const char *reason_words(xseg_range_reason why)
{
    switch (why) {
    case XSEG_RANGE_RECLAIM:
        return "reclaim (empty_cache, trim)";
    case XSEG_RANGE_SLEEP:
        return "sleep";
    case XSEG_RANGE_SHUTDOWN:
        return "shutdown";
    case XSEG_RANGE_MOVE:
        return "a page move";
    case XSEG_RANGE_REMAPPED:
        return "pages mapped again";
    default:
        return "pages kept";
    }
}

/* One pass over @p d: before (@p p) or after. The first failure's message, after all ran. */
static xseg_status pass(struct dev_alloc *d, bool before, struct reg_pass *p, xseg_range_reason why)
{
    if (!before)
        atomic_store_explicit(&d->reg_due, false, memory_order_relaxed);
    if (!atomic_load_explicit(&xseg_rt.reg.count, memory_order_relaxed))
        return XSEG_SUCCESS;
    size_t n, busy_left;
    bool oom;
    dev_lock(d, DEV_NEED_SLOTS);
    mutex_lock(&xseg_rt.reg.lock);
    struct reg_entry **v = collect_locked(d, before, p, &n, &oom, &busy_left);
    mutex_unlock(&xseg_rt.reg.lock);
    dev_unlock(d);
    if (oom)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "registrations of device %d: out of host memory for a %s pass "
                       "(the registered ranges stay mapped)", d->device, before ? "before" : "after");
    /* The program's registrants first: their before may close a dma-buf xseg handed out (whose
     * own entry then finds it closed and lets go), whatever order the entries were made in. */
    for (size_t i = 0, k = 0; i < n; i++)
        if (v[i]->owner == REG_OWNER_USER) {
            struct reg_entry *t = v[i];
            memmove(v + k + 1, v + k, (i - k) * sizeof *v);
            v[k++] = t;
        }
    xseg_status st = XSEG_SUCCESS;
    struct err_kept first = {{0}};
    for (size_t i = 0; i < n; i++) {
        struct reg_entry *e = v[i];
        xseg_range_event ev = {.device = d->device, .ptr = (void *)e->addr, .size = e->size, .reason = why};
        bool timed_out;
        unsigned tmo = e->cb.timeout_ms; /* e may be freed once settled: not read after the call */
        enum reg_owner owner = e->owner;
        int rc = call_one(e, before, &ev, &timed_out);
        if (timed_out) { /* e is still referenced by its thread, which settles it */
            mutex_lock(&xseg_rt.reg.lock);
            xseg_rt.reg.failures[d->device]++;
            if (before)
                xseg_rt.reg.kept_bytes[d->device] += ev.size;
            mutex_unlock(&xseg_rt.reg.lock);
        }
        if (rc == 0 || st != XSEG_SUCCESS)
            continue;
        if (owner != REG_OWNER_USER)
            st = err_set(XSEG_ERROR_ILLEGAL_STATE,
                         "registration [%p, +%zu) on device %d made by xseg (%s): no registrant can be asked, so "
                         "its pages stay mapped for %s", ev.ptr, ev.size, d->device, owner_words(owner),
                         reason_words(why));
        else if (timed_out)
            st = err_set(XSEG_ERROR_ILLEGAL_STATE,
                         "registration [%p, +%zu) on device %d: its %s callback (%s) did not return within %u ms; %s",
                         ev.ptr, ev.size, d->device, before ? "before" : "after", reason_words(why), tmo,
                         before ? "its pages stay mapped until it returns 0" : "it is asked again next time");
        else
            st = err_set(XSEG_ERROR_ILLEGAL_STATE, "registration [%p, +%zu) on device %d: its %s callback (%s) "
                         "returned %d; %s", ev.ptr, ev.size, d->device, before ? "before" : "after",
                         reason_words(why), rc, before ? "its pages stay mapped" : "it stays released, asked again next time");
        first = err_keep();
    }
    xs_free(v);
    if (st == XSEG_SUCCESS && before && busy_left)
        st = err_set(XSEG_ERROR_ILLEGAL_STATE, "%zu registration%s on device %d still run%s a callback of an earlier "
                     "call; %s pages stay mapped", busy_left, busy_left == 1 ? "" : "s", d->device,
                     busy_left == 1 ? "s" : "", busy_left == 1 ? "its" : "their");
    else if (st != XSEG_SUCCESS)
        err_set(st, "%s", first.msg);
    return st;
}

xseg_status reg_before(struct dev_alloc *d, enum reg_scope scope, xseg_pool_id pool, xseg_range_reason why)
{
    struct reg_pass p = {.scope = scope, .pool_id = pool};
    return pass(d, true, &p, why);
}

xseg_status reg_after(struct dev_alloc *d, xseg_range_reason why)
{
    struct reg_pass p = {.scope = REG_SCOPE_ALL};
    return pass(d, false, &p, why);
}

xseg_status reg_before_move(struct dev_alloc *d, uintptr_t addr, size_t size)
{
    struct reg_pass p = {.scope = REG_SCOPE_RANGE, .lo = addr, .hi = addr + size};
    return pass(d, true, &p, XSEG_RANGE_MOVE);
}

xseg_status reg_after_move(struct dev_alloc *d) { return reg_after(d, XSEG_RANGE_REMAPPED); }

void reg_stats(struct dev_alloc *d, xseg_registration_stats *out)
{
    *out = (xseg_registration_stats){0};
    mutex_lock(&xseg_rt.reg.lock);
    for (const struct reg_entry *e = xseg_rt.reg.list; e; e = e->next) {
        if (e->device != d->device)
            continue;
        if (e->released)
            out->released++;
        else
            out->active++;
    }
    out->failures = xseg_rt.reg.failures[d->device];
    out->kept_bytes = xseg_rt.reg.kept_bytes[d->device];
    mutex_unlock(&xseg_rt.reg.lock);
}

xseg_status reg_shutdown(dev_peek_fn device_at)
{
    if (!atomic_load_explicit(&xseg_rt.reg.count, memory_order_relaxed))
        return XSEG_SUCCESS;
    xseg_status st = XSEG_SUCCESS;
    struct err_kept first = {{0}};
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
        struct dev_alloc *d = device_at(i);
        if (!d)
            continue;
        xseg_status s = reg_before(d, REG_SCOPE_ALL, (xseg_pool_id){0, 0}, XSEG_RANGE_SHUTDOWN);
        if (s != XSEG_SUCCESS && st == XSEG_SUCCESS) {
            st = s;
            first = err_keep();
        }
    }
    if (st != XSEG_SUCCESS) {
        /* Nothing is torn down: the released ones hear that their pages stayed. */
        for (int i = 0; i < ALLOC_MAX_DEVICES; i++)
            if (device_at(i))
                (void)reg_after(device_at(i), XSEG_RANGE_KEPT);
        return err_set(st, "xseg_shutdown: %s (unregister it, or make its callback release, then call xseg_shutdown "
                       "again)", first.msg);
    }
    mutex_lock(&xseg_rt.reg.lock);
    while (xseg_rt.reg.list) {
        struct reg_entry *e = xseg_rt.reg.list;
        xseg_rt.reg.list = e->next;
        entry_gone_locked(e);
        unref_locked(e);
    }
    atomic_store_explicit(&xseg_rt.reg.count, 0, memory_order_relaxed);
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++)
        xseg_rt.reg.failures[i] = xseg_rt.reg.kept_bytes[i] = 0; /* the devices' reg_due go with them */
    mutex_unlock(&xseg_rt.reg.lock);
    return XSEG_SUCCESS;
}

xseg_status reg_around(struct dev_alloc *d, enum reg_scope scope, xseg_pool_id pool, xseg_range_reason why,
                       xseg_status (*op)(struct dev_alloc *d, void *ctx), void *ctx)
{
    xseg_status before = reg_before(d, scope, pool, why);
    struct err_kept kept = err_keep();
    xseg_status st = op(d, ctx);
    if (st != XSEG_SUCCESS) {
        struct err_kept opmsg = err_keep();
        (void)reg_after(d, XSEG_RANGE_KEPT);
        return err_set(st, "%s", opmsg.msg);
    }
    xseg_status after = reg_after(d, XSEG_RANGE_KEPT);
    if (before != XSEG_SUCCESS)
        return err_set(before, "%s", kept.msg);
    return after;
}

/* ---- whole-range dma-buf export ----------------------------------------------------------- */

xseg_status reg_dmabuf(struct dev_alloc *d, uintptr_t addr, size_t size, int *fd, size_t *offset, bool *mine)
{
    dev_lock(d, DEV_NEED_SLOTS);
    bool classic;
    struct segrec *s = find_seg(d, addr, size, &classic);
    *mine = s || classic;
    if (!*mine) {
        dev_unlock(d);
        return XSEG_SUCCESS;
    }
    if (!s) {
        dev_unlock(d);
        return err_set(XSEG_ERROR_NOT_SUPPORTED, "xseg_range_dmabuf: %p is in a classic (cuMemAlloc) segment of "
                       "device %d; export its block with cuMemGetHandleForAddressRange directly", (void *)addr,
                       d->device);
    }
    if (!all_mapped(s, addr, size)) {
        dev_unlock(d);
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_range_dmabuf: [%p, +%zu) of device %d is not all mapped now",
                       (void *)addr, size, d->device);
    }
    /* The driver wants a host-page-aligned range; granules are host-page multiples, so the
     * aligned range covers the same (mapped) granules. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = addr & ~(page - 1);
    uintptr_t hi = (addr + size + page - 1) & ~(page - 1);
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    CUresult res = CUDA_SUCCESS;
    if (st == XSEG_SUCCESS)
        res = drv_range_dmabuf((CUdeviceptr)lo, hi - lo, fd);
    int attr = st == XSEG_SUCCESS && res == CUDA_ERROR_NOT_SUPPORTED ? drv_dmabuf_attribute(d->info.dev) : -1;
    /* Handed out: the range enters the ledger as xseg's own (its entry goes when the descriptor
     * is found closed, or a block under it is freed). No entry, no descriptor. */
    if (st == XSEG_SUCCESS && res == CUDA_SUCCESS && (st = reg_own_locked(d, addr, size, REG_OWNER_DMABUF, *fd)) !=
        XSEG_SUCCESS) {
        close(*fd);
        *fd = -1;
    }
    dev_unlock(d);
    if (st != XSEG_SUCCESS)
        return st;
    if (res == CUDA_ERROR_NOT_SUPPORTED)
        return err_set(XSEG_ERROR_NOT_SUPPORTED,
                       "xseg_range_dmabuf: the driver exports no dma-buf for [%p, +%zu) on device %d "
                       "(cuMemGetHandleForAddressRange: CUDA_ERROR_NOT_SUPPORTED; CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED "
                       "%d); use xseg_block_handles and register each chunk (docs/registrations.md)",
                       (void *)addr, size, d->device, attr);
    if (res != CUDA_SUCCESS)
        return drv_fail(res, "xseg_range_dmabuf: cuMemGetHandleForAddressRange(DMA_BUF_FD) of a mapped range");
    *offset = addr - lo;
    return XSEG_SUCCESS;
}

/* Which of xseg's own actions could change the physical pages under a live block, from the code
 * (docs/registrations.md, "What moves pages"): the cache's reclaim (empty_cache, trim, idle
 * release, the release threshold, the OOM retry, recycling, the group's give-way) unmaps only
 * chunks lying wholly inside free blocks, so never a page with a live byte; classic segments are
 * freed whole and only when free. Two actions re-back live pages with no one asked: defrag (the
 * OOM path's last rung, exp_defragment) and spill (blocks declared cold). Both skip the ledger's
 * ranges, which is why a ledger registration stays valid whatever this says. Sleep and wake are
 * the program's own calls, named in the text, not counted here. */
bool reg_config_safe(const struct cfg *c, char *buf, size_t size, size_t *len)
{
    struct strbuf o = {buf, size, 0};
    if (size)
        buf[0] = '\0';
    bool defrag = c->expandable_segments_defrag, spill = c->spill_to_host;
    if (defrag || spill) {
        strbuf_printf(&o, "unsafe: ");
        if (defrag)
            strbuf_printf(&o, "expandable_segments_defrag:True (an allocation out of memory copies the live bytes of "
                              "partly used pages to new physical memory at the same addresses)%s",
                          spill ? "; " : "");
        if (spill)
            strbuf_printf(&o, "spill_to_host:True (pages of blocks declared cold with xseg_spill_hint move to host "
                              "memory at the same addresses)");
        strbuf_printf(&o, ". Set %s to False, or register the range with xseg_register_range too: neither action "
                          "touches a range in xseg's ledger",
                      defrag && spill ? "both" : "it");
    } else {
        strbuf_printf(&o, "safe: nothing xseg does on its own changes the pages under a live block (empty_cache, "
                          "trim, idle_release_ms, release_threshold_mb, the out-of-memory retry and the memory "
                          "group's give-way unmap only pages holding no live byte; expandable_segments_defrag and "
                          "spill_to_host are off)");
    }
    strbuf_printf(&o, ". xseg_sleep and xseg_wake, called by the program, re-back the pages of the pool they "
                      "put to sleep: register such memory with xseg_register_range to be asked first");
    if (c->register_blocks_above)
        strbuf_printf(&o, ". Blocks of at least %zu MiB are in xseg's ledger from malloc to free "
                          "(register_blocks_above_mb): no action moves their pages, and a sleep of their pool is "
                          "refused while one lives", c->register_blocks_above >> 20);
    if (len)
        *len = o.len;
    return !defrag && !spill;
}
