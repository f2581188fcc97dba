/*
 * The allocator configuration string (PyTorch's PYTORCH_CUDA_ALLOC_CONF grammar) and the
 * environment variables it comes from.
 *
 * Parsing is pure: it reads a base struct and writes a result, holds no lock and touches no
 * global state except the one-time note about ignored pinned_* keys. Callers (api.c) serialize
 * the swap of the configuration in force themselves.
 *
 * The string is tokenized first (',' ':' '[' ']' are tokens of their own, every other run of
 * characters is a word, whitespace is dropped as PyTorch's tokenizer drops it), then parsed
 * into a scratch struct; `out` is written only when the whole string is valid.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/process/config.h"
#include "core/process/config_keys.h"
#include "base/log.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/strbuf.h"

#define CFG_DEFAULT_LARGE_SEGMENT (20 * XSEG_MiB)
/* PyTorch requires large_segment_size_mb > 10 (kMinLargeAlloc). */
#define CFG_MIN_LARGE_SEGMENT_MB 10
/* Upper bound on MiB values that are byte sizes, so that value * MiB cannot overflow. */
#define CFG_MAX_MB ((unsigned long long)(SIZE_MAX / XSEG_MiB))
/* Large-pool pages are created with cuMemCreate, whose sizes must be multiples of the driver's
 * granularity (2 MiB on NVIDIA GPUs); an odd large_segment_size_mb could never be mapped. */
#define CFG_LARGE_SEGMENT_MULTIPLE_MB 2
#define CFG_MAX_LARGE_SEGMENT_MB (1024ull * 1024) /* 1 TiB pages: far beyond any device */
/* The bound of large_segment_size_mb and of the keys it bounds: 1 TiB, or what fits a 32-bit size_t. */
#define CFG_MAX_SEGMENT_MB XSEG_MIN(CFG_MAX_LARGE_SEGMENT_MB, CFG_MAX_MB)
/* expandable_page_size_mb: pages are created with cuMemCreate, in multiples of the driver's 2 MiB
 * granularity. */
#define CFG_PAGE_MULTIPLE_MB 2

/* A default or a reset written into a field, by kind (ROUNDUP sets every bucket). */
#define CFG_SET_BOOL(f, v) ((f) = (v))
#define CFG_SET_MIB(f, v) ((f) = (v))
#define CFG_SET_FRACTION(f, v) ((f) = (v))
#define CFG_SET_MS(f, v) ((f) = (v))
#define CFG_SET_COUNT(f, v) ((f) = (v))
#define CFG_SET_NAME(f, v) snprintf((f), sizeof(f), "%s", (v))
#define CFG_SET_ROUNDUP(f, v)                                                                      \
    do {                                                                                           \
        for (size_t b_ = 0; b_ < CFG_ROUNDUP_BUCKETS; b_++)                                        \
            (f)[b_] = (v);                                                                         \
    } while (0)

void cfg_default(struct cfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
#define CFG_DEFAULT_ROW(name, alias, kind, field, def, parse, flags, snap, doc) CFG_SET_##kind(cfg->field, def);
#define CFG_DEFAULT_NONE(name, alias, kind, parse, flags, doc)
    CFG_KEYS(CFG_DEFAULT_ROW, CFG_DEFAULT_NONE)
#undef CFG_DEFAULT_ROW
#undef CFG_DEFAULT_NONE
}

/* ---- tokenizer ------------------------------------------------------------------------- */

#define CFG_WORD_MAX 256

struct cfg_token {
    char text[CFG_WORD_MAX]; /* NUL-terminated, whitespace removed */
    size_t pos;              /* index in the input of the token's first character */
};

struct cfg_lexer {
    struct cfg_token *tok;
    size_t n;
    size_t end; /* length of the input: the position reported for "missing" tokens */
};

static int cfg_is_punct(char c) { return c == ',' || c == ':' || c == '[' || c == ']'; }
static int cfg_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Split @p str into tokens. Caller frees lex->tok. */
static xseg_status cfg_tokenize(const char *str, struct cfg_lexer *lex)
{
    size_t len = strlen(str);
    /* Never more tokens than characters. */
    lex->tok = xs_calloc(len ? len : 1, sizeof *lex->tok);
    lex->n = 0;
    lex->end = len;
    if (!lex->tok)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "allocator config: out of host memory");
    struct cfg_token *word = NULL;
    size_t wlen = 0;
    for (size_t i = 0; i < len; i++) {
        char c = str[i];
        if (cfg_is_space(c))
            continue;
        if (cfg_is_punct(c)) {
            word = NULL;
            struct cfg_token *t = &lex->tok[lex->n++];
            t->text[0] = c;
            t->text[1] = '\0';
            t->pos = i;
            continue;
        }
        if (!word) {
            word = &lex->tok[lex->n++];
            word->pos = i;
            wlen = 0;
        }
        if (wlen + 1 >= CFG_WORD_MAX)
            return err_set(XSEG_ERROR_INVALID_VALUE,
                           "allocator config: word starting at index %zu is longer than %d "
                           "characters",
                           word->pos, CFG_WORD_MAX - 1);
        word->text[wlen++] = c;
        word->text[wlen] = '\0';
    }
    return XSEG_SUCCESS;
}

/* ---- parser ---------------------------------------------------------------------------- */

struct cfg_parser {
    struct cfg_lexer lex;
    size_t i; /* next token */
    struct cfg cfg;
    /* Checks that depend on large_segment_size run after the whole string is read, so the key
     * may come in any order; remember where the dependent values were. */
    bool have_max_split, have_non_split, have_large_segment, have_page, have_chunk;
    size_t max_split_pos, non_split_pos, page_pos, large_pos, chunk_pos;
    unsigned long long max_split_mb, non_split_mb, page_mb, chunk_mb;
    const char *max_split_word, *non_split_word, *page_word, *chunk_word; /* as typed, for messages */
    uint64_t ignored; /* bit k: row k was given and is ignored (named in the one-time note) */
    bool async_backend; /* backend:cudaMallocAsync was given (ignored, named in the note) */
};

static const char *cfg_peek(const struct cfg_parser *p)
{
    return p->i < p->lex.n ? p->lex.tok[p->i].text : NULL;
}

static size_t cfg_pos(const struct cfg_parser *p)
{
    return p->i < p->lex.n ? p->lex.tok[p->i].pos : p->lex.end;
}

static const char *cfg_shown(const char *t) { return t ? t : "end of string"; }

/* Consume punctuation @p c or fail naming @p key and @p form. */
static xseg_status cfg_expect(struct cfg_parser *p, char c, const char *key, const char *form)
{
    const char *t = cfg_peek(p);
    if (t && t[0] == c && t[1] == '\0') {
        p->i++;
        return XSEG_SUCCESS;
    }
    return err_set(XSEG_ERROR_INVALID_VALUE,
                   "allocator config: %s: expected '%c' (form %s), got '%s' at index %zu", key, c,
                   form, cfg_shown(t), cfg_pos(p));
}

/* Take the next token as a value word (not punctuation). */
static xseg_status cfg_word(struct cfg_parser *p, const char *key, const char *form,
                            const char **word, size_t *pos)
{
    /* Written on every path (NULL on an error), so that no caller reads them unset. */
    *word = NULL;
    *pos = cfg_pos(p);
    const char *t = cfg_peek(p);
    if (!t || cfg_is_punct(t[0]))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: %s: expected %s, got '%s' at index %zu", key, form,
                       cfg_shown(t), cfg_pos(p));
    *word = t;
    *pos = cfg_pos(p);
    p->i++;
    return XSEG_SUCCESS;
}

/* Decimal digits only: no sign, no fraction, no exponent (stoul would take "-1" or "12abc"); a
 * value past ULLONG_MAX is refused too, never saturated, so no caller can take a clamped number
 * for the one typed (every caller's message quotes the word and names its range). */
static bool cfg_to_ull(const char *s, unsigned long long *v)
{
    if (!*s)
        return false;
    unsigned long long r = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (r > (ULLONG_MAX - d) / 10)
            return false;
        r = r * 10 + d;
    }
    *v = r;
    return true;
}

static bool cfg_to_double(const char *s, double *v)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(d))
        return false;
    *v = d;
    return true;
}

static bool cfg_pow2(unsigned long long v) { return v && !(v & (v - 1)); }

static xseg_status cfg_parse_bool(struct cfg_parser *p, const char *key, bool *out)
{
    const char *w;
    size_t pos;
    xseg_status st = cfg_word(p, key, "True or False", &w, &pos);
    if (st)
        return st;
    if (!strcmp(w, "True"))
        *out = true;
    else if (!strcmp(w, "False"))
        *out = false;
    else
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: %s: expected True or False, got '%s' at index %zu", key,
                       w, pos);
    return XSEG_SUCCESS;
}

/* A MiB value refused: the key, the range it must be in, the word as typed. */
static xseg_status cfg_bad_mb(const char *key, const char *form, const char *word, size_t pos)
{
    return err_set(XSEG_ERROR_INVALID_VALUE, "allocator config: %s: expected %s, got '%s' at index %zu", key, form,
                   word, pos);
}

/* A whole number of MiB up to @p max; @p form spells the key's whole range for the message, which
 * quotes the word as typed (*word: the token, alive until cfg_parse returns). Checks that depend
 * on other keys are the caller's (or cfg_finish's). */
static xseg_status cfg_parse_mb(struct cfg_parser *p, const char *key, const char *form, unsigned long long max,
                                unsigned long long *mb, const char **word, size_t *pos)
{
    *mb = 0; /* written on every path, as cfg_word's outputs */
    xseg_status st = cfg_word(p, key, form, word, pos);
    if (st)
        return st;
    if (!cfg_to_ull(*word, mb) || *mb > max)
        return cfg_bad_mb(key, form, *word, *pos);
    return XSEG_SUCCESS;
}

static xseg_status cfg_parse_fraction(struct cfg_parser *p, const char *key, const char *form,
                                      bool open, double *out)
{
    const char *w;
    size_t pos;
    double v;
    xseg_status st = cfg_word(p, key, form, &w, &pos);
    if (st)
        return st;
    bool ok = cfg_to_double(w, &v) && (open ? (v > 0.0 && v < 1.0) : (v >= 0.0 && v <= 1.0));
    if (!ok)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: %s is invalid: expected %s, got '%s' at index %zu", key,
                       form, w, pos);
    *out = v;
    return XSEG_SUCCESS;
}

/* A division count: 0 (off) or a power of two. */
static xseg_status cfg_parse_division(struct cfg_parser *p, const char *key, unsigned *out)
{
    static const char form[] = "a power of 2 or 0, up to 2147483648";
    const char *w;
    size_t pos;
    unsigned long long v;
    xseg_status st = cfg_word(p, key, form, &w, &pos);
    if (st)
        return st;
    if (!cfg_to_ull(w, &v) || (v && !cfg_pow2(v)) || v > (1ull << 31))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: %s: divisions must be %s, got '%s' at index %zu", key,
                       form, w, pos);
    *out = (unsigned)v;
    return XSEG_SUCCESS;
}

static unsigned cfg_log2(unsigned long long v)
{
    unsigned r = 0;
    while (v >>= 1)
        r++;
    return r;
}

/*
 * roundup_power2_divisions: N, or [MB:d,...,>:d]. A list entry MB:d sets bucket log2(MB)
 * (clamped to the last bucket); the first entry also fills every bucket below it; '>:d' fills
 * every bucket above the last explicit one (all buckets when no explicit entry came before).
 */
static xseg_status cfg_parse_roundup(struct cfg_parser *p, const struct cfg_key *row, const char *key)
{
    (void)row;
    static const char list_form[] = "[MB:d,...,>:d] with MB a power of 2";
    unsigned *div = p->cfg.roundup_power2_divisions;
    const char *t = cfg_peek(p);
    if (!t || strcmp(t, "[")) {
        unsigned d;
        xseg_status st = cfg_parse_division(p, key, &d);
        if (st)
            return st;
        for (size_t b = 0; b < CFG_ROUNDUP_BUCKETS; b++)
            div[b] = d;
        return XSEG_SUCCESS;
    }
    p->i++; /* '[' */
    bool first = true;
    long last = -1;
    for (;;) {
        const char *w;
        size_t pos;
        xseg_status st = cfg_word(p, key, list_form, &w, &pos);
        if (st)
            return st;
        bool rest = !strcmp(w, ">");
        unsigned long long mb = 0;
        if (!rest && (!cfg_to_ull(w, &mb) || !cfg_pow2(mb)))
            return err_set(XSEG_ERROR_INVALID_VALUE,
                           "allocator config: %s: interval '%s' at index %zu must be a power of 2 "
                           "(in MB, up to 2^63) or '>'",
                           key, w, pos);
        if ((st = cfg_expect(p, ':', key, list_form)))
            return st;
        unsigned d;
        if ((st = cfg_parse_division(p, key, &d)))
            return st;
        if (rest) {
            for (size_t b = (size_t)(last + 1); b < CFG_ROUNDUP_BUCKETS; b++)
                div[b] = d;
        } else {
            unsigned b = XSEG_MIN(cfg_log2(mb), CFG_ROUNDUP_BUCKETS - 1);
            if (first)
                for (unsigned k = 0; k < b; k++)
                    div[k] = d;
            div[b] = d;
            last = (long)b;
            first = false;
        }
        t = cfg_peek(p);
        if (t && !strcmp(t, "]")) {
            p->i++;
            return XSEG_SUCCESS;
        }
        if ((st = cfg_expect(p, ',', key, list_form)))
            return st;
    }
}

static xseg_status cfg_parse_backend(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    (void)k;
    const char *w;
    size_t pos;
    xseg_status st = cfg_word(p, key, "native", &w, &pos);
    if (st)
        return st;
    if (!strcmp(w, "native"))
        return XSEG_SUCCESS;
    /* PyTorch accepts it, so an inherited PYTORCH_ALLOC_CONF carrying it must not fail xseg's
     * init: accepted, and named in the one-time note (xseg is itself the caching allocator). */
    if (!strcmp(w, "cudaMallocAsync") || !strcmp(w, "hipMallocAsync")) {
        p->async_backend = true;
        return XSEG_SUCCESS;
    }
    return err_set(XSEG_ERROR_INVALID_VALUE,
                   "allocator config: backend: expected native, got '%s' at index %zu", w, pos);
}

/* The field of row @p k in the struct being parsed. */
static void *cfg_out(struct cfg_parser *p, const struct cfg_key *k) { return (char *)&p->cfg + k->off; }

static xseg_status cfg_parse_flag(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    return cfg_parse_bool(p, key, cfg_out(p, k));
}

static xseg_status cfg_parse_open_fraction(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    return cfg_parse_fraction(p, key, "a number in (0.0, 1.0)", true, cfg_out(p, k));
}

static xseg_status cfg_parse_closed_fraction(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    return cfg_parse_fraction(p, key, "a number in [0.0, 1.0]", false, cfg_out(p, k));
}

/* max_split_size_mb and max_non_split_rounding_mb: from large_segment_size_mb (checked by
 * cfg_finish, once the whole string is read) to the most whose bytes fit a size_t. */
static xseg_status cfg_parse_split_mb(struct cfg_parser *p, const char *key, unsigned long long *mb,
                                      const char **word, size_t *pos)
{
    char form[96];
    snprintf(form, sizeof form, "a whole number of MiB from large_segment_size_mb to %llu", CFG_MAX_MB);
    return cfg_parse_mb(p, key, form, CFG_MAX_MB, mb, word, pos);
}

static xseg_status cfg_parse_max_split(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    (void)k;
    p->have_max_split = true;
    return cfg_parse_split_mb(p, key, &p->max_split_mb, &p->max_split_word, &p->max_split_pos);
}

static xseg_status cfg_parse_non_split(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    (void)k;
    p->have_non_split = true;
    return cfg_parse_split_mb(p, key, &p->non_split_mb, &p->non_split_word, &p->non_split_pos);
}

static xseg_status cfg_parse_large_segment(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    char form[128];
    snprintf(form, sizeof form, "a whole number of MiB > %d and a multiple of %d (the driver's page granularity), "
             "up to %llu", CFG_MIN_LARGE_SEGMENT_MB, CFG_LARGE_SEGMENT_MULTIPLE_MB, CFG_MAX_SEGMENT_MB);
    unsigned long long mb;
    const char *w;
    size_t pos;
    xseg_status st = cfg_parse_mb(p, key, form, CFG_MAX_SEGMENT_MB, &mb, &w, &pos);
    if (st)
        return st;
    if (mb <= CFG_MIN_LARGE_SEGMENT_MB || mb % CFG_LARGE_SEGMENT_MULTIPLE_MB)
        return cfg_bad_mb(key, form, w, pos);
    p->have_large_segment = true;
    p->large_pos = pos;
    *(size_t *)cfg_out(p, k) = (size_t)mb * XSEG_MiB;
    return XSEG_SUCCESS;
}

/* expandable_page_size_mb's range; @p large_mb: its upper bound in force (0: not known yet). */
static void cfg_page_form(char *form, size_t size, unsigned long long large_mb)
{
    char bound[64] = "large_segment_size_mb";
    if (large_mb)
        snprintf(bound, sizeof bound, "%llu (large_segment_size_mb)", large_mb);
    snprintf(form, size, "an even whole number of MiB >= %d (a multiple of the driver's %d MiB page granularity), "
             "up to %s", CFG_PAGE_MULTIPLE_MB, CFG_PAGE_MULTIPLE_MB, bound);
}

/* expandable_page_size_mb: its upper bound (large_segment_size_mb) is cfg_finish's. */
static xseg_status cfg_parse_page(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    (void)k;
    char form[160];
    cfg_page_form(form, sizeof form, 0);
    xseg_status st = cfg_parse_mb(p, key, form, CFG_MAX_SEGMENT_MB, &p->page_mb, &p->page_word, &p->page_pos);
    if (st)
        return st;
    if (p->page_mb < CFG_PAGE_MULTIPLE_MB || p->page_mb % CFG_PAGE_MULTIPLE_MB)
        return cfg_bad_mb(key, form, p->page_word, p->page_pos);
    p->have_page = true;
    return XSEG_SUCCESS;
}

/* expandable_chunk_mb's range; @p page_mb: its upper bound in force (0: not known yet). */
static void cfg_chunk_form(char *form, size_t size, unsigned long long page_mb)
{
    char bound[64] = "expandable_page_size_mb";
    if (page_mb)
        snprintf(bound, sizeof bound, "%llu (expandable_page_size_mb)", page_mb);
    snprintf(form, size, "0 (the default chunk) or an even whole number of MiB (a multiple of the driver's %d MiB "
             "granularity), up to %s", CFG_PAGE_MULTIPLE_MB, bound);
}

/* expandable_chunk_mb: its upper bound (expandable_page_size_mb) is cfg_finish's. */
static xseg_status cfg_parse_chunk(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    char form[160];
    cfg_chunk_form(form, sizeof form, 0);
    unsigned long long mb;
    size_t pos;
    xseg_status st = cfg_parse_mb(p, key, form, CFG_MAX_SEGMENT_MB, &mb, &p->chunk_word, &pos);
    if (st)
        return st;
    if (mb % CFG_PAGE_MULTIPLE_MB)
        return cfg_bad_mb(key, form, p->chunk_word, pos);
    p->have_chunk = true;
    p->chunk_mb = mb;
    p->chunk_pos = pos;
    *(size_t *)cfg_out(p, k) = (size_t)mb * XSEG_MiB;
    return XSEG_SUCCESS;
}

/* services: release_threshold_mb's largest value means unset (keep all), as the default. */
static xseg_status cfg_parse_release_threshold(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    char form[96];
    snprintf(form, sizeof form, "a whole number of MiB up to %llu", CFG_MAX_MB);
    unsigned long long mb;
    const char *w;
    size_t pos;
    xseg_status st = cfg_parse_mb(p, key, form, CFG_MAX_MB, &mb, &w, &pos);
    if (st)
        return st;
    *(size_t *)cfg_out(p, k) = mb == CFG_MAX_MB ? SIZE_MAX : (size_t)mb * XSEG_MiB;
    return XSEG_SUCCESS;
}

/* A bounded number (CFG_BOUNDED and CFG_BOUNDED_MIB rows): a whole number from the row's min to
 * its max (powers of 2 only with pow2), into its unsigned field, or its size_t field in bytes for
 * MIB (an IGNORED row is only checked); anything else is an error naming the key and the range. */
static xseg_status cfg_parse_bounded(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    /* A MIB row's bytes must fit a size_t (a 32-bit build's bound is lower than the row's). */
    unsigned long long max = k->kind == CFG_KIND_MIB ? XSEG_MIN(k->max, CFG_MAX_MB) : k->max;
    char form[96];
    snprintf(form, sizeof form, "%s from %llu to %llu (%s)", k->pow2 ? "a power of 2" : "a whole number",
             k->min, max, k->unit);
    const char *w;
    size_t pos;
    unsigned long long v;
    xseg_status st = cfg_word(p, key, form, &w, &pos);
    if (st)
        return st;
    if (!cfg_to_ull(w, &v) || v < k->min || v > max || (k->pow2 && !cfg_pow2(v)))
        return err_set(XSEG_ERROR_INVALID_VALUE, "allocator config: %s: expected %s, got '%s' at index %zu", key,
                       form, w, pos);
    if (k->kind == CFG_KIND_MIB)
        *(size_t *)cfg_out(p, k) = (size_t)v * XSEG_MiB;
    else if (k->kind == CFG_KIND_MS || k->kind == CFG_KIND_COUNT)
        *(unsigned *)cfg_out(p, k) = (unsigned)v;
    return XSEG_SUCCESS;
}

/* A NAME (memory_group): it becomes part of a shared-memory object's name, so only letters,
 * digits, '_', '.', '-', at most CFG_NAME_MAX of them. */
static xseg_status cfg_parse_name(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    const char *w;
    size_t pos;
    xseg_status st = cfg_word(p, key, "a name", &w, &pos);
    if (st)
        return st;
    size_t n = strlen(w);
    if (n > CFG_NAME_MAX || strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                      "0123456789_.-") != n)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: %s: expected 1 to %d letters, digits, '_', '.' or '-', got "
                       "'%s' at index %zu", key, CFG_NAME_MAX, w, pos);
    memcpy(cfg_out(p, k), w, n + 1);
    return XSEG_SUCCESS;
}

/* A boolean checked (so a typo still fails) and dropped: pinned_free_catch_all (PyTorch's host
 * allocator has it, xseg's in core/services/hostalloc.c does not need it) and throw_on_cudamalloc_oom
 * (PyTorch 2.12+: refuse a request over the memory fraction before any driver call, which
 * core/alloc.c always does, so both values are honoured as they are). */
static xseg_status cfg_parse_checked_flag(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    (void)k;
    bool dropped;
    return cfg_parse_bool(p, key, &dropped);
}

/* expandable_segments_reserve / _by_class (PyTorch 2.12+ VA bounds): a fraction, NG, or a
 * [name:value,...] list. PyTorch only warns about a bad value; xseg reserves address space to
 * need, so any value is taken (a bracketed list whole) and the key is named in the note. */
static xseg_status cfg_parse_va_hint(struct cfg_parser *p, const struct cfg_key *k, const char *key)
{
    (void)k;
    const char *t = cfg_peek(p);
    if (t && !strcmp(t, "[")) {
        for (p->i++; (t = cfg_peek(p)) && strcmp(t, "]"); p->i++)
            ;
        return cfg_expect(p, ']', key, "[name:value,...]");
    }
    const char *w;
    size_t pos;
    return cfg_word(p, key, "a fraction, NG, or [name:value,...]", &w, &pos);
}

/* Each kind's field type, checked at compile time for every row. */
#define CFG_TYPE_BOOL bool
#define CFG_TYPE_MIB size_t
#define CFG_TYPE_FRACTION double
#define CFG_TYPE_MS unsigned
#define CFG_TYPE_COUNT unsigned
#define CFG_TYPE_NAME char *
#define CFG_TYPE_ROUNDUP unsigned *
#define CFG_CHECK_ROW(name, alias, kind, field, def, parse, flags, snap, doc)                      \
    _Static_assert(_Generic(((struct cfg *)0)->field, CFG_TYPE_##kind: 1, default: 0),            \
                   #name ": the field's type is not its kind's");
#define CFG_CHECK_NONE(name, alias, kind, parse, flags, doc)
CFG_KEYS(CFG_CHECK_ROW, CFG_CHECK_NONE)
#undef CFG_CHECK_ROW
#undef CFG_CHECK_NONE

const struct cfg_key cfg_keys[] = {
#define CFG_KEY_ROW(name, alias, kind, field, def, parse, flags, snap, doc)                        \
    {#name, alias, CFG_KIND_##kind, offsetof(struct cfg, field), flags, snap, doc, parse},
#define CFG_KEY_NONE(name, alias, kind, parse, flags, doc) {#name, alias, CFG_KIND_##kind, 0, flags, 0, doc, parse},
    CFG_KEYS(CFG_KEY_ROW, CFG_KEY_NONE)
#undef CFG_KEY_ROW
#undef CFG_KEY_NONE
};
const size_t cfg_nkeys = sizeof cfg_keys / sizeof cfg_keys[0];
_Static_assert(sizeof cfg_keys / sizeof cfg_keys[0] < 63, "cfg_parser.ignored has a bit per row, and bit 63");

/* Levenshtein distance of @p a and @p b (keys are short; longer strings count as far). */
static size_t cfg_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return SIZE_MAX;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* Rewrite this thread's message with every byte outside printable ASCII as \xNN: a config error
 * echoes the user's text, and a BOM or a control character would print invisibly, so that the
 * message looked right while the key was wrong. */
static xseg_status cfg_escape_message(xseg_status st)
{
    const char *m = err_message();
    char buf[1024];
    size_t n = 0;
    bool any = false;
    for (const unsigned char *c = (const unsigned char *)m; *c && n + 5 < sizeof buf; c++) {
        if (*c >= 0x20 && *c < 0x7f) {
            buf[n++] = (char)*c;
        } else {
            n += (size_t)snprintf(buf + n, sizeof buf - n, "\\x%02X", *c);
            any = true;
        }
    }
    buf[n] = 0;
    return any ? err_set(st, "%s", buf) : st;
}

/* The row spelled @p key (its name or its alias), or NULL. */
static const struct cfg_key *cfg_find_key(const char *key)
{
    for (size_t k = 0; k < cfg_nkeys; k++)
        if (!strcmp(key, cfg_keys[k].name) || (cfg_keys[k].alias && !strcmp(key, cfg_keys[k].alias)))
            return &cfg_keys[k];
    return NULL;
}

/* An unknown key, with the nearest known one (not an ignored key) as a hint when it is near. */
static xseg_status cfg_unknown_key(const char *key, size_t kpos)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t k = 0; k < cfg_nkeys; k++) {
        if (cfg_keys[k].flags & CFG_IGNORED)
            continue;
        const char *spell[2] = {cfg_keys[k].name, cfg_keys[k].alias};
        for (size_t s = 0; s < 2 && spell[s]; s++) {
            size_t dist = cfg_edit_distance(key, spell[s]);
            if (dist < best_d) {
                best_d = dist;
                best = spell[s];
            }
        }
    }
    size_t klen = strlen(key);
    if (best && best_d <= 3 && best_d < klen)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "unrecognized key '%s' in allocator config (at index %zu); did you mean '%s'?", key,
                       kpos, best);
    return err_set(XSEG_ERROR_INVALID_VALUE, "unrecognized key '%s' in allocator config (at index %zu)",
                   key, kpos);
}

/* key:value, dispatched to the key's row (core/process/config_keys.h). */
static xseg_status cfg_parse_entry(struct cfg_parser *p)
{
    const char *t = cfg_peek(p);
    if (!t || cfg_is_punct(t[0]))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: expected a key (key:value), got '%s' at index %zu",
                       cfg_shown(t), cfg_pos(p));
    const char *key = t;
    size_t kpos = cfg_pos(p);
    p->i++;
    const struct cfg_key *k = cfg_find_key(key);
    if (!k)
        return cfg_unknown_key(key, kpos);
    xseg_status st = cfg_expect(p, ':', key, "key:value");
    if (st)
        return st;
    if (k->flags & CFG_IGNORED)
        p->ignored |= UINT64_C(1) << (size_t)(k - cfg_keys);
    return k->parse(p, k, key);
}

/* Checks of values against large_segment_size, which may have been given after them. */
static xseg_status cfg_finish(struct cfg_parser *p, const struct cfg *base)
{
    struct cfg *c = &p->cfg;
    unsigned long long large_mb = c->large_segment_size / XSEG_MiB;
    char form[192];
    snprintf(form, sizeof form, "a whole number of MiB from %llu (large_segment_size_mb) to %llu", large_mb,
             CFG_MAX_MB);
    if (p->have_max_split) {
        if (p->max_split_mb < large_mb)
            return cfg_bad_mb("max_split_size_mb", form, p->max_split_word, p->max_split_pos);
        /* The largest value (its bytes just fit a size_t) means "never split-limited", the default. */
        c->max_split_size = p->max_split_mb == CFG_MAX_MB ? SIZE_MAX : (size_t)p->max_split_mb * XSEG_MiB;
    }
    if (p->have_non_split) {
        if (p->non_split_mb < large_mb)
            return cfg_bad_mb("max_non_split_rounding_mb", form, p->non_split_word, p->non_split_pos);
        c->max_non_split_rounding = (size_t)p->non_split_mb * XSEG_MiB;
    } else if (p->have_large_segment && base->max_non_split_rounding == base->large_segment_size) {
        /* It was following its default (= large_segment_size): keep following it. */
        c->max_non_split_rounding = c->large_segment_size;
    } else if (c->max_non_split_rounding < c->large_segment_size) {
        /* The config in force must keep its own rules, or xseg_get_config's string would be
         * refused by xseg_set_config. */
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: large_segment_size_mb %llu is above max_non_split_rounding_mb "
                       "%zu in force; set max_non_split_rounding_mb too (>= large_segment_size_mb), "
                       "at index %zu",
                       large_mb, c->max_non_split_rounding / XSEG_MiB, p->large_pos);
    }
    /* A page larger than large_segment_size would map more for a 1-10 MiB request than the
     * classic segment PyTorch gives it, and fewer, larger pages never help utilization: the
     * default (PyTorch's page) is the largest page. */
    if (p->have_page) {
        if (p->page_mb > large_mb) {
            cfg_page_form(form, sizeof form, large_mb);
            return cfg_bad_mb("expandable_page_size_mb", form, p->page_word, p->page_pos);
        }
        c->expandable_page_size = (size_t)p->page_mb * XSEG_MiB;
    } else if (p->have_large_segment && base->expandable_page_size == base->large_segment_size) {
        c->expandable_page_size = c->large_segment_size; /* following it, as by default */
    } else if (c->expandable_page_size > c->large_segment_size) {
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: large_segment_size_mb %llu is below expandable_page_size_mb "
                       "%zu in force; set expandable_page_size_mb too (<= large_segment_size_mb), "
                       "at index %zu",
                       large_mb, c->expandable_page_size / XSEG_MiB, p->large_pos);
    }
    /* Requiring RDMA-capable pages and never asking for them cannot both hold; refused whichever
     * of the two this string named, so the config in force keeps its own rules. */
    if (c->gpu_direct_rdma && !c->expandable_segments_rdma)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: gpu_direct_rdma:True requires RDMA-capable pages, but "
                       "expandable_segments_rdma:False turns them off; set one of them the other way");
    /* A chunk is a piece of a page (pages are what growth maps and what PyTorch reserves). */
    if (c->expandable_chunk > c->expandable_page_size) {
        if (p->have_chunk) {
            cfg_chunk_form(form, sizeof form, c->expandable_page_size / XSEG_MiB);
            return cfg_bad_mb("expandable_chunk_mb", form, p->chunk_word, p->chunk_pos);
        }
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "allocator config: expandable_page_size_mb %zu is below expandable_chunk_mb %zu in "
                       "force; set expandable_chunk_mb too (0, or <= expandable_page_size_mb), at index %zu",
                       c->expandable_page_size / XSEG_MiB, c->expandable_chunk / XSEG_MiB,
                       p->have_page ? p->page_pos : p->large_pos);
    }
    return XSEG_SUCCESS;
}

/* Ignored rows already named in a note (bit per row; the last bit: backend:cudaMallocAsync). */
static _Atomic uint64_t cfg_ignored_noted;

/* One note per ignored key per process: which keys, and why each changes nothing. */
static void cfg_note_ignored(uint64_t given)
{
    uint64_t fresh = given & ~atomic_fetch_or(&cfg_ignored_noted, given);
    if (!fresh)
        return;
    char keys[900] = "";
    struct strbuf sb = {keys, sizeof keys, 0};
    for (size_t k = 0; k < cfg_nkeys; k++)
        if (fresh & (UINT64_C(1) << k))
            strbuf_printf(&sb, " %s (%s)", cfg_keys[k].name,
                          !strncmp(cfg_keys[k].name, "pinned_", 7)
                              ? "tunes PyTorch's pinned host allocator, which xseg's does not need"
                              : "xseg reserves address space to need");
    if (fresh & (UINT64_C(1) << 63))
        strbuf_printf(&sb, " backend:cudaMallocAsync (xseg is itself the caching allocator)");
    log_warn("warning: allocator config keys accepted for PyTorch and ignored:%s", keys);
}

xseg_status cfg_parse(const char *str, const struct cfg *base, struct cfg *out)
{
    if (!str || !base || !out)
        return err_set(XSEG_ERROR_INVALID_VALUE, "allocator config: NULL %s",
                       !str ? "string" : !base ? "base" : "out");
    struct cfg_parser p;
    memset(&p, 0, sizeof p);
    p.cfg = *base;
    /* PyTorch's rule: the keys marked CFG_RESET go back to their defaults on every parse. */
#define CFG_RESET_ROW(name, alias, kind, field, def, parse, flags, snap, doc)                      \
    if ((flags) & CFG_RESET)                                                                       \
        CFG_SET_##kind(p.cfg.field, def);
#define CFG_RESET_NONE(name, alias, kind, parse, flags, doc)
    CFG_KEYS(CFG_RESET_ROW, CFG_RESET_NONE)
#undef CFG_RESET_ROW
#undef CFG_RESET_NONE

    xseg_status st = cfg_tokenize(str, &p.lex);
    while (!st && p.i < p.lex.n) {
        const char *key = p.lex.tok[p.i].text;
        st = cfg_parse_entry(&p);
        if (!st && p.i < p.lex.n)
            st = cfg_expect(&p, ',', key, "key:value,key:value");
    }
    if (!st)
        st = cfg_finish(&p, base);
    xs_free(p.lex.tok);
    if (st)
        return cfg_escape_message(st);
    *out = p.cfg;
    cfg_note_ignored(p.ignored | (p.async_backend ? UINT64_C(1) << 63 : 0));
    return XSEG_SUCCESS;
}

const char *cfg_from_env(const char **var)
{
    static const char *const names[] = {"XSEG_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                                        "PYTORCH_ALLOC_CONF"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const char *v = getenv(names[k]);
        if (v) {
            if (var)
                *var = names[k];
            return v;
        }
    }
    if (var)
        *var = NULL;
    return NULL;
}

/* ---- formatting ------------------------------------------------------------------------ */


/* The shortest decimal that reads back as the same double. */
static void cfg_put_double(struct strbuf *o, double v)
{
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    strbuf_printf(o, "%s", tmp);
}

/* ",key:value" (no comma before the first) for one row, by kind. */
static void cfg_put_key(struct strbuf *o, const struct cfg *cfg, const struct cfg_key *k, bool first)
{
    const void *f = cfg_field(cfg, k);
    const char *sep = first ? "" : ",";
    switch (k->kind) {
    case CFG_KIND_BOOL:
        strbuf_printf(o, "%s%s:%s", sep, k->name, *(const bool *)f ? "True" : "False");
        break;
    case CFG_KIND_MIB:
        strbuf_printf(o, "%s%s:%zu", sep, k->name, *(const size_t *)f / XSEG_MiB);
        break;
    case CFG_KIND_FRACTION:
        strbuf_printf(o, "%s%s:", sep, k->name);
        cfg_put_double(o, *(const double *)f);
        break;
    case CFG_KIND_MS:
    case CFG_KIND_COUNT:
        strbuf_printf(o, "%s%s:%u", sep, k->name, *(const unsigned *)f);
        break;
    case CFG_KIND_NAME:
        strbuf_printf(o, "%s%s:%s", sep, k->name, (const char *)f);
        break;
    case CFG_KIND_ROUNDUP: {
        const unsigned *div = f;
        bool uniform = true;
        for (size_t b = 0; b < CFG_ROUNDUP_BUCKETS; b++)
            uniform = uniform && div[b] == div[0];
        if (uniform) {
            strbuf_printf(o, "%s%s:%u", sep, k->name, div[0]);
            break;
        }
        strbuf_printf(o, "%s%s:[", sep, k->name);
        for (size_t b = 0; b < CFG_ROUNDUP_BUCKETS; b++)
            strbuf_printf(o, "%s%llu:%u", b ? "," : "", 1ull << b, div[b]);
        strbuf_printf(o, "]");
        break;
    }
    case CFG_KIND_ENUM:
    case CFG_KIND_IGNORED:
        break;
    }
}

/* Whether @p cfg holds the default of every field of row @p k. */
static bool cfg_at_default(const struct cfg *cfg, const struct cfg_key *k)
{
    struct cfg def;
    cfg_default(&def);
    const void *a = cfg_field(cfg, k), *b = cfg_field(&def, k);
    switch (k->kind) {
    case CFG_KIND_BOOL: return *(const bool *)a == *(const bool *)b;
    case CFG_KIND_MIB: return *(const size_t *)a == *(const size_t *)b;
    case CFG_KIND_FRACTION: return *(const double *)a == *(const double *)b;
    case CFG_KIND_MS:
    case CFG_KIND_COUNT: return *(const unsigned *)a == *(const unsigned *)b;
    case CFG_KIND_NAME: return !strcmp(a, b);
    case CFG_KIND_ROUNDUP: return !memcmp(a, b, CFG_ROUNDUP_BUCKETS * sizeof(unsigned));
    case CFG_KIND_ENUM:
    case CFG_KIND_IGNORED: break;
    }
    return true;
}

/*
 * Every key with a field is written, in the table's order; those marked CFG_OMIT_DEFAULT
 * (max_split_size_mb unlimited, garbage_collection_threshold off, roundup_power2_divisions all 0,
 * release_threshold_mb keep-all) are left out while at their default, because PyTorch's grammar
 * has no spelling for those defaults and the reset rule (or keeping) restores them on parse.
 * Byte sizes are written in whole MiB: the struct holds MiB multiples whenever it came from
 * cfg_default/cfg_parse, which is what makes the string read back equal.
 */
void cfg_format(const struct cfg *cfg, char *buf, size_t size, size_t *len)
{
    struct strbuf o = {buf, size, 0};
    if (size)
        buf[0] = '\0';
    bool first = true;
    for (size_t i = 0; i < cfg_nkeys; i++) {
        const struct cfg_key *k = &cfg_keys[i];
        if (k->kind == CFG_KIND_ENUM || k->kind == CFG_KIND_IGNORED)
            continue;
        if ((k->flags & CFG_OMIT_DEFAULT) && cfg_at_default(cfg, k))
            continue;
        cfg_put_key(&o, cfg, k, first);
        first = false;
    }
    if (len)
        *len = o.len;
}

/* Bucket of @p size: floor(log2(size in MiB)), clamped to [0, CFG_ROUNDUP_BUCKETS - 1]; so
 * everything below 2 MiB shares bucket 0, as in PyTorch. */
unsigned cfg_roundup_divisions(const struct cfg *cfg, size_t size)
{
    size_t mb = size >> 20;
    unsigned b = mb ? cfg_log2(mb) : 0;
    if (b >= CFG_ROUNDUP_BUCKETS)
        b = CFG_ROUNDUP_BUCKETS - 1;
    return cfg->roundup_power2_divisions[b];
}
