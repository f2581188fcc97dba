/*
 * testutil: helpers shared by every test suite (link `testutil_dep`).
 *
 * The same test binaries run on cudaemu (XSEG_LIBCUDA points at it: CI, machines without a GPU)
 * and on the real libcuda.so.1 (-Demulator=false on a GPU machine). Emulator-only controls are
 * reached with dlsym() on the library xseg loaded, so nothing here links cudaemu.
 *
 * Contract for the emulator controls (tu_stream_hold, tu_fail, tu_call_count, tu_live, ...): on
 * the real driver they do nothing and report it (return false / 0); a test that depends on one
 * must call tu_require_emulator_or_skip() first (cmocka skip()), never assert through them.
 *
 * Device memory is touched only through driver calls (tu_fill / tu_check use cuMemsetD8 and
 * cuMemcpyDtoH), so the same test checks data on a GPU too.
 */
#ifndef XSEG_TESTS_TESTUTIL_H
#define XSEG_TESTS_TESTUTIL_H

#include <setjmp.h>   /* cmocka.h needs these first */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <cuda.h>

#include "cudaemu/cudaemu.h"
#include "vmm/driver.h"

/* True when the loaded driver ($XSEG_LIBCUDA, already loaded by drv_load or the test) is cudaemu:
 * it exports cudaemu_stream_hold. False on the real driver or when nothing is loaded. */
bool tu_emulated(void);

/* cmocka skip() unless running on cudaemu. Use at the top of emulator-only tests. */
#define tu_require_emulator_or_skip()                                                             \
    do {                                                                                          \
        if (!tu_emulated()) {                                                                     \
            print_message("[  SKIPPED ] needs cudaemu (emulator-only check)\n");                 \
            skip();                                                                               \
        }                                                                                         \
    } while (0)

/* Load the driver and make device 0's primary context current. @return true on success; false
 * when there is no usable driver or device (no GPU, no libcuda): then the test should skip. */
bool tu_gpu_available(void);

/* cmocka skip() when no driver/device is usable (tu_gpu_available() is false). */
#define tu_require_gpu_or_skip()                                                                  \
    do {                                                                                          \
        if (!tu_gpu_available()) {                                                                \
            print_message("[  SKIPPED ] no CUDA device: %s\n", tu_last_load_error());            \
            skip();                                                                               \
        }                                                                                         \
    } while (0)

/* For a main(): exit(77) (meson's "skipped") when no driver/device is usable. */
void tu_exit_skip_without_gpu(void);

/* Why tu_gpu_available() failed ("" if it did not). */
const char *tu_last_load_error(void);

/* xseg_set_memory_fraction on device 0 such that xseg may reserve @p bytes (to rounding), from
 * its total memory (cuDeviceTotalMem): a cap that holds on any device, an 80 GiB H100, a
 * 143,771 MiB H200 or a small emulated one (a fraction alone assumes a size). */
void tu_set_memory_cap(size_t bytes);

/* The retained primary context of device 0 (after tu_gpu_available()), made current on the
 * calling thread. Other threads call tu_ctx_set() before driver calls that need a context. */
CUcontext tu_ctx(void);
void tu_ctx_set(void);

/* XSEG_TEST_SCALE (default 1.0; sanitizer setups use 0.25 / 0.1). */
double tu_scale(void);
/* n scaled, at least @p min. */
size_t tu_scaled(size_t n, size_t min);
/* Operation count of a randomized test: $XSEG_TEST_STEPS when set (the `long` test setup sets
 * 10^6), else tu_scaled(n, min). */
size_t tu_steps(size_t n, size_t min);

/* A test program that runs one test per process (meson passes its name as argv[1]): the named
 * tests of @p all, or every one without an argument; "test_GROUP: no test named X" and 2 when
 * none matches. */
struct tu_named_test {
    const char *name;
    struct CMUnitTest test;
};
#define TU_NAMED(fn) {#fn, cmocka_unit_test(fn)}
int tu_run_named(const char *group, const struct tu_named_test *all, size_t n, int argc, char **argv);

/* ---- emulator controls (no-ops returning false / 0 on the real driver) ---- */

/* Hold / release a stream (cudaemu_stream_hold): events recorded on a held stream stay
 * CUDA_ERROR_NOT_READY until released or synchronized. @return false when not emulated. */
bool tu_stream_hold(CUstream s);
bool tu_stream_release(CUstream s);
/* cudaemu_stream_hold_all: hold every stream (xseg's own copy streams too), or release them all. */
bool tu_stream_hold_all(bool on);
/* cudaemu_stream_defer_new: non-blocking streams created from now on (xseg's own) run their
 * memsets and fills only when waited for, after work queued later on other streams, as a GPU may.
 * @return false when not emulated. */
bool tu_stream_defer_new(bool on);

/* The process's open file descriptors (entries of /proc/self/fd); -1 when it cannot be read. */
int tu_count_fds(void);

/* cudaemu_dead_stream_calls: calls since start that named a destroyed stream (0 when not emulated). */
unsigned long tu_dead_stream_calls(void);

/* cudaemu_gate: park the nth call from now of @p entry until tu_gate_open (a test catches xseg
 * inside a long operation); tu_gate_wait: true once a call is parked (false after @p timeout_ms, a
 * hang guard). @return false when not emulated (or @p entry unknown). */
bool tu_gate(const char *entry, unsigned long nth);
bool tu_gate_wait(unsigned timeout_ms);
void tu_gate_open(void);

/* Fail the nth call from now of @p entry (API or ABI name) with @p res. @return false when not
 * emulated or when @p entry is unknown to cudaemu. */
bool tu_fail(const char *entry, unsigned long nth, CUresult res);
/* Disarm every injected failure (no-op when not emulated). */
void tu_fail_clear(void);
/* Injected failures that fired since the process started (cudaemu_fail_fired; 0 when not
 * emulated). A fault sweep takes it before a run and checks it grew: a sweep whose fault never
 * fires tests nothing. */
unsigned long tu_fail_fired(void);
/* Fail the test, naming the run (printf-style), when no injected failure fired since @p since (a
 * tu_fail_fired() value). Emulator-only, like tu_fail. */
void tu_assert_fired(unsigned long since, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fail the test, naming the run, unless exactly @p n injected failures fired since @p since: a test
 * that arms several faults checks that each one was reached. Emulator-only, like tu_fail. */
void tu_assert_fired_n(unsigned long since, unsigned long n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Calls of @p entry since start or tu_counts_reset() (0 when not emulated). */
unsigned long tu_call_count(const char *entry);
void tu_counts_reset(void);

/* Fill *live with cudaemu's live state. @return false (and *live zeroed) when not emulated. */
bool tu_live(struct cudaemu_live *live);

/* Set the latency of @p entry in ns. @return false when not emulated or unknown. */
bool tu_set_latency(const char *entry, uint64_t ns);
/* Set the per-byte cost of copy entry @p entry as a rate (0: none). @return false when not
 * emulated or unknown. */
bool tu_set_bandwidth(const char *entry, uint64_t bytes_per_second);
/* Live pinned host allocations (cuMemHostAlloc not yet freed); *bytes (optional) their bytes.
 * 0 when not emulated. */
size_t tu_host_live(size_t *bytes);

/* Enqueue a unit of work on @p s (a kernel launch, for the capture graph): while @p s captures,
 * an empty node after its dependencies, made its only dependency (cudaemu and the driver alike:
 * count it when counting empty nodes); otherwise cudaemu_stream_work on cudaemu (pending work on
 * a held stream), nothing on the real driver. @return false when the driver refused. */
bool tu_stream_work(CUstream s);

/* ---- executable graphs: entry points xseg's driver table does not hold (the allocator never
 * launches a graph), resolved with dlsym on the loaded driver ($XSEG_LIBCUDA or libcuda.so.1), so
 * the same test replays a capture on cudaemu and on a GPU. ---- */
struct tu_graph_api {
    __typeof__(cuGraphInstantiate) *instantiate;      /* ABI name cuGraphInstantiateWithFlags */
    __typeof__(cuGraphLaunch) *launch;
    __typeof__(cuGraphExecDestroy) *exec_destroy;
    __typeof__(cuMemcpyDtoDAsync) *memcpy_dtod_async; /* cuMemcpyDtoDAsync_v2 */
};
/* The entry points (driver loaded); fails the test when the driver lacks one. */
const struct tu_graph_api *tu_graph(void);

/* ---- device data through driver calls ---- */

/* Fill [ptr, ptr + size) with a pattern derived from @p tag (cuMemsetD8 of whole range, then a
 * few tagged 64-byte probes written with cuMemcpyHtoD at sampled offsets). @return the first
 * failing CUresult, CUDA_SUCCESS otherwise. Ranges over 64 MiB are sampled, not fully set. */
CUresult tu_fill(CUdeviceptr ptr, size_t size, uint32_t tag);
/* Check what tu_fill(ptr, size, tag) wrote, reading sampled spots with cuMemcpyDtoH. @return
 * true when every sampled spot matches. */
bool tu_check(CUdeviceptr ptr, size_t size, uint32_t tag);

/* Can the current device read and write byte @p ptr (mapped memory it was granted access to)? A
 * driver copy reads the byte and writes it back unchanged: mapped-ness is checked as a GPU sees
 * it, never by a host touch (device memory is not host memory, on cudaemu as on a GPU). Use on
 * cudaemu for bytes that may be unmapped (it answers CUDA_ERROR_ILLEGAL_ADDRESS there). */
bool tu_device_accessible(CUdeviceptr ptr);

/* ---- child processes (fault checks) ---- */

enum tu_child_outcome {
    TU_CHILD_OK,        /* exited 0 */
    TU_CHILD_EXIT,      /* exited with a nonzero status (*detail = status) */
    TU_CHILD_SIGNAL,    /* killed by a signal (*detail = signal number) */
    TU_CHILD_ERROR,     /* fork/wait failed */
};
/* Run fn(arg) in a forked child; the child exits with fn's return value (0 = fine). Core dumps
 * are disabled and sanitizer reports silenced in the child, which is expected to crash. */
enum tu_child_outcome tu_run_child(int (*fn)(void *arg), void *arg, int *detail);
/* Did the child die by a signal or exit nonzero (the "it faulted or failed" outcome)? */
static inline bool tu_child_failed(enum tu_child_outcome o) { return o == TU_CHILD_SIGNAL || o == TU_CHILD_EXIT; }

/* Assert a driver call's result with its name in the message: tu_assert_cu(drv->cuMemMap(...)). */
#define tu_assert_cu_eq(call, expected)                                                           \
    do {                                                                                          \
        CUresult tu_r_ = (call);                                                                  \
        if (tu_r_ != (expected))                                                                  \
            fail_msg("%s returned %s, expected %s", #call, drv_error_name(tu_r_),                \
                     drv_error_name(expected));                                                   \
    } while (0)
#define tu_assert_cu(call) tu_assert_cu_eq(call, CUDA_SUCCESS)

/* ---- xseg through its public API, on device 0: each helper fails the test with xseg's
 * message (xseg_last_error) when the call does not succeed. ---- */

/* xseg_init(config); skips the test when no driver with a device can be loaded. */
void tu_xseg_init_or_skip(const char *config);
/* The statistic @p key of device 0. */
int64_t tu_stat(const char *key);
/* xseg_malloc on device 0; never returns NULL. */
void *tu_malloc(size_t size, CUstream stream);
/* xseg_free. */
void tu_free(void *p);
/* Compare one row of a seed 003 table with the large pool's Allocated / Active / InactiveSplit /
 * Reserved, each as the seed prints it ("%.3f" of GiB). */
void tu_seed_row(const char *tag, const char *alloc, const char *active, const char *split,
                 const char *reserved);

#endif
