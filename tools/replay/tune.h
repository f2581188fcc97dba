/*
 * xseg-replay --tune: which allocator config gives this trace the smallest device? Two families
 * are searched, each from its own default:
 *   PyTorch's allocator, as xseg models it: classic mode (expandable_segments:False), and
 *     expandable mode with xseg's extras off (expandable_segments_recycle and _defrag False:
 *     PyTorch's expandable layout and OOM path); over expandable_segments, max_split_size_mb,
 *     roundup_power2_divisions and garbage_collection_threshold. Its line is
 *     PYTORCH_CUDA_ALLOC_CONF=..., with PyTorch's keys only.
 *   xseg (expandable segments, its defaults): expandable_chunk_mb, expandable_page_size_mb,
 *     max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold. Its line is
 *     XSEG_ALLOC_CONF=.... expandable_segments_defrag is not searched: it moves live bytes and is
 *     safe only in single-threaded programs (docs/configuration.md).
 * Ranked by the smallest device (fitscan_bisect: the bisection of the verdict and --min-device),
 * deterministically: each
 * family starts from its default (replayed on the full device, its smallest device bisected),
 * then a coordinate search in a fixed order (axes and values as listed in tune.c) replays each
 * challenger once on the pick's smallest device less 2 MiB and takes it only if it fits there
 * (then bisects it); equal devices keep the earlier pick, so no key is set for nothing.
 * Candidates are checked with the config parser first (a combination it refuses is never
 * replayed) and each configuration is tried once. Each family gets its half of the budget (the
 * second also what the first left). The replays themselves are the caller's (a child process
 * each: see main.c).
 */
#ifndef XSEG_TOOLS_REPLAY_TUNE_H
#define XSEG_TOOLS_REPLAY_TUNE_H

#include <stdio.h>

#include "tools/replay/runner.h"

/* --tune-budget: replays or seconds; the search stops starting replays past either, and a
 * replay still running when the seconds are up is stopped there (the tune keeps what finished).
 * The default counts replays, so the answer is the same on a busy machine as on an idle one;
 * seconds are the user's choice (their answer then depends on the machine's speed). */
struct tune_budget {
    double seconds; /* 0: no bound */
    unsigned runs;  /* 0: no bound */
};
/* Room for the whole coordinate search of a typical trace (136 replays on the public2 traces;
 * each family may use half, the second also what the first left). */
#define TUNE_DEFAULT_RUNS 400u

/* "60", "60s", "40runs" (also "40 runs", "1.5s"). @return XSEG_ERROR_INVALID_VALUE with a
 * message naming the value otherwise. */
xseg_status tune_parse_budget(const char *s, struct tune_budget *b, char *err, size_t errlen);

/* One replay of the trace with @p config on an emulated device of @p device_bytes (0: the
 * default device), stopped at @p deadline (CLOCK_MONOTONIC seconds; 0: none). @return 0 with
 * @p out filled, -1 when the replay itself stopped, 1 when it was stopped at the deadline. */
typedef int (*tune_probe_fn)(void *user, const char *config, uint64_t device_bytes, double deadline,
                             struct run_summary *out);

struct tune_candidate {
    char shown[256];        /* the keys set, as the user writes them ("" for the defaults) */
    char config[320];       /* what the replay ran with (the family's fixed keys added) */
    int64_t peak_reserved, peak_allocated;
    uint64_t failed_allocs;
    int64_t reserved_after_empty_cache; /* of its replay on the full device */
    uint64_t min_device;    /* bytes; 0: not bisected */
    int device_exact;       /* 1: the bisection finished (else min_device is an upper bound) */
    int stopped;            /* a replay on a smaller device stopped twice: no smallest device */
};

#define TUNE_FAMILIES 2
struct tune_family_result {
    const char *name;       /* "PyTorch's allocator", "xseg" */
    const char *env;        /* "PYTORCH_CUDA_ALLOC_CONF", "XSEG_ALLOC_CONF" */
    struct tune_candidate def, best, runner_up;
    int have_def, have_best, have_runner_up;
    int over_budget;        /* the budget ran out before any replay of this family finished */
};

struct tune_result {
    struct tune_family_result fam[TUNE_FAMILIES];
    unsigned runs;
    double seconds;
    int cut_short;          /* the budget ended the search before it converged */
    int stopped_replay;     /* a replay was stopped in progress when the seconds ran out */
    double budget_seconds;  /* the budget's seconds (0: none), for the messages */
    unsigned budget_runs;   /* the budget's replays (0: none), for the messages */
    const char *cut_by;     /* what ended it when cut_short: "replays" or "seconds" (NULL: not cut) */
};

/* What bounded the search, for the messages: "the replay budget (400 replays)" or "the time
 * budget (60 s)" into @p buf. */
void tune_budget_text(const struct tune_result *r, char *buf, size_t len);

/* How far tune_run goes with each family: the verdict searches PyTorch's allocator in full (its
 * best one-line setting) and needs only xseg's default; --tune searches both. */
enum tune_depth {
    TUNE_SKIP,         /* not replayed (its result stays empty but for name and env) */
    TUNE_DEFAULT_ONLY, /* the default's figures and smallest device; best = the default */
    TUNE_FULL,         /* the coordinate search */
};
struct tune_plan {
    enum tune_depth depth[TUNE_FAMILIES];
    /* Each family's default already replayed on the full device (NULL: replay it): the replays
     * are deterministic, so the search is the same with or without. */
    const struct run_summary *seed[TUNE_FAMILIES];
    uint64_t step;  /* the bisection's step (0: 2 MiB) */
    double t0;      /* CLOCK_MONOTONIC seconds the budget's seconds count from (0: the call) */
};

/* Search (see above). @p device_bytes: the full device (--device-mem). @p plan: NULL for both
 * families in full. Progress on stderr when @p progress. @return XSEG_ERROR_INVALID_VALUE when
 * the default configs themselves cannot replay the trace, XSEG_ERROR_OUT_OF_MEMORY; the message
 * in @p err. A budget that ran out before a family's first replay finished is no error: that
 * family has over_budget set. */
xseg_status tune_run(tune_probe_fn probe, void *user, uint64_t device_bytes, const struct tune_budget *b,
                     const struct tune_plan *plan, int progress, struct tune_result *r, char *err, size_t errlen);

/* The result as text: per family the winning env line, its predicted figures, the default's and
 * the runner-up's (the last pick the best displaced, else the first alternative tried). */
void tune_print(FILE *out, const char *trace, const struct tune_result *r);

/* The result as JSON lines, one per (family, rank): {"tune": trace, "family": "pytorch"|"xseg",
 * "rank": "best"|"runner-up"|"default", "env": the line, "config": the keys shown,
 * "replay_config": what the replay ran with, "peak_reserved_bytes", "failed_allocs", "stopped",
 * "min_device_bytes" (null: not bisected), "min_device_exact"}, then {"tune": trace, "replays",
 * "seconds", "cut_short", "cut_by": "replays"|"seconds"|null, "budget_replays" (null: none),
 * "budget_seconds" (null: none), "stopped_replay", "no_result": the families with no replay
 * finished within the budget ("pytorch", "xseg")}. */
void tune_print_json(FILE *out, const char *trace, const struct tune_result *r);

/* "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" for @p c of family @p f into @p buf. */
void tune_env_line(const struct tune_family_result *f, const struct tune_candidate *c, char *buf, size_t len);

#endif
