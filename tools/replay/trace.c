/* The trace model: name interning, the action array, sizes. See trace.h. */
#include "tools/replay/trace.h"
#include "tools/replay/actions.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t name_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static xseg_status names_grow(struct trace_names *n)
{
    size_t nslots = n->nslots ? n->nslots * 2 : 64;
    int32_t *slots = malloc(nslots * sizeof *slots);
    if (!slots)
        return XSEG_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < nslots; i++)
        slots[i] = -1;
    for (size_t i = 0; i < n->count; i++) {
        size_t s = name_hash(n->names[i], strlen(n->names[i])) & (nslots - 1);
        while (slots[s] >= 0)
            s = (s + 1) & (nslots - 1);
        slots[s] = (int32_t)i;
    }
    free(n->slots);
    n->slots = slots;
    n->nslots = nslots;
    return XSEG_SUCCESS;
}

void trace_name_find(const struct trace_names *n, const char *name, size_t len, int32_t *index)
{
    *index = -1;
    if (!n->nslots)
        return;
    size_t s = name_hash(name, len) & (n->nslots - 1);
    while (n->slots[s] >= 0) {
        const char *cand = n->names[n->slots[s]];
        if (strlen(cand) == len && memcmp(cand, name, len) == 0) {
            *index = n->slots[s];
            return;
        }
        s = (s + 1) & (n->nslots - 1);
    }
}

xseg_status trace_name_intern(struct trace_names *n, const char *name, size_t len, int32_t *index)
{
    trace_name_find(n, name, len, index);
    if (*index >= 0)
        return XSEG_SUCCESS;
    if (n->count >= INT32_MAX)
        return XSEG_ERROR_OUT_OF_MEMORY;
    /* Keep the load factor under one half so probes stay short. */
    if ((n->count + 1) * 2 > n->nslots && names_grow(n) != XSEG_SUCCESS)
        return XSEG_ERROR_OUT_OF_MEMORY;
    if (n->count == n->cap) {
        size_t cap = n->cap ? n->cap * 2 : 64;
        char **names = realloc(n->names, cap * sizeof *names);
        if (!names)
            return XSEG_ERROR_OUT_OF_MEMORY;
        n->names = names;
        n->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return XSEG_ERROR_OUT_OF_MEMORY;
    memcpy(copy, name, len);
    copy[len] = '\0';
    size_t s = name_hash(name, len) & (n->nslots - 1);
    while (n->slots[s] >= 0)
        s = (s + 1) & (n->nslots - 1);
    n->slots[s] = (int32_t)n->count;
    n->names[n->count] = copy;
    *index = (int32_t)n->count++;
    return XSEG_SUCCESS;
}

static void names_destroy(struct trace_names *n)
{
    for (size_t i = 0; i < n->count; i++)
        free(n->names[i]);
    free(n->names);
    free(n->slots);
    memset(n, 0, sizeof *n);
}

xseg_status trace_init(struct trace *t, const char *source)
{
    memset(t, 0, sizeof *t);
    t->source = strdup(source ? source : "trace");
    t->strings = malloc(256);
    if (!t->source || !t->strings) {
        trace_destroy(t);
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    t->strings[0] = '\0';
    t->strings_len = 1;
    t->strings_cap = 256;
    t->recorded.peak_allocated = t->recorded.peak_reserved = t->recorded.oom_device = -1;
    t->recorded.expandable = -1;
    t->recorded.oom_reserved = t->recorded.oom_free = t->recorded.history_events = t->recorded.device = -1;
    return XSEG_SUCCESS;
}

/* "KEY=DIGITS" at @p s: the number, or -1. */
static int64_t recorded_value(const char *s, const char *end, const char *key)
{
    size_t n = strlen(key);
    if ((size_t)(end - s) <= n || strncmp(s, key, n) || s[n] != '=')
        return -1;
    int64_t v = 0;
    const char *q = s + n + 1;
    if (q >= end || *q < '0' || *q > '9')
        return -1;
    for (; q < end && *q >= '0' && *q <= '9'; q++) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*q - '0');
    }
    return v;
}

void trace_note_comment(struct trace *t, const char *s, const char *end)
{
    static const char pt[] = "# pytorch: ", oom[] = "# the original run hit an OOM";
    size_t len = (size_t)(end - s);
    if (len > sizeof pt - 1 && !strncmp(s, pt, sizeof pt - 1)) {
        const char *kv = s + sizeof pt - 1;
        int64_t v;
        if ((v = recorded_value(kv, end, "peak_allocated_bytes")) >= 0)
            t->recorded.peak_allocated = v;
        else if ((v = recorded_value(kv, end, "peak_reserved_bytes")) >= 0)
            t->recorded.peak_reserved = v;
        else if ((v = recorded_value(kv, end, "expandable_segments")) >= 0 && v <= 1)
            t->recorded.expandable = (int)v;
        else if ((v = recorded_value(kv, end, "oom_device_bytes")) >= 0)
            t->recorded.oom_device = v;
        else if ((v = recorded_value(kv, end, "oom_reserved_bytes")) >= 0)
            t->recorded.oom_reserved = v;
        else if ((v = recorded_value(kv, end, "oom_free_bytes")) >= 0)
            t->recorded.oom_free = v;
        else if ((v = recorded_value(kv, end, "history_events")) >= 0)
            t->recorded.history_events = v;
        else if ((v = recorded_value(kv, end, "device")) >= 0 && v <= 65535)
            t->recorded.device = v;
    } else if (len >= sizeof oom - 1 && !strncmp(s, oom, sizeof oom - 1)) {
        if (t->recorded.noom < TRACE_RECORDED_OOM_MAX)
            t->recorded.oom_at[t->recorded.noom] = t->count;
        t->recorded.noom++;
    }
}

size_t trace_oom_point(const struct trace *t, uint64_t *live, uint64_t *request)
{
    size_t at = t->recorded.noom ? t->recorded.oom_at[0] : SIZE_MAX;
    for (size_t i = 0; i < t->count && i < at; i++)
        if (t->actions[i].op == TRACE_MARK && !strncmp(trace_text(t, t->actions[i].text), "PyTorch OOM", 11))
            at = i + 1;
    *live = *request = 0;
    if (at == SIZE_MAX || at > t->count)
        return SIZE_MAX;
    uint64_t *sizes = calloc(t->bufs.count + 1, sizeof *sizes);
    for (size_t i = 0; sizes && i < at; i++) {
        const struct trace_action *a = &t->actions[i];
        if (a->op == TRACE_ALLOC) {
            *live += a->size - sizes[a->buf];
            sizes[a->buf] = a->size;
        } else if (a->op == TRACE_FREE) {
            *live -= sizes[a->buf];
            sizes[a->buf] = 0;
        }
    }
    free(sizes);
    if (at < t->count && t->actions[at].op == TRACE_ALLOC)
        *request = t->actions[at].size;
    return at;
}

int64_t trace_peak_requested(const struct trace *t)
{
    uint64_t *sizes = calloc(t->bufs.count + 1, sizeof *sizes);
    if (!sizes)
        return -1;
    uint64_t live = 0, peak = 0;
    for (size_t i = 0; i < t->count; i++) {
        const struct trace_action *a = &t->actions[i];
        if (a->op == TRACE_ALLOC) {
            /* PyTorch's round_size without roundup_power2_divisions; a size of 0 hands out nothing */
            uint64_t r = a->size == 0 ? 0 : a->size < 512 ? 512 : (a->size + 511) / 512 * 512;
            live += r - sizes[a->buf];
            sizes[a->buf] = r;
            peak = live > peak ? live : peak;
        } else if (a->op == TRACE_FREE) {
            live -= sizes[a->buf];
            sizes[a->buf] = 0;
        }
    }
    free(sizes);
    return (int64_t)peak;
}

size_t trace_count_op(const struct trace *t, enum trace_op op)
{
    size_t n = 0;
    for (size_t i = 0; i < t->count; i++)
        n += t->actions[i].op == op;
    return n;
}

void trace_destroy(struct trace *t)
{
    free(t->source);
    free(t->actions);
    free(t->strings);
    names_destroy(&t->bufs);
    names_destroy(&t->streams);
    names_destroy(&t->pools);
    names_destroy(&t->stack_names);
    for (size_t i = 0; i < t->stacks_cap; i++)
        free(t->stacks[i].f);
    free(t->stacks);
    memset(t, 0, sizeof *t);
}

xseg_status trace_check_idle(const struct trace *t, uint64_t cap_ns, char *err, size_t errlen)
{
    if (t->idle_ns <= cap_ns)
        return XSEG_SUCCESS;
    snprintf(err, errlen,
             "%s: its %llu idle actions add up to %.10g s (%.1f h), more than the cap on a trace's total idle, "
             "%.10g s: a replay would wait that long (--max-total-idle DURATION raises the cap, e.g. 48h)",
             t->source, (unsigned long long)t->nidle, (double)t->idle_ns / 1e9, (double)t->idle_ns / 3.6e12,
             (double)cap_ns / 1e9);
    return XSEG_ERROR_INVALID_VALUE;
}

xseg_status trace_push(struct trace *t, const struct trace_action *a)
{
    if (t->count == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        struct trace_action *p = realloc(t->actions, cap * sizeof *p);
        if (!p)
            return XSEG_ERROR_OUT_OF_MEMORY;
        t->actions = p;
        t->cap = cap;
    }
    t->actions[t->count++] = *a;
    if (a->op == TRACE_ALLOC) {
        t->nallocs++;
        t->total_alloc_bytes += a->size;
    } else if (a->op == TRACE_IDLE) {
        t->nidle++;
        t->idle_ns = a->size > UINT64_MAX - t->idle_ns ? UINT64_MAX : t->idle_ns + a->size;
    }
    return XSEG_SUCCESS;
}

xseg_status trace_add_text(struct trace *t, const char *text, size_t len, size_t *off)
{
    if (t->strings_len + len + 1 > t->strings_cap) {
        size_t cap = t->strings_cap * 2;
        while (cap < t->strings_len + len + 1)
            cap *= 2;
        char *p = realloc(t->strings, cap);
        if (!p)
            return XSEG_ERROR_OUT_OF_MEMORY;
        t->strings = p;
        t->strings_cap = cap;
    }
    memcpy(t->strings + t->strings_len, text, len);
    t->strings[t->strings_len + len] = '\0';
    *off = t->strings_len;
    t->strings_len += len + 1;
    return XSEG_SUCCESS;
}

xseg_status trace_add_frame(struct trace *t, const char *name, size_t len, int32_t line, const char *file,
                            size_t file_len, const char *func, size_t func_len, int32_t *index)
{
    xseg_status st = trace_name_intern(&t->stack_names, name, len, index);
    if (st != XSEG_SUCCESS)
        return st;
    size_t i = (size_t)*index;
    if (i >= t->stacks_cap) {
        size_t cap = t->stacks_cap ? t->stacks_cap * 2 : 16;
        while (cap <= i)
            cap *= 2;
        struct trace_stack *p = realloc(t->stacks, cap * sizeof *p);
        if (!p)
            return XSEG_ERROR_OUT_OF_MEMORY;
        memset(p + t->stacks_cap, 0, (cap - t->stacks_cap) * sizeof *p);
        t->stacks = p;
        t->stacks_cap = cap;
    }
    struct trace_stack *s = &t->stacks[i];
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        struct trace_frame *p = realloc(s->f, cap * sizeof *p);
        if (!p)
            return XSEG_ERROR_OUT_OF_MEMORY;
        s->f = p;
        s->cap = cap;
    }
    struct trace_frame *f = &s->f[s->n];
    if ((st = trace_add_text(t, file, file_len, &f->file)) != XSEG_SUCCESS ||
        (st = trace_add_text(t, func, func_len, &f->name)) != XSEG_SUCCESS)
        return st;
    f->line = line;
    s->n++;
    return XSEG_SUCCESS;
}

const char *trace_op_name(enum trace_op op)
{
    static const char *const names[] = {
#define NAME_ROW(name, op, parse, run, dump) [op] = #name,
#define NAME_NO_ACTION(name, parse)
        TRACE_ACTIONS(NAME_ROW, NAME_NO_ACTION)
#undef NAME_ROW
#undef NAME_NO_ACTION
    };
    return (size_t)op < sizeof names / sizeof names[0] && names[op] ? names[op] : "?";
}

/* Rewrite @p s (a message in a buffer of @p cap bytes) with every byte outside printable ASCII as
 * \xNN, as xseg's config errors do: messages echo the user's text, and a tab or a control
 * character would print invisibly, so that "bad size ' -5'" hid what was wrong. A printable
 * message is left as it is, so escaping twice changes nothing. */
static void escape_message(char *s, size_t cap)
{
    char buf[TRACE_ERR_MAX * 4];
    size_t n = 0;
    int any = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c && n + 5 < sizeof buf; c++) {
        if (*c >= 0x20 && *c < 0x7f) {
            buf[n++] = (char)*c;
        } else {
            n += (size_t)snprintf(buf + n, sizeof buf - n, "\\x%02X", *c);
            any = 1;
        }
    }
    buf[n] = '\0';
    if (any)
        snprintf(s, cap, "%s", buf);
}

xseg_status trace_parse_size(const char *s, size_t len, uint64_t *bytes, char *err, size_t errlen)
{
    size_t i = 0;
    uint64_t whole = 0;
    int digits = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9') {
        unsigned d = (unsigned)(s[i] - '0');
        if (whole > (UINT64_MAX - d) / 10)
            goto overflow;
        whole = whole * 10 + d;
        i++;
        digits++;
    }
    /* Up to 9 fraction digits, kept as an integer numerator over 10^fdigits so "1.5GiB" is exact. */
    uint64_t frac = 0, fscale = 1;
    if (i < len && s[i] == '.') {
        i++;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            if (fscale < 1000000000ull) {
                frac = frac * 10 + (uint64_t)(s[i] - '0');
                fscale *= 10;
            }
            i++;
            digits++;
        }
    }
    if (!digits)
        goto bad;
    const char *u = s + i;
    size_t ulen = len - i;
    unsigned shift;
    if (ulen == 0 || (ulen == 1 && (u[0] == 'B' || u[0] == 'b')))
        shift = 0;
    else {
        char c = u[0];
        if (c == 'k' || c == 'K') shift = 10;
        else if (c == 'm' || c == 'M') shift = 20;
        else if (c == 'g' || c == 'G') shift = 30;
        else if (c == 't' || c == 'T') shift = 40;
        else goto bad;
        const char *rest = u + 1;
        size_t rlen = ulen - 1;
        if (!(rlen == 0 || (rlen == 1 && (rest[0] == 'B' || rest[0] == 'b')) ||
              (rlen == 2 && (rest[0] == 'i' || rest[0] == 'I') && (rest[1] == 'B' || rest[1] == 'b'))))
            goto bad;
    }
    if (shift && whole > (UINT64_MAX >> shift))
        goto overflow;
    uint64_t v = whole << shift;
    if (fscale > 1) {
        if (!shift)
            goto bad; /* a fraction of a byte */
        uint64_t fpart = (uint64_t)(((unsigned __int128)frac << shift) / fscale);
        if (v > UINT64_MAX - fpart)
            goto overflow;
        v += fpart;
    }
    *bytes = v;
    return XSEG_SUCCESS;
bad:
    snprintf(err, errlen, "bad size '%.*s' (bytes, or a number with B, KiB, MiB, GiB, TiB)",
             (int)(len > 64 ? 64 : len), s);
    escape_message(err, errlen);
    return XSEG_ERROR_INVALID_VALUE;
overflow:
    snprintf(err, errlen, "size '%.*s' does not fit in 64 bits", (int)(len > 64 ? 64 : len), s);
    escape_message(err, errlen);
    return XSEG_ERROR_INVALID_VALUE;
}

const char *trace_format_size(uint64_t bytes, char *buf, size_t buflen)
{
    static const char *units[] = {"TiB", "GiB", "MiB", "KiB"};
    static const unsigned shifts[] = {40, 30, 20, 10};
    for (int i = 0; i < 4; i++) {
        uint64_t m = (1ull << shifts[i]) - 1;
        if (bytes && (bytes & m) == 0) {
            snprintf(buf, buflen, "%" PRIu64 "%s", bytes >> shifts[i], units[i]);
            return buf;
        }
    }
    snprintf(buf, buflen, "%" PRIu64, bytes);
    return buf;
}

xseg_status trace_verror(char *err, size_t errlen, const char *source, unsigned line, const char *fmt,
                         va_list ap)
{
    int n = snprintf(err, errlen, "%s:%u: ", source, line);
    if (n >= 0 && (size_t)n < errlen) {
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        escape_message(err + n, errlen - (size_t)n); /* the message; the file name is the user's own */
    }
    return XSEG_ERROR_INVALID_VALUE;
}
