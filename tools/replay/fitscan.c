/* xseg-replay --min-device's search. See fitscan.h. */
#include "tools/replay/fitscan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/replay/trace.h"

int fitscan_parse_ceiling(const char *s, struct fitscan_ceiling *c, char *err, size_t errlen)
{
    *c = (struct fitscan_ceiling){0};
    if (!strcmp(s, "none"))
        return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end != s && !*end && !errno && isfinite(v) && v >= 1.0 && v <= 100.0) {
        c->ratio = v;
        return 0;
    }
    uint64_t b;
    char e[TRACE_ERR_MAX];
    if (!trace_parse_size(s, strlen(s), &b, e, sizeof e) && b > 0 && (end == s || *end)) {
        c->bytes = b;
        return 0;
    }
    snprintf(err, errlen, "--fit-ceiling: '%.64s' is not a ratio to the peak allocated (at least 1, e.g. 1.10), a "
             "size (e.g. 45GiB) or none", s);
    return -1;
}

/* What is known of each size between the search's floor and the full device, one byte a step. */
enum { UNKNOWN = 0, FITS = 1, FAILS = 2 };
struct memo {
    fitscan_probe_fn probe;
    void *user;
    uint64_t base, step;
    unsigned char *known;
    int *probes;
};

/* Does a device of @p bytes (a multiple of the step, at least base) fit? 1, 0, -1 stopped. */
static int fits(struct memo *m, uint64_t bytes)
{
    unsigned char *k = &m->known[(bytes - m->base) / m->step];
    if (*k == UNKNOWN) {
        (*m->probes)++;
        int f = m->probe(m->user, bytes);
        if (f < 0)
            return f;
        *k = f ? FITS : FAILS;
    }
    return *k == FITS;
}

/* The runs of sizes in [lo, hi] whose state is @p want, into @p out (at most FITSCAN_RANGES_MAX
 * kept); the number of runs. */
static size_t runs_of(const struct memo *m, uint64_t lo, uint64_t hi, unsigned char want, struct fitscan_range *out)
{
    size_t n = 0;
    for (uint64_t s = lo; lo && s <= hi; s += m->step) {
        if (m->known[(s - m->base) / m->step] != want)
            continue;
        uint64_t e = s;
        while (e + m->step <= hi && m->known[(e + m->step - m->base) / m->step] == want)
            e += m->step;
        if (n < FITSCAN_RANGES_MAX)
            out[n] = (struct fitscan_range){s, e};
        n++;
        s = e;
    }
    return n;
}

uint64_t fitscan_floor(uint64_t peak, uint64_t step)
{
    return peak ? (peak - 1) / step * step : 0;
}

int fitscan_bisect(fitscan_probe_fn probe, void *user, uint64_t lo, uint64_t hi, uint64_t guess, uint64_t step,
                   uint64_t *answer, int *probes)
{
    *answer = hi;
    while (hi - lo > step) {
        uint64_t mid = lo + (hi - lo) / step / 2 * step;
        if (guess > lo && guess < hi) {
            mid = guess;
            guess = 0;
        }
        if (probes)
            (*probes)++;
        int f = probe(user, mid);
        if (f < 0)
            return f;
        if (f)
            hi = mid;
        else
            lo = mid;
        *answer = hi;
    }
    return 0;
}

/* How many sizes of [lo, hi] have not been replayed. */
static int unknown_in(const struct memo *m, uint64_t lo, uint64_t hi)
{
    int n = 0;
    for (uint64_t s = lo; s <= hi; s += m->step)
        n += m->known[(s - m->base) / m->step] == UNKNOWN;
    return n;
}

/* fitscan_bisect's probe over the memo. */
static int memo_probe(void *user, uint64_t bytes)
{
    return fits(user, bytes);
}

int fitscan_run(fitscan_probe_fn probe, void *user, uint64_t peak, uint64_t reserved, uint64_t top, uint64_t step,
                const struct fitscan_ceiling *ceiling, int probes_before, struct fitscan_result *r)
{
    memset(r, 0, sizeof *r);
    r->probes = probes_before;
    /* lo: certain (below the peak) or known not to fit; hi: known to fit. */
    uint64_t lo = fitscan_floor(peak, step), hi = top;
    struct memo m = {probe, user, lo, step, calloc((size_t)((top - lo) / step + 1), 1), &r->probes};
    if (!m.known)
        return -2;
    m.known[(top - lo) / step] = FITS;
    int rc = -1;
    if (fitscan_bisect(memo_probe, &m, lo, hi, (reserved + step - 1) / step * step, step, &hi, NULL))
        goto out;
    r->candidate = r->min_device = hi;
    if (ceiling->ratio <= 0 && !ceiling->bytes) {
        rc = 0; /* none: the bisection's answer */
        goto out;
    }
    uint64_t cap = ceiling->bytes ? ceiling->bytes / step * step : (uint64_t)ceil((double)peak * ceiling->ratio);
    cap = cap / step * step;
    if (cap > top)
        cap = top;
    if (cap < hi) {
        r->above_ceiling = 1;
        r->ceiling = cap;
        rc = 0;
        goto out;
    }
    /* What is left to replay, known now: the sizes up to the ceiling and the band below the
     * candidate not yet replayed (a progress line counts against it). */
    r->planned = r->probes + unknown_in(&m, hi + step, cap);
    for (int k = 1; k <= FITSCAN_BELOW_MAX && hi - (uint64_t)k * step > m.base; k++)
        r->planned += m.known[(hi - (uint64_t)k * step - m.base) / step] == UNKNOWN;
    /* Every size from the candidate up to the ceiling; past it while the ceiling itself fails
     * (the full device fits: this ends). */
    for (uint64_t s = hi + step; s <= cap; s += step)
        if (fits(&m, s) < 0)
            goto out;
    int f;
    while ((f = fits(&m, cap)) == 0) {
        cap += step;
        r->planned += m.known[(cap - m.base) / step] == UNKNOWN;
    }
    if (f < 0)
        goto out;
    r->ceiling = cap;
    /* The band below the candidate, for sizes that fit alone. */
    uint64_t floor = hi;
    for (int k = 0; k < FITSCAN_BELOW_MAX && floor - step > m.base; k++) {
        floor -= step;
        if (fits(&m, floor) < 0)
            goto out;
    }
    r->floor = floor < hi ? floor : 0;
    uint64_t a = cap; /* down through the fitting run that ends at the ceiling (hi less a step fails) */
    while (a > hi && m.known[(a - step - m.base) / step] == FITS)
        a -= step;
    r->min_device = a;
    uint64_t first = r->floor ? r->floor : hi;
    r->nisolated = runs_of(&m, first, a - step, FITS, r->isolated);
    if (r->nisolated) {
        first = r->isolated[0].lo;
        r->ngaps = runs_of(&m, first, a - step, FAILS, r->gaps);
    }
    rc = 0;
out:
    free(m.known);
    return rc;
}

void fitscan_ranges_text(const struct fitscan_range *rs, size_t n, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && i < FITSCAN_RANGES_MAX && k < len; i++) {
        unsigned long long lo = rs[i].lo >> 20, hi = rs[i].hi >> 20;
        if (lo == hi)
            k += (size_t)snprintf(buf + k, len - k, "%s%llu MiB", i ? ", " : "", lo);
        else
            k += (size_t)snprintf(buf + k, len - k, "%s%llu-%llu MiB", i ? ", " : "", lo, hi);
    }
    if (n > FITSCAN_RANGES_MAX && k < len)
        snprintf(buf + k, len - k, ", ...");
}
