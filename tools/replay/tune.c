/* xseg-replay --tune. See tune.h. */
#include "tools/replay/tune.h"

#include <inttypes.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/replay/fitscan.h"
#include "tools/replay/report.h"

static const double GiB = 1073741824.0;
#define CANON_MAX 1024           /* a canonical config string (cfg_format) */

/* One searched key and its values; values[0] is the family's default (left unset). */
struct axis {
    const char *key;
    const char *values[7];
};

struct family {
    const char *name, *env;
    const char *fixed;       /* keys every replay of the family runs with, never shown */
    const struct axis *axes;
    size_t naxes;
};

/* expandable_segments first: the others are searched under the mode it picked. */
static const struct axis pytorch_axes[] = {
    {"expandable_segments", {"False", "True"}},
    {"max_split_size_mb", {"", "64", "128", "256", "512", "1024"}},
    {"roundup_power2_divisions", {"", "1", "2", "4", "8", "16"}},
    {"garbage_collection_threshold", {"", "0.6", "0.8"}},
};
static const struct axis xseg_axes[] = {
    {"expandable_chunk_mb", {"", "2", "4", "8"}},
    {"expandable_page_size_mb", {"", "2", "4", "8"}},
    {"max_split_size_mb", {"", "64", "128", "256", "512", "1024"}},
    {"roundup_power2_divisions", {"", "1", "2", "4", "8", "16"}},
    {"garbage_collection_threshold", {"", "0.6", "0.8"}},
};
static const struct family families[TUNE_FAMILIES] = {
    /* classic mode is PyTorch's allocator; expandable with recycle and defrag off is its
     * expandable layout and OOM path (the fixed keys only matter when expandable) */
    {"PyTorch's allocator", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments_recycle:False,expandable_segments_defrag:False",
     pytorch_axes, sizeof pytorch_axes / sizeof pytorch_axes[0]},
    {"xseg", "XSEG_ALLOC_CONF", "expandable_segments:True", xseg_axes, sizeof xseg_axes / sizeof xseg_axes[0]},
};

static size_t nvalues(const struct axis *a)
{
    size_t n = 0;
    while (n < 7 && a->values[n])
        n++;
    return n;
}

xseg_status tune_parse_budget(const char *s, struct tune_budget *b, char *err, size_t errlen)
{
    char *end;
    double v = strtod(s, &end);
    while (*end == ' ')
        end++;
    int runs = !strcmp(end, "runs") || !strcmp(end, "run");
    if (end == s || !(v > 0) || !isfinite(v) || !(runs || !*end || !strcmp(end, "s")) ||
        (runs && (v != floor(v) || v > 1e6))) {
        snprintf(err, errlen, "--tune-budget: '%.64s' is not seconds or runs (e.g. 60s, 40runs)", s);
        return XSEG_ERROR_INVALID_VALUE;
    }
    *b = runs ? (struct tune_budget){.runs = (unsigned)v} : (struct tune_budget){.seconds = v};
    return XSEG_SUCCESS;
}

/* The search's state: the budget, the probe, every config tried. */
struct search {
    tune_probe_fn probe;
    void *user;
    uint64_t device, step;
    struct tune_budget budget;
    double t0;
    unsigned runs;
    int progress;
    char (*seen)[CANON_MAX]; /* the canonical configs tried */
    size_t nseen, cap;
    int cut_short;          /* a stage stopped with candidates left (its share of the budget spent) */
    const char *stage;
    int over;               /* the seconds ran out (a replay was stopped, or none could start) */
    const char *cut_by;     /* the first bound that stopped the search: "replays" or "seconds" */
    int stopped_replay;     /* a replay in progress was stopped at the deadline */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The end of the budget's seconds (CLOCK_MONOTONIC), 0 for none: every replay stops there. */
static double deadline(const struct search *s)
{
    return s->budget.seconds > 0 ? s->t0 + s->budget.seconds : 0;
}

/* May another replay start? @p share: the part of the budget spent so far that this stage may
 * reach. Asked only when there is a replay to start: a no notes that the search was cut short. */
static int budget_left(struct search *s, double share)
{
    const char *by = s->over ? "seconds"
                     : s->budget.runs && s->runs >= (unsigned)ceil(s->budget.runs * share) ? "replays"
                     : s->budget.seconds > 0 && now_s() - s->t0 >= s->budget.seconds * share ? "seconds"
                                                                                                 : NULL;
    if (by) {
        s->cut_short = 1;
        if (!s->cut_by)
            s->cut_by = by;
        return 0;
    }
    return 1;
}

/* One replay: 0 done, -1 stopped, 1 the budget's seconds ran out (before or during it). */
static int probe_once(struct search *s, const char *config, uint64_t device, struct run_summary *sum)
{
    double end = deadline(s);
    if (s->over || (end > 0 && now_s() >= end)) {
        s->over = 1;
        if (!s->cut_by)
            s->cut_by = "seconds";
        return 1;
    }
    s->runs++;
    if (s->progress)
        fprintf(stderr, "\rxseg-replay: --tune: %s, %u replays in %.0f s (budget %g %s)   ", s->stage, s->runs,
                now_s() - s->t0, s->budget.runs ? (double)s->budget.runs : s->budget.seconds,
                s->budget.runs ? "replays" : "s");
    int r = s->probe(s->user, config, device, end, sum);
    if (r > 0) {
        s->over = s->stopped_replay = 1;
        if (!s->cut_by)
            s->cut_by = "seconds";
    }
    return r;
}

static int probe(struct search *s, const char *config, uint64_t device, struct run_summary *sum)
{
    int r = probe_once(s, config, device, sum);
    if (r >= 0)
        return r;
    /* A replay that stopped (a child that could not start, or was killed, on a loaded host) is
     * tried once more before the config counts as one that cannot replay. */
    return probe_once(s, config, device, sum);
}

/* The candidate for @p pick (one value index per axis): its shown keys and replay config.
 * @return 0, or -1 when the config parser refuses the combination (e.g. expandable_chunk_mb
 * over expandable_page_size_mb): such a config is never replayed. */
static int compose(const struct family *f, const size_t *pick, struct tune_candidate *c)
{
    memset(c, 0, sizeof *c);
    size_t n = 0;
    for (size_t i = 0; i < f->naxes; i++) {
        const char *v = f->axes[i].values[pick[i]];
        if (!pick[i] || !*v)
            continue; /* the default: left unset */
        n += (size_t)snprintf(c->shown + n, n < sizeof c->shown ? sizeof c->shown - n : 0, "%s%s:%s", n ? "," : "",
                              f->axes[i].key, v);
    }
    int expandable = f->axes == xseg_axes || pick[0] == 1;
    if (f->axes == pytorch_axes && !expandable)
        snprintf(c->config, sizeof c->config, "expandable_segments:False%s%s", *c->shown ? "," : "", c->shown);
    else
        snprintf(c->config, sizeof c->config, "%s%s%s", f->fixed, *c->shown ? "," : "", c->shown);
    /* The parser the replay's xseg_init runs, on the defaults the replay starts from. */
    return xseg_check_config(c->config, NULL, 0, NULL) == XSEG_SUCCESS ? 0 : -1;
}

/* @p c's canonical config (every key, as the parser resolved it): two spellings of one
 * configuration are one candidate. */
static void canonical(const struct tune_candidate *c, char *buf, size_t len)
{
    size_t n = len;
    if (xseg_check_config(c->config, buf, len, &n) != XSEG_SUCCESS)
        n = len;
    if (n >= len) /* refused, or longer than the buffer: its own spelling */
        snprintf(buf, len, "%s", c->config);
}

/* Seen before in this search (by canonical config)? If not, it is noted. -1: out of memory. */
static int seen(struct search *s, const struct tune_candidate *c)
{
    char key[CANON_MAX] = "";
    canonical(c, key, sizeof key);
    for (size_t i = 0; i < s->nseen; i++)
        if (!strcmp(s->seen[i], key))
            return 1;
    if (s->nseen == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        char(*n)[CANON_MAX] = realloc(s->seen, cap * sizeof *n);
        if (!n)
            return -1;
        s->seen = n;
        s->cap = cap;
    }
    memcpy(s->seen[s->nseen++], key, CANON_MAX);
    return 0;
}

/* One replay of @p c on the full device: its figures. 0 done, -1 stopped, 1 over budget. */
static int full_replay(struct search *s, struct tune_candidate *c)
{
    struct run_summary sum;
    int r = probe(s, c->config, 0, &sum);
    if (r != 0)
        return r;
    c->peak_reserved = sum.peak_reserved;
    c->peak_allocated = sum.peak_allocated;
    c->failed_allocs = sum.failed_allocs;
    c->reserved_after_empty_cache = sum.reserved_after_empty_cache;
    return 0;
}

static uint64_t round_up(const struct search *s, uint64_t v)
{
    return (v + s->step - 1) / s->step * s->step;
}

/* fitscan_bisect's probe for one candidate, within the family's share of the budget. */
struct bis_ctx {
    struct search *s;
    const struct tune_candidate *c;
    double share;
};

static int bis_probe(void *user, uint64_t bytes)
{
    struct bis_ctx *b = user;
    if (!budget_left(b->s, b->share))
        return -2;
    struct run_summary sum;
    int r = probe(b->s, b->c->config, bytes, &sum);
    return r > 0 ? -2 : r < 0 ? -1 : sum.failed_allocs == 0;
}

/* The smallest device of @p c by fitscan_bisect (the search every answer of xseg-replay uses)
 * between @p lo (fails, or below the peak allocated) and @p hi (fits), @p guess first. Stopped by
 * the family's @p share of the budget: min_device is then an upper bound (device_exact 0); a
 * replay that stopped on the first size tried leaves no smallest device (stopped). */
static void bisect_between(struct search *s, struct tune_candidate *c, uint64_t lo, uint64_t hi, uint64_t guess,
                           double share)
{
    struct bis_ctx b = {s, c, share};
    int probes = 0;
    int r = fitscan_bisect(bis_probe, &b, lo, hi, guess, s->step, &c->min_device, &probes);
    c->device_exact = r == 0;
    if (r == -1 && probes == 1 && guess > lo && guess < hi)
        c->stopped = 1;
}

/* The default's smallest device: the bisection of the verdict and --min-device, from the peak
 * allocated up to the full device, its peak reserved (rounded up to the step) tried first. */
static void bisect(struct search *s, struct tune_candidate *c, double share)
{
    if (c->failed_allocs || c->min_device || c->stopped || !budget_left(s, share))
        return;
    uint64_t lo = fitscan_floor(c->peak_allocated > 0 ? (uint64_t)c->peak_allocated : 0, s->step);
    bisect_between(s, c, lo, s->device, round_up(s, (uint64_t)c->peak_reserved), share);
    if (c->stopped)
        c->min_device = 0;
}

/* Does @p c beat @p cur (the family's pick so far)? Ranked by the smallest device: when @p cur
 * has one, @p c is replayed once on 2 MiB less, and beats it only if it fits there (then its
 * own smallest device is bisected below that and its peak reserved taken on the full device),
 * and only if what it reserves more than @p cur on the full device is no more than the device it
 * saves: a line that fits 2 MiB less by reserving 21 GiB more where there is room (builtin:training's
 * max_split_size_mb:256 on top of 2 MiB chunks and pages) is a trade, not a gain, and is not
 * recommended (tune_print says the trade of a pick that still reserves more than the defaults).
 * When @p cur fails on the full device, @p c beats it by fitting there, or by fewer failed
 * allocations. Equal outcomes keep @p cur: a key is changed only for a smaller device.
 * @return 1 better (@p c filled), 0 not, -2 out of the budget. */
static int challenge(struct search *s, const struct tune_candidate *cur, struct tune_candidate *c, double share)
{
    struct run_summary sum;
    if (cur->min_device && !cur->stopped) {
        if (cur->min_device <= s->step)
            return 0;
        uint64_t target = cur->min_device - s->step;
        int r = probe(s, c->config, target, &sum);
        if (r > 0)
            return -2;
        if (r < 0 || sum.failed_allocs)
            return 0;
        uint64_t lo = fitscan_floor(sum.peak_allocated > 0 ? (uint64_t)sum.peak_allocated : 0, s->step);
        /* Its figures on the full device first (what the line reports), then its device. */
        c->peak_reserved = sum.peak_reserved;
        c->peak_allocated = sum.peak_allocated;
        if (budget_left(s, share))
            full_replay(s, c); /* when it did not finish: the figures of the smaller device */
        if (c->failed_allocs) { /* fits smaller but not on the full device: not monotone, not taken */
            c->failed_allocs = 0;
            return 0;
        }
        bisect_between(s, c, lo < target ? lo : 0, target, 0, share);
        if (c->min_device && !c->stopped && c->peak_reserved > cur->peak_reserved &&
            (uint64_t)(c->peak_reserved - cur->peak_reserved) > cur->min_device - c->min_device)
            return 0;
        return 1;
    }
    int r = full_replay(s, c);
    if (r > 0)
        return -2;
    if (r < 0)
        return 0;
    if (c->failed_allocs) {
        if (cur->stopped || c->failed_allocs < cur->failed_allocs)
            return 1;
        return 0;
    }
    bisect(s, c, share);
    return !c->stopped || cur->stopped ? 1 : 0;
}

/* One family: its default (replayed on the full device, its smallest device bisected), then a
 * coordinate search in the axes' fixed order: each axis in turn tries its values (those the
 * parser accepts, each configuration once) against the pick so far and keeps a value that gives
 * a smaller device; passes repeat until one changes nothing. The family may spend the budget up
 * to @p share (its own part, and what the ones before it left). Runner-up: the last pick the
 * best displaced, else the first alternative tried (its figures replayed). */
static void search_family(struct search *s, const struct family *f, double share, enum tune_depth depth,
                          const struct run_summary *seed, struct tune_family_result *fr, int *failed)
{
    fr->name = f->name;
    fr->env = f->env;
    size_t pick[8] = {0};
    struct tune_candidate cur, first_alt;
    int have_first_alt = 0;
    compose(f, pick, &cur); /* the defaults: always accepted */
    if (seen(s, &cur) < 0)
        return;
    int r = 0;
    if (seed) { /* the caller's replay of the default on the full device (deterministic: the same figures) */
        cur.peak_reserved = seed->peak_reserved;
        cur.peak_allocated = seed->peak_allocated;
        cur.failed_allocs = seed->failed_allocs;
        cur.reserved_after_empty_cache = seed->reserved_after_empty_cache;
    } else {
        r = full_replay(s, &cur);
    }
    if (r > 0) {
        fr->over_budget = 1;
        return;
    }
    if (r < 0) {
        *failed = 1;
        return;
    }
    bisect(s, &cur, share);
    fr->def = cur;
    fr->have_def = 1;
    if (depth == TUNE_DEFAULT_ONLY) {
        fr->best = cur;
        fr->have_best = 1;
        return;
    }
    for (int pass = 0, changed = 1; changed && pass < 3; pass++) {
        changed = 0;
        for (size_t a = 0; a < f->naxes; a++) {
            size_t keep = pick[a];
            for (size_t v = 0; v < nvalues(&f->axes[a]); v++) {
                if (v == keep)
                    continue;
                struct tune_candidate c;
                pick[a] = v;
                if (compose(f, pick, &c) || seen(s, &c))
                    continue; /* refused by the parser, or the same configuration as one tried */
                if (!budget_left(s, share)) {
                    pick[a] = keep;
                    goto done;
                }
                int b = challenge(s, &cur, &c, share);
                if (b == -2) {
                    pick[a] = keep;
                    goto done;
                }
                if (!have_first_alt) {
                    first_alt = c;
                    have_first_alt = 1;
                }
                if (b == 1) {
                    fr->runner_up = cur;
                    fr->have_runner_up = 1;
                    cur = c;
                    keep = v;
                    changed = 1;
                }
            }
            pick[a] = keep;
        }
    }
done:
    fr->best = cur;
    fr->have_best = 1;
    if (fr->have_runner_up || !have_first_alt)
        return;
    /* The best is the default: the runner-up is the first alternative tried, with its own
     * figures (it did not fit on the best's device less a step: its device lies above). */
    if (!first_alt.peak_reserved && !first_alt.failed_allocs && budget_left(s, share) &&
        full_replay(s, &first_alt) != 0)
        return;
    if (!first_alt.failed_allocs && !first_alt.min_device && budget_left(s, share)) {
        uint64_t lo = cur.min_device > s->step ? cur.min_device - s->step : 0;
        bisect_between(s, &first_alt, lo, s->device, round_up(s, (uint64_t)first_alt.peak_reserved), share);
        if (first_alt.stopped)
            first_alt.min_device = 0;
    }
    if (first_alt.peak_reserved || first_alt.failed_allocs) {
        fr->runner_up = first_alt;
        fr->have_runner_up = 1;
    }
}

xseg_status tune_run(tune_probe_fn probe_fn, void *user, uint64_t device_bytes, const struct tune_budget *b,
                     const struct tune_plan *plan, int progress, struct tune_result *r, char *err, size_t errlen)
{
    static const struct tune_plan full = {{TUNE_FULL, TUNE_FULL}, {NULL, NULL}, 0, 0};
    if (!plan)
        plan = &full;
    memset(r, 0, sizeof *r);
    double started = now_s();
    struct search s = {.probe = probe_fn, .user = user, .device = device_bytes, .budget = *b,
                       .t0 = plan->t0 > 0 ? plan->t0 : started, .progress = progress, .stage = "searching",
                       .step = plan->step ? plan->step : (uint64_t)2 << 20};
    s.device = s.device / s.step * s.step;
    int failed = 0;
    /* Each family its share of the budget, in order: the first may not starve the second. A
     * family left out still counts its share (the same picks, whichever families run). */
    for (size_t f = 0; f < TUNE_FAMILIES && !failed; f++) {
        r->fam[f].name = families[f].name;
        r->fam[f].env = families[f].env;
        if (plan->depth[f] == TUNE_SKIP)
            continue;
        s.stage = f ? "searching xseg's configs" : "searching PyTorch's configs";
        search_family(&s, &families[f], (double)(f + 1) / TUNE_FAMILIES, plan->depth[f], plan->seed[f], &r->fam[f],
                      &failed);
    }
    xseg_status st = XSEG_SUCCESS;
    if (failed) {
        snprintf(err, errlen, "--tune: the trace does not replay with the default config (see the replay's message)");
        st = XSEG_ERROR_INVALID_VALUE;
    }
    r->runs = s.runs;
    r->seconds = now_s() - started;
    r->cut_short = s.cut_short || s.over;
    r->stopped_replay = s.stopped_replay;
    r->budget_seconds = s.budget.seconds;
    r->budget_runs = s.budget.runs;
    r->cut_by = r->cut_short ? (s.cut_by ? s.cut_by : "seconds") : NULL;
    if (progress)
        fprintf(stderr, "\r%60s\r", "");
    free(s.seen);
    return st;
}

void tune_budget_text(const struct tune_result *r, char *buf, size_t len)
{
    if (r->cut_by && !strcmp(r->cut_by, "seconds"))
        snprintf(buf, len, "the time budget (%g s)", r->budget_seconds);
    else if (r->budget_runs)
        snprintf(buf, len, "the replay budget (%u replays)", r->budget_runs);
    else
        snprintf(buf, len, "no budget");
}

void tune_env_line(const struct tune_family_result *f, const struct tune_candidate *c, char *buf, size_t len)
{
    if (*c->shown)
        snprintf(buf, len, "%s=%s", f->env, c->shown);
    else
        snprintf(buf, len, "%s unset (the defaults)", f->env);
}

static void figures(FILE *out, const char *label, const struct tune_family_result *f, const struct tune_candidate *c)
{
    char line[400];
    tune_env_line(f, c, line, sizeof line);
    fprintf(out, "  %-10s %s\n  %-10s predicted: peak reserved %.3f GiB", label, line, "", (double)c->peak_reserved / GiB);
    if (c->stopped)
        fprintf(out, ", but a replay on a smaller device stopped (no smallest device)");
    else if (c->failed_allocs)
        fprintf(out, ", %llu failed allocs on the full device", (unsigned long long)c->failed_allocs);
    else if (c->min_device)
        fprintf(out, ", smallest device %s%.3f GiB", c->device_exact ? "" : "<= ", (double)c->min_device / GiB);
    fputc('\n', out);
}

/* A pick that reserves more than its family's default on the device replayed buys its smaller
 * device with that cache (it grows where there is room, the OOM path gives it back on a smaller
 * device): said beside it, in figures, so a user on the roomy device sees the trade. Only where
 * the extra is more than one 2 MiB step. */
static void tradeoff(FILE *out, const struct tune_family_result *f, const struct tune_candidate *c)
{
    if (!f->have_def || c == &f->def || c->peak_reserved <= f->def.peak_reserved + (2 << 20) ||
        !c->min_device || !f->def.min_device || c->stopped || f->def.stopped)
        return;
    double extra = (double)(c->peak_reserved - f->def.peak_reserved) / GiB;
    double gain = f->def.min_device > c->min_device ? (double)(f->def.min_device - c->min_device) / GiB : 0;
    fprintf(out, "  %-10s trade-off: %.3f GiB smaller device than the defaults, but %.3f GiB more reserved on the "
                 "device replayed (%.3f against %.3f GiB)%s\n", "", gain, extra, (double)c->peak_reserved / GiB,
            (double)f->def.peak_reserved / GiB,
            extra > gain ? ": on a device with room, the defaults keep less" : "");
}

void tune_print(FILE *out, const char *trace, const struct tune_result *r)
{
    char budget[96];
    tune_budget_text(r, budget, sizeof budget);
    fprintf(out, "== --tune %s: %u replay%s in %.1f s", trace, r->runs, r->runs == 1 ? "" : "s", r->seconds);
    if (r->cut_short)
        fprintf(out, " (cut short by %s: --tune-budget for more; the picks are of the configs tried)\n", budget);
    else
        fprintf(out, " (the search completed within %s)\n", budget);
    if (r->stopped_replay)
        fprintf(out, "The budget's %g s ran out during a replay: it was stopped there; the figures are of the "
                     "replays that finished.\n", r->budget_seconds);
    for (size_t i = 0; i < TUNE_FAMILIES; i++) {
        const struct tune_family_result *f = &r->fam[i];
        if (f->over_budget)
            fprintf(out, "%s:\n  no replay finished within %s: --tune-budget for more\n", f->name, budget);
        if (!f->have_best)
            continue;
        fprintf(out, "%s:\n", f->name);
        figures(out, "best", f, &f->best);
        tradeoff(out, f, &f->best);
        if (f->have_runner_up) {
            figures(out, "runner-up", f, &f->runner_up);
            tradeoff(out, f, &f->runner_up);
        }
        if (f->have_def)
            figures(out, "default", f, &f->def);
    }
    fputc('\n', out);
}

static void json_candidate(FILE *out, const char *trace, size_t fam, const char *rank,
                           const struct tune_family_result *f, const struct tune_candidate *c)
{
    char line[400];
    tune_env_line(f, c, line, sizeof line);
    fputs("{\"tune\": ", out);
    report_json_string(out, trace);
    fprintf(out, ", \"family\": \"%s\", \"rank\": \"%s\", \"env\": ", fam ? "xseg" : "pytorch", rank);
    report_json_string(out, line);
    fputs(", \"config\": ", out);
    report_json_string(out, c->shown);
    fputs(", \"replay_config\": ", out);
    report_json_string(out, c->config);
    fprintf(out, ", \"peak_reserved_bytes\": %" PRId64 ", \"failed_allocs\": %" PRIu64 ", \"stopped\": %s",
            c->peak_reserved, c->failed_allocs, c->stopped ? "true" : "false");
    if (c->min_device)
        fprintf(out, ", \"min_device_bytes\": %" PRIu64 ", \"min_device_exact\": %s}\n", c->min_device,
                c->device_exact ? "true" : "false");
    else
        fputs(", \"min_device_bytes\": null, \"min_device_exact\": false}\n", out);
}

void tune_print_json(FILE *out, const char *trace, const struct tune_result *r)
{
    for (size_t i = 0; i < TUNE_FAMILIES; i++) {
        const struct tune_family_result *f = &r->fam[i];
        if (f->have_best)
            json_candidate(out, trace, i, "best", f, &f->best);
        if (f->have_runner_up)
            json_candidate(out, trace, i, "runner-up", f, &f->runner_up);
        if (f->have_def)
            json_candidate(out, trace, i, "default", f, &f->def);
    }
    fputs("{\"tune\": ", out);
    report_json_string(out, trace);
    fprintf(out, ", \"replays\": %u, \"seconds\": %.3f, \"cut_short\": %s, \"cut_by\": ", r->runs, r->seconds,
            r->cut_short ? "true" : "false");
    if (r->cut_by)
        fprintf(out, "\"%s\"", r->cut_by);
    else
        fputs("null", out);
    if (r->budget_runs)
        fprintf(out, ", \"budget_replays\": %u", r->budget_runs);
    else
        fputs(", \"budget_replays\": null", out);
    if (r->budget_seconds > 0)
        fprintf(out, ", \"budget_seconds\": %g", r->budget_seconds);
    else
        fputs(", \"budget_seconds\": null", out);
    fprintf(out, ", \"stopped_replay\": %s, \"no_result\": [", r->stopped_replay ? "true" : "false");
    for (size_t i = 0, n = 0; i < TUNE_FAMILIES; i++)
        if (r->fam[i].over_budget)
            fprintf(out, "%s\"%s\"", n++ ? ", " : "", i ? "xseg" : "pytorch");
    fputs("]}\n", out);
}
