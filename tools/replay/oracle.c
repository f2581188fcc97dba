/* The lifetime oracle of the replay (an experiment, issue 33). See oracle.h. */
#include "tools/replay/oracle.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* file:PATH: one action index per line (the allocations to route; blank lines and # comments
 * skipped), as benchmarks/lifetime_probe.py --write-mask writes them. Every index must name an
 * alloc of @p t, so a mask made for another trace is refused rather than routing at random. */
static xseg_status read_mask(struct oracle *o, const struct trace *t, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "XSEG_REPLAY_ORACLE: file:%.200s: %s", path, strerror(errno));
        return XSEG_ERROR_INVALID_VALUE;
    }
    o->long_lived = calloc(t->count + 1, 1);
    if (!o->long_lived) {
        fclose(f);
        snprintf(err, errlen, "XSEG_REPLAY_ORACLE: out of host memory");
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    char line[128];
    const char *bad = NULL;
    unsigned long long idx = 0;
    size_t n = 0;
    while (!bad && fgets(line, sizeof line, f)) {
        n++;
        char *s = line + strspn(line, " \t");
        if (*s == '#' || *s == '\n' || *s == '\r' || !*s)
            continue;
        char *end;
        errno = 0;
        idx = strtoull(s, &end, 10);
        end += strspn(end, " \t\r\n");
        if (*s < '0' || *s > '9' || *end || errno)
            bad = "expected one action index per line";
        else if (idx >= t->count)
            bad = "index past the trace's last action";
        else if (t->actions[idx].op != TRACE_ALLOC)
            bad = "that action is not an alloc";
        else
            o->long_lived[idx] = 1;
    }
    if (!bad && ferror(f))
        bad = "read error";
    fclose(f);
    if (bad) {
        snprintf(err, errlen, "XSEG_REPLAY_ORACLE: file:%.200s:%zu: %s (the trace has %zu actions)", path, n,
                 bad, t->count);
        oracle_destroy(o);
        return XSEG_ERROR_INVALID_VALUE;
    }
    o->on = 1;
    return XSEG_SUCCESS;
}

xseg_status oracle_init(struct oracle *o, const struct trace *t, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    const char *v = getenv("XSEG_REPLAY_ORACLE");
    if (!v || !*v)
        return XSEG_SUCCESS;
    if (!strncmp(v, "file:", 5))
        return read_mask(o, t, v + 5, err, errlen);
    uint64_t min_life = UINT64_MAX; /* "never": only never freed */
    if (strcmp(v, "never")) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 10);
        if (*v < '0' || *v > '9' || *end || errno) {
            snprintf(err, errlen, "XSEG_REPLAY_ORACLE: expected \"never\", a number of actions or file:PATH, got \"%.64s\"",
                     v);
            return XSEG_ERROR_INVALID_VALUE;
        }
        min_life = n;
    }
    o->long_lived = calloc(t->count + 1, 1);
    size_t *alloc_at = malloc((t->bufs.count + 1) * sizeof *alloc_at);
    if (!o->long_lived || !alloc_at) {
        free(alloc_at);
        oracle_destroy(o);
        snprintf(err, errlen, "XSEG_REPLAY_ORACLE: out of host memory");
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    /* Mark every allocation long-lived, then clear those freed within min_life actions. */
    for (size_t i = 0; i < t->count; i++) {
        const struct trace_action *a = &t->actions[i];
        if (a->op == TRACE_ALLOC) {
            alloc_at[a->buf] = i;
            o->long_lived[i] = 1;
        } else if (a->op == TRACE_FREE && (min_life == UINT64_MAX || i - alloc_at[a->buf] <= min_life)) {
            o->long_lived[alloc_at[a->buf]] = 0;
        }
    }
    free(alloc_at);
    o->on = 1;
    return XSEG_SUCCESS;
}

void oracle_destroy(struct oracle *o)
{
    free(o->long_lived);
    o->long_lived = NULL;
    o->on = 0;
}

/* One routed malloc: begin, malloc, end, and the use dropped again, so that between the pool's
 * mallocs its cache is as reclaimable as the default pools' (trim and recycle skip pools in use). */
static xseg_status routed_malloc(struct oracle *o, void **p, size_t size, struct CUstream_st *stream)
{
    xseg_status st = xseg_begin_allocate_to_pool(0, o->pool, NULL, NULL);
    if (st)
        return st;
    xseg_status ms = xseg_malloc(p, size, 0, stream);
    (void)xseg_end_allocate_to_pool(0, o->pool);
    (void)xseg_release_pool(0, o->pool);
    return ms;
}

xseg_status oracle_malloc(struct oracle *o, void **p, size_t size, struct CUstream_st *stream)
{
    if (!o->pool.first && !o->pool.second && xseg_pool_create(&o->pool) != XSEG_SUCCESS)
        return xseg_malloc(p, size, 0, stream);
    xseg_status st = routed_malloc(o, p, size, stream);
    if (st == XSEG_ERROR_OUT_OF_MEMORY) {
        /* What malloc's recycle would give back (it is off while a pool records): the request's
         * pages' worth of cache, largest free runs first. */
        xseg_device_stats ds;
        if (xseg_get_stats(0, &ds) == XSEG_SUCCESS) {
            int64_t cache = ds.reserved_bytes[XSEG_STAT_ALL].current - ds.allocated_bytes[XSEG_STAT_ALL].current;
            int64_t page = size < (1u << 20) ? 2 << 20 : 20 << 20;
            int64_t need = ((int64_t)size + page - 1) / page * page;
            (void)xseg_trim(0, cache > need ? (size_t)(cache - need) : 0);
        }
        o->retried++;
        st = routed_malloc(o, p, size, stream);
    }
    if (st == XSEG_ERROR_OUT_OF_MEMORY) {
        o->fallbacks++;
        return xseg_malloc(p, size, 0, stream);
    }
    if (st == XSEG_SUCCESS) {
        o->routed++;
        o->routed_bytes += size;
    }
    return st;
}

void oracle_report(const struct oracle *o, FILE *f)
{
    if (!o->on)
        return;
    fprintf(f, "xseg-replay: XSEG_REPLAY_ORACLE: %llu allocations (%.1f MiB) to the long-lived pool, %llu retried "
               "after a trim, %llu to the default pool after a refusal\n",
            (unsigned long long)o->routed, (double)o->routed_bytes / (1 << 20), (unsigned long long)o->retried,
            (unsigned long long)o->fallbacks);
}
