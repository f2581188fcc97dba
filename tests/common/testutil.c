/* testutil: see testutil.h for the contracts. */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "tests/common/testutil.h"
#include "xseg.h"

/* ---- emulator detection and controls ---- */

struct tu_emu_api {
    void (*stream_hold)(CUstream);
    void (*stream_release)(CUstream);
    int (*fail_nth)(const char *, unsigned long, CUresult);
    void (*fail_clear)(void);
    unsigned long (*call_count)(const char *);
    void (*counts_reset)(void);
    int (*live_query)(struct cudaemu_live *);
    int (*set_latency)(const char *, uint64_t);
    int (*stream_work)(CUstream);
    int (*set_bandwidth)(const char *, uint64_t);
    void (*host_live)(size_t *, size_t *);
};

/* Resolved once the emulator is seen loaded; a negative answer is not cached, because the test
 * may load the driver later. */
static const struct tu_emu_api *tu_emu(void)
{
    static struct tu_emu_api api;
    static _Atomic(const struct tu_emu_api *) ready;
    const struct tu_emu_api *p = ready;
    if (p)
        return p;
    const char *path = getenv("XSEG_LIBCUDA");
    if (!path || !*path)
        return NULL;
    void *lib = dlopen(path, RTLD_NOLOAD | RTLD_NOW);
    if (!lib)
        return NULL;
    struct tu_emu_api a;
#define TU_SYM(field, name) *(void **)&a.field = dlsym(lib, name)
    TU_SYM(stream_hold, "cudaemu_stream_hold");
    TU_SYM(stream_release, "cudaemu_stream_release");
    TU_SYM(fail_nth, "cudaemu_fail");
    TU_SYM(fail_clear, "cudaemu_fail_clear");
    TU_SYM(call_count, "cudaemu_call_count");
    TU_SYM(counts_reset, "cudaemu_counts_reset");
    TU_SYM(live_query, "cudaemu_live_query");
    TU_SYM(set_latency, "cudaemu_set_latency");
    TU_SYM(stream_work, "cudaemu_stream_work");
    TU_SYM(set_bandwidth, "cudaemu_set_bandwidth");
    TU_SYM(host_live, "cudaemu_host_live");
#undef TU_SYM
    /* dlopen(RTLD_NOLOAD) took a reference; the library stays loaded by its first opener. */
    dlclose(lib);
    if (!a.stream_hold || !a.stream_release || !a.fail_nth || !a.fail_clear || !a.call_count ||
        !a.counts_reset || !a.live_query || !a.set_latency || !a.stream_work || !a.set_bandwidth || !a.host_live)
        return NULL;
    api = a;
    ready = &api;
    return &api;
}

bool tu_emulated(void) { return tu_emu() != NULL; }

bool tu_stream_hold(CUstream s)
{
    const struct tu_emu_api *e = tu_emu();
    if (e)
        e->stream_hold(s);
    return e != NULL;
}

bool tu_stream_release(CUstream s)
{
    const struct tu_emu_api *e = tu_emu();
    if (e)
        e->stream_release(s);
    return e != NULL;
}

bool tu_stream_hold_all(bool on)
{
    const char *path = getenv("XSEG_LIBCUDA");
    void *lib = tu_emu() && path ? dlopen(path, RTLD_NOLOAD | RTLD_NOW) : NULL;
    void (*hold_all)(int) = NULL;
    if (lib) {
        *(void **)&hold_all = dlsym(lib, "cudaemu_stream_hold_all");
        dlclose(lib);
    }
    if (hold_all)
        hold_all(on);
    return hold_all != NULL;
}

bool tu_stream_defer_new(bool on)
{
    const char *path = getenv("XSEG_LIBCUDA");
    void *lib = tu_emu() && path ? dlopen(path, RTLD_NOLOAD | RTLD_NOW) : NULL;
    void (*defer_new)(int) = NULL;
    if (lib) {
        *(void **)&defer_new = dlsym(lib, "cudaemu_stream_defer_new");
        dlclose(lib);
    }
    if (defer_new)
        defer_new(on);
    return defer_new != NULL;
}

/* A control of cudaemu's resolved when first used (NULL when not emulated). */
static void *tu_emu_sym(const char *name)
{
    const char *path = getenv("XSEG_LIBCUDA");
    void *lib = tu_emu() && path ? dlopen(path, RTLD_NOLOAD | RTLD_NOW) : NULL, *f = NULL;
    if (lib) {
        f = dlsym(lib, name);
        dlclose(lib);
    }
    return f;
}

bool tu_gate(const char *entry, unsigned long nth)
{
    int (*f)(const char *, unsigned long);
    *(void **)&f = tu_emu_sym("cudaemu_gate");
    return f && f(entry, nth) == 0;
}

bool tu_gate_wait(unsigned timeout_ms)
{
    int (*f)(unsigned);
    *(void **)&f = tu_emu_sym("cudaemu_gate_wait");
    return f && f(timeout_ms) == 0;
}

void tu_gate_open(void)
{
    void (*f)(void);
    *(void **)&f = tu_emu_sym("cudaemu_gate_open");
    if (f)
        f();
}

bool tu_fail(const char *entry, unsigned long nth, CUresult res)
{
    const struct tu_emu_api *e = tu_emu();
    return e && e->fail_nth(entry, nth, res) == 0;
}

void tu_fail_clear(void)
{
    const struct tu_emu_api *e = tu_emu();
    if (e)
        e->fail_clear();
}

unsigned long tu_dead_stream_calls(void)
{
    unsigned long (*f)(void);
    *(void **)&f = tu_emu_sym("cudaemu_dead_stream_calls");
    return f ? f() : 0;
}

unsigned long tu_fail_fired(void)
{
    unsigned long (*f)(void);
    *(void **)&f = tu_emu_sym("cudaemu_fail_fired");
    return f ? f() : 0;
}

/* Fail naming the run (@p fmt, @p ap): none fired (@p n 0: at least one was wanted), or @p got of @p n. */
static void fired_fail(unsigned long got, unsigned long n, const char *fmt, va_list ap)
{
    char what[256];
    vsnprintf(what, sizeof what, fmt, ap);
    if (n == 0)
        fail_msg("%s: the injected fault never fired, so the run tested nothing", what);
    else
        fail_msg("%s: %lu of the %lu injected faults fired", what, got, n);
}

void tu_assert_fired(unsigned long since, const char *fmt, ...)
{
    if (tu_fail_fired() != since)
        return;
    va_list ap;
    va_start(ap, fmt);
    fired_fail(0, 0, fmt, ap);
    va_end(ap);
}

void tu_assert_fired_n(unsigned long since, unsigned long n, const char *fmt, ...)
{
    unsigned long got = tu_fail_fired() - since;
    if (got == n)
        return;
    va_list ap;
    va_start(ap, fmt);
    fired_fail(got, n, fmt, ap);
    va_end(ap);
}

unsigned long tu_call_count(const char *entry)
{
    const struct tu_emu_api *e = tu_emu();
    return e ? e->call_count(entry) : 0;
}

void tu_counts_reset(void)
{
    const struct tu_emu_api *e = tu_emu();
    if (e)
        e->counts_reset();
}

bool tu_live(struct cudaemu_live *live)
{
    const struct tu_emu_api *e = tu_emu();
    memset(live, 0, sizeof *live);
    live->size = sizeof *live;
    return e && e->live_query(live) == 0 && live->size == sizeof *live;
}

bool tu_set_latency(const char *entry, uint64_t ns)
{
    const struct tu_emu_api *e = tu_emu();
    return e && e->set_latency(entry, ns) == 0;
}

bool tu_set_bandwidth(const char *entry, uint64_t bytes_per_second)
{
    const struct tu_emu_api *e = tu_emu();
    return e && e->set_bandwidth(entry, bytes_per_second) == 0;
}

size_t tu_host_live(size_t *bytes)
{
    const struct tu_emu_api *e = tu_emu();
    size_t n = 0, b = 0;
    if (e)
        e->host_live(&n, &b);
    if (bytes)
        *bytes = b;
    return n;
}

/* capture graph (graph_capture_record_stream_reuse) */
bool tu_stream_work(CUstream s)
{
    /* In a capture, one path on cudaemu and the driver: an empty node made the stream's only
     * dependency, which orders the graph as a kernel node would. The test then sees the same
     * graph on both (a test that counted node types once saw a kernel node here and an empty one
     * on the GPU). */
    CUstreamCaptureStatus st;
    CUgraph g = NULL;
    const CUgraphNode *deps = NULL;
    size_t n = 0;
    if (drv->cuStreamGetCaptureInfo(s, &st, NULL, &g, &deps, NULL, &n) != CUDA_SUCCESS)
        return false;
    if (st == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        CUgraphNode node;
        return drv->cuGraphAddEmptyNode(&node, g, deps, n) == CUDA_SUCCESS &&
               drv->cuStreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES) ==
                   CUDA_SUCCESS;
    }
    if (st != CU_STREAM_CAPTURE_STATUS_NONE)
        return false;
    /* Outside a capture: cudaemu's kernel stand-in (pending work on a held stream); on the real
     * driver, work would complete on its own. */
    const struct tu_emu_api *e = tu_emu();
    return e ? e->stream_work(s) == 0 : true;
}

/* ---- executable graphs ---- */

#define TU_STR2(x) #x
#define TU_ABI(fn) TU_STR2(fn) /* the ABI name cuda.h's macros give the API name */

const struct tu_graph_api *tu_graph(void)
{
    static struct tu_graph_api api;
    static _Atomic(const struct tu_graph_api *) ready;
    const struct tu_graph_api *p = ready;
    if (p)
        return p;
    const char *path = getenv("XSEG_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    void *lib = dlopen(path, RTLD_NOLOAD | RTLD_NOW);
    if (!lib)
        fail_msg("%s is not loaded: call tu_gpu_available() first", path);
    struct tu_graph_api a;
    *(void **)&a.instantiate = dlsym(lib, TU_ABI(cuGraphInstantiate));
    *(void **)&a.launch = dlsym(lib, TU_ABI(cuGraphLaunch));
    *(void **)&a.exec_destroy = dlsym(lib, TU_ABI(cuGraphExecDestroy));
    *(void **)&a.memcpy_dtod_async = dlsym(lib, TU_ABI(cuMemcpyDtoDAsync));
    /* dlopen(RTLD_NOLOAD) took a reference; the library stays loaded by its first opener. */
    dlclose(lib);
    if (!a.instantiate || !a.launch || !a.exec_destroy || !a.memcpy_dtod_async)
        fail_msg("%s lacks %s, %s, %s or %s", path, TU_ABI(cuGraphInstantiate), TU_ABI(cuGraphLaunch),
                 TU_ABI(cuGraphExecDestroy), TU_ABI(cuMemcpyDtoDAsync));
    api = a;
    ready = &api;
    return &api;
}

/* ---- driver and device ---- */

static pthread_once_t tu_gpu_once = PTHREAD_ONCE_INIT;
static bool tu_gpu_ok;
static char tu_gpu_msg[1024];
static CUcontext tu_primary;

static void tu_gpu_probe(void)
{
    if (drv_load() != XSEG_SUCCESS) {
        snprintf(tu_gpu_msg, sizeof tu_gpu_msg, "%s", xseg_last_error());
        return;
    }
    int n = 0;
    if (drv->cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
        snprintf(tu_gpu_msg, sizeof tu_gpu_msg, "the driver reports no device");
        return;
    }
    struct drv_device_info info;
    if (drv_device_query(0, &info) != XSEG_SUCCESS) {
        snprintf(tu_gpu_msg, sizeof tu_gpu_msg, "%s", xseg_last_error());
        return;
    }
    tu_primary = info.primary_ctx;
    tu_gpu_ok = true;
}

bool tu_gpu_available(void)
{
    pthread_once(&tu_gpu_once, tu_gpu_probe);
    if (tu_gpu_ok)
        tu_ctx_set();
    return tu_gpu_ok;
}

const char *tu_last_load_error(void)
{
    pthread_once(&tu_gpu_once, tu_gpu_probe);
    return tu_gpu_msg;
}

void tu_exit_skip_without_gpu(void)
{
    if (!tu_gpu_available()) {
        fprintf(stderr, "SKIP: no usable CUDA driver or device: %s\n", tu_gpu_msg);
        exit(77);
    }
}

void tu_set_memory_cap(size_t bytes)
{
    size_t total = 0;
    tu_assert_cu(drv->cuDeviceTotalMem(&total, 0));
    if (bytes > total)
        fail_msg("tu_set_memory_cap(%zu): the device has %zu bytes", bytes, total);
    xseg_status st = xseg_set_memory_fraction((double)bytes / (double)total, 0);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_set_memory_fraction: %s", xseg_last_error());
}

CUcontext tu_ctx(void)
{
    if (!tu_gpu_available())
        return NULL;
    return tu_primary;
}

void tu_ctx_set(void)
{
    if (tu_primary)
        drv_ctx_ensure(tu_primary);
}

double tu_scale(void)
{
    const char *s = getenv("XSEG_TEST_SCALE");
    if (!s || !*s)
        return 1.0;
    char *end;
    double v = strtod(s, &end);
    return (*end || !(v > 0)) ? 1.0 : v;
}

size_t tu_scaled(size_t n, size_t min)
{
    double v = (double)n * tu_scale();
    size_t r = v < 1.0 ? 0 : (size_t)v;
    return r < min ? min : r;
}

size_t tu_steps(size_t n, size_t min)
{
    const char *s = getenv("XSEG_TEST_STEPS");
    if (s && *s) {
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (!*end && v > 0)
            return (size_t)v;
    }
    return tu_scaled(n, min);
}

int tu_run_named(const char *group, const struct tu_named_test *all, size_t n, int argc, char **argv)
{
    struct CMUnitTest *run = malloc((n ? n : 1) * sizeof *run);
    if (!run) {
        fprintf(stderr, "test_%s: out of host memory\n", group);
        return 2;
    }
    size_t nrun = 0;
    for (size_t i = 0; i < n; i++)
        if (argc < 2 || strcmp(argv[1], all[i].name) == 0)
            run[nrun++] = all[i].test;
    if (nrun == 0) {
        fprintf(stderr, "test_%s: no test named %s\n", group, argv[1]);
        free(run);
        return 2;
    }
    int rc = _cmocka_run_group_tests(group, run, nrun, NULL, NULL);
    free(run);
    return rc;
}

/* ---- data through the driver ---- */

#define TU_PROBE 64
#define TU_FULL_SET_MAX ((size_t)64 << 20)
#define TU_FULL_CHECK_MAX ((size_t)4 << 20)

static unsigned char tu_background(uint32_t tag) { return (unsigned char)(0x5a ^ (tag * 0x9e3779b1u) >> 24); }

static void tu_probe_bytes(uint32_t tag, size_t off, unsigned char *out, size_t n)
{
    uint64_t x = ((uint64_t)tag << 32) ^ off ^ 0x243f6a8885a308d3ULL;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out[i] = (unsigned char)((x * 0x2545f4914f6cdd1dULL) >> 56);
    }
}

/* Probe i of n: non-overlapping, the first at 0 and the last ending at size. */
static void tu_probe_at(size_t size, size_t i, size_t n, size_t *off, size_t *len)
{
    *len = size < TU_PROBE ? size : TU_PROBE;
    *off = i + 1 == n ? size - *len : i * (size / n);
}

static size_t tu_probe_count(size_t size)
{
    size_t n = size / TU_PROBE;
    return n == 0 ? 1 : n > 16 ? 16 : n;
}

CUresult tu_fill(CUdeviceptr ptr, size_t size, uint32_t tag)
{
    CUresult r;
    if (!size)
        return CUDA_SUCCESS;
    if (size <= TU_FULL_SET_MAX && (r = drv->cuMemsetD8(ptr, tu_background(tag), size)) != CUDA_SUCCESS)
        return r;
    size_t n = tu_probe_count(size);
    for (size_t i = 0; i < n; i++) {
        size_t off, len;
        unsigned char buf[TU_PROBE];
        tu_probe_at(size, i, n, &off, &len);
        tu_probe_bytes(tag, off, buf, len);
        if ((r = drv->cuMemcpyHtoD(ptr + off, buf, len)) != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

bool tu_device_accessible(CUdeviceptr ptr)
{
    unsigned char b = 0;
    return drv->cuMemcpyDtoH(&b, ptr, 1) == CUDA_SUCCESS && drv->cuMemcpyHtoD(ptr, &b, 1) == CUDA_SUCCESS &&
           drv->cuCtxSynchronize() == CUDA_SUCCESS;
}

bool tu_check(CUdeviceptr ptr, size_t size, uint32_t tag)
{
    if (!size)
        return true;
    size_t n = tu_probe_count(size);
    unsigned char *all = NULL;
    if (size <= TU_FULL_CHECK_MAX) {
        all = malloc(size);
        if (!all || drv->cuMemcpyDtoH(all, ptr, size) != CUDA_SUCCESS) {
            free(all);
            return false;
        }
    }
    bool ok = true;
    size_t prev_end = 0;
    for (size_t i = 0; i < n && ok; i++) {
        size_t off, len;
        unsigned char want[TU_PROBE], got[TU_PROBE];
        tu_probe_at(size, i, n, &off, &len);
        tu_probe_bytes(tag, off, want, len);
        if (all)
            memcpy(got, all + off, len);
        else if (drv->cuMemcpyDtoH(got, ptr + off, len) != CUDA_SUCCESS)
            ok = false;
        ok = ok && !memcmp(want, got, len);
        /* The background between probes, where we have the whole range. */
        for (size_t k = prev_end; all && ok && k < off; k++)
            ok = all[k] == tu_background(tag);
        prev_end = off + len;
    }
    for (size_t k = prev_end; all && ok && k < size; k++)
        ok = all[k] == tu_background(tag);
    if (ok && !all && size <= TU_FULL_SET_MAX) {
        /* Background samples between the probes. */
        unsigned char b;
        for (size_t i = 0; i + 1 < n && ok; i++) {
            size_t off = i * (size / n) + TU_PROBE + 1;
            ok = drv->cuMemcpyDtoH(&b, ptr + off, 1) == CUDA_SUCCESS && b == tu_background(tag);
        }
    }
    free(all);
    return ok;
}

/* ---- fail fast at a fault ----
 *
 * cmocka catches SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGSYS in each test (signal() before it,
 * restored after) and goes on with the next test. After such a fault the faulting code's locks
 * (xseg's device lock, the driver's) are still held, so the next test waits for them for ever: on
 * the H200 two test programs hung to their 60 s and 240 s limits that way. Every test program
 * links this signal(), which the linker exports, so cmocka's calls reach it: a handler for those
 * signals is not installed (the call answers the handler in place), so a fault kills the program
 * at once (or a sanitizer reports it); SIG_DFL, SIG_IGN and every other signal pass through. */
static bool tu_fatal_signal(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGSYS;
}

typedef void (*tu_handler)(int);

tu_handler signal(int sig, tu_handler handler)
{
    struct sigaction sa, old;
    if (tu_fatal_signal(sig) && handler != SIG_DFL && handler != SIG_IGN)
        return sigaction(sig, NULL, &old) ? SIG_ERR : old.sa_handler; /* the union's one pointer */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART; /* glibc's signal(): BSD semantics */
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, &old) ? SIG_ERR : old.sa_handler;
}

/* ---- child processes ---- */

enum tu_child_outcome tu_run_child(int (*fn)(void *arg), void *arg, int *detail)
{
    int dummy;
    if (!detail)
        detail = &dummy;
    *detail = 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return TU_CHILD_ERROR;
    if (pid == 0) {
        /* The child is expected to crash: no core file, no sanitizer report on the test's
         * output, and the default action for the fault signals (a sanitizer's handler would
         * turn the fault into an exit code, which the caller also accepts). */
        struct rlimit nocore = {0, 0};
        setrlimit(RLIMIT_CORE, &nocore);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 2);
            close(devnull);
        }
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        _exit(fn(arg) & 0xff);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        ;
    if (WIFSIGNALED(status)) {
        *detail = WTERMSIG(status);
        return TU_CHILD_SIGNAL;
    }
    if (WIFEXITED(status)) {
        *detail = WEXITSTATUS(status);
        return *detail ? TU_CHILD_EXIT : TU_CHILD_OK;
    }
    return TU_CHILD_ERROR;
}

/* ---- xseg through its public API ---- */

void tu_xseg_init_or_skip(const char *config)
{
    xseg_status st = xseg_init(config);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_init(%s): %s", config, xseg_last_error());
    if (!tu_gpu_available())
        skip();
}

int64_t tu_stat(const char *key)
{
    int64_t v = -1;
    xseg_status st = xseg_stat(0, key, &v);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_stat(%s): %s", key, xseg_last_error());
    return v;
}

void *tu_malloc(size_t size, CUstream stream)
{
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, size, 0, stream);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_malloc(%zu, stream %p): %s", size, (void *)stream, xseg_last_error());
    assert_non_null(p);
    return p;
}

void tu_free(void *p)
{
    xseg_status st = xseg_free(p);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_free(%p): %s", p, xseg_last_error());
}

void tu_seed_row(const char *tag, const char *alloc, const char *active, const char *split,
                 const char *reserved)
{
    const char *keys[4] = {"allocated_bytes.large_pool.current", "active_bytes.large_pool.current",
                           "inactive_split_bytes.large_pool.current", "reserved_bytes.large_pool.current"};
    const char *want[4] = {alloc, active, split, reserved};
    for (int i = 0; i < 4; i++) {
        char got[32];
        snprintf(got, sizeof got, "%.3f", (double)tu_stat(keys[i]) / (double)(1u << 30));
        if (strcmp(got, want[i]) != 0)
            fail_msg("%s: %s is %s GiB, the seed's table says %s", tag, keys[i], got, want[i]);
    }
}

int tu_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}
