/*
 * What xseg-replay prints: mark rows (a table like the seed 003 tables, or JSON lines with every
 * statistic under its PyTorch key), the summary (text or one JSON object), the side-by-side
 * comparison of modes, and the reader for the JSON a child replay writes.
 */
#ifndef XSEG_TOOLS_REPLAY_REPORT_H
#define XSEG_TOOLS_REPLAY_REPORT_H

#include <stdio.h>

#include "tools/replay/runner.h"
#include "tools/replay/tune.h"

/* The mark table: "Tag (GiB)  Allocated  Active  InactiveSplit  Reserved", values in GiB to three
 * decimals, for the pool @p pool (XSEG_STAT_ALL, _SMALL_POOL, _LARGE_POOL). */
void report_mark_header(FILE *out, size_t label_width, int pool);
void report_mark_row(FILE *out, size_t label_width, const char *label, const xseg_device_stats *ds, int pool);
/* One JSON object: {"mark": label, "mode": mode, "<key>": bytes-or-count, ...} over every key
 * xseg_stat_key enumerates. */
void report_mark_jsonl(FILE *out, const char *label, const char *mode, int device);

/* Whom the verdict's OOM probes are about (report_headline.oom_fits). */
enum { REPORT_XSEG, REPORT_CLASSIC, REPORT_BEST, REPORT_WHO };

/*
 * The verdict's headline, from --tune's search (tune.h, whose bisection is --min-device's): the
 * smallest device of xseg's default (tune->fam[1].def), of PyTorch's allocator by default
 * (classic mode, tune->fam[0].def) and with its best one-line setting (tune->fam[0].best); for a
 * recording that ended in an OOM, whether each fits the device it failed on and what its live
 * tensors needed there; and what else xseg gives the workload.
 */
struct report_headline {
    const struct tune_result *tune; /* NULL: no search made (no headline) */
    uint64_t oom_device;            /* the device an OOM recording is answered on (0: none, or unknown) */
    int oom_given;                  /* 1: --device-mem, 0: the recording's */
    int oom_fits[REPORT_WHO];       /* on oom_device: 1 the whole run fits, 0 an allocation fails, -1 not probed */
    int spill_fits;                 /* xseg with spill_to_host:True there: 1 fits, 0 fails, -1 not tried */
    int64_t spilled_peak;           /* its peak of spilled bytes */
    size_t oom_at;                  /* the failing request's action (SIZE_MAX: no OOM recorded) */
    uint64_t oom_live, oom_request; /* the recording's live bytes just before it, and the request */
    size_t nsleeps, ngive_back;     /* the trace's sleep actions; its empty_cache, trim and idle actions */
};

/* The headline's parts that come from the trace itself (the OOM point, sleeps, give-backs); the
 * rest left unknown. */
void report_headline_init(struct report_headline *h, const struct trace *t);

/* The verdict box's colour, from the headline's comparison: "fail" (xseg does not fit the device,
 * or the OOM it is asked about is not avoided), "good" (xseg needs a smaller device than PyTorch's
 * best setting), "same" (as small), "worse" (larger); without a headline, from peak reserved
 * against the recording or classic mode. */
const char *report_outcome(const struct run_summary *s, size_t n, const struct trace_recorded *rec,
                           const struct report_headline *h);

/* The summary of one replay: the verdict, then the figures, PyTorch's recorded ones beside them
 * when @p rec has them; host time and driver calls only with @p driver_stats. */
void report_summary_text(FILE *out, const struct run_summary *s, const struct trace_recorded *rec,
                         int driver_stats);
void report_summary_json(FILE *out, const struct run_summary *s);

/* One mark of one mode, as read back from a child's JSON line. */
struct report_mark {
    char label[128];
    int64_t v[4]; /* allocated, active, inactive_split, reserved (bytes) */
};

/* Side by side: the verdict, marks (when any) and summaries of @p n modes of one trace, with a
 * "PyTorch (recorded)" column when @p rec has figures; host time and driver calls (emulator
 * figures on cudaemu) only with @p driver_stats. */
void report_compare_text(FILE *out, const char *trace, const struct run_summary *s,
                         struct report_mark *const *marks, const size_t *nmarks, size_t n, int pool,
                         const struct trace_recorded *rec, const struct report_headline *h, int driver_stats);

/*
 * The verdict, each sentence into lines[i]: a warning when the recording has no history; for a
 * recording that ended in an OOM, its answer (on the device it failed on: xseg, PyTorch's
 * allocator and its best setting; the live bytes against the card; the size that would fit);
 * the headline @p h (the smallest devices, xseg against PyTorch's best one-line setting, what else
 * xseg gives where it applies); then reserved memory on the device replayed (xseg against
 * PyTorch's recorded figures in @p rec when it has them, else against classic mode; a recording
 * made with expandable segments against expandable mode) and failed allocations. @p h may be
 * NULL. @return the number written.
 */
#define REPORT_VERDICT_MAX 640
/* The link a spilled page is copied over (spill_to_host), for the modelled link time: PCIe 4.0
 * x16's practical rate, as cudaemu's h100 preset charges host copies. */
#define REPORT_LINK_GBPS 25.0
#define REPORT_VERDICT_LINES 10
size_t report_verdict(const struct run_summary *s, size_t n, const struct trace_recorded *rec,
                      const struct report_headline *h, char lines[][REPORT_VERDICT_MAX], size_t maxlines);

/*
 * Why one workload's "peak allocated" figures differ (docs/glossary.md, "peak allocated"): each
 * is PyTorch's allocated_bytes peak of one run, the blocks as handed out; the requests' own peak
 * (run_summary.peak_requested) is what every allocator must hold. Into @p buf, one paragraph that
 * names the requests' peak and each column of @p s (and the recording in @p rec) more than one
 * 2 MiB step and 0.5 % away from it, with the reason; "" when none is, or the requests' peak is
 * unknown. @return its length.
 */
#define REPORT_PEAK_NOTE_MAX 1024
size_t report_peak_note(const struct run_summary *s, size_t n, const struct trace_recorded *rec, char *buf,
                        size_t len);

/* A JSON-writing helper: @p s as a JSON string literal. */
void report_json_string(FILE *out, const char *s);

/*
 * Read back one line of a child's JSON (a flat object; one nested object level, whose keys come
 * back as "outer.inner"). Calls @p fn for each member with the number (or NaN) and the string
 * (or NULL). @return 0, -1 for a malformed line.
 */
typedef void (*report_json_fn)(const char *key, double num, const char *str, void *user);
int report_json_parse(const char *line, report_json_fn fn, void *user);

/* Fill @p s / @p m from a parsed summary / mark line (pass as report_json_parse's callback). */
void report_summary_from_json(const char *key, double num, const char *str, void *user);
struct report_mark_reader {
    struct report_mark *m;
    int pool;
    char mode[32];
    int is_mark;
};
void report_mark_from_json(const char *key, double num, const char *str, void *user);

#endif
