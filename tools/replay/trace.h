/*
 * The replay trace: a list of actions over named buffers, streams and pools, built by the text
 * parser (parse.c), the RMM CSV importer (rmm_csv.c) and the workload generators (workloads.c),
 * and consumed by the runner. Names are interned into dense indices at build time so the runner
 * works on arrays, never on strings.
 *
 * Not thread-safe: one trace is built and replayed by one thread.
 */
#ifndef XSEG_TOOLS_REPLAY_TRACE_H
#define XSEG_TOOLS_REPLAY_TRACE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "xseg.h"

/* Longest message any trace function writes (file:line: what was wrong). */
#define TRACE_ERR_MAX 512

enum trace_op {
    TRACE_STREAM,        /* declare a stream: created when the replay starts */
    TRACE_ALLOC,         /* buf, size, stream */
    TRACE_FREE,          /* buf */
    TRACE_RECORD,        /* buf, stream (record_stream) */
    TRACE_HOLD,          /* stream: work stays pending (cudaemu only) */
    TRACE_RELEASE,       /* stream: pending work completes */
    TRACE_SYNC,          /* stream, or TRACE_ALL_STREAMS */
    TRACE_EMPTY_CACHE,
    TRACE_CONFIG,        /* text = config string */
    TRACE_POOL_BEGIN,    /* pool, stream (TRACE_ALL_STREAMS: every stream) */
    TRACE_POOL_END,      /* pool */
    TRACE_POOL_RELEASE,  /* pool */
    TRACE_CAPTURE_BEGIN, /* stream, pool (or -1) */
    TRACE_CAPTURE_END,   /* stream */
    TRACE_MARK,          /* text = label */
    /* stream order, for forks and joins in a capture (graph_capture_record_stream_reuse) */
    TRACE_WAIT,          /* stream waits for stream2 (an event recorded on stream2) */
    TRACE_WORK,          /* stream: a unit of work (a kernel; a graph node while capturing) */
    TRACE_SNAPSHOT,      /* text = label: xseg-replay --snapshot writes one here */
    /* services */
    TRACE_TRIM,          /* size: xseg_trim(-1, size) */
    TRACE_SLEEP,         /* pool (-1: the default pool), size = XSEG_SLEEP_OFFLOAD or _DISCARD */
    TRACE_WAKE,          /* pool (-1: the default pool) */
    TRACE_IDLE,          /* size = nanoseconds without allocator calls (a wall-clock wait) */
};

/* The longest `idle` a trace may hold (one hour, in ns): the parser refuses more, so neither
 * --check nor a replay accepts a trace that would keep xseg-replay waiting for years. */
#define TRACE_IDLE_MAX_NS (3600ull * 1000000000ull)
/* The default cap on a trace's idle actions all together (two hours, in ns): 1,000 idles of an
 * hour are each allowed, but would keep a replay waiting for 42 days. xseg-replay's
 * --max-total-idle changes it; trace_check_idle enforces it. */
#define TRACE_IDLE_TOTAL_MAX_NS (7200ull * 1000000000ull)

/* Stream index of the legacy default stream, and of "every stream" for sync. */
#define TRACE_DEFAULT_STREAM (-1)
#define TRACE_ALL_STREAMS (-2)

struct trace_action {
    enum trace_op op;
    uint32_t line;   /* 1-based source line (or CSV row); 0 for generated actions */
    int32_t buf;     /* buffer index, or -1 */
    int32_t stream;  /* stream index, TRACE_DEFAULT_STREAM or TRACE_ALL_STREAMS */
    int32_t pool;    /* pool index, or -1 */
    int32_t stream2; /* wait: the stream waited for */
    uint64_t size;   /* bytes (alloc) */
    size_t text;     /* offset into trace.strings (config, mark), or 0 */
    uint32_t stack;  /* alloc: 1 + index into trace.stacks (the `^NAME` given), 0 for none */
};

/* Frames of an allocation: `frame NAME LINE FILE FUNCTION` lines build stack NAME,
 * innermost first; `alloc ... ^NAME` hands it to xseg's history when replaying with --history. */
struct trace_frame {
    size_t file, name; /* offsets into trace.strings */
    int32_t line;
};
struct trace_stack {
    struct trace_frame *f;
    size_t n, cap;
};

/* A name table: interned strings to dense indices (open addressing over a power-of-two table). */
struct trace_names {
    char **names;   /* index -> name (owned) */
    size_t count, cap;
    int32_t *slots; /* hash slot -> index, -1 empty */
    size_t nslots;
};

/* What the recording itself says the original allocator did, from `# pytorch: KEY=N` comment
 * lines (tools/snapshot2trace.py writes them) and its OOM comments: the verdict and the report
 * put them beside the replayed figures. Fields stay -1 / 0 when the trace carries none. */
#define TRACE_RECORDED_OOM_MAX 64
struct trace_recorded {
    int64_t peak_allocated, peak_reserved; /* bytes, -1: not recorded */
    uint64_t oom_at[TRACE_RECORDED_OOM_MAX]; /* action index (the next action) of each recorded OOM */
    size_t noom;                            /* all of them, even past TRACE_RECORDED_OOM_MAX */
    int expandable; /* 1: PyTorch ran with expandable segments, 0: classic, -1: not recorded */
    /* The memory PyTorch could use when it first failed (its reserved bytes plus the device's
     * free bytes, "# pytorch: oom_device_bytes=N"): the device to replay an OOM on; 0 an OOM on
     * a device of unknown size; -1 not written (no OOM unless noom says so). */
    int64_t oom_device;
    /* Its parts at the first OOM, "# pytorch: oom_reserved_bytes=N" and "oom_free_bytes=N": what
     * PyTorch held (as the window's segment events rebuild it) and what the device had free
     * (-1: not written). */
    int64_t oom_reserved, oom_free;
    /* The snapshot's events that are allocator history (not its `snapshot` marker),
     * "# pytorch: history_events=N": 0 for a snapshot of segments only (-1: not written). */
    int64_t history_events;
    int64_t device; /* the snapshot's device the trace came from, "# pytorch: device=N" (-1: not written) */
};

struct trace {
    char *source;   /* file name or "builtin:NAME", for messages */
    struct trace_recorded recorded;
    struct trace_action *actions;
    size_t count, cap;
    struct trace_names bufs, streams, pools;
    struct trace_names stack_names; /* stacks[i] is named stack_names.names[i] */
    struct trace_stack *stacks;
    size_t stacks_cap;
    char *strings;  /* NUL-separated texts; offset 0 is the empty string */
    size_t strings_len, strings_cap;
    uint64_t nallocs, total_alloc_bytes;
    uint64_t idle_ns, nidle; /* the `idle` actions: their total (saturating at UINT64_MAX), their count */
};

/* Start an empty trace; @p source names it in messages. */
xseg_status trace_init(struct trace *t, const char *source);
void trace_destroy(struct trace *t);

/* Intern @p name (length @p len) in @p names; @p index receives its index. */
xseg_status trace_name_intern(struct trace_names *names, const char *name, size_t len,
                              int32_t *index);
/* Look a name up without adding it; @p index receives -1 when absent. */
void trace_name_find(const struct trace_names *names, const char *name, size_t len,
                     int32_t *index);

/* Read a comment (from '#' to @p end, no newline) for the recorded figures (struct
 * trace_recorded); any other comment is ignored. */
void trace_note_comment(struct trace *t, const char *s, const char *end);

/* Where the recording first failed: the failing request's action index (the action after the
 * first recorded OOM: a `# the original run hit an OOM` comment, or the converter's "PyTorch OOM"
 * mark), with the live bytes just before it (requested sizes) in *@p live and the request (when
 * that action allocates; else 0) in *@p request. SIZE_MAX when the trace records no OOM. */
size_t trace_oom_point(const struct trace *t, uint64_t *live, uint64_t *request);

/* How many actions of kind @p op the trace holds. */
/* The requests' own peak (glossary, "peak allocated"): the most bytes live at once with each
 * request rounded up to 512 B as PyTorch's round_size does by default, whatever the allocator or
 * mode does with them (no block larger than its request, no failed allocation). -1: out of host
 * memory. */
int64_t trace_peak_requested(const struct trace *t);

size_t trace_count_op(const struct trace *t, enum trace_op op);

/* Append an action (copied). */
xseg_status trace_push(struct trace *t, const struct trace_action *a);
/* Append a frame to stack @p name (made on first use); @p index receives its index. */
xseg_status trace_add_frame(struct trace *t, const char *name, size_t len, int32_t line, const char *file,
                            size_t file_len, const char *func, size_t func_len, int32_t *index);

/* Store a text and return its offset in @p off. */
xseg_status trace_add_text(struct trace *t, const char *text, size_t len, size_t *off);

static inline const char *trace_text(const struct trace *t, size_t off) { return t->strings + off; }

/* Name of an action's operation as the trace language spells it ("empty_cache"). */
const char *trace_op_name(enum trace_op op);

/* Is the total of @p t's idle actions at most @p cap_ns? XSEG_ERROR_INVALID_VALUE otherwise, with
 * "SOURCE: ..." in @p err naming the total, the count and the cap. */
xseg_status trace_check_idle(const struct trace *t, uint64_t cap_ns, char *err, size_t errlen);

/* "300ms", "1.5s", "20us", "500ns", "2h": a duration into @p ns (up to 9 fraction digits).
 * @return 0, or -1 when @p s (@p len bytes) is not one or does not fit in 64 bits. */
int trace_parse_duration(const char *s, size_t len, uint64_t *ns);

/* Write @p t to @p out in the trace language (dump.c): each stack's frames before its first
 * allocation, then the actions, one line each. @return 0, or -1 when @p out reports an error. */
int trace_dump(const struct trace *t, FILE *out);

/* Format "SOURCE:LINE: message" into err (errlen bytes) for the parsers; bytes of the message
 * outside printable ASCII (echoed from the input) appear as \xNN. Returns
 * XSEG_ERROR_INVALID_VALUE so a parser can `return` it. */
xseg_status trace_verror(char *err, size_t errlen, const char *source, unsigned line, const char *fmt,
                         va_list ap);

/*
 * Parse a size: digits with an optional unit B, KiB, MiB, GiB, TiB (binary; also K/M/G/T and
 * KB/MB/GB/TB taken as binary), and an optional fraction ("1.5GiB"). @return
 * XSEG_ERROR_INVALID_VALUE with a message in @p err for anything else or an overflow (the text
 * echoed with bytes outside printable ASCII as \xNN).
 */
xseg_status trace_parse_size(const char *s, size_t len, uint64_t *bytes, char *err, size_t errlen);

/* Format a byte count the way the trace language reads it back exactly ("4GiB", "1536KiB",
 * "1000"). @p buf holds at least 32 bytes. */
const char *trace_format_size(uint64_t bytes, char *buf, size_t buflen);

/*
 * Parse the trace language (see tools/replay/README in docs or xseg-replay --help) from @p text.
 * Checks the whole file before anything runs: unknown actions, bad sizes, a buffer allocated
 * twice or freed while not live, undeclared streams, unbalanced pools, what the driver refuses
 * during a capture (docs/trace-format.md lists it all). On error returns
 * XSEG_ERROR_INVALID_VALUE and writes "SOURCE:LINE: message" to @p err.
 */
xseg_status trace_parse_text(struct trace *t, const char *text, size_t len, char *err, size_t errlen);

/* Read @p path and parse it: as an RMM CSV log when its first line is the RMM header
 * (Thread,Time,Action,Pointer,Size,Stream), else as the trace language. */
xseg_status trace_load_file(struct trace *t, const char *path, char *err, size_t errlen);

/*
 * Import an RMM logging_resource_adaptor CSV log. Rows: allocate, free, "allocate failure"
 * (skipped: it failed in the original run too). Pointers are mapped to buffer names, streams to
 * declared streams (0 is the default stream). A free of a pointer never allocated in the log is
 * seeded as an allocation at the start, as for a snapshot window.
 */
xseg_status trace_import_rmm_csv(struct trace *t, const char *text, size_t len, char *err,
                                 size_t errlen);

#endif
