/* graph_capture_record_stream_reuse: see capreuse.h. Under the device lock. */
#include "core/policy/capreuse.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/device/device.h"
#include "vmm/capture.h"

/* ---- node map ---- */

static size_t nm_slot(uintptr_t key, size_t cap)
{
    uint64_t k = (uint64_t)key;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

/* The slot of @p node, or SIZE_MAX when absent. */
static size_t nm_find(const struct cr_nodemap *m, CUgraphNode node)
{
    uintptr_t key = (uintptr_t)node;
    if (!m->cap || !key)
        return SIZE_MAX;
    for (size_t i = nm_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key)
            return i;
        if (!m->keys[i])
            return SIZE_MAX;
    }
}

static bool nm_has(const struct cr_nodemap *m, CUgraphNode node) { return nm_find(m, node) != SIZE_MAX; }

/* Insert @p node (value NULL) if absent; *slot receives its slot. @return 1 when added, 0 when
 * already there, -1 when out of host memory. */
static int nm_add(struct cr_nodemap *m, CUgraphNode node, size_t *slot)
{
    uintptr_t key = (uintptr_t)node;
    if (!key)
        return 0;
    if (2 * (m->count + 1) > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 256;
        uintptr_t *keys = xs_calloc(ncap, sizeof *keys);
        void **vals = xs_calloc(ncap, sizeof *vals);
        if (!keys || !vals) {
            xs_free(keys);
            xs_free(vals);
            return -1;
        }
        for (size_t j = 0; j < m->cap; j++) {
            if (!m->keys[j])
                continue;
            size_t i = nm_slot(m->keys[j], ncap);
            while (keys[i])
                i = (i + 1) & (ncap - 1);
            keys[i] = m->keys[j];
            vals[i] = m->vals[j];
        }
        xs_free(m->keys);
        xs_free(m->vals);
        m->keys = keys;
        m->vals = vals;
        m->cap = ncap;
    }
    size_t i = nm_slot(key, m->cap);
    for (; m->keys[i]; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key) {
            *slot = i;
            return 0;
        }
    }
    m->keys[i] = key;
    m->vals[i] = NULL;
    m->count++;
    *slot = i;
    return 1;
}

static void nm_free(struct cr_nodemap *m)
{
    xs_free(m->keys);
    xs_free(m->vals);
    *m = (struct cr_nodemap){0};
}

/* ---- walks and waiting entries ---- */

static struct cr_walk *walk_for(struct capreuse *cr, unsigned long long id, CUstream stream)
{
    for (size_t i = 0; i < cr->nwalks; i++)
        if (cr->walks[i].capture_id == id && cr->walks[i].stream == stream)
            return &cr->walks[i];
    if (!VEC_RESERVE(cr->walks, cr->capwalks, cr->nwalks + 1))
        return NULL;
    struct cr_walk *w = &cr->walks[cr->nwalks++];
    *w = (struct cr_walk){.capture_id = id, .stream = stream};
    return w;
}

/* File @p e under its first marker not reached yet, or on the ready list. @return false when out
 * of host memory (nothing changed). */
static bool entry_file(struct cr_walk *w, struct cr_entry *e)
{
    while (e->next < e->nmarkers && nm_has(&w->seen, e->markers[e->next]))
        e->next++;
    if (e->next == e->nmarkers) {
        e->link = w->ready;
        w->ready = e;
        return true;
    }
    size_t slot;
    if (nm_add(&w->waiting, e->markers[e->next], &slot) < 0)
        return false;
    e->link = w->waiting.vals[slot];
    w->waiting.vals[slot] = e;
    w->nwaiting++;
    return true;
}

/* @p node was just reached: wake the entries waiting on it. */
static void walk_reached(struct cr_walk *w, CUgraphNode node)
{
    size_t slot = nm_find(&w->waiting, node);
    if (slot == SIZE_MAX || !w->waiting.vals[slot])
        return;
    struct cr_entry *e = w->waiting.vals[slot], *stuck = NULL;
    w->waiting.vals[slot] = NULL;
    while (e) {
        struct cr_entry *nx = e->link;
        w->nwaiting--;
        e->next++;
        if (!entry_file(w, e)) {
            /* Out of host memory: it goes back under this node, never woken again (deferred to
             * the end of the capture, the safe outcome), and no walk keeps looking for it. */
            e->next--;
            e->link = stuck;
            stuck = e;
        }
        e = nx;
    }
    if (stuck) /* the key stays in the map; its slot may have moved as the map grew */
        w->waiting.vals[nm_find(&w->waiting, node)] = stuck;
}

static void entry_free(struct cr_entry *e)
{
    xs_free(e->markers);
    xs_free(e);
}

static void walk_free(struct cr_walk *w)
{
    for (size_t i = 0; i < w->waiting.cap; i++) {
        for (struct cr_entry *e = w->waiting.vals[i], *nx; e; e = nx) {
            nx = e->link;
            entry_free(e);
        }
    }
    for (struct cr_entry *e = w->ready, *nx; e; e = nx) {
        nx = e->link;
        entry_free(e);
    }
    nm_free(&w->seen);
    nm_free(&w->waiting);
    xs_free(w->frontier);
    xs_free(w->terms);
}

/* Forget what @p w remembered (the stream order was broken): every entry waits again from its
 * first marker. */
static void walk_forget(struct capreuse *cr, struct cr_walk *w)
{
    struct cr_entry *all = NULL;
    for (size_t i = 0; i < w->waiting.cap; i++) {
        for (struct cr_entry *e = w->waiting.vals[i], *nx; e; e = nx) {
            nx = e->link;
            e->link = all;
            all = e;
        }
    }
    for (struct cr_entry *e = w->ready, *nx; e; e = nx) {
        nx = e->link;
        e->link = all;
        all = e;
    }
    w->ready = NULL;
    nm_free(&w->seen);
    nm_free(&w->waiting);
    w->nwaiting = 0;
    w->nfrontier = 0;
    w->nterms = w->nhit = 0;
    for (struct cr_entry *e = all, *nx; e; e = nx) {
        nx = e->link;
        e->next = 0;
        if (!entry_file(w, e)) {
            /* Out of host memory: the block stays deferred to the end of the capture. */
            w->nentries--;
            cr->n--;
            entry_free(e);
        }
    }
}

/* The legacy default stream never captures, and asking the driver about it while a blocking
 * stream captures is itself an error that invalidates that capture (CUDA_ERROR_STREAM_CAPTURE_
 * IMPLICIT): never query it. */
static bool legacy(CUstream s) { return !s || s == CU_STREAM_LEGACY; }

/* ---- markers ---- */

static bool markers_add(CUgraphNode **v, size_t *n, size_t *cap, const CUgraphNode *add, size_t nadd)
{
    for (size_t i = 0; i < nadd; i++) {
        bool dup = false;
        for (size_t j = 0; j < *n && !dup; j++)
            dup = (*v)[j] == add[i];
        if (dup)
            continue;
        if (*n == *cap && !VEC_RESERVE(*v, *cap, *n + 1))
            return false;
        (*v)[(*n)++] = add[i];
    }
    return true;
}

void capreuse_mark(struct dev_alloc *d, struct block *b, size_t slot)
{
    lock_assert_held(&d->lock);
    struct capreuse *cr = &d->cr;
    const struct block_side *sd = block_side(b);
    if (!d->cfg.graph_capture_record_stream_reuse || !dev_pool_owner(d, block_pool(b)) || legacy(b->stream) ||
        !sd || !sd->uses.n)
        return; /* only the capture's own pool: work outside the graph may still use others */
    for (unsigned i = 0; i < sd->uses.n; i++)
        if (legacy(stream_set_get(&sd->uses, i)))
            return;
    CUgraphNode *m = NULL;
    size_t nm = 0, capm = 0;
    unsigned long long id = 0;
    /* Where each other stream's use ends: its dependency set now. A stream outside the capture
     * (or one the driver cannot tell) has uses the graph does not order: defer as usual. */
    for (unsigned i = 0; i < sd->uses.n; i++) {
        struct vmm_capture_info ci;
        if (vmm_capture_info(stream_set_get(&sd->uses, i), &ci) != XSEG_SUCCESS ||
            ci.status != CU_STREAM_CAPTURE_STATUS_ACTIVE || (i && ci.id != id) ||
            !markers_add(&m, &nm, &capm, ci.deps, ci.ndeps)) {
            err_clear();
            xs_free(m);
            return;
        }
        id = ci.id;
    }
    /* Where its own stream's use ends: an empty node there (also when that stream has no node
     * yet, so that a block always has a marker). The stream is asked last, so that its
     * dependency array is still the driver's current one when the node is added after it. */
    struct vmm_capture_info own;
    CUgraphNode node;
    struct cr_walk *w = NULL;
    struct cr_entry *e = NULL;
    if (vmm_capture_info(b->stream, &own) != XSEG_SUCCESS || own.status != CU_STREAM_CAPTURE_STATUS_ACTIVE ||
        own.id != id || vmm_capture_mark(b->stream, &own, &node) != XSEG_SUCCESS ||
        !markers_add(&m, &nm, &capm, &node, 1) || !(w = walk_for(cr, own.id, b->stream)) ||
        !(e = xs_calloc(1, sizeof *e))) {
        err_clear();
        xs_free(m);
        return;
    }
    *e = (struct cr_entry){.block = b, .deferred_slot = slot, .markers = m, .nmarkers = nm};
    if (!entry_file(w, e)) {
        entry_free(e);
        return;
    }
    w->nentries++;
    cr->n++;
}

/* ---- the walk ---- */

/* Reach @p node: add it to the seen set, wake its waiters, queue it for its dependencies (at
 * queue[*tail]). A node seen before is not entered again; if it is one of the previous walk's
 * starting points, that one is reached. @return false when out of host memory. */
static bool walk_visit(struct capreuse *cr, struct cr_walk *w, size_t *tail, CUgraphNode node)
{
    size_t slot;
    int added = nm_add(&w->seen, node, &slot);
    if (added == 0) {
        for (size_t i = 0; i < w->nterms; i++)
            if (w->terms[i].node == node && !w->terms[i].hit) {
                w->terms[i].hit = true;
                w->nhit++;
            }
        return true;
    }
    if (added < 0 || (*tail == cr->capqueue && !VEC_RESERVE(cr->queue, cr->capqueue, *tail + 1)))
        return false;
    walk_reached(w, node);
    cr->queue[(*tail)++] = node;
    return true;
}

/* The dependencies of @p v into *deps (capacity *cap, grown from the caller's inline buffer
 * @p inl when needed). @return false on a driver failure or out of host memory. */
static bool read_deps(CUgraphNode v, CUgraphNode **deps, size_t *cap, CUgraphNode *inl, size_t *nd)
{
    if (vmm_node_deps(v, *deps, *cap, nd) != XSEG_SUCCESS)
        return false;
    if (*nd <= *cap)
        return true;
    CUgraphNode *p = xs_malloc(*nd * sizeof *p);
    if (!p)
        return false;
    if (*deps != inl)
        xs_free(*deps);
    *deps = p;
    *cap = *nd;
    return vmm_node_deps(v, *deps, *cap, nd) == XSEG_SUCCESS && *nd <= *cap;
}

/*
 * Extend w->seen with nodes that precede (or are) one of @p from, never entering a node already
 * seen. Breadth first from @p from, then into the frontier (most recent first), and only as far
 * as needed: until every starting point of the previous walk is reached again (the stream order
 * held) and no entry waits for a marker, or nothing is left to read. The nodes reached but not
 * read go to the frontier. On a failure the walk stops: what is in the set is still only true
 * predecessors, so the worst outcome is a block not reused.
 */
static void walk_extend(struct capreuse *cr, struct cr_walk *w, const CUgraphNode *from, size_t n)
{
    size_t head = 0, tail = 0;
    w->nhit = 0;
    for (size_t i = 0; i < w->nterms; i++)
        w->terms[i].hit = false;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++)
        ok = walk_visit(cr, w, &tail, from[i]);
    CUgraphNode inl[16];
    CUgraphNode *deps = inl;
    size_t capdeps = 16;
    while (ok && (w->nhit < w->nterms || w->nwaiting)) {
        bool fresh = head < tail;
        CUgraphNode v;
        if (fresh)
            v = cr->queue[head++];
        else if (w->nfrontier)
            v = w->frontier[--w->nfrontier];
        else
            break;
        size_t nd = 0;
        if (!read_deps(v, &deps, &capdeps, inl, &nd)) {
            if (fresh) /* left for a later walk to read */
                head--;
            else
                w->nfrontier++;
            break;
        }
        cr->nodes_read++;
        for (size_t j = 0; j < nd && ok; j++)
            ok = walk_visit(cr, w, &tail, deps[j]);
    }
    if (deps != inl)
        xs_free(deps);
    /* Out of host memory here, these nodes are never read: blocks behind them wait for the end
     * of the capture. */
    if (head < tail && VEC_RESERVE(w->frontier, w->capfrontier, w->nfrontier + (tail - head))) {
        memcpy(w->frontier + w->nfrontier, cr->queue + head, (tail - head) * sizeof *cr->queue);
        w->nfrontier += tail - head;
    }
    err_clear();
}

/* Did the last walk reach every node the one before started from (the stream order held)? */
static bool walk_ordered(const struct cr_walk *w) { return w->nhit == w->nterms; }

/* Remember @p from as the starting points to check the next walk against. On a failure the
 * walk is forgotten instead (nothing to check against would let a broken order pass). */
static void walk_set_terms(struct capreuse *cr, struct cr_walk *w, const CUgraphNode *from, size_t n)
{
    if (!VEC_RESERVE(w->terms, w->capterms, n)) {
        walk_forget(cr, w);
        return;
    }
    for (size_t i = 0; i < n; i++)
        w->terms[i] = (struct cr_term){.node = from[i]};
    w->nterms = n;
    w->nhit = 0;
}

void capreuse_collect(struct dev_alloc *d, CUstream stream)
{
    lock_assert_held(&d->lock);
    struct capreuse *cr = &d->cr;
    bool any = false;
    if (legacy(stream))
        return;
    for (size_t i = 0; i < cr->nwalks && !any; i++)
        any = cr->walks[i].stream == stream && cr->walks[i].nentries;
    if (!any)
        return;
    struct vmm_capture_info ci;
    if (vmm_capture_info(stream, &ci) != XSEG_SUCCESS) {
        err_clear();
        return;
    }
    if (ci.status != CU_STREAM_CAPTURE_STATUS_ACTIVE || ci.ndeps == 0)
        return;
    struct cr_walk *w = walk_for(cr, ci.id, stream);
    if (!w || !w->nentries)
        return;
    walk_extend(cr, w, ci.deps, ci.ndeps);
    if (!walk_ordered(w)) {
        /* The stream's dependencies no longer descend from the last ones: what was remembered
         * may not precede them. Start over from the current dependencies. */
        walk_forget(cr, w);
        walk_extend(cr, w, ci.deps, ci.ndeps);
    }
    walk_set_terms(cr, w, ci.deps, ci.ndeps);
    /* Off the walk and counted now; capreuse_take hands them out one by one, in the walk's order. */
    struct cr_entry **tail = &cr->collected;
    while (*tail)
        tail = &(*tail)->link;
    for (struct cr_entry *e = w->ready; e; e = e->link) {
        w->nentries--;
        cr->n--;
        cr->reused++;
    }
    *tail = w->ready;
    w->ready = NULL;
}

struct block *capreuse_take(struct dev_alloc *d, size_t *slot)
{
    lock_assert_held(&d->lock);
    struct cr_entry *e = d->cr.collected;
    if (!e)
        return NULL;
    d->cr.collected = e->link;
    struct block *b = e->block;
    *slot = e->deferred_slot;
    entry_free(e);
    if (b->sided)
        stream_set_clear(&b->u.side->uses); /* the side goes as the block returns (dev_free_block) */
    return b;
}

void capreuse_reset(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    struct capreuse *cr = &d->cr;
    for (size_t i = 0; i < cr->nwalks; i++)
        walk_free(&cr->walks[i]);
    for (struct cr_entry *e = cr->collected, *nx; e; e = nx) { /* none: events.c takes them all */
        nx = e->link;
        entry_free(e);
    }
    xs_free(cr->walks);
    xs_free(cr->queue);
    uint64_t nodes_read = cr->nodes_read, reused = cr->reused;
    *cr = (struct capreuse){.nodes_read = nodes_read, .reused = reused};
}
