/* The lifetime predictor (core/device/lifetime.h): a window of mallocs and frees, and a key table. */
#include "core/device/lifetime.h"

/* Entries probed from a key's home before one is replaced (linear probing, no deletion). */
#define LIFE_PROBES 8

static inline size_t life_hash(size_t req, CUstream stream, const void *pool)
{
    uint64_t h = (uint64_t)req * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uintptr_t)stream * 0xC2B2AE3D27D4EB4Full;
    h ^= (uint64_t)(uintptr_t)pool * 0x165667B19E3779F9ull;
    return (size_t)(h >> 32) & (LIFE_KEYS - 1);
}

static inline bool life_is(const struct life_key *k, size_t req, CUstream stream, const void *pool)
{
    return k->req == req && k->stream == stream && k->pool == pool;
}

/* The key's entry, or NULL. */
static const struct life_key *life_find(const struct life_state *l, size_t req, CUstream stream, const void *pool)
{
    size_t h = life_hash(req, stream, pool);
    for (unsigned i = 0; i < LIFE_PROBES; i++) {
        const struct life_key *k = &l->keys[(h + i) & (LIFE_KEYS - 1)];
        if (life_is(k, req, stream, pool))
            return k;
        if (!k->req)
            return NULL;
    }
    return NULL;
}

bool life_predict_long(const struct life_state *l, size_t req, CUstream stream, const void *pool)
{
    uint64_t count = l->events < 64 ? l->events : 64;
    if (2u * (unsigned)__builtin_popcountll(l->ring) <= count)
        return false;
    const struct life_key *k = life_find(l, req, stream, pool);
    return k && k->n >= 2 && k->live == (1u << k->n) - 1u;
}

void life_record(struct life_state *l, size_t req, CUstream stream, const void *pool, uintptr_t addr)
{
    if (!req)
        return; /* 0 marks an empty entry; no block has a 0-byte request in the large pool */
    size_t h = life_hash(req, stream, pool);
    struct life_key *k = NULL;
    for (unsigned i = 0; i < LIFE_PROBES && !k; i++) {
        struct life_key *e = &l->keys[(h + i) & (LIFE_KEYS - 1)];
        if (life_is(e, req, stream, pool) || !e->req)
            k = e;
    }
    if (!k) /* full around its home: the home entry is reused */
        k = &l->keys[h];
    if (!life_is(k, req, stream, pool)) {
        *k = (struct life_key){.req = req, .stream = stream, .pool = pool};
    }
    unsigned i = k->next;
    k->addr[i] = addr;
    k->live |= (uint8_t)(1u << i);
    k->next = (uint8_t)((i + 1) % LIFE_DEPTH);
    if (k->n < LIFE_DEPTH)
        k->n++;
}

void life_forget(struct life_state *l, size_t req, CUstream stream, const void *pool, uintptr_t addr)
{
    struct life_key *k = (struct life_key *)life_find(l, req, stream, pool);
    if (!k)
        return;
    for (unsigned i = 0; i < LIFE_DEPTH; i++)
        if ((k->live >> i & 1) && k->addr[i] == addr)
            k->live &= (uint8_t)~(1u << i);
}
