/*
 * xseg-replay --min-device: the smallest device ABOVE WHICH EVERY SIZE FITS, up to a ceiling.
 *
 * Fit is not monotonic in the device size: the OOM path of a smaller device may free the cache
 * and retry where a larger one grows, and a layout that grew can fail later where the freed one
 * does not (tests/replay: a trace that fits 200-208 MiB, fails 210-214 MiB, fits from 216 MiB).
 * So a bisection's answer is only a candidate. The search (one replay per probe, the caller's):
 *   1. bisection between the peak allocated (no smaller device can fit) and the full device, as
 *      before: a candidate C (C fits, C less a step does not);
 *   2. a linear scan of every step from C up to the ceiling (1.10 x peak allocated unless told,
 *      at most the full device): the answer A is the smallest size from which every scanned size
 *      fits; sizes above the ceiling are not claimed (except the full device, replayed first);
 *   3. a linear scan of the band below C, down to the peak allocated but at most
 *      FITSCAN_BELOW_MAX steps: the sizes under A that fit are "isolated" fits, reported apart.
 * Cost: 1 + about log2((full - peak) / step) + (ceiling - C) / step + min(FITSCAN_BELOW_MAX,
 * (C - peak) / step) replays; each size is replayed at most once.
 */
#ifndef XSEG_TOOLS_REPLAY_FITSCAN_H
#define XSEG_TOOLS_REPLAY_FITSCAN_H

#include <stddef.h>
#include <stdint.h>

/* The band below the candidate scanned for isolated fits, in steps (64 MiB at 2 MiB). */
#define FITSCAN_BELOW_MAX 32
#define FITSCAN_RANGES_MAX 8
#define FITSCAN_DEFAULT_RATIO 1.10

/* One replay on a device of @p bytes: 1 it fits (no failed allocation), 0 it does not, -1 the
 * replay itself stopped (no answer), -2 stop searching (a budget ran out: no answer). */
typedef int (*fitscan_probe_fn)(void *user, uint64_t bytes);

/*
 * The bisection every smallest-device answer of xseg-replay comes from (the verdict, --min-device,
 * --tune and --report): between @p lo (known not to fit, or below the peak allocated) and @p hi
 * (known to fit), both multiples of @p step, probing @p guess first when it lies strictly between
 * them (the peak reserved rounded up to the step: it usually fits, which leaves a short range),
 * then midpoints. *@p answer: the smallest size found to fit with the step below it found not to
 * (or, when the probe stopped the search, the smallest size known to fit: an upper bound).
 * @p probes (optional) counts the replays. @return 0 done, else the probe's -1 or -2.
 */
int fitscan_bisect(fitscan_probe_fn probe, void *user, uint64_t lo, uint64_t hi, uint64_t guess, uint64_t step,
                   uint64_t *answer, int *probes);

/* The bisection's lower end for a replay whose peak allocated was @p peak: the largest multiple
 * of @p step under it (no smaller device can fit). */
uint64_t fitscan_floor(uint64_t peak, uint64_t step);

/* --fit-ceiling: a ratio to the peak allocated (ratio > 0), a size (bytes > 0), or none (both
 * 0: bisection only, no scan). */
struct fitscan_ceiling {
    double ratio;
    uint64_t bytes;
};

/* A run of sizes, both ends included. */
struct fitscan_range {
    uint64_t lo, hi;
};

struct fitscan_result {
    uint64_t candidate;   /* the bisection's answer */
    uint64_t min_device;  /* A: every scanned size from it up to `ceiling` fits */
    uint64_t ceiling;     /* the highest size scanned (0: no scan) */
    uint64_t floor;       /* the lowest size scanned below the candidate (0: none) */
    int above_ceiling;    /* the candidate lies above the ceiling: not scanned, A = C */
    struct fitscan_range isolated[FITSCAN_RANGES_MAX]; /* fitting runs below A, lowest first */
    size_t nisolated;     /* how many (more than FITSCAN_RANGES_MAX: the first ones kept) */
    struct fitscan_range gaps[FITSCAN_RANGES_MAX];     /* failing runs between the lowest fit and A */
    size_t ngaps;
    int probes;           /* replays made, the one on the full device included */
    int planned;          /* the replays the whole search makes, once the bisection is done (0 before):
                           * a progress line's "N of M"; it grows only while the ceiling itself fails */
};

/* "1.10" (a ratio, at least 1), "900MiB" / "45GiB" (a size), "none". @return 0, or -1 with a
 * message naming the value in @p err. */
int fitscan_parse_ceiling(const char *s, struct fitscan_ceiling *c, char *err, size_t errlen);

/*
 * The search above for one (trace, mode). @p peak: the peak allocated of the replay on @p top
 * (the full device, a multiple of @p step, which fitted); @p reserved: its peak reserved (the
 * bisection's first guess). @p probes_before: replays already made (the one on @p top).
 * @return 0 (*@p r filled), -1 when a replay stopped, -2 out of host memory.
 */
int fitscan_run(fitscan_probe_fn probe, void *user, uint64_t peak, uint64_t reserved, uint64_t top, uint64_t step,
                const struct fitscan_ceiling *ceiling, int probes_before, struct fitscan_result *r);

/* "200-208 MiB, 230 MiB" (the ranges in MiB) into @p buf. */
void fitscan_ranges_text(const struct fitscan_range *rs, size_t n, char *buf, size_t len);

#endif
