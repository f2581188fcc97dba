/* graph_capture_record_stream_reuse: see capreuse.h. Under the device lock. */
#include "core/capreuse.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/vec.h"
#include "core/alloc.h"
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
        uintptr_t *keys = calloc(ncap, sizeof *keys);
        void **vals = calloc(ncap, sizeof *vals);
        if (!keys || !vals) {
            free(keys);
            free(vals);
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
        free(m->keys);
        free(m->vals);
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
    free(m->keys);
    free(m->vals);
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
 * of host memory (the entry is then dropped by the caller). */
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
    return true;
}

/* @p node was just reached: wake the entries waiting on it. */
static void walk_reached(struct cr_walk *w, CUgraphNode node)
{
    size_t slot = nm_find(&w->waiting, node);
    if (slot == SIZE_MAX || !w->waiting.vals[slot])
        return;
    struct cr_entry *e = w->waiting.vals[slot];
    w->waiting.vals[slot] = NULL;
    while (e) {
        struct cr_entry *nx = e->link;
        e->next++;
        if (!entry_file(w, e)) {
            /* Out of host memory: keep it waiting on this node (never woken again: deferred to
             * the end of the capture, the safe outcome). */
            e->next--;
        }
        e = nx;
    }
}

static void entry_free(struct cr_entry *e)
{
    free(e->markers);
    free(e);
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
    free(w->terms);
    free(w->hit);
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
    w->nterms = 0;
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
        if (!VEC_RESERVE(*v, *cap, *n + 1))
            return false;
        (*v)[(*n)++] = add[i];
    }
    return true;
}

void capreuse_mark(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct capreuse *cr = &d->cr;
    if (!d->cfg.graph_capture_record_stream_reuse || !alloc_pool_owner(d, b->pool) || !d->ndeferred ||
        d->deferred[d->ndeferred - 1] != b || legacy(b->stream))
        return; /* only the capture's own pool: work outside the graph may still use others */
    for (unsigned i = 0; i < b->uses.n; i++)
        if (legacy(stream_set_get(&b->uses, i)))
            return;
    struct vmm_capture_info own;
    if (vmm_capture_info(b->stream, &own) != XSEG_SUCCESS || own.status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        err_clear();
        return;
    }
    CUgraphNode *m = NULL;
    size_t nm = 0, capm = 0;
    /* Where each other stream's use ends: its dependency set now. A stream outside this capture
     * (or one the driver cannot tell) has uses the graph does not order: defer as usual. */
    for (unsigned i = 0; i < b->uses.n; i++) {
        struct vmm_capture_info ci;
        if (vmm_capture_info(stream_set_get(&b->uses, i), &ci) != XSEG_SUCCESS ||
            ci.status != CU_STREAM_CAPTURE_STATUS_ACTIVE || ci.id != own.id ||
            !markers_add(&m, &nm, &capm, ci.deps, ci.ndeps)) {
            err_clear();
            free(m);
            return;
        }
    }
    /* Where its own stream's use ends: an empty node there (also when that stream has no node
     * yet, so that a block always has a marker). */
    CUgraphNode node;
    struct cr_walk *w = NULL;
    struct cr_entry *e = NULL;
    if (vmm_capture_mark(b->stream, &node) != XSEG_SUCCESS || !markers_add(&m, &nm, &capm, &node, 1) ||
        !(w = walk_for(cr, own.id, b->stream)) || !(e = calloc(1, sizeof *e))) {
        err_clear();
        free(m);
        return;
    }
    *e = (struct cr_entry){.block = b, .deferred_slot = d->ndeferred - 1, .markers = m, .nmarkers = nm};
    if (!entry_file(w, e)) {
        entry_free(e);
        return;
    }
    w->nentries++;
    cr->n++;
}

/* ---- the walk ---- */

static bool stack_push(struct capreuse *cr, size_t *top, CUgraphNode node)
{
    if (!VEC_RESERVE(cr->stack, cr->capstack, *top + 1))
        return false;
    cr->stack[(*top)++] = node;
    return true;
}

/* Reach @p node: add it to the seen set, wake its waiters, queue it for its dependencies.
 * @return false when out of host memory. */
static bool walk_visit(struct capreuse *cr, struct cr_walk *w, size_t *top, CUgraphNode node)
{
    size_t slot;
    int added = nm_add(&w->seen, node, &slot);
    if (added == 0) {
        /* Reached a remembered node: is it one of the previous walk's starting points? */
        for (size_t i = 0; i < w->nterms; i++)
            if (w->terms[i] == node)
                w->hit[i] = true;
        return true;
    }
    if (added < 0)
        return false;
    walk_reached(w, node);
    return stack_push(cr, top, node);
}

/* Extend w->seen with every node that precedes (or is) one of @p from, never entering a node
 * already seen: a node is added when first reached and its dependencies read when it is taken off
 * the work list. On a failure the walk stops: what is in the set is still only true
 * predecessors, so the worst outcome is a block not reused. */
static void walk_extend(struct capreuse *cr, struct cr_walk *w, const CUgraphNode *from, size_t n)
{
    size_t top = 0;
    for (size_t i = 0; i < w->nterms; i++)
        w->hit[i] = false;
    for (size_t i = 0; i < n; i++)
        if (!walk_visit(cr, w, &top, from[i]))
            return;
    CUgraphNode inl[16];
    CUgraphNode *deps = inl;
    size_t capdeps = 16;
    while (top) {
        CUgraphNode v = cr->stack[--top];
        size_t nd = 0;
        if (vmm_node_deps(v, deps, capdeps, &nd) != XSEG_SUCCESS)
            break;
        if (nd > capdeps) {
            CUgraphNode *p = malloc(nd * sizeof *p);
            if (!p)
                break;
            if (deps != inl)
                free(deps);
            deps = p;
            capdeps = nd;
            if (vmm_node_deps(v, deps, capdeps, &nd) != XSEG_SUCCESS)
                break;
        }
        cr->nodes_read++;
        bool ok = true;
        for (size_t j = 0; j < nd && ok; j++)
            ok = walk_visit(cr, w, &top, deps[j]);
        if (!ok)
            break;
    }
    if (deps != inl)
        free(deps);
    err_clear();
}

/* Did the last walk reach every node the one before started from (the stream order held)? */
static bool walk_ordered(const struct cr_walk *w)
{
    for (size_t i = 0; i < w->nterms; i++)
        if (!w->hit[i])
            return false;
    return true;
}

/* Remember @p from as the starting points to check the next walk against. On a failure the
 * walk is forgotten instead (nothing to check against would let a broken order pass). */
static void walk_set_terms(struct capreuse *cr, struct cr_walk *w, const CUgraphNode *from, size_t n)
{
    if (!VEC_RESERVE(w->terms, w->capterms, n) || !VEC_RESERVE(w->hit, w->caphit, n)) {
        walk_forget(cr, w);
        return;
    }
    memcpy(w->terms, from, n * sizeof *from);
    w->nterms = n;
}

void capreuse_free_safe(struct dev_alloc *d, CUstream stream)
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
    struct cr_entry *e = w->ready;
    w->ready = NULL;
    while (e) {
        struct cr_entry *nx = e->link;
        /* The graph orders everything captured next on the stream after every marker: the block
         * needs no event. Its deferred slot is emptied (the list is compacted at the capture's
         * end), so this costs O(1) whatever the number of blocks still deferred. */
        struct block *b = e->block;
        d->deferred[e->deferred_slot] = NULL;
        entry_free(e);
        w->nentries--;
        cr->n--;
        cr->reused++;
        stream_set_clear(&b->uses);
        alloc_free_block(d, b);
        e = nx;
    }
}

void capreuse_reset(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    struct capreuse *cr = &d->cr;
    for (size_t i = 0; i < cr->nwalks; i++)
        walk_free(&cr->walks[i]);
    free(cr->walks);
    free(cr->stack);
    uint64_t nodes_read = cr->nodes_read, reused = cr->reused;
    *cr = (struct capreuse){.nodes_read = nodes_read, .reused = reused};
}
