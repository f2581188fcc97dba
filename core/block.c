/* Block indexes (treaps threaded through the blocks), stream sets and the live pointer map.
 * All functions run under the owning device's mutex. */
#include <stdlib.h>
#include <string.h>

#include "core/block.h"

/* ---- treap ---------------------------------------------------------------------------------
 * Both indexes share one treap implementation; `by_addr` selects the key: (stream, size, addr)
 * for the free index, (stream, addr) for the unmapped index. Priorities are a hash of the key
 * taken at insertion, which is as good as random for balance and needs no shared RNG state. */

/* Key order: stream, then (size, addr) as one 128-bit number (a compare and a borrow, no
 * branch per field). */
static inline bool key_lt(uintptr_t s1, size_t z1, uintptr_t a1, uintptr_t s2, size_t z2, uintptr_t a2)
{
    if (s1 != s2)
        return s1 < s2;
    return ((unsigned __int128)z1 << 64 | a1) < ((unsigned __int128)z2 << 64 | a2);
}

#define BKEY(b, by_addr) (uintptr_t)(b)->stream, (by_addr) ? 0 : (b)->size, (b)->addr

static inline uint32_t treap_prio(const struct block *b)
{
    uint64_t x = (uint64_t)b->addr ^ ((uint64_t)b->size << 17) ^ (uint64_t)(uintptr_t)b->stream;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint32_t)x;
}

/* Split @p t into keys < k (*l) and keys >= k (*r). */
static void treap_split(struct block *t, uintptr_t ks, size_t kz, uintptr_t ka, bool by_addr,
                        struct block **l, struct block **r)
{
    while (t) {
        if (key_lt(BKEY(t, by_addr), ks, kz, ka)) {
            *l = t;
            l = &t->right;
            t = t->right;
        } else {
            *r = t;
            r = &t->left;
            t = t->left;
        }
    }
    *l = NULL;
    *r = NULL;
}

/* Merge two treaps where every key of @p a is below every key of @p b. */
static struct block *treap_merge(struct block *a, struct block *b)
{
    struct block *root = NULL;
    struct block **link = &root;
    while (a && b) {
        if (a->prio > b->prio) {
            *link = a;
            link = &a->right;
            a = a->right;
        } else {
            *link = b;
            link = &b->left;
            b = b->left;
        }
    }
    *link = a ? a : b;
    return root;
}

static void treap_insert(struct block **root, struct block *n, bool by_addr)
{
    n->prio = treap_prio(n);
    struct block **link = root;
    while (*link && (*link)->prio >= n->prio)
        link = key_lt(BKEY(n, by_addr), BKEY(*link, by_addr)) ? &(*link)->left : &(*link)->right;
    treap_split(*link, BKEY(n, by_addr), by_addr, &n->left, &n->right);
    *link = n;
}

static void treap_remove(struct block **root, struct block *n, bool by_addr)
{
    struct block **link = root;
    while (*link != n) {
        if (!*link)
            abort(); /* index corrupted: the block is not where its key says */
        link = key_lt(BKEY(n, by_addr), BKEY(*link, by_addr)) ? &(*link)->left : &(*link)->right;
    }
    *link = treap_merge(n->left, n->right);
    n->left = n->right = NULL;
}

static struct block *treap_lower_bound(struct block *t, uintptr_t ks, size_t kz, uintptr_t ka, bool by_addr)
{
    struct block *res = NULL;
    while (t) {
        if (!key_lt(BKEY(t, by_addr), ks, kz, ka)) {
            res = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return res;
}

void bpool_insert_free(struct bpool *p, struct block *b)
{
    treap_insert(&p->free, b, false);
    b->in_index = true;
    p->nfree++;
}

void bpool_remove_free(struct bpool *p, struct block *b)
{
    treap_remove(&p->free, b, false);
    b->in_index = false;
    p->nfree--;
}

struct block *bpool_lower_bound(const struct bpool *p, CUstream stream, size_t size, uintptr_t addr)
{
    return treap_lower_bound(p->free, (uintptr_t)stream, size, addr, false);
}

struct block *bpool_next_free(const struct bpool *p, const struct block *b)
{
    if (b->addr == UINTPTR_MAX)
        return NULL;
    return treap_lower_bound(p->free, (uintptr_t)b->stream, b->size, b->addr + 1, false);
}

struct block *bpool_prev_free(const struct bpool *p, CUstream stream, size_t size, uintptr_t addr)
{
    struct block *t = p->free, *res = NULL;
    while (t) {
        if (key_lt(BKEY(t, false), (uintptr_t)stream, size, addr)) {
            res = t;
            t = t->right;
        } else {
            t = t->left;
        }
    }
    return res;
}

void bpool_rekey_free(struct bpool *p, struct block *b, uintptr_t addr, size_t size)
{
    treap_remove(&p->free, b, false);
    b->addr = addr;
    b->size = size;
    treap_insert(&p->free, b, false);
}

static void collect(struct block *t, struct block **arr, size_t *n)
{
    while (t) {
        collect(t->left, arr, n);
        arr[(*n)++] = t;
        t = t->right;
    }
}

bool bpool_collect_free(const struct bpool *p, struct block ***out, size_t *n)
{
    *n = 0;
    *out = NULL;
    if (!p->nfree)
        return true;
    struct block **arr = malloc(p->nfree * sizeof *arr);
    if (!arr)
        return false;
    collect(p->free, arr, n);
    *out = arr;
    return true;
}

void bpool_insert_unmapped(struct bpool *p, struct block *b)
{
    treap_insert(&p->unmapped, b, true);
    b->in_index = true;
}

void bpool_remove_unmapped(struct bpool *p, struct block *b)
{
    treap_remove(&p->unmapped, b, true);
    b->in_index = false;
}

struct block *bpool_unmapped_lower_bound(const struct bpool *p, CUstream stream, uintptr_t addr)
{
    return treap_lower_bound(p->unmapped, (uintptr_t)stream, 0, addr, true);
}

void bpool_unindex(struct block *b)
{
    if (!b->in_index)
        return;
    if (b->mapped)
        bpool_remove_free(block_pool(b), b);
    else
        bpool_remove_unmapped(block_pool(b), b);
}

/* ---- side structs --------------------------------------------------------------------- */

struct block_side *block_side_get(struct block *b)
{
    if (b->sided)
        return b->u.side;
    xseg_assert(!b->in_index);
    struct block_side *sd = calloc(1, sizeof *sd);
    if (!sd)
        return NULL;
    sd->requested_size = b->u.requested_size;
    b->u.side = sd;
    b->sided = true;
    return sd;
}

void block_side_drop(struct block *b)
{
    if (!b->sided)
        return;
    struct block_side *sd = b->u.side;
    if (sd->uses.n || sd->event_count || sd->hist_stack)
        return;
    size_t requested = sd->requested_size;
    stream_set_clear(&sd->uses);
    free(sd);
    b->sided = false;
    b->u.requested_size = requested;
}

void block_side_free(struct block *b)
{
    if (!b->sided)
        return;
    struct block_side *sd = b->u.side;
    size_t requested = sd->requested_size;
    stream_set_clear(&sd->uses);
    free(sd);
    b->sided = false;
    b->u.requested_size = requested;
}

/* ---- stream sets ----------------------------------------------------------------------- */

bool stream_set_add(struct stream_set *s, CUstream st)
{
    for (unsigned i = 0; i < s->n; i++)
        if (stream_set_get(s, i) == st)
            return true;
    if (s->cap == 0)
        s->cap = 2;
    if (s->n == s->cap) {
        unsigned ncap = s->cap * 2;
        CUstream *h = malloc(ncap * sizeof *h);
        if (!h)
            return false;
        for (unsigned i = 0; i < s->n; i++)
            h[i] = stream_set_get(s, i);
        free(s->heap);
        s->heap = h;
        s->cap = ncap;
    }
    if (s->cap > 2)
        s->heap[s->n++] = st;
    else
        s->inl[s->n++] = st;
    return true;
}

/* ---- live pointer map ------------------------------------------------------------------ */

bool ptrmap_grow(struct ptrmap *m)
{
    size_t ncap = m->cap ? m->cap + m->cap / 2 : 256;
    uintptr_t *slots = calloc(ncap, sizeof *slots);
    if (!slots)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i])
            continue;
        struct block *b = ptrmap_block(m->slots[i]);
        size_t j = ptrmap_hash(b->addr, ncap), d = 0;
        for (; slots[j]; j = ptrmap_next(j, ncap))
            d++;
        slots[j] = ptrmap_entry(b, d);
    }
    free(m->slots);
    m->slots = slots;
    m->cap = ncap;
    return true;
}

void ptrmap_destroy(struct ptrmap *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}
