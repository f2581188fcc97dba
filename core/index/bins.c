/* The free index (size bins and treaps threaded through the blocks) and the unmapped index: the
 * out-of-line half of core/index/bins.h. All functions run under the owning device's mutex. */
#include <stdlib.h>
#include <string.h>

#include "core/index/bins.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "vmm/event.h"

/* ---- treap ---------------------------------------------------------------------------------
 * The unmapped index is one treap keyed (stream, addr) (`by_addr`); the free index's bins are
 * treaps keyed (size, addr) (below). Priorities are a hash of the key
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

/* ---- free index: size bins per (pool, stream) ------------------------------------------------
 * Inside one stream's bins every key has the same stream, so a bin's treap compares (size, addr)
 * only (zkey_less). The bins of a pool's streams are found by `last`, then `hash`; the walks in
 * (stream, size, addr) order go through `by_stream`. */

static inline void bin_mark(struct sbins *s, unsigned k)
{
    s->map[k >> 6] |= (uint64_t)1 << (k & 63);
    s->summary |= (uint64_t)1 << (k >> 6);
}

static inline void bin_unmark(struct sbins *s, unsigned k)
{
    if (!(s->map[k >> 6] &= ~((uint64_t)1 << (k & 63))))
        s->summary &= ~((uint64_t)1 << (k >> 6));
}

/* Insert @p n into the bin treap at @p root: down to the first node of lower priority, then split
 * that subtree around n's key into n's children. */
static inline void bin_insert(struct block **root, struct block *n)
{
    n->prio = treap_prio(n);
    size_t z = n->size;
    uintptr_t a = n->addr;
    struct block **link = root;
    while (*link && (*link)->prio >= n->prio)
        link = zkey_less(z, a, (*link)->size, (*link)->addr) ? &(*link)->left : &(*link)->right;
    struct block *t = *link, **l = &n->left, **r = &n->right;
    while (t) {
        if (zkey_less(t->size, t->addr, z, a)) {
            *l = t;
            l = &t->right;
            t = t->right;
        } else {
            *r = t;
            r = &t->left;
            t = t->left;
        }
    }
    *l = *r = NULL;
    *link = n;
}

static inline void bin_remove(struct block **root, struct block *n)
{
    size_t z = n->size;
    uintptr_t a = n->addr;
    struct block **link = root;
    while (*link != n) {
        if (XSEG_UNLIKELY(!*link))
            abort(); /* index corrupted: the block is not where its key says */
        link = zkey_less(z, a, (*link)->size, (*link)->addr) ? &(*link)->left : &(*link)->right;
    }
    /* Most nodes leave with a child or none (a treap's nodes are leaves half the time). */
    if (!n->left)
        *link = n->right;
    else if (!n->right)
        *link = n->left;
    else
        *link = treap_merge(n->left, n->right);
    n->left = n->right = NULL;
}

static inline struct sbins *bins_of(const struct bpool *p, const struct block *b)
{
    struct sbins *s = bpool_bins(p, b->stream);
    if (XSEG_UNLIKELY(!s))
        abort(); /* contract: a segment of the block's stream holds the bins */
    return s;
}

static inline size_t sbins_hash(CUstream stream, size_t mask)
{
    return (size_t)(((uint64_t)(uintptr_t)stream * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

struct sbins *bpool_bins_lookup(const struct bpool *p, CUstream stream)
{
    if (!p->hash)
        return NULL;
    for (size_t i = sbins_hash(stream, p->hmask);; i = (i + 1) & p->hmask) {
        struct sbins *s = p->hash[i];
        if (!s)
            return NULL;
        if (s->stream == stream) {
            /* `last` is a lookup hint, not part of the pool's value: every bpool is a non-const
             * object used under its device's mutex, so updating it through a const path is sound. */
            ((struct bpool *)p)->last = s;
            return s;
        }
    }
}

/* Fill @p hash (mask + 1 empty slots) with the pool's bins. */
static void sbins_rehash(struct bpool *p, struct sbins **hash, size_t mask)
{
    for (unsigned i = 0; i < p->nstreams; i++) {
        size_t j = sbins_hash(p->by_stream[i]->stream, mask);
        while (hash[j])
            j = (j + 1) & mask;
        hash[j] = p->by_stream[i];
    }
}

/* The position in by_stream of the first bins whose stream is >= @p stream. */
static unsigned stream_pos(const struct bpool *p, CUstream stream)
{
    unsigned lo = 0, hi = p->nstreams;
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if ((uintptr_t)p->by_stream[mid]->stream < (uintptr_t)stream)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool bpool_bins_acquire(struct bpool *p, CUstream stream)
{
    struct sbins *s = bpool_bins(p, stream);
    if (s) {
        s->refs++;
        return true;
    }
    /* Everything that can fail first: the bins, room in by_stream, a hash at most half full. */
    s = xs_calloc(1, sizeof *s);
    if (!s)
        return false;
    if (p->nstreams == p->capstreams) {
        unsigned ncap = p->capstreams ? p->capstreams * 2 : 4;
        struct sbins **v = xs_realloc(p->by_stream, ncap * sizeof *v);
        if (!v) {
            xs_free(s);
            return false;
        }
        p->by_stream = v;
        p->capstreams = ncap;
    }
    struct sbins **hash = NULL;
    size_t hcap = p->hash ? p->hmask + 1 : 0;
    if (2 * ((size_t)p->nstreams + 1) > hcap) {
        hcap = hcap ? hcap * 2 : 8;
        hash = xs_calloc(hcap, sizeof *hash);
        if (!hash) {
            xs_free(s);
            if (!p->nstreams) { /* as bpool_bins_release: an empty pool holds no memory */
                xs_free(p->by_stream);
                p->by_stream = NULL;
                p->capstreams = 0;
            }
            return false;
        }
    }
    s->stream = stream;
    s->refs = 1;
    unsigned at = stream_pos(p, stream);
    memmove(&p->by_stream[at + 1], &p->by_stream[at], (p->nstreams - at) * sizeof *p->by_stream);
    p->by_stream[at] = s;
    p->nstreams++;
    if (hash) {
        xs_free(p->hash);
        p->hash = hash;
        p->hmask = hcap - 1;
        sbins_rehash(p, hash, p->hmask);
    } else {
        size_t j = sbins_hash(stream, p->hmask);
        while (p->hash[j])
            j = (j + 1) & p->hmask;
        p->hash[j] = s;
    }
    p->last = s;
    return true;
}

void bpool_bins_release(struct bpool *p, CUstream stream)
{
    struct sbins *s = bpool_bins(p, stream);
    xseg_assert(s && s->refs > 0);
    if (!s || --s->refs)
        return;
    xseg_assert(s->summary == 0);
    unsigned at = stream_pos(p, stream);
    memmove(&p->by_stream[at], &p->by_stream[at + 1], (p->nstreams - at - 1) * sizeof *p->by_stream);
    p->nstreams--;
    if (p->last == s)
        p->last = NULL;
    if (s->free_ev)
        vevent_destroy(s->free_ev); /* valid whether or not its stream still is */
    xs_free(s);
    if (!p->nstreams) {
        /* The pool's last segment went: no memory stays behind. */
        xs_free(p->by_stream);
        xs_free(p->hash);
        p->by_stream = NULL;
        p->hash = NULL;
        p->hmask = 0;
        p->capstreams = 0;
        return;
    }
    /* Streams come and go rarely: rebuild the hash rather than delete in place. */
    memset(p->hash, 0, (p->hmask + 1) * sizeof *p->hash);
    sbins_rehash(p, p->hash, p->hmask);
}

void bpool_insert_free(struct bpool *p, struct block *b)
{
    struct sbins *s = bins_of(p, b);
    unsigned k = bins_index(b->size);
    if (!s->bin[k])
        bin_mark(s, k);
    bin_insert(&s->bin[k], b);
    b->in_index = true;
    p->nfree++;
}

void bpool_remove_free(struct bpool *p, struct block *b)
{
    struct sbins *s = bins_of(p, b);
    unsigned k = bins_index(b->size);
    bin_remove(&s->bin[k], b);
    if (!s->bin[k])
        bin_unmark(s, k);
    b->in_index = false;
    p->nfree--;
}

void bpool_rekey_free(struct bpool *p, struct block *b, uintptr_t addr, size_t size)
{
    struct sbins *s = bins_of(p, b);
    unsigned k = bins_index(b->size);
    bin_remove(&s->bin[k], b);
    if (!s->bin[k])
        bin_unmark(s, k);
    b->addr = addr;
    b->size = size;
    k = bins_index(size);
    if (!s->bin[k])
        bin_mark(s, k);
    bin_insert(&s->bin[k], b);
}

/* The largest block in the bins of @p s up to bin @p k (k < BINS_N), or NULL. */
static struct block *bins_last_upto(const struct sbins *s, unsigned k)
{
    unsigned w = k >> 6;
    uint64_t m = s->map[w] & (((uint64_t)2 << (k & 63)) - 1); /* bits 0..k&63 (all for 63) */
    if (!m) {
        m = s->summary & (((uint64_t)1 << w) - 1);
        if (!m)
            return NULL;
        w = 63u - (unsigned)__builtin_clzll(m);
        m = s->map[w];
    }
    struct block *t = s->bin[w << 6 | (63u - (unsigned)__builtin_clzll(m))];
    while (t->right)
        t = t->right;
    return t;
}

/* The first block of @p s with key >= (size, addr), or NULL. */
static struct block *bins_lower_bound(const struct sbins *s, size_t size, uintptr_t addr)
{
    unsigned k = bins_index(size);
    struct block *t = s->bin[k], *res = NULL;
    while (t) {
        if (!zkey_less(t->size, t->addr, size, addr)) {
            res = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return res ? res : bins_first_from(s, k + 1);
}

/* The first block of the streams from position @p i of by_stream on, or NULL. */
static struct block *streams_first_from(const struct bpool *p, unsigned i)
{
    for (; i < p->nstreams; i++) {
        struct block *b = bins_first_from(p->by_stream[i], 0);
        if (b)
            return b;
    }
    return NULL;
}

struct block *bpool_lower_bound(const struct bpool *p, CUstream stream, size_t size, uintptr_t addr)
{
    unsigned i = stream_pos(p, stream);
    if (i < p->nstreams && p->by_stream[i]->stream == stream) {
        struct block *b = bins_lower_bound(p->by_stream[i], size, addr);
        if (b)
            return b;
        i++;
    }
    return streams_first_from(p, i);
}

struct block *bpool_next_free(const struct bpool *p, const struct block *b)
{
    const struct sbins *s = bins_of(p, b);
    unsigned k = bins_index(b->size);
    struct block *succ = bins_succ_in_bin(s->bin[k], b);
    if (succ)
        return succ;
    if ((succ = bins_first_from(s, k + 1)) != NULL)
        return succ;
    unsigned i = stream_pos(p, b->stream);
    return streams_first_from(p, i + 1);
}

struct block *bpool_prev_free(const struct bpool *p, CUstream stream, size_t size, uintptr_t addr)
{
    unsigned i = stream_pos(p, stream);
    if (i < p->nstreams && p->by_stream[i]->stream == stream) {
        const struct sbins *s = p->by_stream[i];
        unsigned k = bins_index(size);
        struct block *t = s->bin[k], *res = NULL;
        while (t) {
            if (zkey_less(t->size, t->addr, size, addr)) {
                res = t;
                t = t->right;
            } else {
                t = t->left;
            }
        }
        if (!res && k > 0)
            res = bins_last_upto(s, k - 1);
        if (res)
            return res;
    }
    while (i-- > 0) {
        struct block *b = bins_last_upto(p->by_stream[i], BINS_N - 1);
        if (b)
            return b;
    }
    return NULL;
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
    struct block **arr = xs_malloc(p->nfree * sizeof *arr);
    if (!arr)
        return false;
    for (unsigned i = 0; i < p->nstreams; i++) {
        const struct sbins *s = p->by_stream[i];
        for (int k = bins_next(s, 0); k >= 0; k = bins_next(s, (unsigned)k + 1))
            collect(s->bin[k], arr, n);
    }
    *out = arr;
    return true;
}

/* Append the blocks of treap @p t of at least @p min_size bytes, in order, to (*arr, *cap, *n). */
static bool collect_from(struct block *t, size_t min_size, struct block ***arr, size_t *cap, size_t *n)
{
    while (t) {
        if (t->size >= min_size) { /* else nothing on its left is large enough either */
            if (!collect_from(t->left, min_size, arr, cap, n) || !VEC_RESERVE(*arr, *cap, *n + 1))
                return false;
            (*arr)[(*n)++] = t;
        }
        t = t->right;
    }
    return true;
}

bool bpool_collect_free_from(const struct bpool *p, size_t min_size, struct block ***out, size_t *n)
{
    *n = 0;
    *out = NULL;
    size_t cap = 0;
    for (unsigned i = 0; i < p->nstreams; i++) {
        const struct sbins *s = p->by_stream[i];
        for (int k = bins_next(s, bins_index(min_size)); k >= 0; k = bins_next(s, (unsigned)k + 1)) {
            if (!collect_from(s->bin[k], min_size, out, &cap, n)) {
                xs_free(*out);
                *out = NULL;
                *n = 0;
                return false;
            }
        }
    }
    return true;
}

struct block *bpool_largest_free(const struct bpool *p)
{
    struct block *best = NULL;
    for (unsigned i = 0; i < p->nstreams; i++) {
        struct block *b = bins_last_upto(p->by_stream[i], BINS_N - 1);
        if (b && (!best || b->size > best->size))
            best = b;
    }
    return best;
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
