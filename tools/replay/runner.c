/* Replaying a trace through xseg. See runner.h. */
#define _GNU_SOURCE
#include "tools/replay/runner.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "tools/replay/actions.h"
#include "tools/replay/explain.h"
#include "tools/replay/oracle.h"
#include "tools/replay/report.h"

const char *const run_entry_names[RUN_NENTRIES] = {
#define RUN_NAME(n) #n,
    RUN_ENTRIES(RUN_NAME)
#undef RUN_NAME
};

/* The emulator's control entry points, found with dlsym on the loaded driver; NULL on a real
 * driver, where hold/release and call counts are unavailable. */
static struct {
    void (*hold)(CUstream);
    void (*release)(CUstream);
    unsigned long (*count)(const char *);
    int (*work)(CUstream);
} emu;

/* The few driver calls a replay makes itself (streams, syncs, graphs), resolved with dlsym on the
 * driver xseg loaded (xseg's own driver table is internal to the library). Each under its ABI
 * name: the stringified expansion of cuda.h's macro. */
#define RUN_DRV_ENTRIES(X)                                                                        \
    X(cuGetErrorName)                                                                             \
    X(cuDeviceGet)                                                                                \
    X(cuDeviceGetAttribute)                                                                       \
    X(cuDevicePrimaryCtxRetain)                                                                   \
    X(cuDevicePrimaryCtxRelease)                                                                  \
    X(cuCtxSetCurrent)                                                                            \
    X(cuCtxSynchronize)                                                                           \
    X(cuStreamCreate)                                                                             \
    X(cuStreamSynchronize)                                                                        \
    X(cuGraphDestroy)                                                                             \
    /* wait / work: stream order in a capture */                                                  \
    X(cuEventCreate)                                                                              \
    X(cuEventDestroy)                                                                             \
    X(cuEventRecord)                                                                              \
    X(cuStreamWaitEvent)                                                                          \
    X(cuStreamGetCaptureInfo)                                                                     \
    X(cuGraphAddEmptyNode)                                                                        \
    X(cuStreamUpdateCaptureDependencies)
static struct {
#define RUN_DRV_FIELD(fn) __typeof__(fn) *fn;
    RUN_DRV_ENTRIES(RUN_DRV_FIELD)
#undef RUN_DRV_FIELD
} rdrv;
#define RUN_STR2(x) #x
#define RUN_STR(x) RUN_STR2(x)

static const char *rdrv_error_name(CUresult r)
{
    static _Thread_local char buf[32];
    const char *name = NULL;
    if (rdrv.cuGetErrorName && rdrv.cuGetErrorName(r, &name) == CUDA_SUCCESS && name)
        return name;
    snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)r);
    return buf;
}

xseg_status run_find_driver(const char *const *candidates, size_t ncandidates,
                            const char *device_mem, int *using_emulator, char *err, size_t errlen)
{
    *using_emulator = 0;
    if (device_mem)
        setenv("CUDAEMU_TOTAL_MEM", device_mem, 1);
    else
        setenv("CUDAEMU_TOTAL_MEM", "80G", 0);
    const char *env = getenv("XSEG_LIBCUDA");
    if (env && *env)
        return XSEG_SUCCESS;
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h) {
        dlclose(h);
        return XSEG_SUCCESS;
    }
    for (size_t i = 0; i < ncandidates; i++) {
        if (candidates[i] && access(candidates[i], R_OK) == 0) {
            setenv("XSEG_LIBCUDA", candidates[i], 1);
            *using_emulator = 1;
            fprintf(stderr, "xseg-replay: no GPU driver found, using the emulator (cudaemu: %s)\n", candidates[i]);
            return XSEG_SUCCESS;
        }
    }
    snprintf(err, errlen, "no GPU driver (libcuda.so.1) and no cudaemu library found; set "
                          "XSEG_LIBCUDA to a libcuda.so.1 or to build/cudaemu/libcudaemu.so");
    return XSEG_ERROR_DRIVER;
}

int run_driver_is_emulator(void)
{
    const char *lib = getenv("XSEG_LIBCUDA");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h)
        return 0;
    int emulated = dlsym(h, "cudaemu_call_count") != NULL;
    dlclose(h);
    return emulated;
}

xseg_status run_init(const char *config, char *err, size_t errlen)
{
    xseg_status st = xseg_init(config);
    if (st != XSEG_SUCCESS) {
        snprintf(err, errlen, "xseg_init(%s%s%s): %s", config ? "\"" : "", config ? config : "NULL",
                 config ? "\"" : "", xseg_last_error());
        return st;
    }
    const char *lib = getenv("XSEG_LIBCUDA");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) {
        snprintf(err, errlen, "the CUDA driver %s is not loaded after xseg_init: %s",
                 lib && *lib ? lib : "libcuda.so.1", dlerror());
        return XSEG_ERROR_DRIVER;
    }
    emu.hold = (void (*)(CUstream))dlsym(h, "cudaemu_stream_hold");
    emu.release = (void (*)(CUstream))dlsym(h, "cudaemu_stream_release");
    emu.count = (unsigned long (*)(const char *))dlsym(h, "cudaemu_call_count");
    emu.work = (int (*)(CUstream))dlsym(h, "cudaemu_stream_work");
#define RUN_DRV_RESOLVE(fn)                                                                       \
    {                                                                                             \
        void *sym = dlsym(h, RUN_STR(fn));                                                        \
        if (!sym) {                                                                               \
            snprintf(err, errlen, "the CUDA driver lacks entry point %s", RUN_STR(fn));           \
            dlclose(h);                                                                           \
            return XSEG_ERROR_DRIVER;                                                             \
        }                                                                                         \
        memcpy(&rdrv.fn, &sym, sizeof sym);                                                       \
    }
    RUN_DRV_ENTRIES(RUN_DRV_RESOLVE)
#undef RUN_DRV_RESOLVE
    dlclose(h); /* xseg keeps its own reference: the library stays loaded */
    return XSEG_SUCCESS;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void read_calls(uint64_t calls[RUN_NENTRIES])
{
    for (int i = 0; i < RUN_NENTRIES; i++) {
        /* cudaemu may count under the API or the ABI name (cuMemAlloc vs cuMemAlloc_v2), or answer
         * both with one counter: take the larger, never the sum. */
        char abi[64];
        snprintf(abi, sizeof abi, "%s_v2", run_entry_names[i]);
        uint64_t api = emu.count ? emu.count(run_entry_names[i]) : 0, v2 = emu.count ? emu.count(abi) : 0;
        calls[i] = api > v2 ? api : v2;
    }
}

xseg_status run_timeline_push(struct run_timeline *tl, uint64_t x, int64_t a, int64_t r)
{
    if (tl->n == tl->cap) {
        size_t cap = tl->cap ? tl->cap * 2 : 4096;
        uint64_t *nx = realloc(tl->x, cap * sizeof *nx);
        if (nx)
            tl->x = nx;
        int64_t *na = realloc(tl->allocated, cap * sizeof *na);
        if (na)
            tl->allocated = na;
        int64_t *nr = realloc(tl->reserved, cap * sizeof *nr);
        if (nr)
            tl->reserved = nr;
        if (!nx || !na || !nr)
            return XSEG_ERROR_OUT_OF_MEMORY;
        tl->cap = cap;
    }
    tl->x[tl->n] = x;
    tl->allocated[tl->n] = a;
    tl->reserved[tl->n] = r;
    tl->n++;
    return XSEG_SUCCESS;
}

void run_timeline_free(struct run_timeline *tl)
{
    free(tl->x);
    free(tl->allocated);
    free(tl->reserved);
    memset(tl, 0, sizeof *tl);
}

/* The mode the allocator actually uses on device 0: the config asks for expandable segments,
 * but a device without virtual memory management falls back to classic ones. */
static void mode_of_config(char *mode, size_t len)
{
    static int vmm = -1; /* device 0 supports VMM: 1, 0, or -1 not asked yet */
    char cfg[1024];
    snprintf(mode, len, "unknown");
    if (xseg_get_config(cfg, sizeof cfg, NULL) != XSEG_SUCCESS)
        return;
    if (!strstr(cfg, "expandable_segments:True")) {
        snprintf(mode, len, "classic");
        return;
    }
    if (vmm < 0) {
        CUdevice dev = 0;
        int supported = 1;
        if (rdrv.cuDeviceGet && rdrv.cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
            rdrv.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                      dev) != CUDA_SUCCESS)
            supported = 1;
        vmm = supported != 0;
    }
    snprintf(mode, len, "%s", vmm ? "expandable" : "classic (no VMM)");
}

struct runstate {
    void **ptrs;          /* per buffer: the live pointer, NULL when failed or freed */
    unsigned char *failed;/* per buffer: its last alloc failed */
    CUstream *streams;
    unsigned char *held;
    size_t label_width;
    xseg_pool_id *pools;  /* per trace pool: its xseg id, made on first use ({0,0} before) */
    CUgraph *graphs;      /* per stream: the graph its last capture made (destroyed at the end) */
    CUevent wait_event;   /* wait: recorded on the stream waited for (made on first use) */
    unsigned char *skipped_sleep; /* per pool + 1 (0: default): its sleep was refused as classic */
    int idle_ms;          /* idle_release_ms in force when the replay started an `idle` (-1: unread) */
    struct snap_tag *tags;/* each snapshot label met so far and the file name part it was given */
    size_t ntags, tags_cap;
};

/* A `snapshot LABEL` becomes part of a file name inside --snapshot's folder, never a path: see
 * snapshot_tag. The tag is at most SNAP_TAG_MAX bytes before a "-N" that keeps it unique. */
#define SNAP_TAG_MAX 64
struct snap_tag {
    const char *label;
    char tag[SNAP_TAG_MAX + 24];
};

/* The file name part of @p label, in @p *tag: bytes outside [A-Za-z0-9._-] become '_', a leading
 * '.' too, at most SNAP_TAG_MAX bytes; a label met before gets its tag again, and a different label
 * that comes out the same gets "-2", "-3"... appended. Fails only for host memory. */
static xseg_status snapshot_tag(struct runstate *rs, const char *label, const char **tag)
{
    for (size_t i = 0; i < rs->ntags; i++)
        if (!strcmp(rs->tags[i].label, label)) {
            *tag = rs->tags[i].tag;
            return XSEG_SUCCESS;
        }
    if (rs->ntags == rs->tags_cap) {
        size_t ncap = rs->tags_cap ? rs->tags_cap * 2 : 8;
        struct snap_tag *n = realloc(rs->tags, ncap * sizeof *n);
        if (!n)
            return XSEG_ERROR_OUT_OF_MEMORY;
        rs->tags = n;
        rs->tags_cap = ncap;
    }
    char base[SNAP_TAG_MAX + 1];
    size_t len = 0;
    for (const char *c = label; *c && len < SNAP_TAG_MAX; c++) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 *c == '_' || *c == '-' || (*c == '.' && len > 0);
        base[len++] = ok ? *c : '_';
    }
    base[len] = '\0';
    struct snap_tag *nt = &rs->tags[rs->ntags];
    nt->label = label;
    snprintf(nt->tag, sizeof nt->tag, "%s", base);
    for (unsigned k = 2;; k++) {
        size_t i = 0;
        while (i < rs->ntags && strcmp(rs->tags[i].tag, nt->tag))
            i++;
        if (i == rs->ntags)
            break;
        snprintf(nt->tag, sizeof nt->tag, "%s-%u", base, k);
    }
    rs->ntags++;
    *tag = nt->tag;
    return XSEG_SUCCESS;
}

/* work @s: on cudaemu, cudaemu_stream_work (a kernel node while capturing, pending work on a held
 * stream); on a real driver, while s captures, an empty node after its dependencies, which
 * orders the graph as a kernel would; outside a capture nothing is needed. */
static CUresult run_work(CUstream s)
{
    if (emu.work)
        return emu.work(s) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureStatus st;
    CUgraph g = NULL;
    const CUgraphNode *deps = NULL;
    size_t n = 0;
    CUresult r = rdrv.cuStreamGetCaptureInfo(s, &st, NULL, &g, &deps, NULL, &n);
    if (r != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return r;
    CUgraphNode node;
    if ((r = rdrv.cuGraphAddEmptyNode(&node, g, deps, n)) != CUDA_SUCCESS)
        return r;
    return rdrv.cuStreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
}

/* pool_begin p @s: the pool takes the allocations of stream s only. */
static int run_only_stream(struct CUstream_st *stream, void *user) { return stream == (CUstream)user; }

static xseg_pool_id run_pool_id(struct runstate *rs, int32_t pool)
{
    if (rs->pools[pool].first == 0 && rs->pools[pool].second == 0)
        (void)xseg_pool_create(&rs->pools[pool]);
    return rs->pools[pool];
}

static CUstream stream_of(const struct runstate *rs, int32_t s) { return s >= 0 ? rs->streams[s] : NULL; }

/* idle_release_ms of the configuration in force (0 when unreadable). */
static int run_idle_ms(void)
{
    char cfg[2048];
    if (xseg_get_config(cfg, sizeof cfg, NULL) != XSEG_SUCCESS)
        return 0;
    const char *k = strstr(cfg, "idle_release_ms:");
    return k ? atoi(k + strlen("idle_release_ms:")) : 0;
}

/* The frames of the allocation being replayed, for xseg's history (one replay per process). */
static const struct trace *hist_trace;
static const struct trace_stack *hist_stack;

static int replay_frames(xseg_frame *frames, int max, void *user)
{
    (void)user;
    const struct trace_stack *s = hist_stack;
    int n = 0;
    for (; s && n < max && (size_t)n < s->n; n++) {
        frames[n].filename = trace_text(hist_trace, s->f[n].file);
        frames[n].name = trace_text(hist_trace, s->f[n].name);
        frames[n].line = s->f[n].line;
    }
    return n;
}

void run_snapshot_path(const char *path, const char *tag, char *buf, size_t size)
{
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (!dot || (slash && dot < slash) || dot == path || (slash && dot == slash + 1))
        snprintf(buf, size, "%s.%s", path, tag);
    else
        snprintf(buf, size, "%.*s.%s%s", (int)(dot - path), path, tag, dot);
}

static xseg_status write_snapshot(const char *path, const char *source, char *err, size_t errlen)
{
    if (xseg_dump_snapshot(-1, path) != XSEG_SUCCESS) {
        snprintf(err, errlen, "%s: %s", source, xseg_last_error());
        return XSEG_ERROR_INVALID_VALUE;
    }
    fprintf(stderr, "xseg-replay: snapshot written to %s\n", path);
    return XSEG_SUCCESS;
}

/* What the run functions share while one trace replays. */
struct run_ctx {
    const struct trace *t;
    const struct run_options *o;
    FILE *out;
    struct run_summary *sum;
    struct runstate rs;
    char *err;
    size_t errlen;
    uint64_t ns_alloc, ns_free; /* wall time inside xseg_malloc / xseg_free */
    int table_started;          /* the mark table's header is written */
    int moved;                  /* the action may have changed allocated or reserved bytes */
    CUdevice dev0;
    CUcontext ctx0;             /* device 0's primary context, retained while streams exist */
    FILE *addr_log;             /* XSEG_REPLAY_ADDR_LOG: each alloc's address and each free */
    struct oracle oracle;       /* XSEG_REPLAY_ORACLE: long-lived blocks to a pool (oracle.h) */
    uint64_t ctx_syncs0;        /* cuCtxSynchronize calls before the actions (cudaemu) */
};

/* "SOURCE:LINE: op: xseg's message" for an action whose xseg call failed; returns @p st. */
static xseg_status run_failed(struct run_ctx *c, const struct trace_action *a, xseg_status st)
{
    snprintf(c->err, c->errlen, "%s:%u: %s: %s", c->t->source, a->line, trace_op_name(a->op),
             xseg_last_error());
    return st;
}

/* The same for a driver call of the replay's own. */
static xseg_status run_driver_failed(struct run_ctx *c, const struct trace_action *a, CUresult r)
{
    snprintf(c->err, c->errlen, "%s:%u: %s: %s", c->t->source, a->line, trace_op_name(a->op),
             rdrv_error_name(r));
    return XSEG_ERROR_DRIVER;
}

static xseg_status run_stream(struct run_ctx *c, const struct trace_action *a)
{
    CUresult r = rdrv.cuStreamCreate(&c->rs.streams[a->stream], CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        snprintf(c->err, c->errlen, "%s:%u: stream %s: cuStreamCreate failed: %s", c->t->source, a->line,
                 c->t->streams.names[a->stream], rdrv_error_name(r));
        return XSEG_ERROR_DRIVER;
    }
    return XSEG_SUCCESS;
}

/* A failed allocation is reported and counted; the replay goes on without that buffer. */
/* xseg's message of a failed allocation, and a newline: the replay runs on device 0, so where the
 * trace came from another device of a snapshot, "GPU 0" names that device instead. */
static void run_print_error(const struct trace *t, const char *msg)
{
    static const char gpu0[] = "GPU 0 ";
    const char *at = t->recorded.device > 0 ? strstr(msg, gpu0) : NULL;
    if (at)
        fprintf(stderr, "%.*sGPU %lld (the snapshot's; replayed as device 0) %s\n", (int)(at - msg), msg,
                (long long)t->recorded.device, at + sizeof gpu0 - 1);
    else
        fprintf(stderr, "%s\n", msg);
}

static xseg_status run_alloc(struct run_ctx *c, const struct trace_action *a)
{
    const struct trace *t = c->t;
    void *p = NULL;
    hist_stack = a->stack ? &t->stacks[a->stack - 1] : NULL;
    uint64_t t0 = now_ns();
    xseg_status as = oracle_wants(&c->oracle, (size_t)(a - t->actions))
                         ? oracle_malloc(&c->oracle, &p, (size_t)a->size, stream_of(&c->rs, a->stream))
                         : xseg_malloc(&p, (size_t)a->size, 0, stream_of(&c->rs, a->stream));
    c->ns_alloc += now_ns() - t0;
    c->sum->allocs++;
    if (as != XSEG_SUCCESS) {
        char sz[32];
        if (c->sum->failed_allocs < RUN_FAILED_AT_MAX)
            c->sum->failed_at[c->sum->failed_allocs] = (uint64_t)(a - t->actions);
        c->sum->failed_allocs++;
        c->rs.failed[a->buf] = 1;
        fprintf(stderr, "%s:%u: alloc %s %s failed (%s): ", t->source, a->line, t->bufs.names[a->buf],
                trace_format_size(a->size, sz, sizeof sz), xseg_status_name(as));
        run_print_error(t, xseg_last_error());
        if (c->o->explain_oom && c->sum->failed_allocs == 1)
            explain_oom_emit(c->out, c->o->explain_oom == 2 || c->o->marks == RUN_MARKS_JSONL, t,
                             (size_t)(a - t->actions), (void *const *)c->rs.ptrs);
    } else {
        c->rs.failed[a->buf] = 0;
        c->rs.ptrs[a->buf] = p;
        if (c->o->cold && xseg_spill_hint(p, XSEG_SPILL_COLD) != XSEG_SUCCESS)
            return run_failed(c, a, XSEG_ERROR_INVALID_VALUE);
    }
    if (c->addr_log)
        fprintf(c->addr_log, "a %u %u %#lx %llu\n", a->line, a->buf,
                as == XSEG_SUCCESS ? (unsigned long)(uintptr_t)p : 0ul, (unsigned long long)a->size);
    c->moved = 1;
    return XSEG_SUCCESS;
}

static xseg_status run_free(struct run_ctx *c, const struct trace_action *a)
{
    void *p = c->rs.ptrs[a->buf];
    if (c->rs.failed[a->buf])
        return XSEG_SUCCESS; /* its allocation failed: nothing to free */
    uint64_t t0 = now_ns();
    xseg_status fs = xseg_free(p);
    c->ns_free += now_ns() - t0;
    c->sum->frees++;
    c->rs.ptrs[a->buf] = NULL;
    if (c->addr_log)
        fprintf(c->addr_log, "f %u %u\n", a->line, a->buf);
    if (fs != XSEG_SUCCESS) {
        snprintf(c->err, c->errlen, "%s:%u: free %s: %s", c->t->source, a->line, c->t->bufs.names[a->buf],
                 xseg_last_error());
        return fs;
    }
    c->moved = 1;
    return XSEG_SUCCESS;
}

static xseg_status run_record(struct run_ctx *c, const struct trace_action *a)
{
    if (c->rs.failed[a->buf] || !c->rs.ptrs[a->buf])
        return XSEG_SUCCESS;
    xseg_status st = xseg_record_stream(c->rs.ptrs[a->buf], stream_of(&c->rs, a->stream));
    if (st)
        snprintf(c->err, c->errlen, "%s:%u: record %s: %s", c->t->source, a->line, c->t->bufs.names[a->buf],
                 xseg_last_error());
    return st;
}

static xseg_status run_hold_release(struct run_ctx *c, const struct trace_action *a)
{
    if (!emu.hold || !emu.release) {
        static int warned;
        if (!warned++)
            fprintf(stderr, "%s:%u: %s: only the emulator can hold a stream; ignored on this driver\n",
                    c->t->source, a->line, trace_op_name(a->op));
        return XSEG_SUCCESS;
    }
    if (a->op == TRACE_HOLD)
        emu.hold(stream_of(&c->rs, a->stream));
    else
        emu.release(stream_of(&c->rs, a->stream));
    if (a->stream >= 0)
        c->rs.held[a->stream] = a->op == TRACE_HOLD;
    return XSEG_SUCCESS;
}

static xseg_status run_sync(struct run_ctx *c, const struct trace_action *a)
{
    CUresult r = a->stream == TRACE_ALL_STREAMS ? rdrv.cuCtxSynchronize()
                                                : rdrv.cuStreamSynchronize(stream_of(&c->rs, a->stream));
    return r != CUDA_SUCCESS ? run_driver_failed(c, a, r) : XSEG_SUCCESS;
}

static xseg_status run_empty_cache(struct run_ctx *c, const struct trace_action *a)
{
    xseg_status st = xseg_empty_cache(-1);
    c->moved = 1;
    return st ? run_failed(c, a, st) : XSEG_SUCCESS;
}

/* services */
static xseg_status run_trim(struct run_ctx *c, const struct trace_action *a)
{
    xseg_status st = xseg_trim(-1, (size_t)a->size);
    c->moved = 1;
    return st ? run_failed(c, a, st) : XSEG_SUCCESS;
}

static xseg_status run_sleep_wake(struct run_ctx *c, const struct trace_action *a)
{
    xseg_pool_id id = a->pool >= 0 ? run_pool_id(&c->rs, a->pool) : (xseg_pool_id){0, 0};
    unsigned char *skipped = &c->rs.skipped_sleep[a->pool + 1];
    if (a->op == TRACE_WAKE && *skipped) {
        *skipped = 0; /* its sleep did not happen */
        return XSEG_SUCCESS;
    }
    xseg_status st = a->op == TRACE_SLEEP ? xseg_sleep(0, id, (unsigned)a->size) : xseg_wake(0, id);
    if (st == XSEG_ERROR_NOT_SUPPORTED && a->op == TRACE_SLEEP) {
        /* Classic segments cannot sleep: a property of the mode, not of the trace. */
        static int warned; /* a note, not a warning: the mode cannot do it, the trace is fine */
        if (!warned++)
            fprintf(stderr, "note: %s [%s]: classic segments cannot sleep, so this mode skips the trace's "
                            "sleep and its wake (first at line %u)\n", c->t->source, c->sum->mode, a->line);
        *skipped = 1;
        return XSEG_SUCCESS;
    }
    if (st)
        return run_failed(c, a, st);
    c->moved = 1;
    return XSEG_SUCCESS;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The replay is past its deadline at action @p i (0-based): the message, and the summary says so. */
static xseg_status run_over_deadline(struct run_ctx *c, size_t i)
{
    c->sum->over_deadline = 1;
    snprintf(c->err, c->errlen, "%s:%u: the time limit ran out: the replay stopped at action %zu of %zu",
             c->t->source, i < c->t->count ? c->t->actions[i].line : 0, i + 1, c->t->count);
    return XSEG_ERROR_ILLEGAL_STATE;
}

/* Wall time matters only to idle reclaim: without idle_release_ms nothing waits. A deadline
 * (run_options) cuts the wait short, and the replay stops there. */
static xseg_status run_idle(struct run_ctx *c, const struct trace_action *a)
{
    if (c->rs.idle_ms < 0)
        c->rs.idle_ms = run_idle_ms();
    if (c->rs.idle_ms > 0) {
        /* The parser bounds idle; a trace built another way is held to the same bound. */
        uint64_t ns = a->size < TRACE_IDLE_MAX_NS ? a->size : TRACE_IDLE_MAX_NS;
        int cut = 0;
        if (c->o->deadline > 0) {
            double left = c->o->deadline - mono_s();
            if (left <= 0 || (double)ns > left * 1e9) {
                ns = left > 0 ? (uint64_t)(left * 1e9) : 0;
                cut = 1;
            }
        }
        struct timespec d = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
        while (nanosleep(&d, &d) != 0 && errno == EINTR)
            ;
        c->moved = 1;
        if (cut)
            return run_over_deadline(c, (size_t)(a - c->t->actions));
    }
    return XSEG_SUCCESS;
}

static xseg_status run_config(struct run_ctx *c, const struct trace_action *a)
{
    c->rs.idle_ms = -1; /* may change idle_release_ms */
    xseg_status st = xseg_set_config(trace_text(c->t, a->text));
    if (st)
        return run_failed(c, a, st);
    mode_of_config(c->sum->mode, sizeof c->sum->mode);
    return XSEG_SUCCESS;
}

static xseg_status run_pool_begin(struct run_ctx *c, const struct trace_action *a)
{
    bool every = a->stream == TRACE_ALL_STREAMS;
    xseg_status st = xseg_begin_allocate_to_pool(0, run_pool_id(&c->rs, a->pool), every ? NULL : run_only_stream,
                                                 every ? NULL : stream_of(&c->rs, a->stream));
    c->oracle.trace_routes += st == XSEG_SUCCESS;
    return st ? run_failed(c, a, st) : XSEG_SUCCESS;
}

static xseg_status run_pool_end(struct run_ctx *c, const struct trace_action *a)
{
    xseg_status st = xseg_end_allocate_to_pool(0, run_pool_id(&c->rs, a->pool));
    c->oracle.trace_routes -= st == XSEG_SUCCESS;
    return st ? run_failed(c, a, st) : XSEG_SUCCESS;
}

static xseg_status run_pool_release(struct run_ctx *c, const struct trace_action *a)
{
    xseg_status st = xseg_release_pool(0, run_pool_id(&c->rs, a->pool));
    return st ? run_failed(c, a, st) : XSEG_SUCCESS;
}

static xseg_status run_capture_begin(struct run_ctx *c, const struct trace_action *a)
{
    /* Without a pool named, the capture gets a pool of its own, kept to the end. */
    xseg_pool_id id = a->pool >= 0 ? run_pool_id(&c->rs, a->pool) : (xseg_pool_id){0, 0};
    xseg_status st = xseg_capture_begin(0, stream_of(&c->rs, a->stream), &id, CU_STREAM_CAPTURE_MODE_GLOBAL);
    c->oracle.trace_routes += st == XSEG_SUCCESS;
    return st ? run_failed(c, a, st) : XSEG_SUCCESS;
}

static xseg_status run_capture_end(struct run_ctx *c, const struct trace_action *a)
{
    CUgraph g = NULL;
    xseg_status st = xseg_capture_end(0, stream_of(&c->rs, a->stream), &g);
    c->oracle.trace_routes -= st == XSEG_SUCCESS;
    if (c->rs.graphs[a->stream])
        (void)rdrv.cuGraphDestroy(c->rs.graphs[a->stream]);
    c->rs.graphs[a->stream] = g;
    return st ? run_failed(c, a, st) : XSEG_SUCCESS;
}

/* wait: a.stream.wait_stream(a.stream2), an event recorded on stream2 (a fork or a join when a
 * capture is involved); work: a unit of work on the stream. */
static xseg_status run_wait_work(struct run_ctx *c, const struct trace_action *a)
{
    CUresult r = CUDA_SUCCESS;
    if (a->op == TRACE_WORK)
        r = run_work(stream_of(&c->rs, a->stream));
    else if (!c->rs.wait_event)
        r = rdrv.cuEventCreate(&c->rs.wait_event, CU_EVENT_DISABLE_TIMING);
    if (a->op == TRACE_WAIT && r == CUDA_SUCCESS &&
        (r = rdrv.cuEventRecord(c->rs.wait_event, stream_of(&c->rs, a->stream2))) == CUDA_SUCCESS)
        r = rdrv.cuStreamWaitEvent(stream_of(&c->rs, a->stream), c->rs.wait_event, 0);
    return r != CUDA_SUCCESS ? run_driver_failed(c, a, r) : XSEG_SUCCESS;
}

static xseg_status run_snapshot(struct run_ctx *c, const struct trace_action *a)
{
    if (!c->o->snapshot)
        return XSEG_SUCCESS;
    char path[4096];
    const char *tag;
    if (snapshot_tag(&c->rs, trace_text(c->t, a->text), &tag) != XSEG_SUCCESS) {
        snprintf(c->err, c->errlen, "%s:%u: snapshot: out of host memory", c->t->source, a->line);
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    run_snapshot_path(c->o->snapshot, tag, path, sizeof path);
    return write_snapshot(path, c->t->source, c->err, c->errlen);
}

static xseg_status run_mark(struct run_ctx *c, const struct trace_action *a)
{
    xseg_device_stats ds;
    xseg_status st = xseg_get_stats(0, &ds);
    if (st)
        return run_failed(c, a, st);
    if (c->o->marks == RUN_MARKS_TABLE) {
        if (!c->table_started++)
            report_mark_header(c->out, c->rs.label_width, c->o->pool);
        report_mark_row(c->out, c->rs.label_width, trace_text(c->t, a->text), &ds, c->o->pool);
    } else if (c->o->marks == RUN_MARKS_JSONL) {
        report_mark_jsonl(c->out, trace_text(c->t, a->text), c->sum->mode, 0);
    }
    fflush(c->out);
    return XSEG_SUCCESS;
}

/* The run function of each trace_op (tools/replay/actions.h). */
static xseg_status (*const run_table[])(struct run_ctx *, const struct trace_action *) = {
#define RUN_ROW(name, op, parse, run, dump) [op] = run,
#define RUN_NO_ACTION(name, parse)
    TRACE_ACTIONS(RUN_ROW, RUN_NO_ACTION)
#undef RUN_ROW
#undef RUN_NO_ACTION
};

/* The per-buffer, per-stream and per-pool arrays, the label width, device 0's context for the
 * streams and xseg's history. */
static xseg_status run_setup(struct run_ctx *c)
{
    const struct trace *t = c->t;
    struct runstate *rs = &c->rs;
    rs->ptrs = calloc(t->bufs.count + 1, sizeof *rs->ptrs);
    rs->failed = calloc(t->bufs.count + 1, 1);
    rs->streams = calloc(t->streams.count + 1, sizeof *rs->streams);
    rs->held = calloc(t->streams.count + 1, 1);
    rs->pools = calloc(t->pools.count + 1, sizeof *rs->pools);
    rs->graphs = calloc(t->streams.count + 1, sizeof *rs->graphs);
    rs->skipped_sleep = calloc(t->pools.count + 1, 1);
    rs->idle_ms = -1;
    if (!rs->ptrs || !rs->failed || !rs->streams || !rs->held || !rs->pools || !rs->graphs || !rs->skipped_sleep) {
        snprintf(c->err, c->errlen, "out of host memory");
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    /* The mark table's label column fits the longest label. */
    rs->label_width = 24;
    for (size_t i = 0; i < t->count; i++)
        if (t->actions[i].op == TRACE_MARK && strlen(trace_text(t, t->actions[i].text)) > rs->label_width)
            rs->label_width = strlen(trace_text(t, t->actions[i].text));

    /* Streams are created in device 0's primary context, the one xseg allocates in. */
    if (t->streams.count) {
        CUresult r = rdrv.cuDeviceGet(&c->dev0, 0);
        if (r == CUDA_SUCCESS && (r = rdrv.cuDevicePrimaryCtxRetain(&c->ctx0, c->dev0)) == CUDA_SUCCESS &&
            (r = rdrv.cuCtxSetCurrent(c->ctx0)) != CUDA_SUCCESS) {
            (void)rdrv.cuDevicePrimaryCtxRelease(c->dev0);
            c->ctx0 = NULL;
        }
        if (r != CUDA_SUCCESS) {
            snprintf(c->err, c->errlen, "device 0: its primary context: %s", rdrv_error_name(r));
            return XSEG_ERROR_DRIVER;
        }
    }
    if (c->o->history) {
        /* Every event of the replay fits: 3 per allocation (alloc, free_requested,
         * free_completed) plus segment events. */
        xseg_history_options ho = {0};
        ho.enabled = 1;
        ho.stacks = XSEG_STACKS_CALLBACK;
        ho.max_frames = 256;
        ho.callback = replay_frames;
        ho.max_entries = t->nallocs * 4 + 1000;
        hist_trace = t;
        xseg_status st = xseg_record_memory_history(&ho);
        if (st) {
            snprintf(c->err, c->errlen, "--history: %s", xseg_last_error());
            return st;
        }
    }
    return XSEG_SUCCESS;
}

/* Every action in order, with the progress line and the timeline. */
static xseg_status run_actions(struct run_ctx *c, struct run_timeline *tl)
{
    const struct trace *t = c->t;
    size_t progress_step = t->count / 100 + 1;
    for (size_t i = 0; i < t->count; i++) {
        const struct trace_action *a = &t->actions[i];
        if (c->o->progress && i % progress_step == 0)
            fprintf(stderr, "\rxseg-replay: %s [%s] %3zu%%", t->source, c->sum->mode, i * 100 / t->count);
        if (c->o->deadline > 0 && i % RUN_DEADLINE_EVERY == 0 && mono_s() >= c->o->deadline)
            return run_over_deadline(c, i);
        c->moved = 0;
        xseg_status st = run_table[a->op](c, a);
        if (st != XSEG_SUCCESS)
            return st;
        if (c->moved && tl) {
            xseg_device_stats ds;
            if (xseg_get_stats(0, &ds) == XSEG_SUCCESS &&
                run_timeline_push(tl, i, ds.allocated_bytes[XSEG_STAT_ALL].current,
                              ds.reserved_bytes[XSEG_STAT_ALL].current) != XSEG_SUCCESS) {
                snprintf(c->err, c->errlen, "out of host memory for the timeline");
                return XSEG_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    if (c->o->progress)
        fprintf(stderr, "\r%*s\r", (int)strlen(t->source) + 40, "");
    return XSEG_SUCCESS;
}

/* The summary: peaks, the snapshot at the end, the final empty_cache and the driver calls. */
static xseg_status run_finish(struct run_ctx *c, const uint64_t calls0[RUN_NENTRIES])
{
    const struct trace *t = c->t;
    struct run_summary *sum = c->sum;
    xseg_status st;
    /* Held streams would keep deferred frees pending forever: let them finish first. */
    for (size_t s = 0; s < t->streams.count; s++)
        if (c->rs.held[s] && emu.release)
            emu.release(c->rs.streams[s]);
    xseg_device_stats ds;
    if ((st = xseg_get_stats(0, &ds))) {
        snprintf(c->err, c->errlen, "xseg_get_stats: %s", xseg_last_error());
        return st;
    }
    sum->actions = t->count;
    sum->peak_allocated = ds.allocated_bytes[XSEG_STAT_ALL].peak;
    sum->peak_reserved = ds.reserved_bytes[XSEG_STAT_ALL].peak;
    sum->peak_requested = trace_peak_requested(t);
    sum->utilization = sum->peak_reserved ? (double)sum->peak_allocated / (double)sum->peak_reserved : 0;
    sum->reserved_end = ds.reserved_bytes[XSEG_STAT_ALL].current;
    if (c->o->snapshot && (st = write_snapshot(c->o->snapshot, t->source, c->err, c->errlen)))
        return st;
    sum->host_ns_per_alloc = sum->allocs ? (double)c->ns_alloc / (double)sum->allocs : 0;
    sum->host_ns_per_free = sum->frees ? (double)c->ns_free / (double)sum->frees : 0;
    if ((st = xseg_empty_cache(-1)) || (st = xseg_get_stats(0, &ds))) {
        snprintf(c->err, c->errlen, "final empty_cache: %s", xseg_last_error());
        return st;
    }
    sum->reserved_after_empty_cache = ds.reserved_bytes[XSEG_STAT_ALL].current;
    sum->spilled_peak = ds.spilled_bytes.peak;
    sum->spill_copied = ds.spill_copied_bytes;
    sum->spills = (uint64_t)ds.num_spills;
    sum->promotions = (uint64_t)ds.num_promotions;
    /* Spill's waits for the device's work (its contract), the one caller of cuCtxSynchronize here. */
    sum->spill_syncs = emu.count ? emu.count("cuCtxSynchronize") - c->ctx_syncs0 : 0;
    if (emu.count) {
        uint64_t calls1[RUN_NENTRIES];
        read_calls(calls1);
        sum->have_calls = 1;
        for (int e = 0; e < RUN_NENTRIES; e++) {
            sum->calls[e] = calls1[e] - calls0[e];
            if (e < RUN_MEMORY_ENTRIES)
                sum->memory_calls += sum->calls[e];
        }
    }
    return XSEG_SUCCESS;
}

/* The graphs live to the end of the replay, as the program's would; then everything goes. */
static void run_cleanup(struct run_ctx *c)
{
    struct runstate *rs = &c->rs;
    hist_stack = NULL;
    for (size_t s = 0; rs->graphs && s < c->t->streams.count; s++)
        if (rs->graphs[s])
            (void)rdrv.cuGraphDestroy(rs->graphs[s]);
    if (rs->wait_event)
        (void)rdrv.cuEventDestroy(rs->wait_event);
    if (c->ctx0)
        (void)rdrv.cuDevicePrimaryCtxRelease(c->dev0);
    free(rs->tags);
    free(rs->pools);
    free(rs->graphs);
    free(rs->skipped_sleep);
    free(rs->ptrs);
    free(rs->failed);
    free(rs->streams);
    free(rs->held);
    if (c->addr_log)
        fclose(c->addr_log);
    oracle_report(&c->oracle, stderr);
    oracle_destroy(&c->oracle);
}

xseg_status run_trace(const struct trace *t, const struct run_options *o, FILE *out,
                      struct run_summary *sum, struct run_timeline *tl, char *err, size_t errlen)
{
    struct run_ctx c = {.t = t, .o = o, .out = out, .sum = sum, .err = err, .errlen = errlen};
    /* A debugging aid (benchmarks/fit_probe.py): where each allocation went, for placement work. */
    const char *log = getenv("XSEG_REPLAY_ADDR_LOG");
    if (log && *log && !(c.addr_log = fopen(log, "w")))
        fprintf(stderr, "xseg-replay: XSEG_REPLAY_ADDR_LOG: cannot open %s\n", log);
    memset(sum, 0, sizeof *sum);
    snprintf(sum->trace, sizeof sum->trace, "%s", t->source);
    xseg_status st = oracle_init(&c.oracle, t, err, errlen);
    if (st == XSEG_SUCCESS)
        st = run_setup(&c);
    if (st == XSEG_SUCCESS) {
        uint64_t calls0[RUN_NENTRIES];
        read_calls(calls0);
        c.ctx_syncs0 = emu.count ? emu.count("cuCtxSynchronize") : 0;
        mode_of_config(sum->mode, sizeof sum->mode);
        st = run_actions(&c, tl);
        if (st == XSEG_SUCCESS)
            st = run_finish(&c, calls0);
    }
    run_cleanup(&c);
    return st;
}
