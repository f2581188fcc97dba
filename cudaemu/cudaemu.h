/*
 * cudaemu control interface: what a test can do to the emulated driver beyond the CUDA API.
 *
 * cudaemu is a libcuda.so.1 stand-in over host memory (see docs/design.md). These functions are
 * exported by libcudaemu.so next to the cu* entry points. Tests reach them with dlsym() on the
 * library xseg loaded ($XSEG_LIBCUDA), so the same test binary runs on a real driver, where the
 * symbols are absent and emulator-only checks are skipped.
 *
 * Environment variables (read once, at cuInit; a malformed value stops the process with a
 * message naming the variable):
 *   CUDAEMU_DEVICES      number of devices (default 1)
 *   CUDAEMU_TOTAL_MEM    memory per device: bytes, or with K/M/G/T suffix ("80G", "81920M")
 *   CUDAEMU_GRANULARITY  VMM granularity (default 2M); a power of two, multiple of the host page
 *   CUDAEMU_VMM          1 (default) or 0: the device reports no VMM support
 *   CUDAEMU_FAIL         comma list entry:N:CUresult — fail the Nth call of entry point `entry`
 *                        (API or ABI name: cuMemMap, cuMemAlloc, cuMemAlloc_v2) with that code,
 *                        e.g. "cuMemMap:3:CUDA_ERROR_OUT_OF_MEMORY"
 *   CUDAEMU_LATENCY      comma list entry:duration — busy-wait that long in each call
 *                        ("cuMemMap:12us,cuMemCreate:30us"; units ns, us, ms) — or
 *                        entry:rate for a copy ("cuMemcpyDtoHAsync:25GB/s": the call lasts at
 *                        least its bytes over the rate); the item "h100" sets the per-call
 *                        medians measured on an H100 (20 MiB pages) and 25 GB/s for host<->device
 *                        copies (a PCIe 4.0 x16 figure, not measured), and later items override
 *                        single entries ("h100,cuMemMap:2us")
 *   CUDAEMU_REPORT       1: print call counters and live handles / mapped bytes / reservations /
 *                        cuMemAlloc blocks at exit, on stderr
 *   CUDAEMU_FABRIC       1: emulate CU_MEM_HANDLE_TYPE_FABRIC (default 0: reported unsupported)
 *   CUDAEMU_HOST_NUMA_ID the host NUMA node of each device (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID):
 *                        "1", or "0,1" device by device (the last repeats); -1: a system without
 *                        NUMA. Default 0. HOST_NUMA memory may name nodes 0 up to the largest.
 *   CUDAEMU_FRESH        what new cuMemCreate memory holds (the driver promises nothing):
 *                        sparse (default: a non-zero pattern in the first host page of each
 *                        allocation, the rest zero), garbage (the pattern in every byte), zero
 */
#ifndef CUDAEMU_H
#define CUDAEMU_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Hold a stream: work recorded on it from now on stays pending, so events recorded on it return
 * CUDA_ERROR_NOT_READY from cuEventQuery, until cudaemu_stream_release() or a synchronize of the
 * stream (or context). The NULL stream may be held too. */
void cudaemu_stream_hold(CUstream stream);
void cudaemu_stream_release(CUstream stream);
/* Hold (@p on) every stream, the NULL stream and streams created from now on included, as
 * cudaemu_stream_hold does one: for work queued on streams a test cannot name (a library's own).
 * 0 releases every stream (their work completes) and new streams start unheld again. */
void cudaemu_stream_hold_all(int on);
/* Defer (@p on) the bytes of non-blocking streams created from now on: such a stream is held, and
 * its cuMemsetD8Async and fill kernels move their bytes only when its work completes (a wait of
 * the stream, the context or an event of it, another stream's cuStreamWaitEvent on such an event,
 * a copy or compare queued after them on it, its destroy), so work queued later on another stream
 * that nothing orders after them lands first: the driver promises no order between streams, and
 * a GPU runs a later-queued 1-byte memset before a large fill. For a library's own streams. */
void cudaemu_stream_defer_new(int on);

/* Enqueue a unit of work on @p stream, standing for a kernel launch, so that tests can express
 * forks and joins in a capture. While @p stream captures: a kernel node that depends on the
 * stream's capture dependencies is added to the capture's graph and becomes its only dependency.
 * Otherwise, on a held stream, the work stays pending (cuStreamQuery: CUDA_ERROR_NOT_READY)
 * until released or waited for; on other streams it completes at once.
 * @return 0, or -1 for an unknown stream, an invalidated capture (nothing is added) or out of
 *         host memory. */
int cudaemu_stream_work(CUstream stream);

/* Fail the @p nth call from now (1 = the next call) of @p entry with @p result. Several may be
 * armed at once. @return 0, or -1 when @p entry is not an emulated entry point. */
int cudaemu_fail(const char *entry, unsigned long nth, CUresult result);
/* Disarm every pending failure. */
void cudaemu_fail_clear(void);
/* Armed failures (cudaemu_fail, CUDAEMU_FAIL) that fired since start, never reset: a test
 * compares it before and after a run to know its fault struck (a call answered with the armed
 * CUresult; two armed for the same call count once). */
unsigned long cudaemu_fail_fired(void);

/* A gate, for tests that must catch a caller inside a call (a library's long operation between
 * two steps): the @p nth call of @p entry from now (1 = the next) parks at its start, holding no
 * cudaemu lock, until cudaemu_gate_open(); other calls and threads go on. One gate at a time (a
 * new one replaces it). cudaemu_gate_wait returns 0 once a call is parked, -1 after @p timeout_ms
 * without one (a hang guard) or when the gate was opened first. @return 0, or -1 for an unknown
 * entry or nth 0. */
int cudaemu_gate(const char *entry, unsigned long nth);
int cudaemu_gate_wait(unsigned timeout_ms);
void cudaemu_gate_open(void);

/* Calls since start that named a destroyed stream (a dangling handle on a GPU, undefined
 * behaviour; cudaemu answers CUDA_ERROR_INVALID_HANDLE), until a new stream reuses its address. */
unsigned long cudaemu_dead_stream_calls(void);

/* Calls made to @p entry since start or the last reset (0 for unknown names). */
unsigned long cudaemu_call_count(const char *entry);
void cudaemu_counts_reset(void);

/*
 * Live state, for leak checks. ABI rule: the struct only ever grows at its end, and the caller
 * states how much of it its own header declared: set `size` to sizeof(struct cudaemu_live) before
 * the call. cudaemu_live_query fills only the fields that fit in min(size, its own struct's size)
 * and sets `size` to the bytes it filled, so a program built against an older (shorter) header
 * never has memory written past its struct, and one built against a newer header sees from
 * `size` which fields this cudaemu knows (the rest are left as they were).
 */
struct cudaemu_live {
    size_t size;           /* in: sizeof the caller's struct; out: the bytes filled (this field included) */
    size_t handles;        /* cuMemCreate/import handles not yet fully freed (memory still held) */
    size_t mapped_bytes;   /* bytes of VA currently mapped */
    size_t reservations;   /* cuMemAddressReserve ranges not freed */
    size_t reserved_bytes; /* their bytes (address space reserved) */
    size_t allocs;         /* cuMemAlloc blocks not freed */
    size_t used_bytes[8];  /* device memory in use per device (first 8 devices) */
    size_t events;         /* cuEventCreate'd events not destroyed */
    size_t graphs;         /* graphs not destroyed: ended captures' and those still capturing */
    size_t graph_execs;    /* cuGraphInstantiate'd executable graphs not destroyed */
    size_t modules;        /* cuModuleLoadData'd modules not unloaded */
};
/* Fill @p live as the rule above says. @return 0, or -1 when @p live is NULL or its size is
 * smaller than the size field (nothing is written then).
 * (cudaemu_live_get, the earlier call without a size, is still exported for programs built before
 * this one existed: it writes at most 96 bytes, the smallest struct cudaemu_live ever installed,
 * with no size field; new code must not use it.) */
int cudaemu_live_query(struct cudaemu_live *live);

/* Set the busy-wait latency of @p entry in nanoseconds (0: none). -1 for an unknown name. */
int cudaemu_set_latency(const char *entry, uint64_t ns);
/* The latency of @p entry in ns and its per-byte cost in picoseconds per byte (0: none), as
 * CUDAEMU_LATENCY or the setters left them: what a benchmark needs to model the time of the calls
 * it counted. Either pointer may be NULL. -1 for an unknown name. */
int cudaemu_get_latency(const char *entry, uint64_t *ns, uint64_t *ps_per_byte);
/* The timeline model's clock, in ns: each call adds its latency, a synchronous copy its bytes at
 * its rate; an async copy occupies its stream and its direction's copy engine from when both (and
 * the host) are ready for bytes / rate, and a wait (stream, context or event synchronize) moves
 * the clock to the end of what it waited for. The difference across a sequence of calls is its
 * modelled duration with copies overlapping host calls and each other as a GPU would run them. */
uint64_t cudaemu_model_ns(void);
/* Set the per-byte cost of a copy entry (cuMemcpyHtoD, ...) as a rate (0: none): a call that
 * moves n bytes lasts at least n / rate; of cuMemHostAlloc, cuMemFreeHost, cuMemHostRegister and
 * cuMemHostUnregister, the cost of pinning or unpinning n bytes. -1 for an unknown name. The
 * name "link" sets the host link's rate (also for cudaemu_get_latency): the bytes of any copy
 * (cuMemcpy*, cuMemcpy*Async) that lie in host-located VMM memory (cuMemCreate location HOST or
 * HOST_NUMA) run at it instead of the entry's rate. The name "pageable" sets the rate of a copy
 * whose host side is not pinned (cuMemHostAlloc'd or registered): all its bytes run at it, and
 * the host waits for it on the timeline model even when asynchronous. */
int cudaemu_set_bandwidth(const char *entry, uint64_t bytes_per_second);
/* Bytes copied to or from host-located VMM memory since start (the "link bytes" of the report),
 * by every copy entry; those bytes are in the entries' own counts too. */
uint64_t cudaemu_link_bytes(void);

/* Print the report CUDAEMU_REPORT=1 prints at exit. */
void cudaemu_report(void);

/* Services: live pinned host allocations (cuMemHostAlloc not yet cuMemFreeHost'd, and ranges
 * cuMemHostRegister'ed not yet unregistered) and their bytes (cuMemHostAlloc's in host-page
 * multiples). Either pointer may be NULL. */
void cudaemu_host_live(size_t *count, size_t *bytes);
/* Test hook: a stray host write into pinned memory. Flips (xor 0xFF) byte @p off of every live
 * cuMemHostAlloc allocation of at least @p min_bytes (and longer than @p off). @return how many. */
size_t cudaemu_host_flip(size_t min_bytes, size_t off);

#ifdef __cplusplus
}
#endif

#endif
