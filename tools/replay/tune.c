/* xseg-replay --tune. See tune.h. */
#include "tools/replay/tune.h"

#include <inttypes.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/replay/report.h"

static const double GiB = 1073741824.0;
#define STEP ((uint64_t)2 << 20) /* the bisection's step: the driver's granularity */
#define TUNE_BISECTED 5          /* configs per family whose smallest device is bisected */

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
    uint64_t device;
    struct tune_budget budget;
    double t0;
    unsigned runs;
    int progress;
    struct tune_candidate *tried;
    size_t ntried, cap;
    const char *stage;
    int over;               /* the seconds ran out (a replay was stopped, or none could start) */
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

/* May another replay start? @p share: the part of the budget this stage may use. */
static int budget_left(const struct search *s, double share)
{
    if (s->over)
        return 0;
    if (s->budget.runs && s->runs >= (unsigned)ceil(s->budget.runs * share))
        return 0;
    if (s->budget.seconds > 0 && now_s() - s->t0 >= s->budget.seconds * share)
        return 0;
    return 1;
}

/* One replay: 0 done, -1 stopped, 1 the budget's seconds ran out (before or during it). */
static int probe_once(struct search *s, const char *config, uint64_t device, struct run_summary *sum)
{
    double end = deadline(s);
    if (s->over || (end > 0 && now_s() >= end)) {
        s->over = 1;
        return 1;
    }
    s->runs++;
    if (s->progress)
        fprintf(stderr, "\rxseg-replay: --tune: %s, %u replays in %.0f s (budget %g %s)   ", s->stage, s->runs,
                now_s() - s->t0, s->budget.runs ? (double)s->budget.runs : s->budget.seconds,
                s->budget.runs ? "replays" : "s");
    int r = s->probe(s->user, config, device, end, sum);
    if (r > 0)
        s->over = s->stopped_replay = 1;
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

/* Lower is better: fits on the full device first, then the smallest device (known before
 * unknown), then peak reserved. */
static int better(const struct tune_candidate *a, const struct tune_candidate *b)
{
    if (a->stopped != b->stopped)
        return !a->stopped;
    if ((a->failed_allocs == 0) != (b->failed_allocs == 0))
        return a->failed_allocs == 0;
    if (!a->min_device != !b->min_device) /* a bisected config ranks before one never bisected */
        return a->min_device != 0;
    if (a->min_device != b->min_device)
        return a->min_device < b->min_device;
    return a->peak_reserved < b->peak_reserved;
}

/* The candidate for @p pick (one value index per axis): its shown keys and replay config. */
static void compose(const struct family *f, const size_t *pick, struct tune_candidate *c)
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
}

/* Replay @p c once on the full device (or find it among those tried). 0 done, -1 stopped, 1 over
 * budget. */
static int evaluate(struct search *s, struct tune_candidate *c)
{
    for (size_t i = 0; i < s->ntried; i++)
        if (!strcmp(s->tried[i].config, c->config)) {
            *c = s->tried[i];
            return 0;
        }
    struct run_summary sum;
    int r = probe(s, c->config, 0, &sum);
    if (r != 0)
        return r;
    c->peak_reserved = sum.peak_reserved;
    c->peak_allocated = sum.peak_allocated;
    c->failed_allocs = sum.failed_allocs;
    if (s->ntried == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        struct tune_candidate *n = realloc(s->tried, cap * sizeof *n);
        if (!n)
            return -1;
        s->tried = n;
        s->cap = cap;
    }
    s->tried[s->ntried++] = *c;
    return 0;
}

/* Coordinate search from the defaults: each axis in turn takes its best value, until a pass
 * changes nothing or the stage's budget is spent. */
static void coordinate_search(struct search *s, const struct family *f)
{
    size_t pick[8] = {0};
    struct tune_candidate cur;
    compose(f, pick, &cur);
    if (evaluate(s, &cur))
        return;
    for (int pass = 0, changed = 1; changed && pass < 3; pass++) {
        changed = 0;
        for (size_t a = 0; a < f->naxes; a++) {
            size_t keep = pick[a];
            for (size_t v = 0; v < nvalues(&f->axes[a]) && budget_left(s, 0.3 * (f == &families[0] ? 1 : 2)); v++) {
                if (v == keep)
                    continue;
                struct tune_candidate c;
                pick[a] = v;
                compose(f, pick, &c);
                if (evaluate(s, &c) == 0 && better(&c, &cur)) {
                    cur = c;
                    keep = v;
                    changed = 1;
                }
            }
            pick[a] = keep;
        }
    }
}

/* The smallest device (2 MiB steps) @p c replays on with no failed allocation. */
static void bisect(struct search *s, struct tune_candidate *c)
{
    if (c->failed_allocs || c->min_device || c->stopped || !budget_left(s, 1.0))
        return;
    uint64_t hi = ((uint64_t)c->peak_reserved + STEP - 1) / STEP * STEP;
    uint64_t lo = c->peak_allocated > 0 ? ((uint64_t)c->peak_allocated - 1) / STEP * STEP : 0;
    struct run_summary sum;
    int r = hi > s->device ? 0 : probe(s, c->config, hi, &sum);
    if (r > 0)
        return; /* out of time before the first answer: not bisected */
    if (r == 0 && (hi > s->device || sum.failed_allocs))
        hi = s->device; /* the device needed more than what was reserved: stay on the full one */
    c->min_device = hi;
    while (r == 0 && hi - lo > STEP && budget_left(s, 1.0)) {
        uint64_t mid = lo + (hi - lo) / STEP / 2 * STEP;
        if ((r = probe(s, c->config, mid, &sum)) != 0)
            break;
        if (sum.failed_allocs)
            lo = mid;
        else
            hi = mid;
        c->min_device = hi;
    }
    if (r < 0) { /* no answer: it ranks after every config that has one */
        c->stopped = 1;
        c->min_device = 0;
    } /* out of time (r > 0): min_device stays the upper bound found so far */
    c->device_exact = r == 0 && hi - lo <= STEP;
}

/* Ranked; among equal figures, the config with fewer keys first (nothing set for nothing). */
static int by_rank(const void *x, const void *y)
{
    const struct tune_candidate *a = x, *b = y;
    if (better(a, b))
        return -1;
    if (better(b, a))
        return 1;
    size_t la = strlen(a->shown), lb = strlen(b->shown);
    return la < lb ? -1 : la > lb ? 1 : strcmp(a->shown, b->shown);
}

static int same_figures(const struct tune_candidate *a, const struct tune_candidate *b)
{
    return a->peak_reserved == b->peak_reserved && a->min_device == b->min_device && a->failed_allocs == b->failed_allocs;
}

/* Of a family's configs (@p from..@p to in s->tried): the default, and the best and runner-up
 * after bisecting the default and the most promising few. */
static void finish_family(struct search *s, const struct family *f, size_t from, size_t to,
                          struct tune_family_result *fr)
{
    fr->name = f->name;
    fr->env = f->env;
    struct tune_candidate *c = s->tried + from;
    size_t n = to - from;
    if (!n)
        return;
    bisect(s, &c[0]); /* the first tried: the defaults, the baseline of the figures */
    fr->def = c[0];
    fr->have_def = 1;
    qsort(c, n, sizeof *c, by_rank);
    for (size_t i = 0, done = 0; i < n && done < TUNE_BISECTED && budget_left(s, 1.0); i++)
        if (!c[i].min_device && !c[i].failed_allocs && !c[i].stopped) {
            bisect(s, &c[i]);
            done++;
        }
    qsort(c, n, sizeof *c, by_rank);
    fr->best = c[0];
    fr->have_best = 1;
    /* The runner-up: the next different outcome (a key that changes nothing is no alternative),
     * else the next config. */
    for (size_t i = 1; i < n && !fr->have_runner_up; i++)
        if (!same_figures(&c[i], &c[0])) {
            fr->runner_up = c[i];
            fr->have_runner_up = 1;
        }
    if (!fr->have_runner_up && n > 1) {
        fr->runner_up = c[1];
        fr->have_runner_up = 1;
    }
}

xseg_status tune_run(tune_probe_fn probe_fn, void *user, uint64_t device_bytes, const struct tune_budget *b,
                     int progress, struct tune_result *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    struct search s = {.probe = probe_fn, .user = user, .device = device_bytes, .budget = *b, .t0 = now_s(),
                       .progress = progress, .stage = "searching configs"};
    size_t start[TUNE_FAMILIES + 1];
    int out_of_time[TUNE_FAMILIES]; /* a family with no replay finished, as the seconds ran out */
    for (size_t f = 0; f < TUNE_FAMILIES; f++) {
        start[f] = s.ntried;
        coordinate_search(&s, &families[f]);
        out_of_time[f] = s.ntried == start[f] && s.over;
    }
    start[TUNE_FAMILIES] = s.ntried;
    xseg_status st = XSEG_SUCCESS;
    int empty = 0;
    for (size_t f = 0; f < TUNE_FAMILIES; f++)
        empty |= start[f + 1] == start[f] && !out_of_time[f];
    if (empty) {
        snprintf(err, errlen, "--tune: the trace does not replay with the default config (see the replay's message)");
        st = XSEG_ERROR_INVALID_VALUE;
    } else {
        s.stage = "bisecting the smallest device";
        for (size_t f = 0; f < TUNE_FAMILIES; f++) {
            r->fam[f].over_budget = out_of_time[f];
            finish_family(&s, &families[f], start[f], start[f + 1], &r->fam[f]);
        }
    }
    r->runs = s.runs;
    r->seconds = now_s() - s.t0;
    r->cut_short = !budget_left(&s, 1.0);
    r->stopped_replay = s.stopped_replay;
    r->budget_seconds = s.budget.seconds;
    if (progress)
        fprintf(stderr, "\r%60s\r", "");
    free(s.tried);
    return st;
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

void tune_print(FILE *out, const char *trace, const struct tune_result *r)
{
    fprintf(out, "== --tune %s: %u replays in %.1f s%s\n", trace, r->runs, r->seconds,
            r->cut_short ? " (the budget ended the search: --tune-budget for more)" : "");
    if (r->stopped_replay)
        fprintf(out, "The budget's %g s ran out during a replay: it was stopped there; the figures are of the "
                     "replays that finished.\n", r->budget_seconds);
    for (size_t i = 0; i < TUNE_FAMILIES; i++) {
        const struct tune_family_result *f = &r->fam[i];
        if (f->over_budget)
            fprintf(out, "%s:\n  no replay finished within the budget (%g s): a replay of this trace takes longer, "
                         "--tune-budget for more\n", f->name, r->budget_seconds);
        if (!f->have_best)
            continue;
        fprintf(out, "%s:\n", f->name);
        figures(out, "best", f, &f->best);
        if (f->have_runner_up)
            figures(out, "runner-up", f, &f->runner_up);
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
    fprintf(out, ", \"replays\": %u, \"seconds\": %.3f, \"cut_short\": %s, \"stopped_replay\": %s, \"no_result\": [",
            r->runs, r->seconds, r->cut_short ? "true" : "false", r->stopped_replay ? "true" : "false");
    for (size_t i = 0, n = 0; i < TUNE_FAMILIES; i++)
        if (r->fam[i].over_budget)
            fprintf(out, "%s\"%s\"", n++ ? ", " : "", i ? "xseg" : "pytorch");
    fputs("]}\n", out);
}
