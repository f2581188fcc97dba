/*
 * Replaying a trace through xseg on device 0: streams, allocations, marks, the summary, and the
 * timeline of allocated / reserved bytes for the plot. One replay per process: xseg's state
 * (caches, statistics, mode of existing segments) cannot be fully reset in-process, so
 * `--compare` runs each mode in a child (see main.c).
 */
#ifndef XSEG_TOOLS_REPLAY_RUNNER_H
#define XSEG_TOOLS_REPLAY_RUNNER_H

#include <stdint.h>
#include <stdio.h>

#include "tools/replay/trace.h"

/* Driver entry points counted for the summary (cudaemu only; the real driver has no counters). */
#define RUN_ENTRIES(X)                                                                            \
    X(cuMemAlloc) X(cuMemFree) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate)         \
    X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuEventRecord)                  \
    X(cuEventQuery) X(cuStreamSynchronize)
enum run_entry {
#define RUN_ENUM(n) RUN_E_##n,
    RUN_ENTRIES(RUN_ENUM)
#undef RUN_ENUM
    RUN_NENTRIES
};
/* The entries above that create or destroy device memory or mappings: "driver calls per GiB". */
#define RUN_MEMORY_ENTRIES 9
extern const char *const run_entry_names[RUN_NENTRIES];

enum run_marks { RUN_MARKS_TABLE, RUN_MARKS_JSONL, RUN_MARKS_NONE };

struct run_options {
    int pool;               /* XSEG_STAT_ALL, _SMALL_POOL or _LARGE_POOL for the mark table */
    enum run_marks marks;
    int progress;           /* progress on stderr (main decides: a terminal, a long trace) */
    int timeline;           /* keep allocated/reserved after every action, for the plot */
    /* Record allocation history (with the trace's `^STACK` frames) while replaying,
     * and write a snapshot (PyTorch's format) to `snapshot` at the end, before the final
     * empty_cache, and at each `snapshot LABEL` action (to snapshot with ".TAG" inserted, TAG the
     * label made a safe, unique file name: see snapshot_tag in runner.c). */
    int history;
    const char *snapshot;
    /* CLOCK_MONOTONIC seconds (0: none): the replay stops when it is reached, checked every
     * RUN_DEADLINE_EVERY actions and inside `idle` (which waits no longer than to it). */
    double deadline;
    /* --explain-oom: at the first failed allocation, the pages holding stranded free bytes and the
     * blocks pinning them (explain.h): 1 text on `out`, 2 a JSON line {"explain_oom": TEXT} (also
     * whenever the marks are JSON lines, as a child's are). */
    int explain_oom;
    /* --cold: each block declared cold (xseg_spill_hint COLD) right after its allocation; a
     * trace records no use between allocation and free, so the promise of spill's contract holds
     * (docs/services.md): spill_to_host may move any block. */
    int cold;
};
#define RUN_DEADLINE_EVERY 64

/* @p path with ".@p tag" inserted before its extension ("out.pickle", "peak" ->
 * "out.peak.pickle") into @p buf. */
void run_snapshot_path(const char *path, const char *tag, char *buf, size_t size);

#define RUN_FAILED_AT_MAX 16

struct run_summary {
    char mode[32];          /* "classic", "expandable", or "classic (no VMM)" when the config asks
                             * for expandable segments on a device without VMM: the mode used */
    char trace[256];
    int64_t peak_allocated, peak_reserved; /* PyTorch's allocated_bytes and reserved_bytes peaks */
    int64_t peak_requested; /* the requests' own peak at 512 B (trace_peak_requested; -1: unknown) */
    double utilization;     /* peak allocated / peak reserved; 0 when nothing was reserved */
    int64_t reserved_end, reserved_after_empty_cache;
    uint64_t actions, allocs, frees, failed_allocs;
    double host_ns_per_alloc, host_ns_per_free; /* mean wall time of xseg_malloc / xseg_free */
    int have_calls;         /* 1 on cudaemu: calls[] are valid */
    uint64_t calls[RUN_NENTRIES];
    uint64_t memory_calls;  /* sum of the first RUN_MEMORY_ENTRIES */
    /* Action index of the first RUN_FAILED_AT_MAX failed allocations (the plot's OOM points). */
    uint64_t failed_at[RUN_FAILED_AT_MAX];
    int over_deadline;      /* run_trace stopped at run_options.deadline (the rest is not filled) */
    /* spill_to_host (after the final empty_cache, which promotes): the peak of spilled bytes,
     * pages spilled and promoted, bytes copied over the link both ways. */
    int64_t spilled_peak, spill_copied;
    uint64_t spills, promotions;
    uint64_t spill_syncs;   /* context synchronizes (cudaemu: cuCtxSynchronize calls), spill's waits */
    /* Filled by the parent for the verdict, never by a replay (0 / -1: not measured). */
    uint64_t device_bytes;  /* the device the replay ran on (--device-mem, else 80 GiB) */
    uint64_t min_device;    /* the smallest device it fits on, as --min-device finds it */
    uint64_t oom_device;    /* the device an OOM recording was replayed on (0: none) */
    int oom_fits;           /* on oom_device (when not 0): 1 the whole run fits, 0 an allocation failed */
};

/* allocated and reserved bytes (all pools) after each allocating / freeing action. */
struct run_timeline {
    size_t n, cap;
    uint64_t *x;            /* action index */
    int64_t *allocated, *reserved;
};

/*
 * Make sure a driver is there before xseg_init: when $XSEG_LIBCUDA is unset and libcuda.so.1
 * cannot be opened, point XSEG_LIBCUDA at a cudaemu from @p candidates (first readable one) and
 * say so on stderr. Sets CUDAEMU_TOTAL_MEM to @p device_mem (or 80G when unset) either way; the
 * real driver ignores it. @p using_emulator receives 1 when the emulator was chosen here.
 */
xseg_status run_find_driver(const char *const *candidates, size_t ncandidates,
                            const char *device_mem, int *using_emulator, char *err, size_t errlen);

/* Is the driver run_find_driver settled on the emulator? Asks the library ($XSEG_LIBCUDA, else
 * libcuda.so.1) for cudaemu's control API without initializing anything: 1 on cudaemu, 0 on a
 * real driver (or none). */
int run_driver_is_emulator(void);

/* Initialize xseg with @p config (NULL: the environment) and load the emulator controls. */
xseg_status run_init(const char *config, char *err, size_t errlen);

/*
 * Replay @p t. Marks go to @p out as they happen (a table or JSON lines, per @p o). An allocation
 * that fails is reported on stderr and counted; the replay goes on, and later frees of that
 * buffer are skipped. Pool and capture actions go through xseg's private pools (pool_begin
 * without a stream routes every stream; capture_begin without a pool gets a new one; captures
 * are GLOBAL mode and their graphs live to the end); a failed one stops the replay with xseg's
 * message. At the end, held streams are released, the summary is filled, then a final empty_cache gives
 * reserved_after_empty_cache. Past o->deadline: XSEG_ERROR_ILLEGAL_STATE with sum->over_deadline
 * set and the message saying where it stopped.
 */
xseg_status run_trace(const struct trace *t, const struct run_options *o, FILE *out,
                      struct run_summary *sum, struct run_timeline *tl, char *err, size_t errlen);

/* Append a point, growing the arrays: XSEG_ERROR_OUT_OF_MEMORY (the timeline unchanged) when the
 * host has no memory. */
xseg_status run_timeline_push(struct run_timeline *tl, uint64_t x, int64_t a, int64_t r);
void run_timeline_free(struct run_timeline *tl);

#endif
