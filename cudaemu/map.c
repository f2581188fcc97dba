/* A small open-addressed hash map (linear probing, backward-shift deletion) from nonzero 64-bit
 * keys to pointers: handle ids and object addresses to their records. Callers hold emu.lock. */
#include <stdlib.h>

#include "cudaemu/emu.h"

static size_t map_slot(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

void *emu_map_get(const struct emu_map *m, uint64_t key)
{
    if (!m->cap || !key)
        return NULL;
    for (size_t i = map_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key)
            return m->vals[i];
        if (!m->keys[i])
            return NULL;
    }
}

static int map_grow(struct emu_map *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uint64_t *nk = calloc(ncap, sizeof *nk);
    void **nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return -1;
    }
    for (size_t j = 0; j < m->cap; j++) {
        if (!m->keys[j])
            continue;
        size_t i = map_slot(m->keys[j], ncap);
        while (nk[i])
            i = (i + 1) & (ncap - 1);
        nk[i] = m->keys[j];
        nv[i] = m->vals[j];
    }
    free(m->keys);
    free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
    return 0;
}

int emu_map_put(struct emu_map *m, uint64_t key, void *val)
{
    if ((m->count + 1) * 2 > m->cap && map_grow(m))
        return -1;
    size_t i = map_slot(key, m->cap);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i])
        m->count++;
    m->keys[i] = key;
    m->vals[i] = val;
    return 0;
}

void *emu_map_del(struct emu_map *m, uint64_t key)
{
    if (!m->cap || !key)
        return NULL;
    size_t mask = m->cap - 1, i = map_slot(key, m->cap);
    while (m->keys[i] != key) {
        if (!m->keys[i])
            return NULL;
        i = (i + 1) & mask;
    }
    void *val = m->vals[i];
    /* Backward shift: pull later members of the probe run into the hole so lookups that pass
     * through it still find them, without tombstones. */
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t home = map_slot(m->keys[j], m->cap);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->vals[i] = NULL;
    m->count--;
    return val;
}

void *emu_map_next(const struct emu_map *m, size_t *pos, uint64_t *key)
{
    for (; *pos < m->cap; (*pos)++) {
        if (m->keys[*pos]) {
            if (key)
                *key = m->keys[*pos];
            return m->vals[(*pos)++];
        }
    }
    return NULL;
}

void emu_map_free(struct emu_map *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->count = 0;
}
