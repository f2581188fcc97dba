/*
 * What xseg-replay prints: mark rows (a table like the seed 003 tables, or JSON lines with every
 * statistic under its PyTorch key), the summary (text or one JSON object), the side-by-side
 * comparison of modes, and the reader for the JSON a child replay writes.
 */
#ifndef XSEG_TOOLS_REPLAY_REPORT_H
#define XSEG_TOOLS_REPLAY_REPORT_H

#include <stdio.h>

#include "tools/replay/runner.h"

/* The mark table: "Tag (GiB)  Allocated  Active  InactiveSplit  Reserved", values in GiB to three
 * decimals, for the pool @p pool (XSEG_STAT_ALL, _SMALL_POOL, _LARGE_POOL). */
void report_mark_header(FILE *out, size_t label_width, int pool);
void report_mark_row(FILE *out, size_t label_width, const char *label, const xseg_device_stats *ds, int pool);
/* One JSON object: {"mark": label, "mode": mode, "<key>": bytes-or-count, ...} over every key
 * xseg_stat_key enumerates. */
void report_mark_jsonl(FILE *out, const char *label, const char *mode, int device);

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
                         const struct trace_recorded *rec, int driver_stats);

/*
 * The verdict: one sentence per mode comparison of @p n replays of one trace (xseg against
 * PyTorch's recorded figures in @p rec when it has them, else against classic mode; classic mode
 * against the recording; failed allocations), each into lines[i]. @return the number written.
 */
#define REPORT_VERDICT_MAX 320
/* The link a spilled page is copied over (spill_to_host), for the modelled link time: PCIe 4.0
 * x16's practical rate, as cudaemu's h100 preset charges host copies. */
#define REPORT_LINK_GBPS 25.0
#define REPORT_VERDICT_LINES 6
size_t report_verdict(const struct run_summary *s, size_t n, const struct trace_recorded *rec,
                      char lines[][REPORT_VERDICT_MAX], size_t maxlines);

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
