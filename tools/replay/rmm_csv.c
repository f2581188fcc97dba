/*
 * RMM's logging_resource_adaptor CSV (header Thread,Time,Action,Pointer,Size,Stream; actions
 * allocate, free, "allocate failure") read into a trace. Rows are replayed in file order on one
 * thread; the Thread column is ignored because replay order, not concurrency, decides what the
 * allocator does. "allocate failure" rows are skipped: that request failed in the original run
 * too, and nothing refers to it later.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/replay/trace.h"

/* Pointer -> buffer index. Entries are never deleted: a freed pointer keeps pointing at its old
 * buffer, whose live flag says it is gone, and a new allocation at that address overwrites it. */
struct ptr_map {
    uint64_t *keys;
    int32_t *vals;
    size_t n, nslots;
};

static size_t ptr_slot(const struct ptr_map *m, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t s = (size_t)(h >> 20) & (m->nslots - 1);
    while (m->vals[s] >= 0 && m->keys[s] != key)
        s = (s + 1) & (m->nslots - 1);
    return s;
}

static int ptr_map_put(struct ptr_map *m, uint64_t key, int32_t val)
{
    if ((m->n + 1) * 2 > m->nslots) {
        struct ptr_map nm = {.nslots = m->nslots ? m->nslots * 2 : 1024};
        nm.keys = malloc(nm.nslots * sizeof *nm.keys);
        nm.vals = malloc(nm.nslots * sizeof *nm.vals);
        if (!nm.keys || !nm.vals) {
            free(nm.keys);
            free(nm.vals);
            return -1;
        }
        for (size_t i = 0; i < nm.nslots; i++)
            nm.vals[i] = -1;
        for (size_t i = 0; i < m->nslots; i++)
            if (m->vals[i] >= 0) {
                size_t s = ptr_slot(&nm, m->keys[i]);
                nm.keys[s] = m->keys[i];
                nm.vals[s] = m->vals[i];
                nm.n++;
            }
        free(m->keys);
        free(m->vals);
        *m = nm;
    }
    size_t s = ptr_slot(m, key);
    if (m->vals[s] < 0)
        m->n++;
    m->keys[s] = key;
    m->vals[s] = val;
    return 0;
}

static int32_t ptr_map_get(const struct ptr_map *m, uint64_t key)
{
    if (!m->nslots)
        return -1;
    return m->vals[ptr_slot(m, key)];
}

struct action_vec {
    struct trace_action *a;
    size_t n, cap;
};

static int vec_push(struct action_vec *v, const struct trace_action *a)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        struct trace_action *p = realloc(v->a, cap * sizeof *p);
        if (!p)
            return -1;
        v->a = p;
        v->cap = cap;
    }
    v->a[v->n++] = *a;
    return 0;
}

struct csv_state {
    struct trace *t;
    char *err;
    size_t errlen;
    uint32_t row;
};

__attribute__((format(printf, 2, 3))) static xseg_status cerr(struct csv_state *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    xseg_status st = trace_verror(c->err, c->errlen, c->t->source, c->row, fmt, ap);
    va_end(ap);
    return st;
}

/* One CSV field as an unsigned 64-bit number: blanks and quotes around it are dropped; "0x"
 * digits are hexadecimal (pointers), anything else decimal (a leading 0 is not octal). A sign,
 * inner blanks, other characters or a value above 2^64-1 are errors: strtoull would skip a tab
 * before "-5" and wrap it to 2^64-5, and clamp over-wide pointers so that distinct ones collapse. */
static int parse_u64(const char *s, size_t len, uint64_t *v)
{
    while (len && (*s == ' ' || *s == '\t' || *s == '"')) {
        s++;
        len--;
    }
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '"' || s[len - 1] == '\r'))
        len--;
    unsigned base = 10;
    if (len > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
        len -= 2;
    }
    if (!len)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned d;
        char ch = s[i];
        if (ch >= '0' && ch <= '9')
            d = (unsigned)(ch - '0');
        else if (base == 16 && ch >= 'a' && ch <= 'f')
            d = (unsigned)(ch - 'a' + 10);
        else if (base == 16 && ch >= 'A' && ch <= 'F')
            d = (unsigned)(ch - 'A' + 10);
        else
            return -1;
        if (x > (UINT64_MAX - d) / base)
            return -1; /* over 2^64-1 */
        x = x * base + d;
    }
    *v = x;
    return 0;
}

/* What the importer keeps between rows: the pointer map, the seeded allocations (frees of
 * pointers allocated before the log), the log's actions in order, and which buffers are live. */
struct csv_import {
    struct csv_state c;
    struct ptr_map map;
    struct action_vec seeds, body;
    unsigned char *live;
    size_t live_cap;
    uint64_t buf_counter;
};

/* Split a row into at most 7 fields; the count is returned (6 expected, 5 without a stream). */
static int csv_fields(const char *p, const char *eol, const char *f[7], size_t fl[7])
{
    int nf = 0;
    while (nf < 7) {
        const char *comma = memchr(p, ',', (size_t)(eol - p));
        f[nf] = p;
        fl[nf] = (size_t)((comma ? comma : eol) - p);
        nf++;
        if (!comma)
            break;
        p = comma + 1;
    }
    return nf;
}

/* The declared stream "sHEX" of RMM stream @p stream (0 is the default stream), made on first use. */
static xseg_status csv_stream(struct csv_import *im, uint64_t stream, int32_t *out)
{
    if (!stream)
        return XSEG_SUCCESS;
    char name[32];
    int nl = snprintf(name, sizeof name, "s%" PRIx64, stream);
    int32_t idx;
    trace_name_find(&im->c.t->streams, name, (size_t)nl, &idx);
    if (idx < 0 && trace_name_intern(&im->c.t->streams, name, (size_t)nl, &idx) != XSEG_SUCCESS)
        return cerr(&im->c, "out of host memory");
    *out = idx;
    return XSEG_SUCCESS;
}

/* A new buffer for @p ptr: either this allocation, or the seed of a free whose allocation
 * happened before the log started. */
static xseg_status csv_new_buffer(struct csv_import *im, const struct trace_action *a, uint64_t ptr,
                                  uint64_t size, int is_alloc, int32_t *buf)
{
    char name[32];
    int nl = snprintf(name, sizeof name, "p%" PRIu64, im->buf_counter++);
    if (trace_name_intern(&im->c.t->bufs, name, (size_t)nl, buf) != XSEG_SUCCESS ||
        ptr_map_put(&im->map, ptr, *buf) != 0)
        return cerr(&im->c, "out of host memory");
    if ((size_t)*buf >= im->live_cap) {
        size_t ncap = im->live_cap ? im->live_cap * 2 : 1024;
        unsigned char *nl2 = realloc(im->live, ncap);
        if (!nl2)
            return cerr(&im->c, "out of host memory");
        memset(nl2 + im->live_cap, 0, ncap - im->live_cap);
        im->live = nl2;
        im->live_cap = ncap;
    }
    struct trace_action al = *a;
    al.op = TRACE_ALLOC;
    al.buf = *buf;
    al.size = size;
    if (!is_alloc)
        al.line = 0; /* seeded: not from a row of the log */
    if (vec_push(is_alloc ? &im->body : &im->seeds, &al))
        return cerr(&im->c, "out of host memory");
    im->live[*buf] = 1;
    return XSEG_SUCCESS;
}

/* One row of the log, [line, eol): allocate, free, or allocate failure (skipped). */
static xseg_status csv_row(struct csv_import *im, const char *line, const char *eol)
{
    struct csv_state *c = &im->c;
    const char *f[7];
    size_t fl[7];
    int nf = csv_fields(line, eol, f, fl);
    if (nf < 5 || nf > 6)
        return cerr(c, "expected 6 fields (Thread,Time,Action,Pointer,Size,Stream), got %d", nf);
    const char *act = f[2];
    size_t alen = fl[2];
    while (alen && act[alen - 1] == '\r')
        alen--;
    int is_alloc = alen == 8 && memcmp(act, "allocate", 8) == 0;
    int is_free = alen == 4 && memcmp(act, "free", 4) == 0;
    if (alen == 16 && memcmp(act, "allocate failure", 16) == 0)
        return XSEG_SUCCESS;
    if (!is_alloc && !is_free)
        return cerr(c, "unknown action '%.*s' (allocate, free, allocate failure)", (int)(alen > 40 ? 40 : alen), act);
    uint64_t ptr, size, stream = 0;
    if (parse_u64(f[3], fl[3], &ptr))
        return cerr(c, "bad pointer '%.*s' (0x and up to 16 hex digits, or decimal below 2^64)",
                    (int)(fl[3] > 40 ? 40 : fl[3]), f[3]);
    if (parse_u64(f[4], fl[4], &size))
        return cerr(c, "bad size '%.*s' (a byte count: decimal digits, below 2^64)",
                    (int)(fl[4] > 40 ? 40 : fl[4]), f[4]);
    if (nf == 6 && fl[5] && parse_u64(f[5], fl[5], &stream))
        return cerr(c, "bad stream '%.*s' (a number below 2^64)", (int)(fl[5] > 40 ? 40 : fl[5]), f[5]);
    struct trace_action a = {.line = c->row, .buf = -1, .stream = TRACE_DEFAULT_STREAM, .pool = -1};
    xseg_status st = csv_stream(im, stream, &a.stream);
    if (st)
        return st;
    int32_t buf = ptr_map_get(&im->map, ptr);
    int buf_live = buf >= 0 && (size_t)buf < im->live_cap && im->live[buf];
    if (is_alloc && buf_live)
        return cerr(c, "pointer 0x%" PRIx64 " allocated again without a free", ptr);
    if ((is_alloc || !buf_live) && (st = csv_new_buffer(im, &a, ptr, size, is_alloc, &buf)))
        return st;
    if (is_free) {
        struct trace_action fr = a;
        fr.op = TRACE_FREE;
        fr.buf = buf;
        fr.stream = TRACE_DEFAULT_STREAM;
        im->live[buf] = 0;
        if (vec_push(&im->body, &fr))
            return cerr(c, "out of host memory");
    }
    return XSEG_SUCCESS;
}

xseg_status trace_import_rmm_csv(struct trace *t, const char *text, size_t len, char *err, size_t errlen)
{
    struct csv_import im = {.c = {.t = t, .err = err, .errlen = errlen}};
    xseg_status st = XSEG_SUCCESS;
    const char *s = text, *end = text + len;

    while (s < end && st == XSEG_SUCCESS) {
        const char *eol = memchr(s, '\n', (size_t)(end - s));
        if (!eol)
            eol = end;
        im.c.row++;
        const char *line = s;
        s = eol + 1;
        if (im.c.row == 1)
            continue; /* the header, checked by the caller */
        if (eol == line || (eol - line == 1 && line[0] == '\r'))
            continue;
        st = csv_row(&im, line, eol);
    }
    /* Streams first (declared before use), then the seeds, then the log in order. */
    for (size_t i = 0; st == XSEG_SUCCESS && i < t->streams.count; i++) {
        struct trace_action sa = {.op = TRACE_STREAM, .buf = -1, .stream = (int32_t)i, .pool = -1};
        st = trace_push(t, &sa);
    }
    for (size_t i = 0; st == XSEG_SUCCESS && i < im.seeds.n; i++)
        st = trace_push(t, &im.seeds.a[i]);
    for (size_t i = 0; st == XSEG_SUCCESS && i < im.body.n; i++)
        st = trace_push(t, &im.body.a[i]);
    free(im.map.keys);
    free(im.map.vals);
    free(im.seeds.a);
    free(im.body.a);
    free(im.live);
    return st;
}
