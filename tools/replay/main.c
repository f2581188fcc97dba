/*
 * xseg-replay: what would xseg do for this workload? Replays an allocation trace through xseg on
 * the real driver, or on cudaemu where there is no GPU, and prints the statistics at each mark,
 * a summary, and optionally a plot. See usage() for the command line.
 *
 * One replay per process: xseg cannot be reset in-process (caches, statistics and the mode of
 * existing segments persist), so comparing modes or replaying several traces re-executes this
 * program once per (trace, mode) with --child, reading back its JSON lines and timeline file.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/replay/explain.h"
#include "tools/replay/fitscan.h"
#include "tools/replay/plot.h"
#include "tools/replay/report.h"
#include "tools/replay/runner.h"
#include "tools/replay/snapshot.h"
#include "tools/replay/trace.h"
#include "tools/replay/tune.h"
#include "tools/replay/workloads.h"
#include "tools/replay/webreport.h"

#ifndef XSEG_REPLAY_CUDAEMU_BUILD
#define XSEG_REPLAY_CUDAEMU_BUILD ""
#endif
#ifndef XSEG_REPLAY_LIBDIR
#define XSEG_REPLAY_LIBDIR "/usr/local/lib"
#endif

/* --min-device answers to the page granularity: xseg maps 2 MiB pages, so a smaller step would
 * only repeat probes (docs/trace-format.md). */
#define MIN_DEVICE_GRANULE ((uint64_t)2 << 20)

/* A child's exit status when its replay ran out of time (--time-limit): not a failure of the
 * trace, so a probe is not tried again. */
#define EXIT_OVER_DEADLINE 3
/* How long past its deadline the parent waits for a child to stop by itself before killing it
 * (one in a long driver call, or still loading a large trace). */
#define DEADLINE_GRACE_S 1.0

struct cli {
    const char *config;
    int compare;
    enum run_marks marks;
    int pool;
    enum { SUM_TEXT, SUM_JSON, SUM_NONE } summary;
    const char *plot;
    const char *device_mem;
    unsigned long long seed;
    int progress; /* -1 auto */
    int child, check, dump;
    int min_device;         /* --min-device: the smallest device each (trace, mode) fits on (fitscan.h) */
    int explain_oom;        /* --explain-oom: why the first failed allocation failed (explain.h) */
    int cold;               /* --cold: every block declared cold after its allocation (spill's contract) */
    const char *timeline_out;
    const char *snapshot; /* --snapshot FILE */
    int history;          /* --history */
    int driver_stats;     /* --driver-stats: host time and driver calls in the summary */
    int tune;             /* --tune */
    int real_gpu;         /* the driver is not cudaemu: no emulated device sizes, no search */
    struct tune_budget budget; /* --tune-budget */
    const char *report;   /* --report FILE.html */
    FILE *report_file;    /* opened before the replays: a bad path fails first */
    int builtin_default;  /* no TRACE given: the main job, which says what it does first */
    int any_snapshot;     /* a PyTorch snapshot is among the traces (converted) */
    const char *explain_device; /* --explain-oom of one trace replayed here: the recorded OOM device */
    const char **traces;
    const char **names;     /* what tables and messages call each trace (a snapshot: "F (device N)") */
    int ntraces;
    int device;             /* --device N: that device of each snapshot only; -1 every device */
    uint64_t step;          /* --step: the --min-device resolution, a multiple of 2 MiB */
    struct fitscan_ceiling ceiling; /* --fit-ceiling: how far above its answer --min-device scans */
    int full_scan;          /* --full-scan, or a --fit-ceiling other than none: --min-device scans */
    int ceiling_given;      /* --fit-ceiling was given */
    double t_start;         /* CLOCK_MONOTONIC seconds the replays began (--tune-budget's seconds count
                             * from there) */
    uint64_t max_idle_ns;   /* --max-total-idle: the cap on a trace's idle actions all together */
    /* CLOCK_MONOTONIC seconds, 0: none. A child's own, from the internal --time-limit; in the
     * parent, what a child it starts is held to (--tune's budget). */
    double deadline;
};

/* "21.94 GiB", "110 MiB" (as the verdict writes sizes). */
static void size_text(char *buf, size_t len, uint64_t b)
{
    if (b >= (uint64_t)1 << 30)
        snprintf(buf, len, "%.2f GiB", (double)b / (1 << 30));
    else
        snprintf(buf, len, "%.0f MiB", (double)b / (1 << 20));
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage_language(FILE *f);

static void usage(FILE *f)
{
    fprintf(f,
        "usage: xseg-replay [options] [TRACE...]\n"
        "Replay allocation traces through xseg and show what the memory did.\n"
        "With no TRACE: the bundled workloads, classic and expandable mode side by side.\n"
        "\n"
        "TRACE is a file in the trace language, an RMM CSV log (Thread,Time,Action,Pointer,Size,Stream),\n"
        "a PyTorch snapshot (torch.cuda.memory._dump_snapshot; told by its first byte, whatever its name;\n"
        "every device that holds data is replayed as a trace of its own; needs python3 to run the\n"
        "data-only converter xseg-snapshot2trace; one that ended in an OOM is replayed in both modes on\n"
        "the device it failed on, or --device-mem, and answered first), or builtin:NAME for a bundled\n"
        "workload (see --list).\n"
        "The trace language in full: docs/trace-format.md.\n"
        "\n"
        "options:\n"
        "  --config STRING      config string applied before the trace (e.g. expandable_segments:False)\n"
        "  --compare            classic and expandable mode side by side (one child process each)\n"
        "  --marks=table|jsonl|none  statistics at each `mark`: a table (default), or one JSON object\n"
        "                       per line with every statistic under its PyTorch key, in bytes\n"
        "  --pool all|large|small    the pool the mark table shows (default all)\n"
        "  --summary=text|json|none  the summary (default text); json: one object per mode\n"
        "  --plot FILE.svg      allocated and reserved over the trace, one line per mode\n"
        "  --history            record allocation history while replaying (events, and each alloc's\n"
        "                       frames from the trace's `frame` lines), for --snapshot\n"
        "  --snapshot FILE      write a snapshot in PyTorch's format (torch.cuda.memory._dump_snapshot;\n"
        "                       open it on pytorch.org/memory_viz) at the end of the replay, and at\n"
        "                       each `snapshot LABEL` action to FILE with .LABEL before its extension\n"
        "                       (the label as a file name: bytes outside A-Za-z0-9._- become _);\n"
        "                       with several replays, .MODE (and .N for the Nth trace) is inserted\n"
        "  --driver-stats       add host time per call and driver calls to the summary (on the\n"
        "                       emulator: its host time includes the driver time it models)\n"
        "  --tune               search the allocator config for the smallest device (the verdict's\n"
        "                       bisection): prints the best PYTORCH_CUDA_ALLOC_CONF line for PyTorch's\n"
        "                       allocator (as modelled by classic mode and expandable mode) and the\n"
        "                       best XSEG_ALLOC_CONF line for xseg, each with its runner-up (whatever\n"
        "                       --summary says; JSON lines with --summary=json). A line that reserves\n"
        "                       more on the device replayed than it saves in device size is not\n"
        "                       taken; a pick that reserves more than the defaults says the trade.\n"
        "                       The verdict always\n"
        "                       searches PyTorch's family: its best line is the headline's\n"
        "  --tune-budget N{runs|s}  bound --tune's search (and --report's): replays (default 400runs,\n"
        "                       room for the whole search of a typical trace: the same answer on any\n"
        "                       machine) or seconds (e.g. 60s: every replay of the command, the first\n"
        "                       included, stops by then, and the command ends within a second of it;\n"
        "                       the answer then depends on the machine's speed); a bare N is seconds.\n"
        "                       The result says when a budget cut the search short, and which one\n"
        "  --report FILE.html   one self-contained page: verdict, table, plot with marks and failed\n"
        "                       allocations, the --tune result, the largest live allocations at\n"
        "                       the peak with their frames (implies --tune)\n"
        "  --device N           of a PyTorch snapshot, replay device N only (default: every device)\n"
        "  --device-mem SIZE    device memory on the emulator (default 80G)\n"
        "  --min-device         the smallest emulated device (to 2 MiB, up to --device-mem) each trace\n"
        "                       replays on with no failed allocation, per mode (with --compare: classic\n"
        "                       and expandable): the bisection the verdict and --tune use, so all three\n"
        "                       name the same device. Fit is not monotonic in the device size: a size\n"
        "                       above the answer may fail (--full-scan checks). One child per probe;\n"
        "                       progress on a terminal\n"
        "  --full-scan          with --min-device: also replay every size from the bisection's answer up\n"
        "                       to --fit-ceiling and 32 steps below it, and answer the smallest device\n"
        "                       ABOVE WHICH EVERY SIZE FITS; the sizes that fit or fail around the\n"
        "                       bisection's answer are said in words\n"
        "  --fit-ceiling R|SIZE|none  how high --full-scan checks every size (implies it unless none): a\n"
        "                       ratio to the peak allocated (default 1.10) or a size (e.g. 45GiB). Cost:\n"
        "                       about (ceiling - answer) / step replays, on a 40 GiB trace ~2,000 at 1.10\n"
        "  --step SIZE          --min-device's resolution (default 2MiB; a multiple of 2 MiB)\n"
        "  --explain-oom        at the first failed allocation: the pages that still hold free bytes\n"
        "                       after xseg's OOM path (stranded: they share a chunk or a classic\n"
        "                       segment with live blocks) and the live blocks pinning them, with the\n"
        "                       lines that allocate and free them (also in --report's page); on\n"
        "                       --device-mem, else on the device a snapshot that ended in an OOM\n"
        "                       records (it says which)\n"
        "  --cold               declare every block cold (xseg_spill_hint) right after its allocation:\n"
        "                       a trace records no use between a block's allocation and its free, so\n"
        "                       spill's promise holds for all (spill_to_host moves declared blocks only)\n"
        "  --seed N             seed of the bundled workload generators (default 1)\n"
        "  --max-total-idle D   the cap on a trace's `idle` actions all together (default 2h; e.g. 48h):\n"
        "                       a trace past it fails --check and is not replayed\n"
        "  --check              parse the traces, report errors, replay nothing\n"
        "  --dump               print a trace (e.g. builtin:training) in the trace language\n"
        "  --list               list the bundled workloads\n"
        "  --progress, --no-progress  progress on stderr (default: when stderr is a terminal)\n"
        "  --version            the version of xseg-replay (and of the libxseg it runs)\n"
        "  -h, --help           this text\n");
    usage_language(f);
}

/* The trace language and the environment, after the options (usage). */
static void usage_language(FILE *f)
{
    fprintf(f,
        "\n"
        "trace language (one action per line, # comments):\n"
        "  stream s1 | alloc x1 4GiB [@s1] | free x1 | record x1 @s1 | hold @s1 | release @s1\n"
        "  sync [@s1] | empty_cache | trim 1GiB | config expandable_segments:True,max_split_size_mb:128\n"
        "  sleep default|POOL offload|discard | wake default|POOL | idle 300ms\n"
        "  pool_begin p1 [@s1] | pool_end p1 | pool_release p1 | capture_begin @s1 [p1] | capture_end @s1\n"
        "  mark After alloc x1 | wait @s1 @s2 (s1 waits for s2's work so far) | work @s1 (a kernel)\n"
        "  snapshot peak | frame k1 42 model.py forward | alloc x2 1MiB ^k1\n"
        "Sizes: bytes, or B, KiB, MiB, GiB, TiB (binary). @default is the legacy default stream.\n"
        "Driver: $XSEG_LIBCUDA, else libcuda.so.1, else the emulator (cudaemu).\n"
        "XSEG_REPLAY_ADDR_LOG=FILE: write each alloc (a LINE BUF ADDRESS SIZE; address 0: it failed)\n"
        "and each free (f LINE BUF) to FILE, BUF the buffer's index (benchmarks/fit_probe.py).\n"
        "Experiment: XSEG_REPLAY_ORACLE=never sends each allocation never freed in the\n"
        "trace to a private pool of its own (=N: also those freed more than N actions later;\n"
        "=file:PATH: the allocations whose action indices PATH lists, one per line, counting every\n"
        "line but blanks, comments and frames from 0, as benchmarks/lifetime_probe.py --write-mask),\n"
        "an upper bound of lifetime-aware placement; what went there is reported on stderr.\n");
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "xseg-replay: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(xseg-replay --help for usage)\n");
    return 2;
}

/* "--name=value" or "--name value": the value, advancing *i; NULL when absent. */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] == '\0' && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

static int is_opt(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* Each parse_*_opt below takes the option at argv[*i] (and its value, advancing *i): 1 taken,
 * 0 not one of its own, 2 a usage error (reported). */

/* What the run does: --help and --list (answered here), --compare, --check, --dump,
 * --min-device, --progress, --no-progress and the internal --child. */
static int parse_job_opt(const char *a, struct cli *c)
{
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        usage(stdout);
        exit(0);
    } else if (!strcmp(a, "--version")) {
        /* The library's version is the program's: both come from XSEG_API_VERSION. */
        printf("xseg-replay %s\n", xseg_version());
        exit(0);
    } else if (!strcmp(a, "--list")) {
        for (size_t w = 0; w < wl_count; w++)
            printf("builtin:%-12s %s\n", wl_list[w].name, wl_list[w].description);
        exit(0);
    }
    if (!strcmp(a, "--compare"))
        c->compare = 1;
    else if (!strcmp(a, "--check"))
        c->check = 1;
    else if (!strcmp(a, "--dump"))
        c->dump = 1;
    else if (!strcmp(a, "--min-device"))
        c->min_device = 1;
    else if (!strcmp(a, "--full-scan"))
        c->full_scan = 1;
    else if (!strcmp(a, "--explain-oom"))
        c->explain_oom = 1;
    else if (!strcmp(a, "--cold"))
        c->cold = 1;
    else if (!strcmp(a, "--child"))
        c->child = 1;
    else if (!strcmp(a, "--progress") || !strcmp(a, "--no-progress"))
        c->progress = a[2] == 'p';
    else
        return 0;
    return 1;
}

/* @p v as one of the three @p words (NULL-terminated) of option @p name: 1 and its index in *out,
 * else a usage error naming them. */
static int pick_word(const char *v, const char *name, const char *const *words, int *out)
{
    for (int w = 0; words[w]; w++)
        if (!strcmp(v, words[w])) {
            *out = w;
            return 1;
        }
    char e[160];
    snprintf(e, sizeof e, "%s: '%%s' is not %s, %s or %s", name, words[0], words[1], words[2]);
    return usage_error(e, v);
}

/* How the figures are shown: --marks, --summary, --pool. */
static int parse_view_opt(int argc, char **argv, int *i, struct cli *c)
{
    static const char *const marks[] = {"table", "jsonl", "none", NULL};
    static const char *const summary[] = {"text", "json", "none", NULL};
    static const char *const pools[] = {"all", "large", "small", NULL};
    static const enum run_marks mark_of[] = {RUN_MARKS_TABLE, RUN_MARKS_JSONL, RUN_MARKS_NONE};
    static const int pool_of[] = {XSEG_STAT_ALL, XSEG_STAT_LARGE_POOL, XSEG_STAT_SMALL_POOL};
    const char *a = argv[*i], *v;
    int w, rc;
    if (is_opt(a, "--marks")) {
        if (!(v = opt_value(argc, argv, i, "--marks")))
            return usage_error("%s needs table, jsonl or none", a);
        if ((rc = pick_word(v, "--marks", marks, &w)) == 1)
            c->marks = mark_of[w];
    } else if (is_opt(a, "--summary")) {
        if (!(v = opt_value(argc, argv, i, "--summary")))
            return usage_error("%s needs text, json or none", a);
        if ((rc = pick_word(v, "--summary", summary, &w)) == 1)
            c->summary = w == 0 ? SUM_TEXT : w == 1 ? SUM_JSON : SUM_NONE;
    } else if (is_opt(a, "--pool")) {
        if (!(v = opt_value(argc, argv, i, "--pool")))
            return usage_error("%s needs all, large or small", a);
        if ((rc = pick_word(v, "--pool", pools, &w)) == 1)
            c->pool = pool_of[w];
    } else {
        return 0;
    }
    return rc;
}

/* The files written besides the tables: --history (for them), --snapshot, --plot and
 * --timeline-out. */
static int parse_file_opt(int argc, char **argv, int *i, struct cli *c)
{
    static const char *const names[] = {"--snapshot", "--plot", "--timeline-out"};
    const char **dest[] = {&c->snapshot, &c->plot, &c->timeline_out};
    const char *a = argv[*i];
    if (!strcmp(a, "--history")) {
        c->history = 1;
        return 1;
    }
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (is_opt(a, names[k])) {
            if (!(*dest[k] = opt_value(argc, argv, i, names[k])))
                return usage_error("%s needs a file name", a);
            return 1;
        }
    return 0;
}

/* The output side's options: --driver-stats, --tune, --tune-budget, --report. */
static int parse_output_opt(int argc, char **argv, int *i, struct cli *c)
{
    const char *a = argv[*i], *v;
    char e[TRACE_ERR_MAX];
    if (!strcmp(a, "--driver-stats")) {
        c->driver_stats = 1;
    } else if (!strcmp(a, "--tune")) {
        c->tune = 1;
    } else if (is_opt(a, "--tune-budget")) {
        if (!(v = opt_value(argc, argv, i, "--tune-budget")))
            return usage_error("%s needs seconds or runs (e.g. 60s, 40runs)", a);
        if (tune_parse_budget(v, &c->budget, e, sizeof e))
            return usage_error("%s", e);
    } else if (is_opt(a, "--report")) {
        if (!(c->report = opt_value(argc, argv, i, "--report")))
            return usage_error("%s needs a file name (e.g. out.html)", a);
    } else {
        return 0;
    }
    return 1;
}

/* The options about devices and the traces' names: --device-mem, --device, --step and the
 * internal --source-name and --time-limit. */
static int parse_device_opt(int argc, char **argv, int *i, struct cli *c, const char **source_name)
{
    const char *a = argv[*i], *v;
    char e[TRACE_ERR_MAX];
    if (is_opt(a, "--device-mem")) {
        if (!(c->device_mem = opt_value(argc, argv, i, "--device-mem")))
            return usage_error("%s needs a size (e.g. 80G)", a);
        uint64_t b;
        char norm[64];
        if (trace_parse_size(c->device_mem, strlen(c->device_mem), &b, e, sizeof e) || b == 0)
            return usage_error("--device-mem: bad size '%s' (e.g. 80G, 81920MiB)", c->device_mem);
        snprintf(norm, sizeof norm, "%llu", (unsigned long long)b);
        c->device_mem = strdup(norm); /* cudaemu reads bytes or K/M/G/T */
    } else if (is_opt(a, "--device")) {
        char *end;
        if (!(v = opt_value(argc, argv, i, "--device")))
            return usage_error("%s needs a device number", a);
        errno = 0;
        long d = strtol(v, &end, 10);
        if (!*v || *end || errno || d < 0 || d > 65535)
            return usage_error("--device: '%s' is not a device number (0, 1, ...)", v);
        c->device = (int)d;
    } else if (is_opt(a, "--step")) {
        if (!(v = opt_value(argc, argv, i, "--step")))
            return usage_error("%s needs a size (e.g. 64MiB)", a);
        if (trace_parse_size(v, strlen(v), &c->step, e, sizeof e) || c->step == 0 || c->step % MIN_DEVICE_GRANULE)
            return usage_error("--step: '%s' is not a positive multiple of 2MiB (the page granularity)", v);
    } else if (is_opt(a, "--fit-ceiling")) {
        if (!(v = opt_value(argc, argv, i, "--fit-ceiling")))
            return usage_error("%s needs a ratio, a size or none (e.g. 1.10, 45GiB)", a);
        if (fitscan_parse_ceiling(v, &c->ceiling, e, sizeof e))
            return usage_error("%s", e);
        c->ceiling_given = 1;
    } else if (is_opt(a, "--time-limit")) {
        char *end;
        if (!(v = opt_value(argc, argv, i, "--time-limit")))
            return usage_error("%s needs seconds", a); /* internal: --tune's budget, for a child */
        errno = 0;
        double s = strtod(v, &end);
        if (!*v || *end || errno || !(s > 0) || s > 1e9)
            return usage_error("--time-limit: '%s' is not a number of seconds", v);
        c->deadline = mono_s() + s;
    } else if (is_opt(a, "--source-name")) {
        if (!(*source_name = opt_value(argc, argv, i, "--source-name")))
            return usage_error("%s needs a name", a); /* internal: a child's trace's name in tables */
    } else {
        return 0;
    }
    return 1;
}

/* What the traces are made with: --config, --seed, --max-total-idle. */
static int parse_input_opt(int argc, char **argv, int *i, struct cli *c)
{
    const char *a = argv[*i], *v;
    if (is_opt(a, "--config")) {
        if (!(c->config = opt_value(argc, argv, i, "--config")))
            return usage_error("%s needs a config string", a);
    } else if (is_opt(a, "--seed")) {
        char *end;
        if (!(v = opt_value(argc, argv, i, "--seed")))
            return usage_error("%s needs a number", a);
        errno = 0;
        c->seed = strtoull(v, &end, 0);
        if (*end || errno)
            return usage_error("--seed: '%s' is not a number", v);
    } else if (is_opt(a, "--max-total-idle")) {
        if (!(v = opt_value(argc, argv, i, "--max-total-idle")))
            return usage_error("%s needs a duration (e.g. 48h, 7200s)", a);
        if (trace_parse_duration(v, strlen(v), &c->max_idle_ns))
            return usage_error("--max-total-idle: '%s' is not a duration (e.g. 48h, 7200s, 500ms)", v);
    } else {
        return 0;
    }
    return 1;
}

static int parse_cli(int argc, char **argv, struct cli *c)
{
    memset(c, 0, sizeof *c);
    c->seed = 1;
    c->progress = -1;
    c->budget = (struct tune_budget){.runs = TUNE_DEFAULT_RUNS};
    c->device = -1;
    c->step = MIN_DEVICE_GRANULE;
    c->ceiling = (struct fitscan_ceiling){.ratio = FITSCAN_DEFAULT_RATIO};
    c->max_idle_ns = TRACE_IDLE_TOTAL_MAX_NS;
    c->traces = calloc((size_t)argc + 1, sizeof *c->traces);
    c->names = calloc((size_t)argc + 1, sizeof *c->names);
    if (!c->traces || !c->names)
        return usage_error("%s", "out of host memory");
    const char *source_name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == '\0') {
            c->traces[c->ntraces++] = a;
            continue;
        }
        int rc = parse_job_opt(a, c);
        if (!rc)
            rc = parse_view_opt(argc, argv, &i, c);
        if (!rc)
            rc = parse_file_opt(argc, argv, &i, c);
        if (!rc)
            rc = parse_output_opt(argc, argv, &i, c);
        if (!rc)
            rc = parse_device_opt(argc, argv, &i, c, &source_name);
        if (!rc)
            rc = parse_input_opt(argc, argv, &i, c);
        if (rc != 1)
            return rc ? rc : usage_error("unknown option '%s'", a);
    }
    for (int t = 0; t < c->ntraces; t++)
        c->names[t] = source_name && c->ntraces == 1 ? source_name : c->traces[t];
    /* --min-device answers the verdict's bisection unless a scan is asked for. */
    if (c->ceiling_given)
        c->full_scan = c->ceiling.ratio > 0 || c->ceiling.bytes;
    else if (!c->full_scan)
        c->ceiling = (struct fitscan_ceiling){0};
    return 0;
}

static xseg_status load_trace_any(const char *spec, unsigned long long seed, struct trace *t, char *err, size_t errlen)
{
    if (!strncmp(spec, "builtin:", 8)) {
        char *text;
        size_t len;
        xseg_status st = wl_generate(spec + 8, seed, &text, &len, err, errlen);
        if (st)
            return st;
        if ((st = trace_init(t, spec)) == XSEG_SUCCESS && (st = trace_parse_text(t, text, len, err, errlen)))
            trace_destroy(t);
        free(text);
        return st;
    }
    return trace_load_file(t, spec, err, errlen);
}

/* @p spec loaded, and held to --max-total-idle (--check, the parent's check and each replay). */
static xseg_status load_trace(const struct cli *c, const char *spec, struct trace *t, char *err, size_t errlen)
{
    xseg_status st = load_trace_any(spec, c->seed, t, err, errlen);
    if (st == XSEG_SUCCESS && (st = trace_check_idle(t, c->max_idle_ns, err, errlen)))
        trace_destroy(t);
    return st;
}

static void exe_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0) {
        snprintf(buf, len, ".");
        return;
    }
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
}

static int find_driver(const struct cli *c)
{
    char dir[PATH_MAX], c0[PATH_MAX + 64], c1[PATH_MAX + 64], c2[PATH_MAX + 64];
    exe_dir(dir, sizeof dir);
    snprintf(c0, sizeof c0, "%s/libcudaemu.so", dir);               /* the wheel: both in the package */
    snprintf(c1, sizeof c1, "%s/../cudaemu/libcudaemu.so", dir);   /* the build tree */
    snprintf(c2, sizeof c2, "%s/../lib/xseg/libcudaemu.so", dir);  /* an installed tree */
    const char *cands[] = {c0, XSEG_REPLAY_CUDAEMU_BUILD, c1, c2, XSEG_REPLAY_LIBDIR "/xseg/libcudaemu.so"};
    char err[TRACE_ERR_MAX];
    int emu;
    if (run_find_driver(cands, sizeof cands / sizeof cands[0], c->device_mem, &emu, err, sizeof err)) {
        fprintf(stderr, "xseg-replay: %s\n", err);
        return -1;
    }
    return 0;
}

/* Call @p t by @p name in tables and messages (a converted snapshot's "FILE (device N)"). */
static void name_trace(struct trace *t, const char *name)
{
    char *n = name && t->source && strcmp(name, t->source) ? strdup(name) : NULL;
    if (n) {
        free(t->source);
        t->source = n;
    }
}

/* One (trace, mode) replay in this process. */
static int replay_here(const struct cli *c, const char *spec, const char *name)
{
    char err[TRACE_ERR_MAX];
    struct trace t;
    if (load_trace(c, spec, &t, err, sizeof err)) {
        fprintf(stderr, "xseg-replay: %s\n", err);
        return 1;
    }
    name_trace(&t, name);
    if (run_init(c->config, err, sizeof err)) {
        fprintf(stderr, "xseg-replay: %s\n", err);
        trace_destroy(&t);
        return 1;
    }
    struct run_options o = {.pool = c->pool, .marks = c->marks};
    o.progress = c->progress >= 0 ? c->progress : (isatty(2) && t.count > 20000);
    o.timeline = c->plot || c->timeline_out;
    o.history = c->history;
    o.snapshot = c->snapshot;
    o.deadline = c->deadline;
    o.explain_oom = c->explain_oom ? (c->summary == SUM_JSON ? 2 : 1) : 0; /* JSON output stays JSON */
    o.cold = c->cold;
    struct run_summary sum;
    struct run_timeline tl = {0};
    xseg_status st = run_trace(&t, &o, stdout, &sum, o.timeline ? &tl : NULL, err, sizeof err);
    int rc = 0;
    if (st) {
        fprintf(stderr, "xseg-replay: %s\n", err);
        rc = sum.over_deadline ? EXIT_OVER_DEADLINE : 1;
    } else {
        if (c->summary == SUM_TEXT) {
            if (c->marks == RUN_MARKS_TABLE)
                putchar('\n');
            sum.device_bytes = c->real_gpu ? 0 : c->device_mem ? strtoull(c->device_mem, NULL, 10) : 80ULL << 30;
            report_summary_text(stdout, &sum, &t.recorded, c->driver_stats);
        } else if (c->summary == SUM_JSON) {
            report_summary_json(stdout, &sum);
        }
    }
    if (c->timeline_out) {
        FILE *f = fopen(c->timeline_out, "w");
        if (!f || plot_timeline_write(f, &tl, 2000) || fclose(f)) {
            fprintf(stderr, "xseg-replay: cannot write %s\n", c->timeline_out);
            rc = 1;
        }
    }
    if (!st && c->plot) {
        struct plot_mark *pm = NULL;
        size_t npm = 0;
        uint64_t nf = sum.failed_allocs < RUN_FAILED_AT_MAX ? sum.failed_allocs : RUN_FAILED_AT_MAX;
        struct plot_series s = {sum.mode, &tl, sum.failed_at, (size_t)nf};
        struct plot_panel p = {t.source, t.count, &s, 1, NULL, 0};
        if (plot_marks_of_trace(&t, &pm, &npm) == XSEG_SUCCESS) {
            p.marks = pm;
            p.nmarks = npm;
        }
        if (plot_write_svg(c->plot, &p, 1, err, sizeof err)) {
            fprintf(stderr, "xseg-replay: %s\n", err);
            rc = 1;
        }
        free(pm);
    }
    run_timeline_free(&tl);
    trace_destroy(&t);
    fflush(stdout);
    return rc;
}

struct child_result {
    struct run_summary sum;
    int have_summary;
    struct report_mark *marks;
    size_t nmarks, capmarks;
    struct run_timeline tl;
    char *explain;        /* --explain-oom's text, NULL: none */
    int rc;
    int over_deadline;    /* stopped at cli.deadline: by itself, or killed DEADLINE_GRACE_S after */
};

/* The command line of a child: its arguments and the strings they point into. */
struct child_args {
    char cfg[1024], seed[32], pool[16], idle[32], limit[32];
    const char *argv[40];
};

static void child_argv(const struct cli *c, const char *self, const char *spec, const char *name, const char *mode_cfg,
                       const char *tl_path, const char *device_mem, const char *snap_path,
                       struct child_args *ca)
{
    if (c->config && mode_cfg)
        snprintf(ca->cfg, sizeof ca->cfg, "%s,%s", c->config, mode_cfg);
    else
        snprintf(ca->cfg, sizeof ca->cfg, "%s", mode_cfg ? mode_cfg : c->config ? c->config : "");
    snprintf(ca->seed, sizeof ca->seed, "%llu", c->seed);
    snprintf(ca->pool, sizeof ca->pool, "%s", c->pool == XSEG_STAT_LARGE_POOL ? "large" : c->pool == XSEG_STAT_SMALL_POOL ? "small" : "all");
    const char **argv = ca->argv;
    int k = 0;
    argv[k++] = self;
    argv[k++] = "--child";
    argv[k++] = "--marks=jsonl";
    argv[k++] = "--summary=json";
    argv[k++] = "--pool";
    argv[k++] = ca->pool;
    argv[k++] = "--seed";
    argv[k++] = ca->seed;
    if (c->deadline > 0) {
        double left = c->deadline - mono_s();
        snprintf(ca->limit, sizeof ca->limit, "%.3f", left > 0.001 ? left : 0.001);
        argv[k++] = "--time-limit";
        argv[k++] = ca->limit;
    }
    if (c->max_idle_ns != TRACE_IDLE_TOTAL_MAX_NS) {
        snprintf(ca->idle, sizeof ca->idle, "%lluns", (unsigned long long)c->max_idle_ns);
        argv[k++] = "--max-total-idle";
        argv[k++] = ca->idle;
    }
    if (c->progress >= 0)
        argv[k++] = c->progress ? "--progress" : "--no-progress";
    if (ca->cfg[0]) {
        argv[k++] = "--config";
        argv[k++] = ca->cfg;
    }
    if (tl_path) {
        argv[k++] = "--timeline-out";
        argv[k++] = tl_path;
    }
    if (device_mem) {
        argv[k++] = "--device-mem";
        argv[k++] = device_mem;
    }
    if (c->history)
        argv[k++] = "--history";
    if (c->explain_oom)
        argv[k++] = "--explain-oom";
    if (c->cold)
        argv[k++] = "--cold";
    if (snap_path) {
        argv[k++] = "--snapshot";
        argv[k++] = snap_path;
    }
    if (name && strcmp(name, spec)) {
        argv[k++] = "--source-name";
        argv[k++] = name;
    }
    argv[k++] = spec;
    argv[k] = NULL;
}

/* The child's JSON lines: marks (forwarded when the parent writes JSON lines too) and the
 * summary. */
static void child_read(const struct cli *c, FILE *in, struct child_result *r)
{
    char *line = NULL;
    size_t cap = 0;
    while (in && getline(&line, &cap, in) > 0) {
        if (c->marks == RUN_MARKS_JSONL && !strncmp(line, "{\"mark\"", 7))
            fputs(line, stdout); /* forwarded as they come */
        char *x = explain_oom_from_json(line);
        if (x) {
            free(r->explain);
            r->explain = x;
            if (c->summary == SUM_JSON)
                fputs(line, stdout);
            continue;
        }
        struct report_mark m = {{0}};
        struct report_mark_reader mr = {.m = &m, .pool = c->pool};
        if (report_json_parse(line, report_mark_from_json, &mr) != 0)
            continue;
        if (mr.is_mark) {
            if (r->nmarks == r->capmarks) {
                size_t nc = r->capmarks ? r->capmarks * 2 : 16;
                struct report_mark *nm = realloc(r->marks, nc * sizeof *nm);
                if (!nm)
                    continue;
                r->marks = nm;
                r->capmarks = nc;
            }
            r->marks[r->nmarks++] = m;
        } else {
            report_json_parse(line, report_summary_from_json, &r->sum);
            r->have_summary = 1;
        }
    }
    free(line);
}

/* The output of child @p pid on @p fd (closed here) into *@p buf, until its end or @p until
 * (CLOCK_MONOTONIC seconds), when the child is killed. @return 1 when it was killed. What does
 * not fit in host memory is dropped (the summary, last, then counts as missing). */
static int read_until(int fd, pid_t pid, double until, char **buf, size_t *len)
{
    size_t cap = 0;
    char chunk[4096];
    *buf = NULL;
    *len = 0;
    for (;;) {
        double left = until - mono_s();
        if (left <= 0) {
            kill(pid, SIGKILL);
            close(fd);
            return 1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, left < 1.0 ? (int)(left * 1000) + 1 : 1000);
        if (pr <= 0)
            continue; /* EINTR, or the time is up: the loop's head decides */
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (*len + (size_t)n + 1 > cap) {
            size_t nc = (*len + (size_t)n + 1) * 2;
            char *nb = realloc(*buf, nc);
            if (!nb)
                continue;
            *buf = nb;
            cap = nc;
        }
        memcpy(*buf + *len, chunk, (size_t)n);
        *len += (size_t)n;
    }
    close(fd);
    return 0;
}

/* Run one (trace, mode) in a child process and collect its JSON lines; held to c->deadline when
 * set (the child stops by itself there, or is killed DEADLINE_GRACE_S later). */
static void run_child(const struct cli *c, const char *spec, const char *name, const char *mode_cfg, const char *tl_path,
                      const char *device_mem, int quiet, const char *snap_path, struct child_result *r)
{
    memset(r, 0, sizeof *r);
    if (c->deadline > 0 && mono_s() >= c->deadline) { /* the budget is spent: no child at all */
        r->over_deadline = 1;
        r->rc = EXIT_OVER_DEADLINE;
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        r->rc = -1;
        return;
    }
    self[n] = '\0';
    struct child_args ca;
    child_argv(c, self, spec, name, mode_cfg, tl_path, device_mem, snap_path, &ca);
    int fds[2];
    if (pipe(fds)) {
        r->rc = -1;
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        r->rc = -1;
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        if (quiet) { /* a probe's failed allocations are expected: only the count matters */
            int nul = open("/dev/null", O_WRONLY);
            if (nul >= 0)
                dup2(nul, 2);
        }
        execv(self, (char *const *)ca.argv);
        fprintf(stderr, "xseg-replay: cannot run %s: %m\n", self);
        _exit(127);
    }
    close(fds[1]);
    if (c->deadline > 0) {
        char *buf;
        size_t len;
        r->over_deadline = read_until(fds[0], pid, c->deadline + DEADLINE_GRACE_S, &buf, &len);
        FILE *in = len ? fmemopen(buf, len, "r") : NULL;
        child_read(c, in, r);
        if (in)
            fclose(in);
        free(buf);
    } else {
        FILE *in = fdopen(fds[0], "r");
        child_read(c, in, r);
        if (in)
            fclose(in);
        else
            close(fds[0]);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r->rc == EXIT_OVER_DEADLINE)
        r->over_deadline = 1;
    if (tl_path && r->have_summary) {
        char err[TRACE_ERR_MAX];
        if (plot_timeline_read(tl_path, &r->tl, err, sizeof err))
            fprintf(stderr, "xseg-replay: %s\n", err);
    }
}

static const char *const cmp_modes[2][2] = {{"classic", "expandable_segments:False"},
                                            {"expandable", "expandable_segments:True"}};

/* Does @p spec replay with no failed allocation on a device of @p bytes? 1 yes, 0 no, -1 the
 * replay itself stopped (a bad trace, a crash): no answer. */
static int fits_on(const struct cli *c, const char *spec, const char *name, const char *mode_cfg, uint64_t bytes,
                   struct child_result *r)
{
    char mem[32];
    snprintf(mem, sizeof mem, "%llu", (unsigned long long)bytes);
    struct cli q = *c;
    q.marks = RUN_MARKS_NONE;
    q.progress = 0;
    q.history = 0; /* a fit probe records nothing and writes no snapshot */
    q.explain_oom = 0;
    run_child(&q, spec, name, mode_cfg, NULL, mem, 1, NULL, r);
    free(r->marks);
    r->marks = NULL;
    if (r->rc != 0 || !r->have_summary)
        return -1;
    return r->sum.failed_allocs == 0;
}

/* Progress on stderr: --progress, or a terminal unless --no-progress. */
static int want_progress(const struct cli *c)
{
    return c->progress > 0 || (c->progress < 0 && isatty(2));
}

/* fitscan's probe: one quiet child replay of a (trace, mode) on a device of the given size, with a
 * progress line per probe when asked (rewritten in place on a terminal). */
struct fit_probe_ctx {
    const struct cli *c;
    const char *spec, *name, *mode_cfg, *mode;
    int progress, tty, probes;
    struct run_summary last; /* the last replay's figures */
    const struct fitscan_result *fr; /* the search underway (its plan), or NULL */
    double scan_t0;                  /* when the first replay of the planned scan began (0: not yet) */
    int scan_p0;                     /* replays made before it */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* " of 40, about 1 min 20 s left" once the search knows how many replays it makes (the
 * --full-scan part: the bisection's own count is not known ahead), from the replays made since. */
static void fit_progress_plan(struct fit_probe_ctx *p, double began, char *buf, size_t len)
{
    buf[0] = '\0';
    if (!p->fr || !p->fr->planned)
        return;
    if (!p->scan_t0) {
        p->scan_t0 = began;
        p->scan_p0 = p->probes - 1;
    }
    int done = p->probes - p->scan_p0, left = p->fr->planned - p->probes;
    double el = now_s() - p->scan_t0, eta = done > 0 ? el / done * (left > 0 ? left : 0) : 0;
    if (done < 2 || left <= 0)
        snprintf(buf, len, " of %d", p->fr->planned);
    else if (eta < 60)
        snprintf(buf, len, " of %d, about %.0f s left", p->fr->planned, eta);
    else
        snprintf(buf, len, " of %d, about %d min %02d s left", p->fr->planned, (int)(eta / 60), (int)eta % 60);
}

static int fit_probe(void *user, uint64_t bytes)
{
    struct fit_probe_ctx *p = user;
    struct child_result r;
    double began = now_s();
    int f = fits_on(p->c, p->spec, p->name, p->mode_cfg, bytes, &r);
    run_timeline_free(&r.tl);
    p->last = r.sum;
    p->probes++;
    char plan[64];
    fit_progress_plan(p, began, plan, sizeof plan);
    if (p->progress)
        fprintf(stderr, "%sxseg-replay: --min-device %s%s%s%s: replay %d%s, %.3f GiB %s%s", p->tty ? "\r" : "",
                p->name, p->mode ? " [" : "", p->mode ? p->mode : "", p->mode ? "]" : "", p->probes, plan,
                (double)bytes / (1 << 30), f > 0 ? "fits" : f == 0 ? "fails" : "stopped", p->tty ? "      " : "\n");
    return f;
}

/*
 * The smallest device of one (trace, mode) as fitscan.h defines it (--fit-ceiling none: the
 * bisection alone, the verdict's answer), in *@p fr; the figures of the replay on the largest
 * device in *@p full. @return 0; 1 when it does not fit on the largest device; -1 when a replay
 * stopped, -2 out of host memory (*@p probes: the replays made).
 */
static int min_device_of(const struct cli *c, const char *spec, const char *name, size_t m,
                         struct run_summary *full, struct fitscan_result *fr, int *probes)
{
    const uint64_t step = c->step;
    uint64_t top = c->device_mem ? strtoull(c->device_mem, NULL, 10) : 80ULL << 30;
    top = top / step * step;
    struct fit_probe_ctx pc = {c, spec, name, c->compare ? cmp_modes[m][1] : NULL, c->compare ? cmp_modes[m][0] : NULL,
                               want_progress(c), isatty(2), 0, {{0}}, fr, 0, 0};
    memset(fr, 0, sizeof *fr);
    *probes = 1;
    int f = top ? fit_probe(&pc, top) : -1;
    if (f <= 0)
        return f < 0 ? -1 : 1;
    /* fits_on kept that replay's summary for the caller: the figures on the full device */
    *full = pc.last;
    uint64_t peak = full->peak_allocated > 0 ? (uint64_t)full->peak_allocated : 0;
    uint64_t reserved = full->peak_reserved > 0 ? (uint64_t)full->peak_reserved : 0;
    int rc = fitscan_run(fit_probe, &pc, peak, reserved, top, step, &c->ceiling, 1, fr);
    *probes = fr->probes;
    if (pc.progress && pc.tty)
        fprintf(stderr, "\r%*s\r", 100, "");
    return rc;
}

/* What --min-device --full-scan says of one row besides the table: the ceiling, and what fits
 * and fails around the bisection's answer (the verdict's), in words. */
static void min_device_note(const char *name, const char *mode, const struct fitscan_result *fr)
{
    char iso[256], gaps[256];
    fitscan_ranges_text(fr->isolated, fr->nisolated, iso, sizeof iso);
    fitscan_ranges_text(fr->gaps, fr->ngaps, gaps, sizeof gaps);
    if (fr->above_ceiling)
        printf("  %s (%s): the bisection's answer lies above the ceiling (%llu MiB): not scanned\n", name, mode,
               (unsigned long long)(fr->ceiling >> 20));
    else if (fr->nisolated)
        printf("  %s (%s): fits every device from %llu MiB (to %llu MiB scanned); the bisection's answer (the "
               "verdict's) is %llu MiB: it also fits %s alone, and fails %s (a gap: fit is not monotonic)\n",
               name, mode, (unsigned long long)(fr->min_device >> 20), (unsigned long long)(fr->ceiling >> 20),
               (unsigned long long)(fr->candidate >> 20), iso, gaps);
    else
        printf("  %s (%s): every size from %llu MiB (the bisection's answer, the verdict's) to %llu MiB fits: no "
               "gap\n", name, mode, (unsigned long long)(fr->min_device >> 20), (unsigned long long)(fr->ceiling >> 20));
}

static void json_ranges(const char *key, const struct fitscan_range *rs, size_t n)
{
    printf(",\"%s\":[", key);
    for (size_t i = 0; i < n && i < FITSCAN_RANGES_MAX; i++)
        printf("%s[%llu,%llu]", i ? "," : "", (unsigned long long)rs[i].lo, (unsigned long long)rs[i].hi);
    putchar(']');
}

/* One --min-device row (text or JSON). */
static void min_device_row(const struct cli *c, const char *name, const struct run_summary *full,
                           const struct fitscan_result *fr, int probes)
{
    uint64_t peak = full->peak_allocated > 0 ? (uint64_t)full->peak_allocated : 0;
    uint64_t hi = fr->min_device;
    double ratio = peak ? (double)hi / (double)peak : 0;
    const char *mode = full->mode[0] ? full->mode : "?";
    if (c->summary == SUM_TEXT) {
        char to[32] = "-";
        if (fr->ceiling && !fr->above_ceiling)
            snprintf(to, sizeof to, "%10.3f GiB", (double)fr->ceiling / (1 << 30));
        printf("%-40s %-11s %10.3f GiB %10.3f GiB %7.4f %7d %14s\n", name, mode, (double)peak / (1 << 30),
               (double)hi / (1 << 30), ratio, probes, to);
        if (c->full_scan)
            min_device_note(name, mode, fr);
    } else if (c->summary == SUM_JSON) {
        printf("{\"trace\":");
        report_json_string(stdout, full->trace);
        printf(",\"mode\":\"%s\",\"peak_allocated\":%llu,\"min_device\":%llu,"
               "\"ratio\":%.4f,\"step\":%llu,\"probes\":%d,\"bisection\":%llu,\"full_scan\":%s,\"ceiling\":%llu,"
               "\"above_ceiling\":%s",
               mode, (unsigned long long)peak, (unsigned long long)hi, ratio, (unsigned long long)c->step, probes,
               (unsigned long long)fr->candidate, c->full_scan ? "true" : "false", (unsigned long long)fr->ceiling,
               fr->above_ceiling ? "true" : "false");
        json_ranges("also_fits", fr->isolated, fr->nisolated);
        json_ranges("gaps", fr->gaps, fr->ngaps);
        printf("}\n");
    }
    fflush(stdout);
}

static int min_device_children(const struct cli *c)
{
    size_t nmodes = c->compare ? 2 : 1;
    int rc = 0;
    if (c->summary == SUM_TEXT) {
        if (!c->full_scan)
            printf("(the bisection the verdict and --tune use; fit is not monotonic in the device size, so a size "
                   "above it may fail: --full-scan checks every size up to 1.10 x peak allocated)\n");
        if (!c->compare)
            printf("(%s only: --compare adds PyTorch's allocator by default (classic mode), as the verdict "
                   "compares; --tune its best one-line setting)\n", c->config ? "this --config" : "xseg's default");
        printf("%-40s %-11s %14s %14s %7s %7s %14s\n", "trace", "mode", "peak alloc", "min device", "ratio", "probes",
               "every size to");
    }
    for (int ti = 0; ti < c->ntraces; ti++) {
        for (size_t m = 0; m < nmodes; m++) {
            const char *name = c->names[ti];
            struct run_summary full;
            struct fitscan_result fr;
            int probes;
            int f = min_device_of(c, c->traces[ti], name, m, &full, &fr, &probes);
            if (f) {
                if (f == -2)
                    fprintf(stderr, "xseg-replay: %s: out of host memory\n", name);
                else if (probes == 1)
                    fprintf(stderr, "xseg-replay: %s%s%s: %s\n", name, c->compare ? " in " : "",
                            c->compare ? cmp_modes[m][0] : "",
                            f < 0 ? "the replay stopped" : "does not fit on --device-mem (raise it)");
                else
                    fprintf(stderr, "xseg-replay: %s: a probe's replay stopped\n", name);
                rc = 1;
                continue;
            }
            min_device_row(c, name, &full, &fr, probes);
        }
    }
    return rc;
}

/* --tune's replays: one child each, quiet, on the device it asks for. */
struct tune_ctx {
    const struct cli *c;
    const char *spec, *name;
};

static int tune_probe(void *user, const char *config, uint64_t device_bytes, double deadline, struct run_summary *out)
{
    const struct tune_ctx *tc = user;
    struct cli q = *tc->c;
    q.deadline = deadline;
    q.marks = RUN_MARKS_NONE;
    q.progress = 0;
    q.history = 0;
    q.explain_oom = 0;
    char mem[32];
    snprintf(mem, sizeof mem, "%llu", (unsigned long long)device_bytes);
    struct child_result r;
    run_child(&q, tc->spec, tc->name, config, NULL, device_bytes ? mem : NULL, 1, NULL, &r);
    free(r.marks);
    run_timeline_free(&r.tl);
    if (r.over_deadline)
        return 1; /* the budget ran out during this replay: tune.c says so */
    if (r.rc != 0 || !r.have_summary) {
        fprintf(stderr, "\nxseg-replay: --tune: the replay of %s with --config %s%s%s stopped (exit status %d)\n",
                tc->name, config, device_bytes ? " --device-mem " : "", device_bytes ? mem : "", r.rc);
        return -1;
    }
    *out = r.sum;
    return 0;
}

static uint64_t device_bytes(const struct cli *c)
{
    return c->device_mem ? strtoull(c->device_mem, NULL, 10) : 80ULL << 30;
}

/* Everything the replays of several traces collect for the summary, the plot and the report. */
struct children {
    size_t nt, nmodes;
    struct child_result *res;
    struct plot_panel *panels;
    struct plot_series *series;
    struct trace *traces;     /* the parent's copy: recorded figures, marks, live allocations */
    struct plot_mark **marks;
    size_t *nmarks;
    struct tune_result *tunes; /* the verdict's search (--tune's answer with --tune) */
    int *tuned;
    struct report_headline *heads;
    char (*explain_device)[160]; /* where --explain-oom's replays ran, in words ("": the device replayed) */
    char tmpdir[32];
};

/* One (trace, mode) replay in a child, its timeline read back when a plot or report wants it.
 * @return 0, 1 it stopped, 2 it was stopped at --tune-budget's seconds. */
static int replay_child_mode(const struct cli *c, struct children *ch, size_t ti, size_t m)
{
    char tl_path[PATH_MAX];
    snprintf(tl_path, sizeof tl_path, "%s/t%zu-m%zu.txt", ch->tmpdir, ti, m);
    struct child_result *r = &ch->res[ti * ch->nmodes + m];
    /* One snapshot file per replay: .MODE, and .N when several traces run. */
    char snap[PATH_MAX + 64], tag[64];
    snprintf(tag, sizeof tag, "%s%s%.0zu", c->compare ? cmp_modes[m][0] : "", c->compare && ch->nt > 1 ? "." : "",
             ch->nt > 1 ? ti + 1 : 0);
    if (c->snapshot)
        run_snapshot_path(c->snapshot, tag, snap, sizeof snap);
    int want_tl = c->plot || c->report;
    run_child(c, c->traces[ti], c->names[ti], c->compare ? cmp_modes[m][1] : NULL, want_tl ? tl_path : NULL, NULL, 0,
              c->snapshot ? (tag[0] ? snap : c->snapshot) : NULL, r);
    int rc = 0;
    if (r->over_deadline) {
        fprintf(stderr, "xseg-replay: %s%s%s: stopped at --tune-budget's %g s, before the end of the trace\n",
                c->names[ti], c->compare ? " in " : "", c->compare ? cmp_modes[m][0] : "", c->budget.seconds);
        rc = 2;
    } else if (r->rc != 0 || !r->have_summary) {
        fprintf(stderr, "xseg-replay: %s%s%s: the replay stopped (exit status %d)\n", c->names[ti],
                c->compare ? " in " : "", c->compare ? cmp_modes[m][0] : "", r->rc);
        rc = 1;
    }
    if (!r->have_summary) {
        snprintf(r->sum.mode, sizeof r->sum.mode, "%s", c->compare ? cmp_modes[m][0] : "?");
        snprintf(r->sum.trace, sizeof r->sum.trace, "%s", c->names[ti]);
    }
    if (c->summary == SUM_JSON && r->have_summary)
        report_summary_json(stdout, &r->sum);
    if (want_tl)
        unlink(tl_path);
    uint64_t nf = r->sum.failed_allocs < RUN_FAILED_AT_MAX ? r->sum.failed_allocs : RUN_FAILED_AT_MAX;
    ch->series[ti * ch->nmodes + m] = (struct plot_series){r->sum.mode, &r->tl, r->sum.failed_at, (size_t)nf};
    return rc;
}

/* Run @p fn(@p arg, fd) in a forked helper that writes its answer to fd and exits: the read end
 * in *@p rfd, its pid returned (-1: no helper, *@p rfd -1; the caller does the work itself). A
 * replay mostly waits on the emulated driver, so two searches at once take the time of one. */
static pid_t helper_start(void (*fn)(void *arg, int fd), void *arg, int *rfd)
{
    int p[2];
    *rfd = -1;
    if (pipe(p))
        return -1;
    fflush(NULL); /* a helper exits with _exit, but nothing buffered must be written twice */
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        fn(arg, p[1]);
        _exit(0);
    }
    close(p[1]);
    if (pid < 0)
        close(p[0]);
    else
        *rfd = p[0];
    return pid;
}

/* Read exactly @p len bytes (0), or fail (-1). */
static int read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* The helper's end: its answer read (0), or -1 (then the caller does the work itself). */
static int helper_finish(pid_t pid, int fd, void *buf, size_t len)
{
    int rc = pid > 0 && fd >= 0 ? read_full(fd, buf, len) : -1;
    if (fd >= 0)
        close(fd);
    while (pid > 0 && waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return rc;
}

/* The verdict's search for one trace: --tune's (tune.h), with the plan and the seeds given. */
struct search_job {
    const struct cli *c;
    const char *spec, *name;
    struct tune_plan plan;
    int progress;
    struct tune_result r;
    xseg_status st;
    char err[TRACE_ERR_MAX];
};

static void search_run(struct search_job *j)
{
    struct tune_ctx tc = {j->c, j->spec, j->name};
    j->st = tune_run(tune_probe, &tc, device_bytes(j->c), &j->c->budget, &j->plan, j->progress, &j->r, j->err,
                     sizeof j->err);
}

static void search_helper(void *arg, int fd)
{
    struct search_job *j = arg;
    search_run(j);
    ssize_t n = write(fd, j, sizeof *j);
    (void)n;
}

/* The seeds of the search: the mode replays already made that are a family's default. */
static void search_seeds(const struct cli *c, const struct children *ch, size_t ti, struct tune_plan *plan)
{
    const struct child_result *row = &ch->res[ti * ch->nmodes];
    for (size_t m = 0; m < ch->nmodes; m++) {
        if (!row[m].have_summary)
            continue;
        if (c->compare)
            plan->seed[m] = &row[m].sum; /* classic: PyTorch's default; expandable: xseg's */
        else if (!c->config)
            plan->seed[1] = &row[m].sum; /* no config: xseg's default */
    }
}

/*
 * The search the headline comes from (and --tune's answer): PyTorch's allocator in full (its best
 * one-line setting) and xseg's default (its smallest device), as two helpers at once; with --tune
 * or --report both families in full, in order, here (the budget's shares are --tune's). @return 0,
 * 1 after a message.
 */
static int verdict_search(const struct cli *c, struct children *ch, size_t ti)
{
    int full = c->tune || c->report;
    struct search_job j = {c, c->traces[ti], c->names[ti],
                           {{TUNE_FULL, full ? TUNE_FULL : TUNE_DEFAULT_ONLY}, {NULL, NULL}, c->step, c->t_start},
                           want_progress(c), {{{0}}}, 0, ""};
    search_seeds(c, ch, ti, &j.plan);
    if (j.progress)
        fprintf(stderr, "xseg-replay: %s: searching PyTorch's configs for its best one-line setting and each smallest "
                "device (the verdict's headline%s; a few dozen replays)\n", c->names[ti], full ? ", and --tune" : "");
    if (full) {
        search_run(&j);
    } else {
        struct search_job x = j;
        x.plan.depth[0] = TUNE_SKIP;
        x.progress = 0;
        j.plan.depth[1] = TUNE_SKIP;
        int fd;
        pid_t pid = helper_start(search_helper, &x, &fd);
        search_run(&j);
        if (helper_finish(pid, fd, &x, sizeof x))
            search_run(&x);
        j.r.fam[1] = x.r.fam[1];
        j.r.runs += x.r.runs;
        j.r.seconds = j.r.seconds > x.r.seconds ? j.r.seconds : x.r.seconds;
        j.r.cut_short |= x.r.cut_short;
        j.r.stopped_replay |= x.r.stopped_replay;
        if (!j.r.cut_by)
            j.r.cut_by = x.r.cut_by;
        if (x.st && !j.st) {
            j.st = x.st;
            memcpy(j.err, x.err, sizeof j.err);
        }
    }
    ch->tunes[ti] = j.r;
    if (j.st) {
        fprintf(stderr, "xseg-replay: %s: %s\n", c->names[ti], j.err);
        return 1;
    }
    ch->tuned[ti] = 1;
    return 0;
}

/* One replay on the device an OOM recording failed on: 1 fits, 0 fails, -1 no answer; the
 * --explain-oom text of its first failed allocation into *@p explain when asked. */
static int oom_probe(const struct cli *c, const char *spec, const char *name, const char *cfg, uint64_t bytes,
                     int explain, char **explain_out, struct run_summary *sum)
{
    char mem[32];
    snprintf(mem, sizeof mem, "%llu", (unsigned long long)bytes);
    struct cli q = *c;
    q.marks = RUN_MARKS_NONE;
    q.progress = 0;
    q.history = 0;
    q.explain_oom = explain;
    struct child_result r;
    run_child(&q, spec, name, cfg, NULL, mem, 1, NULL, &r);
    free(r.marks);
    run_timeline_free(&r.tl);
    if (explain_out)
        *explain_out = r.explain;
    else
        free(r.explain);
    if (sum)
        *sum = r.sum;
    return r.rc != 0 || !r.have_summary ? -1 : r.sum.failed_allocs == 0;
}

/* The OOM's questions, on the device PyTorch failed on (--device-mem, else what it held plus what
 * was free): does xseg fit there, does PyTorch's allocator by default and with its best setting,
 * does xseg with spill_to_host when nothing else does? With --explain-oom each mode's first failed
 * allocation there is explained (and said on which device). */
static void verdict_oom(const struct cli *c, struct children *ch, size_t ti, struct report_headline *h)
{
    const struct trace_recorded *rec = &ch->traces[ti].recorded;
    if (!(rec->noom > 0 || rec->oom_device >= 0))
        return;
    h->oom_given = c->device_mem != NULL;
    h->oom_device = c->device_mem ? strtoull(c->device_mem, NULL, 10) : rec->oom_device > 0 ? (uint64_t)rec->oom_device : 0;
    if (!h->oom_device)
        return;
    const char *spec = c->traces[ti], *name = c->names[ti];
    struct child_result *row = &ch->res[ti * ch->nmodes];
    for (size_t m = 0; m < ch->nmodes && m < 2; m++) {
        int who = (c->compare ? m == 0 : !strncmp(row[m].sum.mode, "classic", 7)) ? REPORT_CLASSIC : REPORT_XSEG;
        const char *cfg = c->compare ? cmp_modes[m][1] : NULL;
        if (c->device_mem) { /* the replay just made ran on that device */
            h->oom_fits[who] = row[m].sum.failed_allocs == 0;
            continue;
        }
        char *x = NULL;
        h->oom_fits[who] = oom_probe(c, spec, name, cfg, h->oom_device, c->explain_oom && !row[m].explain, &x, NULL);
        if (x && !row[m].explain)
            row[m].explain = x;
        else
            free(x);
    }
    const struct tune_family_result *py = ch->tuned[ti] ? &ch->tunes[ti].fam[0] : NULL;
    if (py && py->have_best && py->best.shown[0])
        h->oom_fits[REPORT_BEST] = oom_probe(c, spec, name, py->best.config, h->oom_device, 0, NULL, NULL);
    else if (py && py->have_best)
        h->oom_fits[REPORT_BEST] = h->oom_fits[REPORT_CLASSIC];
    if (h->oom_fits[REPORT_XSEG] == 0 && h->oom_fits[REPORT_CLASSIC] != 1 && h->oom_fits[REPORT_BEST] != 1) {
        struct run_summary sum;
        h->spill_fits = oom_probe(c, spec, name, "expandable_segments:True,spill_to_host:True", h->oom_device, 0, NULL,
                                  &sum);
        h->spilled_peak = sum.spilled_peak;
    }
}

/* A mode the search does not cover (a config of the user's): its own bisection, the same one. */
static void mode_min_device(const struct cli *c, const char *spec, const char *name, struct run_summary *s)
{
    if (s->failed_allocs || s->peak_allocated <= 0)
        return;
    struct fit_probe_ctx pc = {c, spec, name, NULL, NULL, 0, 0, 0, {{0}}, NULL, 0, 0};
    struct fitscan_result fr;
    struct fitscan_ceiling none = {0};
    uint64_t top = device_bytes(c) / c->step * c->step;
    if (fitscan_run(fit_probe, &pc, (uint64_t)s->peak_allocated, (uint64_t)s->peak_reserved, top, c->step, &none, 1,
                    &fr) == 0)
        s->min_device = fr.min_device;
}

/* The verdict's figures of trace @p ti: the search, each mode's smallest device from it, the OOM's
 * answers. */
static int verdict_figures(const struct cli *c, struct children *ch, size_t ti)
{
    int rc = verdict_search(c, ch, ti);
    struct report_headline *h = &ch->heads[ti];
    h->tune = ch->tuned[ti] ? &ch->tunes[ti] : NULL;
    for (size_t m = 0; m < ch->nmodes; m++) {
        struct run_summary *s = &ch->res[ti * ch->nmodes + m].sum;
        s->device_bytes = device_bytes(c);
        const struct tune_candidate *d = !h->tune ? NULL
                                         : c->compare ? &ch->tunes[ti].fam[m ? 1 : 0].def
                                         : !c->config ? &ch->tunes[ti].fam[1].def : NULL;
        if (d && !d->failed_allocs && !d->stopped)
            s->min_device = d->min_device;
        else if (!d && !c->compare && c->config)
            mode_min_device(c, c->traces[ti], c->names[ti], s);
    }
    verdict_oom(c, ch, ti, h);
    return rc;
}

/* The section of trace @p ti on stdout: the verdict, the marks and the table, the explanations. */
static void section_text(const struct cli *c, struct children *ch, size_t ti)
{
    struct child_result *row = &ch->res[ti * ch->nmodes];
    struct run_summary sums[2];
    struct report_mark *marks[2];
    size_t nmarks[2];
    for (size_t m = 0; m < ch->nmodes; m++) {
        sums[m] = row[m].sum;
        marks[m] = row[m].marks;
        nmarks[m] = c->marks == RUN_MARKS_TABLE ? row[m].nmarks : 0;
    }
    report_compare_text(stdout, c->names[ti], sums, marks, nmarks, ch->nmodes, c->pool, &ch->traces[ti].recorded,
                        ch->heads[ti].tune ? &ch->heads[ti] : NULL, c->driver_stats);
    for (size_t m = 0; m < ch->nmodes; m++) {
        if (!row[m].explain)
            continue;
        if (ch->nmodes > 1)
            printf("In %s mode", row[m].sum.mode);
        if (ch->explain_device[ti][0])
            printf("%s%s", ch->nmodes > 1 ? ", " : "", ch->explain_device[ti]);
        if (ch->nmodes > 1 || ch->explain_device[ti][0])
            printf(":\n");
        fputs(row[m].explain, stdout);
        putchar('\n');
    }
}

/* --tune's answer, whatever --summary says (JSON lines with --summary=json, else text). */
static void tune_answer(const struct cli *c, struct children *ch, size_t ti)
{
    if (c->summary == SUM_JSON)
        tune_print_json(stdout, c->names[ti], &ch->tunes[ti]);
    else
        tune_print(stdout, c->names[ti], &ch->tunes[ti]);
}

/* Every mode of trace @p ti, then its verdict, its plot panel and its tuning. */
static int replay_child_trace(const struct cli *c, struct children *ch, size_t ti)
{
    int rc = 0;
    char err[TRACE_ERR_MAX];
    if (load_trace(c, c->traces[ti], &ch->traces[ti], err, sizeof err) ||
        plot_marks_of_trace(&ch->traces[ti], &ch->marks[ti], &ch->nmarks[ti])) {
        fprintf(stderr, "xseg-replay: %s\n", err);
        return 1;
    }
    name_trace(&ch->traces[ti], c->names[ti]);
    report_headline_init(&ch->heads[ti], &ch->traces[ti]);
    int over = 0;
    for (size_t m = 0; m < ch->nmodes; m++) {
        int r = replay_child_mode(c, ch, ti, m);
        over |= r == 2;
        rc |= r == 1;
    }
    if (rc == 0 && !c->real_gpu && (c->summary == SUM_TEXT || c->report || c->tune))
        rc = verdict_figures(c, ch, ti);
    if (over && ch->tuned[ti]) { /* a mode's replay was what the budget's seconds stopped */
        ch->tunes[ti].stopped_replay = ch->tunes[ti].cut_short = 1;
        ch->tunes[ti].cut_by = "seconds";
    }
    if (c->explain_oom && !c->device_mem && ch->heads[ti].oom_device) {
        char d[32];
        size_text(d, sizeof d, ch->heads[ti].oom_device);
        snprintf(ch->explain_device[ti], sizeof ch->explain_device[ti], "on your %s device (the capacity the "
                 "snapshot records: what PyTorch held plus what was free when it failed)", d);
    }
    if (!over && (c->summary == SUM_TEXT || (c->summary == SUM_NONE && c->marks == RUN_MARKS_TABLE)))
        section_text(c, ch, ti);
    struct child_result *row = &ch->res[ti * ch->nmodes];
    ch->panels[ti] = (struct plot_panel){c->names[ti], row[0].sum.actions, &ch->series[ti * ch->nmodes], ch->nmodes,
                                         ch->marks[ti], ch->nmarks[ti]};
    for (size_t m = 1; m < ch->nmodes; m++)
        if (row[m].sum.actions > ch->panels[ti].xmax)
            ch->panels[ti].xmax = row[m].sum.actions;
    if (c->tune && ch->tuned[ti])
        tune_answer(c, ch, ti);
    fflush(stdout);
    return rc;
}

/* The --plot SVG and the --report page, from what the replays collected. */
static int children_outputs(const struct cli *c, struct children *ch)
{
    char err[TRACE_ERR_MAX];
    int rc = 0;
    if (c->plot) {
        if (plot_write_svg(c->plot, ch->panels, ch->nt, err, sizeof err)) {
            fprintf(stderr, "xseg-replay: %s\n", err);
            rc = 1;
        } else {
            fprintf(stderr, "xseg-replay: wrote %s\n", c->plot);
        }
    }
    if (c->report) {
        struct webreport_trace *wt = calloc(ch->nt, sizeof *wt);
        struct run_summary *sums = calloc(ch->nt * ch->nmodes, sizeof *sums);
        const char **explain = calloc(ch->nt * ch->nmodes, sizeof *explain);
        for (size_t ti = 0; wt && sums && explain && ti < ch->nt; ti++) {
            for (size_t m = 0; m < ch->nmodes; m++) {
                sums[ti * ch->nmodes + m] = ch->res[ti * ch->nmodes + m].sum;
                explain[ti * ch->nmodes + m] = ch->res[ti * ch->nmodes + m].explain;
            }
            wt[ti] = (struct webreport_trace){&ch->traces[ti], &sums[ti * ch->nmodes], ch->nmodes, &ch->panels[ti],
                                              ch->tuned[ti] ? &ch->tunes[ti] : NULL, &explain[ti * ch->nmodes],
                                              ch->explain_device[ti], ch->heads[ti].tune ? &ch->heads[ti] : NULL};
        }
        if (!wt || !sums || !explain) {
            fprintf(stderr, "xseg-replay: out of host memory\n");
            fclose(c->report_file);
            unlink(c->report);
            rc = 1;
        } else if (webreport_write(c->report_file, c->report, wt, ch->nt, err, sizeof err)) {
            fprintf(stderr, "xseg-replay: %s\n", err);
            rc = 1;
        } else {
            fprintf(stderr, "xseg-replay: wrote %s (open it in a browser)\n", c->report);
        }
        free(wt);
        free(sums);
        free(explain);
    }
    return rc;
}

static int replay_children(const struct cli *c)
{
    struct children ch = {.nt = (size_t)c->ntraces, .nmodes = c->compare ? 2 : 1};
    size_t nt = ch.nt;
    snprintf(ch.tmpdir, sizeof ch.tmpdir, "/tmp/xseg-replay-XXXXXX");
    ch.res = calloc(nt * ch.nmodes, sizeof *ch.res);
    ch.panels = calloc(nt, sizeof *ch.panels);
    ch.series = calloc(nt * ch.nmodes, sizeof *ch.series);
    ch.traces = calloc(nt, sizeof *ch.traces);
    ch.marks = calloc(nt, sizeof *ch.marks);
    ch.nmarks = calloc(nt, sizeof *ch.nmarks);
    ch.tunes = calloc(nt, sizeof *ch.tunes);
    ch.tuned = calloc(nt, sizeof *ch.tuned);
    ch.heads = calloc(nt, sizeof *ch.heads);
    ch.explain_device = calloc(nt, sizeof *ch.explain_device);
    int rc = 0;
    if (!ch.res || !ch.panels || !ch.series || !ch.traces || !ch.marks || !ch.nmarks || !ch.tunes || !ch.tuned ||
        !ch.heads || !ch.explain_device ||
        ((c->plot || c->report) && !mkdtemp(ch.tmpdir))) {
        fprintf(stderr, "xseg-replay: out of host memory (or no /tmp)\n");
        rc = 1;
    }
    for (size_t ti = 0; rc == 0 && ti < nt; ti++)
        rc |= replay_child_trace(c, &ch, ti);
    if (c->plot || c->report)
        rmdir(ch.tmpdir);
    if (rc == 0) {
        rc = children_outputs(c, &ch);
    } else if (c->report_file) { /* no page: not an empty file either */
        fclose(c->report_file);
        unlink(c->report);
    }
    for (size_t i = 0; ch.res && i < nt * ch.nmodes; i++) {
        free(ch.res[i].marks);
        free(ch.res[i].explain);
        run_timeline_free(&ch.res[i].tl);
    }
    for (size_t ti = 0; ch.traces && ti < nt; ti++) {
        trace_destroy(&ch.traces[ti]);
        free(ch.marks ? ch.marks[ti] : NULL);
    }
    free(ch.res);
    free(ch.panels);
    free(ch.series);
    free(ch.traces);
    free(ch.marks);
    free(ch.nmarks);
    free(ch.tunes);
    free(ch.tuned);
    free(ch.heads);
    free(ch.explain_device);
    return rc;
}

/* The folder of converted snapshots, removed at exit and on a fatal signal with what is in it. */
static char snapshot_tmp[64];

/* Remove the files and folders in the folder @p fd (closed here), two levels deep: our own
 * mkdtemp folder holds a subfolder per snapshot, trace files in them. Only system calls that are
 * async-signal-safe (getdents64, unlinkat, openat, close), so a signal handler may call it. */
static void remove_entries(int fd, int depth)
{
    char buf[4096];
    long n;
    while (fd >= 0 && (n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            struct linux_dirent64 {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *e = (void *)(buf + off);
            off += e->reclen;
            if (e->name[0] == '.' && (!e->name[1] || (e->name[1] == '.' && !e->name[2])))
                continue;
            if (e->type == DT_DIR && depth > 0) {
                remove_entries(openat(fd, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW), depth - 1);
                unlinkat(fd, e->name, AT_REMOVEDIR);
            } else {
                unlinkat(fd, e->name, 0);
            }
        }
    }
    if (fd >= 0)
        close(fd);
}

static void snapshot_tmp_remove(void)
{
    if (!snapshot_tmp[0])
        return;
    remove_entries(open(snapshot_tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW), 1);
    rmdir(snapshot_tmp);
}

/* Interrupted (Ctrl-C, kill): the converter (if it runs) stops first, the converted traces go,
 * then the signal does what it does. */
static void snapshot_tmp_signal(int sig)
{
    pid_t conv = snapshot_converter_pid;
    if (conv > 0) {
        kill(conv, SIGKILL);
        waitpid(conv, NULL, 0);
    }
    snapshot_tmp_remove();
    signal(sig, SIG_DFL);
    raise(sig);
}

/*
 * Replace each PyTorch snapshot among the traces (told by its first byte) by one converted trace
 * per device that holds data (--device N: that one), named "FILE (device N)" in what is printed.
 * Returns 0, or 1 after the one-line message of what was wrong.
 */
static int expand_snapshots(struct cli *c)
{
    int any = 0;
    for (int i = 0; i < c->ntraces; i++) {
        const char *spec = c->traces[i];
        if (!strncmp(spec, "builtin:", 8))
            continue;
        if (!snapshot_is_pickle(spec)) {
            /* An empty file named as a snapshot would otherwise be read as an empty trace and
             * "replay" with exit 0. */
            char why[160];
            if (snapshot_named_but_not(spec, why, sizeof why)) {
                fprintf(stderr, "xseg-replay: %s: not a PyTorch snapshot: %s\n", spec, why);
                return 1;
            }
            continue;
        }
        any = c->any_snapshot = 1;
        if (!snapshot_tmp[0]) {
            const char *tmp = getenv("TMPDIR");
            snprintf(snapshot_tmp, sizeof snapshot_tmp, "%s/xseg-replay-XXXXXX",
                     tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp");
            if (!mkdtemp(snapshot_tmp)) {
                fprintf(stderr, "xseg-replay: cannot make a folder for the converted snapshot (%s): %m\n",
                        snapshot_tmp);
                snapshot_tmp[0] = '\0';
                return 1;
            }
            atexit(snapshot_tmp_remove);
            struct sigaction sa = {.sa_handler = snapshot_tmp_signal};
            sigemptyset(&sa.sa_mask);
            sigaction(SIGINT, &sa, NULL);
            sigaction(SIGTERM, &sa, NULL);
            sigaction(SIGHUP, &sa, NULL);
        }
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%d", snapshot_tmp, i);
        if (mkdir(dir, 0700)) {
            fprintf(stderr, "xseg-replay: cannot make %s: %m\n", dir);
            return 1;
        }
        struct snapshot_device *devs;
        size_t n;
        char err[TRACE_ERR_MAX];
        /* Frames for --history (the snapshot's stacks) and for --report (its live allocations'
         * frames); left out otherwise, as a smaller trace parses faster in every replay. */
        if (snapshot_convert(spec, c->device, c->history || c->report || c->explain_oom, dir, &devs, &n, err, sizeof err)) {
            if (err[0])
                fprintf(stderr, "xseg-replay: %s\n", err);
            return 1;
        }
        size_t total = (size_t)c->ntraces - 1 + n;
        const char **traces = calloc(total + 1, sizeof *traces), **names = calloc(total + 1, sizeof *names);
        if (!traces || !names) {
            free(traces);
            free(names);
            snapshot_devices_free(devs, n);
            fprintf(stderr, "xseg-replay: out of host memory\n");
            return 1;
        }
        size_t k = 0;
        for (int j = 0; j < i; j++, k++)
            traces[k] = c->traces[j], names[k] = c->names[j];
        for (size_t d = 0; d < n; d++, k++) { /* the strings stay to the end, like the arrays */
            traces[k] = devs[d].trace_path, names[k] = devs[d].name;
            devs[d].trace_path = devs[d].name = NULL;
        }
        for (int j = i + 1; j < c->ntraces; j++, k++)
            traces[k] = c->traces[j], names[k] = c->names[j];

        snapshot_devices_free(devs, n);
        free((void *)c->traces);
        free((void *)c->names);
        c->traces = traces;
        c->names = names;
        c->ntraces = (int)total;
        i += (int)n - 1;
    }
    if (c->device >= 0 && !any && !c->child) {
        fprintf(stderr, "xseg-replay: --device %d: no PyTorch snapshot among the traces (--device picks a "
                "device of a snapshot)\n", c->device);
        return 1;
    }
    return 0;
}

/* The main job (no TRACE) says first what it does and what to look at. */
static void intro(int real_gpu)
{
    if (real_gpu)
        printf("xseg-replay: replaying two bundled workloads (builtin:training, builtin:inference) on the GPU,\n"
               "each twice: classic mode (PyTorch's caching allocator, as xseg models it) and expandable mode\n"
               "(xseg's default). Each workload opens with what each mode reserves at its peak on this GPU;\n"
               "the marks and the table below show where. The verdict (the smallest device xseg fits it on,\n"
               "against PyTorch's allocator by default and with its best one-line setting) replays on\n"
               "emulated devices of each size: run this where no GPU is found, or with XSEG_LIBCUDA set to\n"
               "libcudaemu.so. Your own run: a PyTorch snapshot: xseg-replay FILE.pickle; --report out.html\n"
               "for a page with the plot, --help for the rest.\n\n");
    else
        printf("xseg-replay: replaying two bundled workloads (builtin:training, builtin:inference) on the emulator\n"
               "(cudaemu), each twice: classic mode (PyTorch's caching allocator, as xseg models it) and\n"
               "expandable mode (xseg's default). Each workload opens with the verdict: the smallest device\n"
               "xseg fits it on, against PyTorch's allocator by default and with its best one-line setting (the\n"
               "PYTORCH_CUDA_ALLOC_CONF line --tune's search finds); the marks and the table below show where.\n"
               "Your own run: a PyTorch snapshot: xseg-replay FILE.pickle; --report out.html for a page with\n"
               "the plot and the best config (--tune), --help for the rest.\n\n");
    fflush(stdout);
}

/* Every trace loaded once before any replay (a typo costs nothing), and what the recordings ask
 * for: both modes for an OOM or a PyTorch snapshot, the OOM's device for --explain-oom here.
 * @return 0, 1 after a message. */
static int validate_traces(struct cli *c)
{
    for (int i = 0; i < c->ntraces; i++) {
        struct trace t;
        char err[TRACE_ERR_MAX];
        if (load_trace(c, c->traces[i], &t, err, sizeof err)) {
            fprintf(stderr, "xseg-replay: %s\n", err);
            return 1;
        }
        /* A recording that ended in an OOM is answered for both modes ("would xseg have avoided
         * it?", against PyTorch's allocator as modelled), and so is every PyTorch snapshot (its
         * headline compares xseg with PyTorch's allocator), unless options name one mode or files
         * whose names depend on the number of modes. */
        if ((t.recorded.noom || t.recorded.oom_device >= 0 || c->any_snapshot) && c->summary == SUM_TEXT &&
            !c->config && !c->min_device && !c->snapshot && !c->plot && !c->timeline_out)
            c->compare = 1;
        /* --explain-oom on one replay here: on the device the recording failed on. */
        if (c->explain_oom && !c->device_mem && c->ntraces == 1 && t.recorded.oom_device > 0) {
            static char mem[32];
            snprintf(mem, sizeof mem, "%lld", (long long)t.recorded.oom_device);
            c->explain_device = mem;
        }
        trace_destroy(&t);
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* Static: what parse_cli allocates stays reachable to the end (no leak report on exit). */
    static struct cli c;
    int rc = parse_cli(argc, argv, &c);
    if (rc)
        return rc;
    if ((c.tune || c.report) && (c.min_device || c.child))
        return usage_error("%s", c.min_device ? "--tune and --report do not combine with --min-device (--tune finds "
                                                "the smallest device of each config it ranks)"
                                              : "--tune and --report are not for --child");
    if (c.ntraces == 0) {
        if (c.check || c.dump)
            return usage_error("%s needs a TRACE", c.check ? "--check" : "--dump");
        static const char *defaults[] = {"builtin:training", "builtin:inference"};
        free((void *)c.traces);
        free((void *)c.names);
        c.traces = defaults;
        c.names = defaults;
        c.ntraces = 2;
        c.compare = 1;
        c.builtin_default = 1;
    }
    if (expand_snapshots(&c))
        return 1;
    if (c.report) {
        c.compare = 1;     /* the page compares PyTorch's allocator (classic mode) with xseg */
        c.explain_oom = 1; /* and says why a failed allocation failed */
    }
    if (c.check || c.dump) {
        for (int i = 0; i < c.ntraces; i++) {
            struct trace t;
            char err[TRACE_ERR_MAX];
            if (load_trace(&c, c.traces[i], &t, err, sizeof err)) {
                fprintf(stderr, "xseg-replay: %s\n", err);
                rc = 1;
                continue;
            }
            name_trace(&t, c.names[i]);
            if (c.dump && c.ntraces > 1)
                printf("# %s\n", t.source);
            if (c.dump)
                trace_dump(&t, stdout);
            else
                printf("%s: ok, %zu actions, %llu allocations, %zu buffers, %zu streams\n", t.source, t.count,
                       (unsigned long long)t.nallocs, t.bufs.count, t.streams.count);
            trace_destroy(&t);
        }
        return rc;
    }
    if (c.child && c.ntraces != 1)
        return usage_error("%s", "--child takes exactly one trace");
    /* Validate every trace before starting any replay: a typo should cost nothing. */
    if (!c.child && validate_traces(&c))
        return 1;
    int here = c.child || (!c.compare && c.ntraces == 1 && !c.tune && !c.min_device);
    if (find_driver(&c))
        return 1;
    /* On a GPU the device's memory is what it is: what sizes an emulated device is refused, and
     * the verdict's smallest-device search is not made (its answers would be the GPU's, not the
     * sizes probed). */
    c.real_gpu = !run_driver_is_emulator();
    if (c.real_gpu && !c.child) {
        const char *opt = c.min_device ? "--min-device" : c.tune ? "--tune" : c.device_mem ? "--device-mem" : NULL;
        if (opt) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s needs the emulator (cudaemu): on a GPU the device's memory is what it is, "
                     "and %s replays on emulated devices of the sizes it asks for. Run it where no GPU is found, or "
                     "with XSEG_LIBCUDA set to libcudaemu.so (beside xseg-replay in the wheel, build/cudaemu/ in a "
                     "build tree)", opt, opt);
            return usage_error("%s", msg);
        }
    }
    if (here && c.explain_device && !c.child && !c.real_gpu) {
        c.device_mem = c.explain_device;
        setenv("CUDAEMU_TOTAL_MEM", c.device_mem, 1);
        char d[32];
        size_text(d, sizeof d, strtoull(c.device_mem, NULL, 10));
        printf("--explain-oom: replaying on your %s device, the capacity the snapshot records (what PyTorch held "
               "plus what was free when it failed; --device-mem SIZE for another)\n", d);
    }
    if (c.builtin_default && !c.child && c.summary == SUM_TEXT)
        intro(c.real_gpu);
    c.t_start = mono_s();
    /* --tune-budget's seconds hold every replay of the command, the first one too. */
    if ((c.tune || c.report) && c.budget.seconds > 0 && !c.child)
        c.deadline = c.t_start + c.budget.seconds;
    if (c.report && !(c.report_file = fopen(c.report, "w"))) {
        fprintf(stderr, "xseg-replay: --report %s: cannot write: %s\n", c.report, strerror(errno));
        return 1;
    }
    if (c.min_device && !c.child)
        return min_device_children(&c);
    if (here)
        return replay_here(&c, c.traces[0], c.names[0]);
    return replay_children(&c);
}
