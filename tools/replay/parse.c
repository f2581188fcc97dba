/*
 * The trace language, one action per line:
 *
 *   stream s1                   alloc x1 4GiB [@s1]       free x1
 *   record x1 @s1               hold @s1                  release @s1
 *   sync [@s1]                  empty_cache               config expandable_segments:True
 *   pool_begin p1 [@s1]         pool_end p1               pool_release p1
 *   capture_begin @s1 [p1]      capture_end @s1           mark After alloc x1
 *   wait @s1 @s2                work @s1
 *   snapshot peak               frame k1 42 model.py forward    alloc x2 1MiB ^k1
 *   trim 1GiB                   sleep POOL offload|discard    wake POOL       idle 300ms
 *
 * Services: `trim KEEP` is xseg_trim(-1, KEEP); `sleep`/`wake` put a pool (`default`, or one
 * begun before) to sleep and wake it (xseg_sleep / xseg_wake); `idle D` is D of wall time with no
 * allocator call (the replay waits when idle_release_ms is set: nothing else depends on time), at
 * most TRACE_IDLE_MAX_NS (an hour).
 *
 * `snapshot LABEL` is where xseg-replay --snapshot writes a snapshot; `frame` lines build a named
 * stack (innermost first) that `alloc ... ^NAME` hands to xseg's history (--history), so the
 * snapshot shows, for each block, the frames the original program recorded for it.
 *
 * '#' starts a comment (at the start of a line or after a blank). `@default` names the legacy
 * default stream. The whole file is checked before anything runs, so a typo on line 9000 never
 * costs a half-finished replay: buffers must be live to be freed or recorded and free to be
 * allocated, streams declared before use, pools and captures balanced: a pool has one recorder
 * at a time (pool_begin's or one capture's), is released at most once per pool_begin or
 * capture_begin into it, and every capture ends. Captures follow the driver's rules: no sync of
 * a capturing stream (or of the device) during one, no wait across a capture's boundary; which
 * streams take part in a capture follows from its forks (`wait` for a stream that takes part).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/replay/actions.h"
#include "tools/replay/trace.h"

struct pool_state {
    unsigned char open;     /* between pool_begin and pool_end */
    unsigned char asleep;   /* between sleep and wake */
    uint32_t sleep_line;    /* line of its last sleep */
    uint32_t uses;          /* each pool_begin and capture_begin into it adds one, pool_release
                             * takes one (xseg's use count) */
    int32_t capture;        /* stream index + 1 of the capture recording into it, or 0 */
    uint32_t line;          /* line of the last pool_begin / capture_begin / pool_release */
};

struct stream_state {
    unsigned char capturing; /* began a capture (is its origin) */
    int32_t pool;           /* pool index the capture records into, or -1 (a pool of its own) */
    uint32_t line;          /* line of its capture_begin */
    /* Taking part in a capture: its own, or one it joined by waiting for a capturing stream
     * (a fork). in = the origin's index + 1, 0 when none; join_line = where it joined. */
    int32_t in;
    uint32_t join_line;
};

struct parser {
    struct trace *t;
    uint32_t line;
    char *err;
    size_t errlen;
    /* Per buffer: live now, and the line that last allocated or freed it (for messages). */
    unsigned char *live;
    uint32_t *last_line;
    size_t track_cap;
    /* Per pool and per stream: what --check must know to reject what a replay would refuse. */
    struct pool_state *pools;
    size_t pool_cap;
    struct stream_state *streams;
    size_t stream_cap;
    struct pool_state default_pool; /* the default pools: only asleep / sleep_line are used */
};

__attribute__((format(printf, 2, 3))) static xseg_status perr(struct parser *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    xseg_status st = trace_verror(p->err, p->errlen, p->t->source, p->line, fmt, ap);
    va_end(ap);
    return st;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* The value of one hexadecimal digit, or -1 (a bounded decoder: the input has no terminating NUL). */
static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int valid_name(const char *s, size_t len)
{
    if (!len)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == ':'))
            return 0;
    }
    return 1;
}

/* Grow a byte array to hold index @p need; new bytes are zero. */
static xseg_status grow_bytes(unsigned char **arr, size_t *cap, size_t need)
{
    if (need < *cap)
        return XSEG_SUCCESS;
    size_t ncap = *cap ? *cap : 64;
    while (ncap <= need)
        ncap *= 2;
    unsigned char *a = realloc(*arr, ncap);
    if (!a)
        return XSEG_ERROR_OUT_OF_MEMORY;
    memset(a + *cap, 0, ncap - *cap);
    *arr = a;
    *cap = ncap;
    return XSEG_SUCCESS;
}

/* Grow an array of @p elem-byte records to hold index @p need; new records are zero. */
static xseg_status grow_array(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need < *cap)
        return XSEG_SUCCESS;
    size_t ncap = *cap ? *cap : 16;
    while (ncap <= need)
        ncap *= 2;
    unsigned char *a = realloc(*arr, ncap * elem);
    if (!a)
        return XSEG_ERROR_OUT_OF_MEMORY;
    memset(a + *cap * elem, 0, (ncap - *cap) * elem);
    *arr = a;
    *cap = ncap;
    return XSEG_SUCCESS;
}

static xseg_status track_buf(struct parser *p, int32_t buf)
{
    if ((size_t)buf < p->track_cap)
        return XSEG_SUCCESS;
    size_t old = p->track_cap;
    if (grow_bytes(&p->live, &p->track_cap, (size_t)buf) != XSEG_SUCCESS)
        return XSEG_ERROR_OUT_OF_MEMORY;
    uint32_t *ll = realloc(p->last_line, p->track_cap * sizeof *ll);
    if (!ll)
        return XSEG_ERROR_OUT_OF_MEMORY;
    memset(ll + old, 0, (p->track_cap - old) * sizeof *ll);
    p->last_line = ll;
    return XSEG_SUCCESS;
}

struct tok {
    const char *s;
    size_t len;
};

/* Split [s, end) into at most @p max blank-separated tokens; *n receives how many. */
static void tokenize(const char *s, const char *end, struct tok *toks, int max, int *n)
{
    *n = 0;
    while (s < end) {
        while (s < end && is_blank(*s))
            s++;
        if (s >= end)
            break;
        const char *b = s;
        while (s < end && !is_blank(*s))
            s++;
        if (*n < max) {
            toks[*n].s = b;
            toks[*n].len = (size_t)(s - b);
        }
        (*n)++;
    }
}

static int tok_is(const struct tok *t, const char *word)
{
    return t->len == strlen(word) && memcmp(t->s, word, t->len) == 0;
}

/* Resolve "@name" to a declared stream index (or the default stream). */
static xseg_status stream_ref(struct parser *p, const struct tok *tk, int32_t *stream)
{
    if (tk->len < 2 || tk->s[0] != '@')
        return perr(p, "expected a stream '@NAME', got '%.*s'", (int)tk->len, tk->s);
    if (tk->len == 8 && memcmp(tk->s, "@default", 8) == 0) {
        *stream = TRACE_DEFAULT_STREAM;
        return XSEG_SUCCESS;
    }
    trace_name_find(&p->t->streams, tk->s + 1, tk->len - 1, stream);
    if (*stream < 0)
        return perr(p, "stream '%.*s' is not declared (add a line 'stream %.*s' before it)",
                    (int)tk->len - 1, tk->s + 1, (int)tk->len - 1, tk->s + 1);
    return XSEG_SUCCESS;
}

static xseg_status want_args(struct parser *p, const char *verb, int n, int min, int max,
                             const char *usage)
{
    if (n - 1 < min)
        return perr(p, "%s: missing argument (usage: %s)", verb, usage);
    if (n - 1 > max)
        return perr(p, "%s: too many arguments (usage: %s)", verb, usage);
    return XSEG_SUCCESS;
}

static xseg_status buf_name(struct parser *p, const struct tok *tk)
{
    if (!valid_name(tk->s, tk->len) || tk->s[0] == '@')
        return perr(p, "bad buffer name '%.*s' (letters, digits, _ - . :)", (int)tk->len, tk->s);
    return XSEG_SUCCESS;
}

static xseg_status pool_ref(struct parser *p, const struct tok *tk, int32_t *pool)
{
    if (!valid_name(tk->s, tk->len))
        return perr(p, "bad pool name '%.*s' (letters, digits, _ - . :)", (int)tk->len, tk->s);
    if (trace_name_intern(&p->t->pools, tk->s, tk->len, pool) != XSEG_SUCCESS ||
        grow_array((void **)&p->pools, &p->pool_cap, (size_t)*pool, sizeof *p->pools) != XSEG_SUCCESS)
        return perr(p, "out of host memory");
    return XSEG_SUCCESS;
}

/* Does a pool record (pool_begin not ended) or a stream capture? xseg sleeps and wakes nothing
 * then. @p what receives a description of the first one found. */
static int recording(const struct parser *p, char *what, size_t len)
{
    for (size_t i = 0; i < p->t->pools.count; i++)
        if (p->pools[i].open || p->pools[i].capture) {
            snprintf(what, len, "pool '%s' records (line %u)", p->t->pools.names[i], p->pools[i].line);
            return 1;
        }
    for (size_t i = 0; i < p->t->streams.count; i++)
        if (p->streams[i].capturing) {
            snprintf(what, len, "stream '%s' captures (line %u)", p->t->streams.names[i], p->streams[i].line);
            return 1;
        }
    return 0;
}

/* "the capture on stream 's' (line 3)": the capture stream state @p ss takes part in. */
static const char *capture_name(const struct parser *p, const struct stream_state *ss, char *buf, size_t len)
{
    const struct stream_state *o = &p->streams[ss->in - 1];
    snprintf(buf, len, "the capture on stream '%s' (line %u)", p->t->streams.names[ss->in - 1], o->line);
    return buf;
}

/* "'s' captures (line 3)" or "'u' takes part in the capture on stream 's' (line 3; joined at
 * line 5)": how stream @p x, which takes part in a capture, does. */
static const char *capture_role(const struct parser *p, int32_t x, char *buf, size_t len)
{
    const struct stream_state *ss = &p->streams[x];
    if (ss->capturing)
        snprintf(buf, len, "'%s' captures (line %u)", p->t->streams.names[x], ss->line);
    else
        snprintf(buf, len, "'%s' takes part in the capture on stream '%s' (line %u; joined at line %u)",
                 p->t->streams.names[x], p->t->streams.names[ss->in - 1], p->streams[ss->in - 1].line,
                 ss->join_line);
    return buf;
}

int trace_parse_duration(const char *s, size_t len, uint64_t *ns)
{
    size_t i = 0;
    uint64_t whole = 0, frac = 0, div = 1;
    while (i < len && s[i] >= '0' && s[i] <= '9' && whole < UINT64_MAX / 10)
        whole = whole * 10 + (uint64_t)(s[i++] - '0');
    int digits = i > 0;
    if (i < len && s[i] == '.')
        for (i++; i < len && s[i] >= '0' && s[i] <= '9' && div < 1000000000; i++, digits = 1) {
            frac = frac * 10 + (uint64_t)(s[i] - '0');
            div *= 10;
        }
    static const struct {
        const char *unit;
        uint64_t mul;
    } units[] = {{"ns", 1}, {"us", 1000}, {"ms", 1000000}, {"s", 1000000000}, {"h", 3600000000000}};
    for (size_t u = 0; digits && u < sizeof units / sizeof units[0]; u++) {
        size_t ul = strlen(units[u].unit);
        if (len - i == ul && !memcmp(s + i, units[u].unit, ul) && whole <= (UINT64_MAX - units[u].mul) / units[u].mul) {
            uint64_t m = units[u].mul; /* m % div == 0 when m >= div: the fraction never overflows */
            *ns = whole * m + (m >= div ? frac * (m / div) : frac * m / div);
            return 0;
        }
    }
    return -1;
}

static xseg_status parse_duration(struct parser *p, const struct tok *tk, uint64_t *ns)
{
    if (trace_parse_duration(tk->s, tk->len, ns) == 0)
        return XSEG_SUCCESS;
    return perr(p, "idle: '%.*s' is not a duration (e.g. 300ms, 1.5s, 20us)", (int)tk->len, tk->s);
}

/* The rest of the line after the verb, trimmed: config strings and mark labels keep blanks. */
static void rest_of_line(const char *after_verb, const char *end, const char **b, size_t *len)
{
    while (after_verb < end && is_blank(*after_verb))
        after_verb++;
    while (end > after_verb && is_blank(end[-1]))
        end--;
    *b = after_verb;
    *len = (size_t)(end - after_verb);
}

/* One line split into its verb and arguments (at most 5 tokens kept; n counts them all). */
struct line {
    struct tok tk[5];
    int n;
    const char *end; /* end of the line (before a comment): config and mark keep blanks */
};

static xseg_status parse_stream(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    if ((st = want_args(p, "stream", l->n, 1, 1, "stream NAME")))
        return st;
    if (!valid_name(tk[1].s, tk[1].len))
        return perr(p, "bad stream name '%.*s' (letters, digits, _ - . :)", (int)tk[1].len, tk[1].s);
    if (tok_is(&tk[1], "default"))
        return perr(p, "stream: 'default' is the legacy default stream's name; pick another");
    int32_t idx;
    trace_name_find(&p->t->streams, tk[1].s, tk[1].len, &idx);
    if (idx >= 0)
        return perr(p, "stream '%.*s' is declared twice", (int)tk[1].len, tk[1].s);
    if (trace_name_intern(&p->t->streams, tk[1].s, tk[1].len, &idx) != XSEG_SUCCESS ||
        grow_array((void **)&p->streams, &p->stream_cap, (size_t)idx, sizeof *p->streams) != XSEG_SUCCESS)
        return perr(p, "out of host memory");
    a->stream = idx;
    return XSEG_SUCCESS;
}

/* alloc's optional arguments: [@STREAM] [^STACK]. */
static xseg_status parse_alloc_options(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    for (int k = 3; k < l->n; k++) {
        if (tk[k].len > 1 && tk[k].s[0] == '^' && !a->stack) {
            /* The allocation's frames: a stack built by earlier `frame` lines. */
            int32_t si;
            trace_name_find(&p->t->stack_names, tk[k].s + 1, tk[k].len - 1, &si);
            if (si < 0)
                return perr(p, "alloc %.*s: no stack '%.*s' (define it with 'frame %.*s LINE FILE FUNCTION' "
                               "lines first)", (int)tk[1].len, tk[1].s, (int)tk[k].len - 1, tk[k].s + 1,
                            (int)tk[k].len - 1, tk[k].s + 1);
            a->stack = (uint32_t)si + 1;
        } else if (k == 3 && (st = stream_ref(p, &tk[k], &a->stream))) {
            return st;
        } else if (k == 4) {
            return perr(p, "alloc %.*s: expected '^STACK', got '%.*s' (usage: alloc NAME SIZE [@STREAM] "
                           "[^STACK])", (int)tk[1].len, tk[1].s, (int)tk[k].len, tk[k].s);
        }
    }
    return XSEG_SUCCESS;
}

static xseg_status parse_alloc(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    if ((st = want_args(p, "alloc", l->n, 2, 4, "alloc NAME SIZE [@STREAM] [^STACK]")))
        return st;
    if ((st = buf_name(p, &tk[1])))
        return st;
    char msg[TRACE_ERR_MAX];
    if (trace_parse_size(tk[2].s, tk[2].len, &a->size, msg, sizeof msg) != XSEG_SUCCESS)
        return perr(p, "alloc %.*s: %s", (int)tk[1].len, tk[1].s, msg);
    if ((st = parse_alloc_options(p, l, a)))
        return st;
    if (trace_name_intern(&p->t->bufs, tk[1].s, tk[1].len, &a->buf) != XSEG_SUCCESS ||
        track_buf(p, a->buf) != XSEG_SUCCESS)
        return perr(p, "out of host memory");
    if (p->live[a->buf])
        return perr(p, "alloc %.*s: '%.*s' is still allocated (line %u); free it first",
                    (int)tk[1].len, tk[1].s, (int)tk[1].len, tk[1].s, p->last_line[a->buf]);
    /* Into the sleeping default pool, when no pool can take it: xseg would refuse it. */
    char what[160];
    if (p->default_pool.asleep && !recording(p, what, sizeof what))
        return perr(p, "alloc %.*s: the default pool is asleep (sleep at line %u); wake it first",
                    (int)tk[1].len, tk[1].s, p->default_pool.sleep_line);
    p->live[a->buf] = 1;
    p->last_line[a->buf] = p->line;
    return XSEG_SUCCESS;
}

/* free NAME, record NAME @STREAM: the buffer must be live. */
static xseg_status parse_free_record(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    int is_free = a->op == TRACE_FREE;
    if (is_free ? (st = want_args(p, "free", l->n, 1, 1, "free NAME"))
                : (st = want_args(p, "record", l->n, 2, 2, "record NAME @STREAM")))
        return st;
    if ((st = buf_name(p, &tk[1])))
        return st;
    trace_name_find(&p->t->bufs, tk[1].s, tk[1].len, &a->buf);
    if (a->buf < 0)
        return perr(p, "%s %.*s: no buffer '%.*s' was allocated", is_free ? "free" : "record",
                    (int)tk[1].len, tk[1].s, (int)tk[1].len, tk[1].s);
    if (!p->live[a->buf])
        return perr(p, "%s %.*s: '%.*s' was already freed (line %u)", is_free ? "free" : "record",
                    (int)tk[1].len, tk[1].s, (int)tk[1].len, tk[1].s, p->last_line[a->buf]);
    if (!is_free)
        return stream_ref(p, &tk[2], &a->stream);
    p->live[a->buf] = 0;
    p->last_line[a->buf] = p->line;
    return XSEG_SUCCESS;
}

/* hold @STREAM, release @STREAM. */
static xseg_status parse_hold_release(struct parser *p, const struct line *l, struct trace_action *a)
{
    int hold = a->op == TRACE_HOLD;
    xseg_status st;
    if ((st = want_args(p, hold ? "hold" : "release", l->n, 1, 1, hold ? "hold @STREAM" : "release @STREAM")))
        return st;
    return stream_ref(p, &l->tk[1], &a->stream);
}

static xseg_status parse_sync(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    if ((st = want_args(p, "sync", l->n, 0, 1, "sync [@STREAM]")))
        return st;
    a->stream = TRACE_ALL_STREAMS;
    if (l->n == 2 && (st = stream_ref(p, &tk[1], &a->stream)))
        return st;
    /* The driver refuses to synchronize a capturing stream, or the whole context while any
     * stream captures (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), and invalidates the capture. A
     * stream outside the capture is refused too: xseg-replay captures in the driver's GLOBAL
     * mode, where a synchronize is a capture-unsafe call (as PyTorch's torch.cuda.graph, whose
     * default capture_error_mode is "global"). */
    char what[160];
    if (a->stream >= 0 && p->streams[a->stream].in)
        return perr(p, "sync %.*s: %s; a capturing stream cannot be synchronized", (int)tk[1].len, tk[1].s,
                    capture_role(p, a->stream, what, sizeof what));
    for (size_t i = 0; i < p->t->streams.count; i++)
        if (p->streams[i].capturing) {
            if (a->stream == TRACE_ALL_STREAMS)
                return perr(p, "sync: stream '%s' captures (line %u); the whole device cannot be synchronized "
                               "during a capture (sync after capture_end)",
                            p->t->streams.names[i], p->streams[i].line);
            return perr(p, "sync %.*s: stream '%s' captures (line %u); no stream can be synchronized during a "
                           "capture (the driver refuses it in the global capture mode xseg-replay uses, as "
                           "PyTorch's torch.cuda.graph does by default): sync before capture_begin or after "
                           "capture_end",
                        (int)tk[1].len, tk[1].s, p->t->streams.names[i], p->streams[i].line);
        }
    return XSEG_SUCCESS;
}

static xseg_status parse_empty_cache(struct parser *p, const struct line *l, struct trace_action *a)
{
    (void)a;
    return want_args(p, "empty_cache", l->n, 0, 0, "empty_cache");
}

/* services: trim KEEP -> xseg_trim(-1, KEEP), KEEP a size as in alloc. */
static xseg_status parse_trim(struct parser *p, const struct line *l, struct trace_action *a)
{
    xseg_status st;
    if ((st = want_args(p, "trim", l->n, 1, 1, "trim KEEP_BYTES")))
        return st;
    char msg[160];
    if (trace_parse_size(l->tk[1].s, l->tk[1].len, &a->size, msg, sizeof msg) != XSEG_SUCCESS)
        return perr(p, "trim: %s", msg);
    return XSEG_SUCCESS;
}

/* sleep POOL offload|discard, wake POOL: POOL is `default` or one begun before. */
static xseg_status parse_sleep_wake(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    int sl = a->op == TRACE_SLEEP;
    const char *v = sl ? "sleep" : "wake";
    if ((st = want_args(p, v, l->n, sl ? 2 : 1, sl ? 2 : 1, sl ? "sleep POOL offload|discard" : "wake POOL")))
        return st;
    struct pool_state *ps = &p->default_pool;
    if (!tok_is(&tk[1], "default")) {
        trace_name_find(&p->t->pools, tk[1].s, tk[1].len, &a->pool);
        if (a->pool < 0)
            return perr(p, "%s %.*s: no pool '%.*s' was begun ('default' names the default pool)", v,
                        (int)tk[1].len, tk[1].s, (int)tk[1].len, tk[1].s);
        ps = &p->pools[a->pool];
    }
    if (sl) {
        if (tok_is(&tk[2], "offload"))
            a->size = XSEG_SLEEP_OFFLOAD;
        else if (tok_is(&tk[2], "discard"))
            a->size = XSEG_SLEEP_DISCARD;
        else
            return perr(p, "sleep %.*s: expected offload or discard, got '%.*s'", (int)tk[1].len, tk[1].s,
                        (int)tk[2].len, tk[2].s);
        if (ps->asleep)
            return perr(p, "sleep %.*s: the pool is asleep already (line %u)", (int)tk[1].len, tk[1].s,
                        ps->sleep_line);
    } else if (!ps->asleep) {
        return perr(p, "wake %.*s: the pool is not asleep", (int)tk[1].len, tk[1].s);
    }
    char what[160];
    if (recording(p, what, sizeof what))
        return perr(p, "%s %.*s: %s; xseg sleeps and wakes nothing during a capture or while a pool "
                       "records", v, (int)tk[1].len, tk[1].s, what);
    ps->asleep = (unsigned char)sl;
    ps->sleep_line = p->line;
    return XSEG_SUCCESS;
}

static xseg_status parse_idle(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    if ((st = want_args(p, "idle", l->n, 1, 1, "idle DURATION")))
        return st;
    if ((st = parse_duration(p, &tk[1], &a->size)))
        return st;
    if (a->size > TRACE_IDLE_MAX_NS)
        return perr(p, "idle: '%.*s' is longer than the maximum, %llus", (int)tk[1].len, tk[1].s,
                    (unsigned long long)(TRACE_IDLE_MAX_NS / 1000000000u));
    return XSEG_SUCCESS;
}

/* frame STACK LINE FILE FUNCTION...: FILE has %XX escapes for blanks ('-' is empty). Builds no
 * action: frames only describe allocations. */
static xseg_status parse_frame(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    (void)a;
    if (l->n < 5)
        return perr(p, "frame: missing argument (usage: frame STACK LINE FILE FUNCTION)");
    if (!valid_name(tk[1].s, tk[1].len))
        return perr(p, "bad stack name '%.*s' (letters, digits, _ - . :)", (int)tk[1].len, tk[1].s);
    char *e;
    char num[16];
    snprintf(num, sizeof num, "%.*s", (int)(tk[2].len < 15 ? tk[2].len : 15), tk[2].s);
    long line = strtol(num, &e, 10);
    if (*e || tk[2].len > 10 || line < 0 || line > INT32_MAX)
        return perr(p, "frame %.*s: bad line number '%.*s'", (int)tk[1].len, tk[1].s, (int)tk[2].len, tk[2].s);
    char file[1024];
    size_t fl = 0;
    if (!(tk[3].len == 1 && tk[3].s[0] == '-')) {
        for (size_t i = 0; i < tk[3].len && fl < sizeof file; i++) {
            int hi, lo;
            if (tk[3].s[i] == '%' && i + 2 < tk[3].len && (hi = hex_digit(tk[3].s[i + 1])) >= 0 &&
                (lo = hex_digit(tk[3].s[i + 2])) >= 0) {
                file[fl++] = (char)(hi << 4 | lo);
                i += 2;
            } else {
                file[fl++] = tk[3].s[i];
            }
        }
    }
    const char *b;
    size_t len;
    rest_of_line(tk[3].s + tk[3].len, l->end, &b, &len);
    int32_t si;
    if (trace_add_frame(p->t, tk[1].s, tk[1].len, (int32_t)line, file, fl, b, len, &si) != XSEG_SUCCESS)
        return perr(p, "out of host memory");
    return XSEG_SUCCESS;
}

/* config STRING, mark LABEL, snapshot LABEL: the rest of the line, blanks inside kept. */
static xseg_status parse_text(struct parser *p, const struct line *l, struct trace_action *a)
{
    int snap = a->op == TRACE_SNAPSHOT;
    int config = a->op == TRACE_CONFIG;
    const char *b;
    size_t len;
    rest_of_line(l->tk[0].s + l->tk[0].len, l->end, &b, &len);
    if (!len)
        return perr(p, config ? "config: missing the config string (e.g. config expandable_segments:True)"
                    : snap  ? "snapshot: missing the label (e.g. snapshot peak)"
                            : "mark: missing the label (e.g. mark After alloc x1)");
    if (config && memchr(b, ' ', len))
        return perr(p, "config: the config string has a blank in it ('%.*s'); write key:value,key:value",
                    (int)len, b);
    if (trace_add_text(p->t, b, len, &a->text) != XSEG_SUCCESS)
        return perr(p, "out of host memory");
    return XSEG_SUCCESS;
}

static xseg_status parse_pool_begin(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    if ((st = want_args(p, "pool_begin", l->n, 1, 2, "pool_begin POOL [@STREAM]")))
        return st;
    if ((st = pool_ref(p, &tk[1], &a->pool)))
        return st;
    if (l->n == 3 && (st = stream_ref(p, &tk[2], &a->stream)))
        return st;
    if (l->n == 2)
        a->stream = TRACE_ALL_STREAMS; /* no stream named: the pool takes every stream's */
    struct pool_state *ps = &p->pools[a->pool];
    if (ps->open)
        return perr(p, "pool_begin %.*s: pool already begun (line %u) and not ended", (int)tk[1].len,
                    tk[1].s, ps->line);
    if (ps->asleep)
        return perr(p, "pool_begin %.*s: the pool is asleep (sleep at line %u); wake it first", (int)tk[1].len,
                    tk[1].s, ps->sleep_line);
    if (ps->capture)
        return perr(p, "pool_begin %.*s: a capture on stream '%s' records into this pool (line %u); "
                       "end it first", (int)tk[1].len, tk[1].s, p->t->streams.names[ps->capture - 1], ps->line);
    ps->open = 1;
    ps->uses++;
    ps->line = p->line;
    return XSEG_SUCCESS;
}

/* pool_end POOL, pool_release POOL. */
static xseg_status parse_pool_end_release(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    int end_ = a->op == TRACE_POOL_END;
    const char *v = end_ ? "pool_end" : "pool_release";
    if ((st = want_args(p, v, l->n, 1, 1, end_ ? "pool_end POOL" : "pool_release POOL")))
        return st;
    trace_name_find(&p->t->pools, tk[1].s, tk[1].len, &a->pool);
    if (a->pool < 0)
        return perr(p, "%s %.*s: no pool '%.*s' was begun", v, (int)tk[1].len, tk[1].s,
                    (int)tk[1].len, tk[1].s);
    struct pool_state *ps = &p->pools[a->pool];
    if (end_ && !ps->open)
        return perr(p, "pool_end %.*s: the pool is not begun", (int)tk[1].len, tk[1].s);
    if (!end_ && !ps->uses)
        return perr(p, "pool_release %.*s: the pool has no users left (every pool_begin and "
                       "capture_begin into it is released already; last release line %u)",
                    (int)tk[1].len, tk[1].s, ps->line);
    /* Releasing the last use of a pool that still records is refused; an older use is not. */
    if (!end_ && ps->uses == 1 && ps->open)
        return perr(p, "pool_release %.*s: end the pool first (pool_end %.*s)", (int)tk[1].len,
                    tk[1].s, (int)tk[1].len, tk[1].s);
    if (!end_ && ps->uses == 1 && ps->capture)
        return perr(p, "pool_release %.*s: a capture on stream '%s' still records into it (line %u); "
                       "end it first", (int)tk[1].len, tk[1].s, p->t->streams.names[ps->capture - 1], ps->line);
    if (end_) {
        ps->open = 0;
    } else {
        ps->uses--;
        ps->line = p->line;
    }
    return XSEG_SUCCESS;
}

/* capture_begin @STREAM POOL: one recorder per pool at a time, pool_begin's or one capture's. */
static xseg_status capture_pool(struct parser *p, const struct line *l, const struct trace_action *a)
{
    const struct tok *tk = l->tk;
    struct pool_state *ps = &p->pools[a->pool];
    if (ps->open)
        return perr(p, "capture_begin: pool '%.*s' is already recording (pool_begin, line %u); "
                       "pool_end it first", (int)tk[2].len, tk[2].s, ps->line);
    if (ps->capture)
        return perr(p, "capture_begin: pool '%.*s' is already recording (a capture on stream '%s', "
                       "line %u); capture_end it first", (int)tk[2].len, tk[2].s,
                    p->t->streams.names[ps->capture - 1], ps->line);
    if (ps->asleep)
        return perr(p, "capture_begin: pool '%.*s' is asleep (sleep at line %u); wake it first",
                    (int)tk[2].len, tk[2].s, ps->sleep_line);
    ps->capture = a->stream + 1;
    ps->uses++;
    ps->line = p->line;
    return XSEG_SUCCESS;
}

/* capture_end: every stream that took part in the capture leaves it. A stream that forked off
 * and was never joined back does not fail the end: the driver documents
 * CUDA_ERROR_STREAM_CAPTURE_UNJOINED for it, but the H200's driver 580.159.04 ended such a capture
 * with its side work in the graph (docs/gpu.md, 2026-11-27), and cudaemu does the same. */
static void capture_leave_all(struct parser *p, const struct trace_action *a)
{
    for (size_t i = 0; i < p->t->streams.count; i++)
        if (p->streams[i].in == a->stream + 1) {
            p->streams[i].in = 0;
        }
}

/* capture_begin @STREAM [POOL], capture_end @STREAM. */
static xseg_status parse_capture(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    int begin = a->op == TRACE_CAPTURE_BEGIN;
    if ((st = want_args(p, begin ? "capture_begin" : "capture_end", l->n, 1, begin ? 2 : 1,
                        begin ? "capture_begin @STREAM [POOL]" : "capture_end @STREAM")))
        return st;
    if ((st = stream_ref(p, &tk[1], &a->stream)))
        return st;
    if (a->stream < 0)
        return perr(p, "%s: the legacy default stream cannot be captured; declare a stream",
                    begin ? "capture_begin" : "capture_end");
    if (begin && l->n == 3 && (st = pool_ref(p, &tk[2], &a->pool)))
        return st;
    struct stream_state *ss = &p->streams[a->stream];
    char what[160];
    if (begin && ss->capturing)
        return perr(p, "capture_begin: stream '%.*s' is already capturing (line %u)", (int)tk[1].len - 1,
                    tk[1].s + 1, ss->line);
    if (begin && ss->in)
        return perr(p, "capture_begin: stream '%.*s' takes part in %s since its wait at line %u",
                    (int)tk[1].len - 1, tk[1].s + 1, capture_name(p, ss, what, sizeof what), ss->join_line);
    if (!begin && !ss->capturing && ss->in)
        return perr(p, "capture_end: stream '%.*s' joined %s by its wait at line %u; end the capture on the "
                       "stream that began it", (int)tk[1].len - 1, tk[1].s + 1,
                    capture_name(p, ss, what, sizeof what), ss->join_line);
    if (!begin && !ss->capturing)
        return perr(p, "capture_end: stream '%.*s' is not capturing", (int)tk[1].len - 1, tk[1].s + 1);
    if (!begin)
        capture_leave_all(p, a);
    if (begin) {
        ss->in = a->stream + 1;
    }
    if (begin && a->pool >= 0 && (st = capture_pool(p, l, a)))
        return st;
    if (!begin && ss->pool >= 0)
        p->pools[ss->pool].capture = 0;
    ss->capturing = (unsigned char)begin;
    ss->pool = begin ? a->pool : -1;
    ss->line = p->line;
    return XSEG_SUCCESS;
}

/* wait @A @B: stream order (forks and joins in a capture). */
static xseg_status parse_wait(struct parser *p, const struct line *l, struct trace_action *a)
{
    const struct tok *tk = l->tk;
    xseg_status st;
    if ((st = want_args(p, "wait", l->n, 2, 2, "wait @STREAM @WAITED_FOR")))
        return st;
    if ((st = stream_ref(p, &tk[1], &a->stream)) || (st = stream_ref(p, &tk[2], &a->stream2)))
        return st;
    if (a->stream == a->stream2)
        return perr(p, "wait: a stream cannot wait for itself ('%.*s')", (int)tk[1].len, tk[1].s);
    /* What cuStreamWaitEvent does with an event recorded on the waited-for stream: in a
     * capture it forks (the waiting stream joins it) or joins (its work now comes first). */
    struct stream_state *sa = a->stream >= 0 ? &p->streams[a->stream] : NULL;
    struct stream_state *sb = a->stream2 >= 0 ? &p->streams[a->stream2] : NULL;
    char what[160], what2[160];
    if (sb && sb->in) {
        if (!sa)
            return perr(p, "wait %.*s %.*s: %s; the legacy default stream cannot join a capture",
                        (int)tk[1].len, tk[1].s, (int)tk[2].len, tk[2].s,
                        capture_role(p, a->stream2, what, sizeof what));
        if (sa->in && sa->in != sb->in)
            return perr(p, "wait %.*s %.*s: %s and %s; two captures cannot be merged", (int)tk[1].len,
                        tk[1].s, (int)tk[2].len, tk[2].s, capture_role(p, a->stream, what, sizeof what),
                        capture_role(p, a->stream2, what2, sizeof what2));
        if (!sa->in) {
            sa->in = sb->in;
            sa->join_line = p->line;
        }
    } else if (sa && sa->in) {
        return perr(p, "wait %.*s %.*s: %s and '%.*s' does not; a capture cannot wait for work outside it",
                    (int)tk[1].len, tk[1].s, (int)tk[2].len, tk[2].s, capture_role(p, a->stream, what, sizeof what),
                    (int)tk[2].len - 1, tk[2].s + 1);
    }
    return XSEG_SUCCESS;
}

static xseg_status parse_work(struct parser *p, const struct line *l, struct trace_action *a)
{
    xseg_status st;
    if ((st = want_args(p, "work", l->n, 1, 1, "work @STREAM")))
        return st;
    if ((st = stream_ref(p, &l->tk[1], &a->stream)))
        return st;
    return XSEG_SUCCESS;
}

/* The trace language's actions (tools/replay/actions.h), in the order the unknown-action message
 * lists them. op < 0: the line builds no action (frame). */
static const struct parse_row {
    const char *name;
    int op;
    xseg_status (*parse)(struct parser *, const struct line *, struct trace_action *);
} parse_table[] = {
#define PARSE_ROW(name, op, parse, run, dump) {#name, op, parse},
#define PARSE_ROW_NO_ACTION(name, parse) {#name, -1, parse},
    TRACE_ACTIONS(PARSE_ROW, PARSE_ROW_NO_ACTION)
#undef PARSE_ROW
#undef PARSE_ROW_NO_ACTION
};
#define PARSE_NROWS (sizeof parse_table / sizeof parse_table[0])

static xseg_status unknown_action(struct parser *p, const struct tok *verb)
{
    char list[512];
    size_t len = 0;
    for (size_t r = 0; r < PARSE_NROWS; r++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", r ? ", " : "", parse_table[r].name);
    return perr(p, "unknown action '%.*s' (expected %s)", (int)(verb->len > 40 ? 40 : verb->len), verb->s,
                list);
}

/* A line: tokens, the verb's row, its parse function, then the action (if any) appended. */
static xseg_status parse_line(struct parser *p, const char *s, const char *end)
{
    struct line l = {.end = end};
    tokenize(s, end, l.tk, 5, &l.n);
    if (l.n == 0)
        return XSEG_SUCCESS;
    const struct parse_row *row = NULL;
    for (size_t r = 0; r < PARSE_NROWS && !row; r++)
        if (tok_is(&l.tk[0], parse_table[r].name))
            row = &parse_table[r];
    if (!row)
        return unknown_action(p, &l.tk[0]);
    struct trace_action a = {.line = p->line, .buf = -1, .stream = TRACE_DEFAULT_STREAM, .pool = -1};
    a.op = row->op < 0 ? TRACE_STREAM : (enum trace_op)row->op;
    xseg_status st = row->parse(p, &l, &a);
    if (st || row->op < 0)
        return st;
    if (trace_push(p->t, &a) != XSEG_SUCCESS)
        return perr(p, "out of host memory");
    return XSEG_SUCCESS;
}

xseg_status trace_parse_text(struct trace *t, const char *text, size_t len, char *err, size_t errlen)
{
    struct parser p = {.t = t, .err = err, .errlen = errlen};
    xseg_status st = XSEG_SUCCESS;
    const char *s = text, *end = text + len;
    while (s < end && st == XSEG_SUCCESS) {
        const char *eol = memchr(s, '\n', (size_t)(end - s));
        if (!eol)
            eol = end;
        p.line++;
        /* A comment starts at '#' at the line start or after a blank. */
        const char *stop = s;
        while (stop < eol && !(*stop == '#' && (stop == s || is_blank(stop[-1]))))
            stop++;
        if (memchr(s, '\0', (size_t)(stop - s)))
            st = perr(&p, "a NUL byte in the line (is this a binary file?)");
        else
            st = parse_line(&p, s, stop);
        if (st == XSEG_SUCCESS && stop == s && stop < eol)
            trace_note_comment(t, stop, eol[-1] == '\r' ? eol - 1 : eol); /* PyTorch's own figures */
        s = eol + 1;
    }
    /* A capture left open would leave its stream capturing past the end of the replay. */
    for (size_t i = 0; st == XSEG_SUCCESS && i < t->streams.count; i++)
        if (p.streams[i].capturing) {
            p.line = p.streams[i].line;
            st = perr(&p, "capture_begin: the capture on stream '%s' is never ended (add 'capture_end @%s')",
                      t->streams.names[i], t->streams.names[i]);
        }
    free(p.live);
    free(p.last_line);
    free(p.pools);
    free(p.streams);
    return st;
}

static int looks_like_rmm_csv(const char *text, size_t len)
{
    /* Skip a UTF-8 byte-order mark; compare the header's first fields. */
    if (len >= 3 && (unsigned char)text[0] == 0xEF && (unsigned char)text[1] == 0xBB &&
        (unsigned char)text[2] == 0xBF) {
        text += 3;
        len -= 3;
    }
    static const char hdr[] = "Thread,Time,Action,Pointer,Size";
    return len >= sizeof hdr - 1 && memcmp(text, hdr, sizeof hdr - 1) == 0;
}

xseg_status trace_load_file(struct trace *t, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %m", path);
        return XSEG_ERROR_INVALID_VALUE;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int ioerr = ferror(f);
    fclose(f);
    if (!buf) {
        snprintf(err, errlen, "%s: out of host memory reading it", path);
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    if (ioerr) {
        free(buf);
        snprintf(err, errlen, "%s: read error", path);
        return XSEG_ERROR_INVALID_VALUE;
    }
    xseg_status st = trace_init(t, path);
    if (st == XSEG_SUCCESS) {
        st = looks_like_rmm_csv(buf, len) ? trace_import_rmm_csv(t, buf, len, err, errlen)
                                          : trace_parse_text(t, buf, len, err, errlen);
        if (st != XSEG_SUCCESS)
            trace_destroy(t);
    }
    free(buf);
    return st;
}
