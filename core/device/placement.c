/* Placement (core/device/placement.h): L1's window and key table, C1-C3's chunk sizes. */
#include "core/device/placement.h"

#include "base/assert.h"

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
    for (unsigned i = 0; i < PLACE_LIFE_PROBES; i++) {
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
    _Static_assert(PLACE_LIFE_WINDOW == 64, "the window is the 64 bits of life_state.ring");
    uint64_t count = l->events < PLACE_LIFE_WINDOW ? l->events : PLACE_LIFE_WINDOW;
    if (2u * (unsigned)__builtin_popcountll(l->ring) <= count)
        return false;
    const struct life_key *k = life_find(l, req, stream, pool);
    return k && k->n >= PLACE_LIFE_TWINS && k->live == (1u << k->n) - 1u;
}

void life_record(struct life_state *l, size_t req, CUstream stream, const void *pool, uintptr_t addr)
{
    if (!req)
        return; /* 0 marks an empty entry; no block has a 0-byte request in the large pool */
    size_t h = life_hash(req, stream, pool);
    struct life_key *k = NULL;
    for (unsigned i = 0; i < PLACE_LIFE_PROBES && !k; i++) {
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

/* C2: xseg's reserved memory is within the last 1/PLACE_NEAR_FULL_DIV of the device (or of the
 * memory fraction's limit). Other processes' memory is not counted (no driver call here): near the
 * limit a refusal says the rest. */
static bool near_full(const struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    size_t limit = d->acct.set_fraction ? d->acct.allowed_memory_maximum : d->info.total_mem;
    return limit && d->acct.total_allocated_memory >= limit - limit / PLACE_NEAR_FULL_DIV;
}

/* C1: a page, or 1/PLACE_DEVICE_CHUNK_DIV of the device's memory in granules where that is less
 * (under 10 GiB with 20 MiB pages). The device's size, not the memory fraction, which may change at
 * any time. */
static size_t device_chunk(const struct dev_alloc *d, size_t page, size_t gran)
{
    lock_assert_held(&d->lock);
    size_t chunk = d->info.total_mem / PLACE_DEVICE_CHUNK_DIV / gran * gran;
    if (!d->cfg.expandable_segments_recycle || !d->info.total_mem || chunk >= page)
        return page; /* 0: the size is unknown */
    return XSEG_MAX(chunk, gran);
}

size_t place_chunk_limit(const struct dev_alloc *d, const struct bpool *pool, size_t page, size_t gran, size_t size)
{
    lock_assert_held(&d->lock);
    if (pool->is_small)
        return page;
    size_t chunk = page;
    if (d->cfg.expandable_chunk && d->cfg.expandable_chunk < page)
        chunk = XSEG_MAX(d->cfg.expandable_chunk / gran * gran, gran);
    if (!d->exp.fine_chunks && !(d->cfg.expandable_segments_recycle && near_full(d)))
        return d->cfg.expandable_chunk ? chunk : device_chunk(d, page, gran);
    /* C3. A kept handle is a whole chunk of its size: chunks of the largest one's size, so that they
     * are mapped again (with a page here, eornn_cnn_small's granule handles went back). */
    if (!d->exp.handles.n)
        return XSEG_MIN(chunk, XSEG_MAX(size / PLACE_FINE_CHUNK_DIV / gran * gran, gran));
    size_t spare = gran;
    for (size_t i = 0; i < d->exp.handles.n; i++)
        spare = XSEG_MAX(spare, d->exp.handles.v[i].bytes);
    return XSEG_MIN(chunk, spare);
}
