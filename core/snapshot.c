/* Snapshots in PyTorch's format, the live-process log and the OOM snapshot (snapshot.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/afile.h"
#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "base/witness.h"
#include "core/device/check.h"
#include "core/device/device.h"
#include "core/device/quarantine.h"
#include "core/process/history.h"
#include "core/runtime.h"
#include "core/services/hostalloc.h"
#include "core/process/settings.h"
#include "core/services/spill.h"
#include "core/snapshot.h"

/* ---- a map from 64-bit keys to 32-bit values (open addressing; keys never 0) ------------- */

struct u64map {
    uint64_t *keys;
    uint32_t *vals;
    size_t cap, count;
};

static size_t u64map_slot(const struct u64map *m, uint64_t k)
{
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != k)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static bool u64map_get(const struct u64map *m, uint64_t k, uint32_t *v)
{
    if (!m->cap)
        return false;
    size_t i = u64map_slot(m, k);
    if (!m->keys[i])
        return false;
    *v = m->vals[i];
    return true;
}

static bool u64map_put(struct u64map *m, uint64_t k, uint32_t v)
{
    if ((m->count + 1) * 2 > m->cap) {
        struct u64map n = {0};
        n.cap = m->cap ? m->cap * 2 : 256;
        n.keys = xs_calloc(n.cap, sizeof *n.keys);
        n.vals = xs_calloc(n.cap, sizeof *n.vals);
        if (!n.keys || !n.vals) {
            xs_free(n.keys);
            xs_free(n.vals);
            return false;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (m->keys[i]) {
                size_t j = u64map_slot(&n, m->keys[i]);
                n.keys[j] = m->keys[i];
                n.vals[j] = m->vals[i];
                n.count++;
            }
        }
        xs_free(m->keys);
        xs_free(m->vals);
        *m = n;
    }
    size_t i = u64map_slot(m, k);
    if (!m->keys[i])
        m->count++;
    m->keys[i] = k;
    m->vals[i] = v;
    return true;
}

static void u64map_free(struct u64map *m)
{
    xs_free(m->keys);
    xs_free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- the emitter: one walk, two encodings ------------------------------------------------ */

/* Pickle opcodes (protocol 2 and below: no FRAME, MEMOIZE or SHORT_BINUNICODE). */
enum {
    P_PROTO = 0x80, P_STOP = '.', P_MARK = '(', P_EMPTY_DICT = '}', P_SETITEMS = 'u', P_EMPTY_LIST = ']',
    P_APPENDS = 'e', P_BININT = 'J', P_BININT1 = 'K', P_BININT2 = 'M', P_LONG1 = 0x8a, P_BINUNICODE = 'X',
    P_NEWTRUE = 0x88, P_NEWFALSE = 0x89, P_BINFLOAT = 'G', P_TUPLE2 = 0x86, P_BINPUT = 'q',
    P_LONG_BINPUT = 'r', P_BINGET = 'h', P_LONG_BINGET = 'j',
};

/* Python's pickler batches APPENDS by 1000; MemoryViz.js spreads each batch into push(). */
#define EMIT_BATCH 1000

#define SNAP_STR2(x) #x
#define SNAP_STR(x) SNAP_STR2(x)
#define XSEG_VERSION_STRING                                                                                  \
    SNAP_STR(XSEG_API_VERSION_MAJOR) "." SNAP_STR(XSEG_API_VERSION_MINOR) "." SNAP_STR(XSEG_API_VERSION_PATCH)
#define EMIT_DEPTH 16

struct emit {
    FILE *f;
    bool json;
    int depth;
    bool is_list[EMIT_DEPTH];
    size_t count[EMIT_DEPTH]; /* items (lists) or keys (dicts) so far at each level */
    bool after_key;           /* JSON: a value follows its key without a comma */
    uint32_t memo_next;       /* pickle memo ids handed out */
};

static void put(struct emit *e, const void *p, size_t n) { fwrite(p, 1, n, e->f); }
static void put1(struct emit *e, int c) { putc(c, e->f); }
static void put_u32(struct emit *e, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put(e, b, 4);
}

/* Before every value and key: JSON commas, pickle APPENDS batches. */
static void sep(struct emit *e)
{
    if (e->depth == 0)
        return;
    int d = e->depth - 1;
    if (e->json) {
        if (e->after_key) {
            e->after_key = false;
            return;
        }
        if (e->count[d]++)
            put1(e, ',');
        return;
    }
    if (e->is_list[d]) {
        if (e->count[d] && e->count[d] % EMIT_BATCH == 0) {
            put1(e, P_APPENDS);
            put1(e, P_MARK);
        }
        e->count[d]++;
    }
}

static void open_(struct emit *e, bool list)
{
    sep(e);
    if (e->json) {
        put1(e, list ? '[' : '{');
    } else {
        put1(e, list ? P_EMPTY_LIST : P_EMPTY_DICT);
    }
    if (e->depth < EMIT_DEPTH) {
        e->is_list[e->depth] = list;
        e->count[e->depth] = 0;
    }
    e->depth++;
    if (!e->json)
        put1(e, P_MARK);
}

static void close_(struct emit *e)
{
    e->depth--;
    if (e->json)
        put1(e, e->is_list[e->depth] ? ']' : '}');
    else
        put1(e, e->is_list[e->depth] ? P_APPENDS : P_SETITEMS);
}

static void e_list(struct emit *e) { open_(e, true); }
static void e_dict(struct emit *e) { open_(e, false); }
static void e_end(struct emit *e) { close_(e); }

static void put_int(struct emit *e, int64_t v)
{
    if (e->json) {
        fprintf(e->f, "%lld", (long long)v);
        return;
    }
    if (v >= 0 && v < 256) {
        put1(e, P_BININT1);
        put1(e, (int)v);
    } else if (v >= 0 && v < 65536) {
        put1(e, P_BININT2);
        put1(e, (int)(v & 0xff));
        put1(e, (int)(v >> 8));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        put1(e, P_BININT);
        put_u32(e, (uint32_t)(int32_t)v);
    } else {
        /* LONG1: little-endian two's complement, the fewest bytes that keep the sign. */
        unsigned char b[8];
        uint64_t u = (uint64_t)v;
        int n = 0;
        do {
            b[n++] = (unsigned char)u;
            u = (uint64_t)((int64_t)u >> 8);
        } while (n < 8 && !((u == 0 && !(b[n - 1] & 0x80)) || (u == UINT64_MAX && (b[n - 1] & 0x80))));
        put1(e, P_LONG1);
        put1(e, n);
        put(e, b, (size_t)n);
    }
}

static void e_int(struct emit *e, int64_t v)
{
    sep(e);
    put_int(e, v);
}

static void e_bool(struct emit *e, bool v)
{
    sep(e);
    if (e->json)
        fputs(v ? "true" : "false", e->f);
    else
        put1(e, v ? P_NEWTRUE : P_NEWFALSE);
}

static void e_float(struct emit *e, double v)
{
    sep(e);
    if (e->json) {
        /* %.17g reads back as the same double; keep a float a float (0.0, not 0) for readers
         * that, like Python's json, tell 0 from 0.0. */
        char b[40];
        snprintf(b, sizeof b, "%.17g", v);
        fputs(b, e->f);
        if (!strpbrk(b, ".eEni"))
            fputs(".0", e->f);
        return;
    }
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    put1(e, P_BINFLOAT);
    for (int i = 7; i >= 0; i--)
        put1(e, (int)(u >> (8 * i)) & 0xff);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is not valid (RFC 3629: no
 * overlong form, no surrogate U+D800..U+DFFF, nothing past U+10FFFF). Reads no byte past a NUL. */
static int utf8_len(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    int n;
    unsigned char lo = 0x80, hi = 0xbf; /* the range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0; /* below: overlong */
        else if (c == 0xed)
            hi = 0x9f; /* above: surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90; /* below: overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above: past U+10FFFF */
    } else {
        return 0; /* a continuation byte, C0/C1 (overlong) or F5..FF */
    }
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

/* A string; each byte that does not start a valid UTF-8 sequence becomes '?' (one byte for one, so
 * the pickle's length holds): Python's tools decode the strings as strict UTF-8. */
static void e_str(struct emit *e, const char *s)
{
    sep(e);
    if (!s)
        s = "";
    size_t n = strlen(s);
    if (e->json) {
        put1(e, '"');
        for (const unsigned char *p = (const unsigned char *)s; *p;) {
            int l = utf8_len(p);
            if (!l) {
                put1(e, '?');
                p++;
            } else if (*p == '"' || *p == '\\') {
                put1(e, '\\');
                put1(e, *p++);
            } else if (*p < 0x20) {
                fprintf(e->f, "\\u%04x", *p++);
            } else {
                put(e, p, (size_t)l);
                p += l;
            }
        }
        put1(e, '"');
        return;
    }
    put1(e, P_BINUNICODE);
    put_u32(e, (uint32_t)n);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int l = utf8_len(p);
        if (!l) {
            put1(e, '?');
            p++;
        } else {
            put(e, p, (size_t)l);
            p += l;
        }
    }
}

static void e_key(struct emit *e, const char *k)
{
    e_str(e, k);
    if (e->json) {
        put1(e, ':');
        e->after_key = true;
    }
}

static void e_tuple2(struct emit *e, int64_t a, int64_t b)
{
    if (e->json) {
        e_list(e);
        e_int(e, a);
        e_int(e, b);
        e_end(e);
        return;
    }
    sep(e);
    put_int(e, a);
    put_int(e, b);
    put1(e, P_TUPLE2);
}

/* Pickle memo: remember the object just built as @p id, or push the remembered one. */
static void memo_put(struct emit *e, uint32_t id)
{
    if (id < 256) {
        put1(e, P_BINPUT);
        put1(e, (int)id);
    } else {
        put1(e, P_LONG_BINPUT);
        put_u32(e, id);
    }
}

static void memo_get(struct emit *e, uint32_t id)
{
    sep(e);
    if (id < 256) {
        put1(e, P_BINGET);
        put1(e, (int)id);
    } else {
        put1(e, P_LONG_BINGET);
        put_u32(e, id);
    }
}

/* ---- frames ------------------------------------------------------------------------------ */

struct frames_out {
    struct u64map frame_memo; /* frame value -> memo id of its dict (pickle) */
    struct u64map stack_memo; /* struct hstack * -> memo id of its list (pickle) */
};

static void e_frame(struct emit *e, struct frames_out *fo, uintptr_t f)
{
    uint32_t id;
    if (!e->json && u64map_get(&fo->frame_memo, f, &id)) {
        memo_get(e, id);
        return;
    }
    char buf[1024];
    const char *filename, *name;
    int line;
    hist_frame_info(f, buf, sizeof buf, &filename, &name, &line);
    e_dict(e);
    e_key(e, "filename");
    e_str(e, filename);
    e_key(e, "name");
    e_str(e, name);
    e_key(e, "line");
    e_int(e, line);
    e_end(e);
    if (!e->json && u64map_put(&fo->frame_memo, f, e->memo_next))
        memo_put(e, e->memo_next++);
}

/* The `frames` list of a stack (NULL: empty), written once and then referred to (pickle). */
static void e_frames(struct emit *e, struct frames_out *fo, const struct hstack *s)
{
    uint32_t id;
    if (s && !e->json && u64map_get(&fo->stack_memo, (uintptr_t)s, &id)) {
        memo_get(e, id);
        return;
    }
    e_list(e);
    for (uint32_t i = 0; s && i < s->n; i++)
        e_frame(e, fo, s->f[i]);
    e_end(e);
    if (s && !e->json && u64map_put(&fo->stack_memo, (uintptr_t)s, e->memo_next))
        memo_put(e, e->memo_next++);
}

/* ---- the snapshot ------------------------------------------------------------------------ */

static const char *state_name(xseg_block_state st)
{
    switch (st) {
    case XSEG_BLOCK_ACTIVE_ALLOCATED: return "active_allocated";
    case XSEG_BLOCK_ACTIVE_PENDING_FREE: return "active_pending_free";
    default: return "inactive";
    }
}

/* debug_stale_access's part (below): a quarantined block's record and its frames. */
struct stale_acc;
struct stale_held;
static const struct stale_held *stale_held_at(const struct stale_acc *sa, int dev, uintptr_t addr, size_t size);
static void e_held_frames(struct emit *e, struct frames_out *fo, const struct stale_acc *sa,
                          const struct stale_held *h);

static void e_segments(struct emit *e, struct frames_out *fo, const struct snap_acc *a, const struct stale_acc *sa)
{
    e_key(e, "segments");
    e_list(e);
    for (size_t i = 0; i < a->n; i++) {
        const xseg_segment_info *s = &a->segs[i];
        e_dict(e);
        e_key(e, "device");
        e_int(e, s->device);
        e_key(e, "address");
        e_int(e, (int64_t)s->address);
        e_key(e, "total_size");
        e_int(e, (int64_t)s->total_size);
        e_key(e, "allocated_size");
        e_int(e, (int64_t)s->allocated_size);
        e_key(e, "active_size");
        e_int(e, (int64_t)s->active_size);
        e_key(e, "requested_size");
        e_int(e, (int64_t)s->requested_size);
        e_key(e, "stream");
        e_int(e, (int64_t)(uintptr_t)s->stream);
        e_key(e, "segment_type");
        e_str(e, s->is_large ? "large" : "small");
        e_key(e, "segment_pool_id");
        e_tuple2(e, (int64_t)s->pool_id[0], (int64_t)s->pool_id[1]);
        e_key(e, "is_expandable");
        e_bool(e, s->is_expandable != 0);
        e_key(e, "frames");
        e_frames(e, fo, NULL);
        e_key(e, "blocks");
        e_list(e);
        for (size_t j = 0; j < s->nblocks; j++) {
            const xseg_block_info *b = &s->blocks[j];
            e_dict(e);
            e_key(e, "address");
            e_int(e, (int64_t)b->address);
            e_key(e, "size");
            e_int(e, (int64_t)b->size);
            e_key(e, "requested_size");
            e_int(e, (int64_t)b->requested_size);
            e_key(e, "state");
            e_str(e, state_name(b->state));
            if (b->host_bytes) { /* spill_to_host: where the block is (xseg only; viewers ignore it) */
                e_key(e, "host_bytes");
                e_int(e, (int64_t)b->host_bytes);
                e_key(e, "host_numa_node");
                e_int(e, b->host_numa_node);
            }
            e_key(e, "frames");
            const struct stale_held *h = b->state == XSEG_BLOCK_ACTIVE_PENDING_FREE
                                             ? stale_held_at(sa, s->device, (uintptr_t)b->address, b->size)
                                             : NULL;
            if (h)
                e_held_frames(e, fo, sa, h);
            else
                e_frames(e, fo, a->with_stacks ? a->stacks[i][j] : NULL);
            e_end(e);
        }
        e_end(e);
        e_end(e);
    }
    e_end(e);
}

static void e_event(struct emit *e, struct frames_out *fo, const struct hist_event *ev)
{
    e_dict(e);
    e_key(e, "action");
    e_str(e, hist_action_name(ev->action));
    if (ev->action == HIST_OOM) {
        e_key(e, "device_free");
        e_int(e, (int64_t)ev->addr);
    } else {
        e_key(e, "addr");
        e_int(e, (int64_t)ev->addr);
    }
    e_key(e, "size");
    e_int(e, (int64_t)ev->size);
    e_key(e, "stream");
    e_int(e, (int64_t)ev->stream);
    e_key(e, "time_us");
    e_int(e, ev->time_us);
    e_key(e, "frames");
    e_frames(e, fo, ev->stack);
    e_end(e);
}

/* One key of PyTorch's allocator_settings, from its row (core/process/config_keys.h): sizes in bytes (-1
 * unlimited) under the key's name without "_mb", the divisions as a dict by bucket's MiB. */
static void e_setting(struct emit *e, const struct cfg *c, const struct cfg_key *k)
{
    char name[64];
    size_t n = strlen(k->name);
    if (k->kind == CFG_KIND_MIB && n > 3 && !strcmp(k->name + n - 3, "_mb"))
        n -= 3;
    snprintf(name, sizeof name, "%.*s", (int)n, k->name);
    e_key(e, name);
    const void *f = cfg_field(c, k);
    switch (k->kind) {
    case CFG_KIND_MIB: {
        size_t v = *(const size_t *)f;
        e_int(e, v == SIZE_MAX ? -1 : (int64_t)v);
        break;
    }
    case CFG_KIND_FRACTION: e_float(e, *(const double *)f); break;
    case CFG_KIND_BOOL: e_bool(e, *(const bool *)f); break;
    case CFG_KIND_MS:
    case CFG_KIND_COUNT: e_int(e, *(const unsigned *)f); break;
    case CFG_KIND_NAME: e_str(e, (const char *)f); break;
    case CFG_KIND_ROUNDUP:
        e_dict(e);
        for (int i = 0; i < CFG_ROUNDUP_BUCKETS; i++) {
            char b[16];
            snprintf(b, sizeof b, "%d", 1 << i);
            e_key(e, b);
            e_int(e, ((const unsigned *)f)[i]);
        }
        e_end(e);
        break;
    case CFG_KIND_ENUM:
    case CFG_KIND_IGNORED: break; /* no field, so never given a place (snap 0) */
    }
}

static void e_settings(struct emit *e, uint64_t dropped)
{
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    char conf[1024];
    cfg_format(&c, conf, sizeof conf, NULL);
    e_key(e, "allocator_settings");
    e_dict(e);
    e_key(e, "PYTORCH_CUDA_ALLOC_CONF");
    e_str(e, conf);
    /* PyTorch's fields, in its order: the rows that name a place (1, 2, ...). */
    for (unsigned place = 1;; place++) {
        const struct cfg_key *k = NULL;
        for (size_t i = 0; i < cfg_nkeys && !k; i++)
            if (cfg_keys[i].snap == place)
                k = &cfg_keys[i];
        if (!k)
            break;
        e_setting(e, &c, k);
    }
    e_key(e, "allocator");
    e_str(e, "xseg");
    e_key(e, "xseg_version");
    e_str(e, XSEG_VERSION_STRING);
    e_key(e, "history_events_dropped");
    e_int(e, (int64_t)dropped);
    e_end(e);
}

/* ---- the segments of a device ------------------------------------------------------------ */

static xseg_status snap_push(struct snap_acc *a, xseg_segment_info *si, struct hstack **stacks)
{
    if (!VEC_RESERVE(a->segs, a->cap, a->n + 1) ||
        (a->with_stacks && !VEC_RESERVE(a->stacks, a->cap_stacks, a->n + 1)))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory taking a snapshot");
    if (a->with_stacks)
        a->stacks[a->n] = stacks;
    a->segs[a->n++] = *si;
    return XSEG_SUCCESS;
}

void snap_acc_free(struct snap_acc *a)
{
    for (size_t i = 0; i < a->n; i++) {
        if (a->with_stacks && a->stacks[i]) {
            for (size_t j = 0; j < a->segs[i].nblocks; j++)
                hist_stack_unref(a->stacks[i][j]);
            xs_free(a->stacks[i]);
        }
        xs_free(a->segs[i].blocks);
    }
    xs_free(a->segs);
    xs_free(a->stacks);
    memset(a, 0, sizeof *a);
}

/* One snapshot entry for blocks [from, to) of a segment (to exclusive, may be NULL). */
static xseg_status snap_range(struct dev_alloc *d, struct segrec *s, struct block *from, struct block *to,
                              struct snap_acc *a)
{
    lock_assert_held(&d->lock);
    xseg_segment_info si;
    memset(&si, 0, sizeof si);
    size_t nb = 0;
    for (struct block *b = from; b != to; b = b->next)
        nb++;
    si.blocks = xs_calloc(nb ? nb : 1, sizeof *si.blocks);
    struct hstack **stacks = a->with_stacks ? xs_calloc(nb ? nb : 1, sizeof *stacks) : NULL;
    if (!si.blocks || (a->with_stacks && !stacks)) {
        xs_free(si.blocks);
        xs_free(stacks);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory taking a snapshot");
    }
    si.device = d->device;
    si.address = from->addr;
    si.stream = s->stream;
    si.is_large = !s->pool->is_small;
    si.is_expandable = s->vseg != NULL;
    const struct priv_pool *owner = dev_pool_owner(d, s->pool);
    if (owner) {
        si.pool_id[0] = owner->id.first;
        si.pool_id[1] = owner->id.second;
    }
    for (struct block *b = from; b != to; b = b->next) {
        if (stacks && b->recorded && block_hist_stack(b)) {
            hist_stack_ref(block_hist_stack(b));
            stacks[si.nblocks] = block_hist_stack(b);
        }
        xseg_block_info *bi = &si.blocks[si.nblocks++];
        bi->address = b->addr;
        bi->size = b->size;
        si.total_size += b->size;
        bi->host_bytes = XSEG_UNLIKELY(b->spill) ? spill_block_host(d, b) : 0;
        bi->host_numa_node = bi->host_bytes ? spill_numa_node(d) : -1;
        if (b->allocated) {
            bi->state = XSEG_BLOCK_ACTIVE_ALLOCATED;
            bi->requested_size = block_requested(b);
            si.allocated_size += b->size;
            si.active_size += b->size;
            si.requested_size += block_requested(b);
        } else if (block_event_count(b) > 0 || block_uses_n(b)) {
            bi->state = XSEG_BLOCK_ACTIVE_PENDING_FREE;
            bi->requested_size = block_requested(b);
            si.active_size += b->size;
            si.requested_size += block_requested(b);
        } else {
            bi->state = XSEG_BLOCK_INACTIVE;
        }
    }
    xseg_status st = snap_push(a, &si, stacks);
    if (st != XSEG_SUCCESS) {
        if (stacks)
            for (size_t j = 0; j < si.nblocks; j++)
                hist_stack_unref(stacks[j]);
        xs_free(stacks);
        xs_free(si.blocks);
    }
    return st;
}

xseg_status snapshot_segments(struct dev_alloc *d, struct snap_acc *a)
{
    xseg_status st = XSEG_SUCCESS;
    dev_lock(d, DEV_NEED_SLOTS);
    for (struct segrec *s = d->segs; s && st == XSEG_SUCCESS; s = s->next_seg) {
        if (!s->vseg) {
            st = snap_range(d, s, s->first, NULL, a);
            continue;
        }
        if (s->asleep)
            continue; /* its pages are given back (xseg_sleep): nothing of it is on the device */
        /* Expandable: one entry per maximal run of mapped blocks. */
        struct block *b = s->first;
        while (b && st == XSEG_SUCCESS) {
            if (!b->mapped) {
                b = b->next;
                continue;
            }
            struct block *e = b;
            while (e && e->mapped)
                e = e->next;
            st = snap_range(d, s, b, e, a);
            b = e;
        }
    }
    dev_unlock(d);
    return st;
}

static size_t active_bytes(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_SLOTS);
    /* active_bytes.all.current, folded (dev_alloc.acct.pending) */
    size_t n = (size_t)(stats_all_current(d->acct.stats.allocated_bytes) + d->acct.pending_bytes[XSEG_STAT_ALL]);
    dev_unlock(d);
    return n;
}

/* ---- debug_stale_access's findings (core/device/quarantine.h) ------------------------------ */

struct stale_acc {
    struct quar_item *v; /* stacks referenced */
    int *dev;
    size_t n, cap, capdev;
    struct stale_held *held; /* the blocks quarantined at the snapshot (stacks referenced) */
    size_t nheld, capheld;
    struct u64map held_at;   /* stale_key(device, address) -> index into held, plus one */
};

/* Addresses have at most 56 bits; never 0. */
static uint64_t stale_key(int dev, uintptr_t addr) { return (uint64_t)addr ^ ((uint64_t)(unsigned)dev << 56); }

/* A quarantined block as PyTorch's viewers are shown it: pending, with its free's frames before
 * its allocation's. Taken under the lock before the segments are (in a lock of their own), so a
 * block is matched to its record by device, address and size. */
struct stale_held {
    uintptr_t addr;
    size_t size;
    int dev;
    int64_t freed_us;
    bool reported; /* a write after the free was found in it: its finding is among the kept ones */
    struct hstack *alloc_stack, *free_stack;
};

/* A snapshot is one of the checks' occasions: @p d's quarantine is checked (not during a
 * capture), the findings delivered, and every finding kept so far copied into @p sa. */
static void stale_gather(struct dev_alloc *d, struct stale_acc *sa)
{
    dev_lock(d, DEV_NEED_SLOTS);
    struct quar_batch batch = {0};
    if (quar_count(d, NULL) && !cap_underway(d)) {
        (void)quar_check_all(d, "snapshot", false, NULL); /* a failed read-back leaves its block unreported */
        quar_take(d, &batch);
    }
    size_t n;
    const struct quar_item *f = quar_findings(d, &n);
    if (n && VEC_RESERVE(sa->v, sa->cap, sa->n + n) && VEC_RESERVE(sa->dev, sa->capdev, sa->n + n)) {
        for (size_t i = 0; i < n; i++) {
            hist_stack_ref(f[i].alloc_stack);
            hist_stack_ref(f[i].free_stack);
            sa->dev[sa->n] = d->device;
            sa->v[sa->n++] = f[i];
        }
    }
    /* Host memory lacking: a quarantined block shows its allocation's frames only. */
    size_t nq = quar_count(d, NULL);
    if (nq && VEC_RESERVE(sa->held, sa->capheld, sa->nheld + nq)) {
        for (size_t i = 0; i < nq; i++) {
            const struct quar_item *it = quar_at(d, i);
            if (!u64map_put(&sa->held_at, stale_key(d->device, it->addr), (uint32_t)(sa->nheld + 1)))
                break;
            hist_stack_ref(it->alloc_stack);
            hist_stack_ref(it->free_stack);
            sa->held[sa->nheld++] = (struct stale_held){it->addr, it->size, d->device, it->freed_us, it->reported,
                                                        it->alloc_stack, it->free_stack};
        }
    }
    dev_unlock(d);
    quar_deliver(&batch);
}

static void stale_free(struct stale_acc *sa)
{
    for (size_t i = 0; i < sa->n; i++) {
        hist_stack_unref(sa->v[i].alloc_stack);
        hist_stack_unref(sa->v[i].free_stack);
    }
    xs_free(sa->v);
    xs_free(sa->dev);
    for (size_t i = 0; i < sa->nheld; i++) {
        hist_stack_unref(sa->held[i].alloc_stack);
        hist_stack_unref(sa->held[i].free_stack);
    }
    xs_free(sa->held);
    u64map_free(&sa->held_at);
}

/* The quarantined block of @p dev at [addr, addr + size), or NULL. */
static const struct stale_held *stale_held_at(const struct stale_acc *sa, int dev, uintptr_t addr, size_t size)
{
    uint32_t i;
    if (!sa || !u64map_get(&sa->held_at, stale_key(dev, addr), &i))
        return NULL;
    const struct stale_held *h = &sa->held[i - 1];
    return h->dev == dev && h->size == size ? h : NULL;
}

/* The finding made on the quarantine record freed at @p freed_us at @p addr of @p dev, or NULL (a
 * search of the findings kept, at most QUAR_MAX_FINDINGS a device: for reported blocks only). */
static const struct quar_item *stale_finding_of(const struct stale_acc *sa, int dev, uintptr_t addr,
                                                int64_t freed_us)
{
    for (size_t i = 0; i < sa->n; i++)
        if (sa->dev[i] == dev && sa->v[i].addr == addr && sa->v[i].freed_us == freed_us)
            return &sa->v[i];
    return NULL;
}

/* A line of text in a `frames` list: PyTorch's viewers print a frame as filename:line:name. */
static void e_note(struct emit *e, const char *text)
{
    e_dict(e);
    e_key(e, "filename");
    e_str(e, "xseg");
    e_key(e, "name");
    e_str(e, text);
    e_key(e, "line");
    e_int(e, 0);
    e_end(e);
}

/* The frames of a stack, inline in the list being written. */
static void e_stack_frames(struct emit *e, struct frames_out *fo, const struct hstack *s)
{
    for (uint32_t i = 0; s && i < s->n; i++)
        e_frame(e, fo, s->f[i]);
}

/* The `frames` PyTorch's viewers show for a quarantined block or a finding: two notes (what it is,
 * then what was found), the free's frames, a note, the allocation's frames. PyTorch's viewers show
 * a frame a line; no ';' (_memory_viz.py's flame graphs split stacks on it). */
static void e_stale_frames(struct emit *e, struct frames_out *fo, const char *what, const char *found,
                           const struct hstack *free_stack, const struct hstack *alloc_stack)
{
    e_list(e);
    e_note(e, what);
    e_note(e, found);
    e_stack_frames(e, fo, free_stack);
    if (!free_stack || !free_stack->n)
        e_note(e, "(the free's frames were not recorded)");
    e_note(e, "allocated at:");
    e_stack_frames(e, fo, alloc_stack);
    if (!alloc_stack || !alloc_stack->n)
        e_note(e, "(the allocation's frames were not recorded)");
    e_end(e);
}

/* A finding's notes. */
static void stale_notes(char *what, char *found, size_t size, const struct quar_item *f)
{
    snprintf(what, size, "STALE WRITE (debug_stale_access): block 0x%llx (%zu bytes) was written after its free",
             (unsigned long long)f->addr, f->size);
    snprintf(found, size, "first changed byte at offset %zu, found at %s %.3f s after the free. Freed at:",
             f->first_offset, f->when ? f->when : "?", (double)(f->found_us - f->freed_us) / 1e6);
}

/* A quarantined block's frames (state active_pending_free: MemoryViz draws it red). */
static void e_held_frames(struct emit *e, struct frames_out *fo, const struct stale_acc *sa,
                          const struct stale_held *h)
{
    char what[160], found[160];
    const struct quar_item *f = h->reported ? stale_finding_of(sa, h->dev, h->addr, h->freed_us) : NULL;
    if (f) {
        stale_notes(what, found, sizeof what, f);
    } else {
        snprintf(what, sizeof what, "quarantined (debug_stale_access): freed, not reused until it leaves the quarantine");
        snprintf(found, sizeof found, "no write after the free found so far. Freed at:");
    }
    e_stale_frames(e, fo, what, found, h->free_stack, h->alloc_stack);
}

/* A finding as a trace entry both viewers draw: a `snapshot` entry (MemoryViz lists it and, when it is
 * selected, draws the memory of that moment, the block still pending) at the block's address, size and
 * stream, at the time it was found, whose frames say what was found and where the block was freed and
 * allocated. */
static void e_finding_event(struct emit *e, struct frames_out *fo, const struct quar_item *f)
{
    char what[160], found[160];
    stale_notes(what, found, sizeof what, f);
    e_dict(e);
    e_key(e, "action");
    e_str(e, "snapshot");
    e_key(e, "addr");
    e_int(e, (int64_t)f->addr);
    e_key(e, "size");
    e_int(e, (int64_t)f->size);
    e_key(e, "stream");
    e_int(e, (int64_t)(uintptr_t)f->stream);
    e_key(e, "time_us");
    e_int(e, f->found_us);
    e_key(e, "frames");
    e_stale_frames(e, fo, what, found, f->free_stack, f->alloc_stack);
    e_end(e);
}

/* xseg's own key (PyTorch's readers ignore it): each write after a free found, with the
 * allocation's frames (`frames`) and the free's (`free_frames`). */
static void e_stale(struct emit *e, struct frames_out *fo, const struct stale_acc *sa)
{
    e_key(e, "xseg_stale_accesses");
    e_list(e);
    for (size_t i = 0; i < sa->n; i++) {
        const struct quar_item *f = &sa->v[i];
        e_dict(e);
        e_key(e, "device");
        e_int(e, sa->dev[i]);
        e_key(e, "address");
        e_int(e, (int64_t)f->addr);
        e_key(e, "size");
        e_int(e, (int64_t)f->size);
        e_key(e, "requested_size");
        e_int(e, (int64_t)f->requested);
        e_key(e, "stream");
        e_int(e, (int64_t)(uintptr_t)f->stream);
        e_key(e, "segment_type");
        e_str(e, f->pool == XSEG_STAT_SMALL_POOL ? "small" : "large");
        e_key(e, "is_expandable");
        e_bool(e, f->expandable);
        e_key(e, "first_changed_offset");
        e_int(e, (int64_t)f->first_offset);
        e_key(e, "freed_time_us");
        e_int(e, f->freed_us);
        e_key(e, "found_time_us");
        e_int(e, f->found_us);
        e_key(e, "found_at");
        e_str(e, f->when);
        e_key(e, "frames");
        e_frames(e, fo, f->alloc_stack);
        e_key(e, "free_frames");
        e_frames(e, fo, f->free_stack);
        e_end(e);
    }
    e_end(e);
}

/* The segments of @p device (-1: every device created so far) into @p a. */
static xseg_status gather(int device, struct snap_acc *a)
{
    int n = rt_device_count();
    for (int i = 0; i < n; i++) {
        if (device != -1 && i != device)
            continue;
        struct dev_alloc *d = rt_device_peek(i);
        if (!d)
            continue;
        if (hist_mode() & HIST_TRACE)
            hist_record(HIST_SNAPSHOT, i, 0, active_bytes(d), 0, NULL);
        xseg_status st = snapshot_segments(d, a);
        if (st != XSEG_SUCCESS)
            return st;
    }
    return XSEG_SUCCESS;
}

xseg_status snapshot_write(int device, const char *path, bool json)
{
    const char *what = json ? "xseg_dump_snapshot_json" : "xseg_dump_snapshot";
    int ndev = rt_device_count();
    xseg_status st;
    struct snap_acc a = {.with_stacks = true};
    struct hist_event *ev = NULL;
    size_t nev = 0;
    uint64_t dropped = 0;
    struct stale_acc sa = {0};
    (void)hostalloc_check_stale("snapshot", false, NULL); /* the pinned host quarantine: findings delivered */
    for (int i = 0; i < ndev; i++) {
        struct dev_alloc *d = (device == -1 || i == device) ? rt_device_peek(i) : NULL;
        if (d)
            stale_gather(d, &sa);
    }
    if ((st = gather(device, &a)) != XSEG_SUCCESS || (st = hist_events_copy(&ev, &nev, &dropped)) != XSEG_SUCCESS) {
        stale_free(&sa);
        snap_acc_free(&a);
        return st;
    }

    /* A fresh file renamed into place: nothing planted at either name is written through. */
    struct afile af;
    if ((st = afile_open(&af, path, what)) != XSEG_SUCCESS) {
        stale_free(&sa);
        snap_acc_free(&a);
        hist_events_free(ev, nev);
        return st;
    }
    FILE *f = af.f;
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    struct emit e = {.f = f, .json = json};
    struct frames_out fo = {0};
    if (!json) {
        put1(&e, P_PROTO);
        put1(&e, 2);
    }
    e_dict(&e);
    e_segments(&e, &fo, &a, &sa);
    e_key(&e, "device_traces");
    e_list(&e);
    int ntraces = ndev > 0 ? ndev : 1;
    for (int dv = 0; dv < ntraces; dv++) {
        e_list(&e);
        size_t k = 0; /* the device's findings go in by the time they were found (sa.v: oldest first) */
        for (size_t i = 0; i < nev; i++) {
            if (ev[i].device != dv || (device != -1 && device != dv))
                continue;
            for (; k < sa.n; k++) {
                if (sa.dev[k] != dv)
                    continue;
                if (sa.v[k].found_us > ev[i].time_us)
                    break;
                e_finding_event(&e, &fo, &sa.v[k]);
            }
            e_event(&e, &fo, &ev[i]);
        }
        for (; k < sa.n; k++)
            if (sa.dev[k] == dv)
                e_finding_event(&e, &fo, &sa.v[k]);
        e_end(&e);
    }
    e_end(&e);
    e_settings(&e, dropped);
    if (sa.n)
        e_stale(&e, &fo, &sa);
    e_end(&e);
    if (!json)
        put1(&e, P_STOP);
    else
        put1(&e, '\n');
    u64map_free(&fo.frame_memo);
    u64map_free(&fo.stack_memo);
    snap_acc_free(&a);
    stale_free(&sa);
    hist_events_free(ev, nev);
    return afile_commit(&af, path, what);
}

/* ---- the live-process log: events as an xseg-replay trace ---------------------------------- */

/* xseg_dump_trace's names over the ring's events of one device (or all): the streams used, the
 * seeds (buffers freed in the window but allocated before it, p1.. in the order of their
 * frees), and whether a map could not grow (then the trace would be wrong: out of memory). */
struct trace_names {
    struct hist_event *ev;
    size_t nev;
    int device; /* -1: every device */
    struct u64map streams, seeded;
    bool oom;
};

/* Whether event @p i is one of the trace's device. */
static bool trace_has(const struct trace_names *t, size_t i)
{
    return t->device == -1 || t->ev[i].device == t->device;
}

/* Put (k, v) in map @p m, noting a failure to grow it in t->oom. */
static void trace_put(struct trace_names *t, struct u64map *m, uint64_t k, uint32_t v)
{
    if (!u64map_put(m, k, v))
        t->oom = true;
}

/* The first pass: the streams used, and the frees whose alloc the ring dropped (or that came
 * before recording) as seeds. */
static void trace_scan(struct trace_names *t)
{
    struct u64map live = {0}; /* live[addr] = N while b<N> is allocated, 0 once freed */
    uint32_t next = 1, nseed = 0, v;
    for (size_t i = 0; i < t->nev && !t->oom; i++) {
        const struct hist_event *x = &t->ev[i];
        if (!trace_has(t, i))
            continue;
        if (x->stream && !u64map_get(&t->streams, x->stream, &v))
            trace_put(t, &t->streams, x->stream, 1);
        if (x->action == HIST_ALLOC) {
            trace_put(t, &live, x->addr, next++);
        } else if (x->action == HIST_FREE_COMPLETED && x->addr) {
            if (!u64map_get(&live, x->addr, &v)) {
                if (!u64map_get(&t->seeded, x->addr, &v))
                    trace_put(t, &t->seeded, x->addr, ++nseed);
            } else {
                trace_put(t, &live, x->addr, 0); /* a key can't be deleted from u64map */
            }
        }
    }
    u64map_free(&live);
}

/* The header, the streams and the seeds' allocs (in the order their frees appear). */
static void trace_write_head(struct trace_names *t, FILE *f, uint64_t dropped)
{
    fprintf(f, "# xseg-replay trace written by xseg_dump_trace (xseg %s) from the allocation history\n",
            XSEG_VERSION_STRING);
    fprintf(f, "# device %d: %zu events in the ring, %llu older ones dropped; buffers freed in the window\n"
               "# but allocated before it are allocated first (their sizes are their requested sizes)\n",
            t->device, t->nev, (unsigned long long)dropped);
    for (size_t i = 0; i < t->streams.cap; i++)
        if (t->streams.keys[i])
            fprintf(f, "stream s%llx\n", (unsigned long long)t->streams.keys[i]);
    struct u64map done = {0};
    for (size_t i = 0; i < t->nev && !t->oom; i++) {
        const struct hist_event *x = &t->ev[i];
        uint32_t v, w;
        if (!trace_has(t, i) || x->action != HIST_FREE_COMPLETED || !u64map_get(&t->seeded, x->addr, &v) ||
            u64map_get(&done, x->addr, &w))
            continue;
        trace_put(t, &done, x->addr, 1);
        fprintf(f, "alloc p%u %llu", v, (unsigned long long)(x->size ? x->size : 1));
        if (x->stream)
            fprintf(f, " @s%llx", (unsigned long long)x->stream);
        fputc('\n', f);
    }
    u64map_free(&done);
}

/* The window, in order. A seeded buffer's first free is its own; later allocs at the same
 * address get fresh names. */
static void trace_write_window(struct trace_names *t, FILE *f)
{
    struct u64map cur = {0}, seed_used = {0};
    uint32_t next = 1;
    for (size_t i = 0; i < t->nev && !t->oom; i++) {
        const struct hist_event *x = &t->ev[i];
        uint32_t v;
        if (!trace_has(t, i))
            continue;
        if (x->action == HIST_ALLOC) {
            trace_put(t, &cur, x->addr, next);
            fprintf(f, "alloc b%u %llu", next++, (unsigned long long)x->size);
            if (x->stream)
                fprintf(f, " @s%llx", (unsigned long long)x->stream);
            fputc('\n', f);
        } else if (x->action == HIST_FREE_COMPLETED) {
            if (u64map_get(&cur, x->addr, &v) && v) {
                fprintf(f, "free b%u\n", v);
                trace_put(t, &cur, x->addr, 0);
            } else if (u64map_get(&t->seeded, x->addr, &v) && !u64map_get(&seed_used, x->addr, &v)) {
                u64map_get(&t->seeded, x->addr, &v);
                fprintf(f, "free p%u\n", v);
                trace_put(t, &seed_used, x->addr, 1);
            }
        } else if (x->action == HIST_OOM) {
            fprintf(f, "# oom: %llu bytes requested, %llu free on the device\n", (unsigned long long)x->size,
                    (unsigned long long)x->addr);
        } else if (x->action == HIST_SNAPSHOT) {
            fprintf(f, "mark snapshot\n");
        }
    }
    u64map_free(&cur);
    u64map_free(&seed_used);
}

xseg_status snapshot_write_trace(int device, const char *path)
{
    const char *what = "xseg_dump_trace";
    struct trace_names t = {.device = device};
    uint64_t dropped;
    xseg_status st = hist_events_copy(&t.ev, &t.nev, &dropped);
    if (st != XSEG_SUCCESS)
        return st;
    trace_scan(&t);
    struct afile af = {0};
    if (!t.oom && (st = afile_open(&af, path, what)) == XSEG_SUCCESS) {
        trace_write_head(&t, af.f, dropped);
        trace_write_window(&t, af.f);
        if (t.oom)
            afile_discard(&af);
        else
            st = afile_commit(&af, path, what);
    }
    u64map_free(&t.streams);
    u64map_free(&t.seeded);
    hist_events_free(t.ev, t.nev);
    if (t.oom)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
    return st;
}

/* ---- OOM snapshots ------------------------------------------------------------------------- */

#define OOM_SNAPSHOT_INTERVAL_US (10 * 1000000ll)

/* This part's state is xseg_rt.oom (core/process/procstate.h). */
FORK_MUTEX_AT(FORK_RANK_OOM_SNAPSHOT, oom_lock, xseg_rt.oom.lock)

xseg_status snapshot_set_oom_path(const char *path)
{
    char *p = NULL;
    if (path && *path && !(p = xs_strdup(path)))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_set_oom_snapshot: out of host memory");
    mutex_lock(&xseg_rt.oom.lock);
    xs_free(xseg_rt.oom.path);
    xseg_rt.oom.path = p;
    xseg_rt.oom.path_set = true;
    xseg_rt.oom.last_us = 0;
    mutex_unlock(&xseg_rt.oom.lock);
    return XSEG_SUCCESS;
}

void snapshot_oom_reset(void)
{
    mutex_lock(&xseg_rt.oom.lock);
    xs_free(xseg_rt.oom.path);
    xseg_rt.oom.path = NULL;
    xseg_rt.oom.path_set = false;
    xseg_rt.oom.last_us = 0;
    mutex_unlock(&xseg_rt.oom.lock);
}

void snapshot_on_oom(char *info, size_t size)
{
    info[0] = 0;
    mutex_lock(&xseg_rt.oom.lock);
    const char *path = xseg_rt.oom.path_set ? xseg_rt.oom.path : getenv("XSEG_OOM_SNAPSHOT");
    if (!path || !*path || xseg_rt.oom.writing) {
        mutex_unlock(&xseg_rt.oom.lock);
        return;
    }
    char *copy = xs_strdup(path);
    int64_t now = hist_now_us(), last = xseg_rt.oom.last_us;
    bool due = copy && (last == 0 || now - last >= OOM_SNAPSHOT_INTERVAL_US);
    if (due) {
        xseg_rt.oom.writing = true;
        xseg_rt.oom.last_us = now;
    }
    mutex_unlock(&xseg_rt.oom.lock);
    if (!copy)
        return;
    if (!due) {
        snprintf(info, size, " (No memory snapshot this time: one was written to %.400s %.1f s ago.)", copy,
                 (double)(now - last) / 1e6);
        xs_free(copy);
        return;
    }
    /* The writer sets this thread's error message on failure: keep its text for ours. */
    xseg_status st = snapshot_write(-1, copy, false);
    if (st == XSEG_SUCCESS)
        snprintf(info, size, " A memory snapshot was written to %.400s.", copy);
    else
        snprintf(info, size, " (The memory snapshot could not be written: %.400s)", err_message());
    mutex_lock(&xseg_rt.oom.lock);
    xseg_rt.oom.writing = false;
    mutex_unlock(&xseg_rt.oom.lock);
    xs_free(copy);
}
