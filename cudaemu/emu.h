/*
 * cudaemu internals shared by its files. Not installed, not used outside cudaemu/.
 *
 * Locking: one process-wide mutex, emu.lock, guards every piece of emulator state below except
 * the per-entry call counters and latencies (atomics, touched outside the lock so that a latency
 * busy-wait never serializes other threads) and the thread-locals (current context, capture
 * interaction mode). Functions named *_locked expect the caller to hold emu.lock.
 */
#ifndef CUDAEMU_EMU_H
#define CUDAEMU_EMU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The cu* declarations from cuda.h and the control API are the library's exports (the
 * driver-only build, CUDAEMU_DRIVER_ONLY, exports the cu* ones alone); everything declared after
 * the pop is internal (the build hides symbols by default). */
#pragma GCC visibility push(default)
#include <cuda.h>
#ifdef CUDAEMU_DRIVER_ONLY
#pragma GCC visibility pop
#include "cudaemu/cudaemu.h" /* hidden: a real driver has no control API */
#else
#include "cudaemu/cudaemu.h"
#pragma GCC visibility pop
#endif

#define EMU_MAX_DEVICES 64

/* Every entry point cudaemu exports. The API name is the token; its ABI name (cuMemAlloc_v2) is
 * what cuda.h's macros expand the token to, so EMU_ABI_NAME(cuMemAlloc) is "cuMemAlloc_v2". */
#define EMU_FOREACH_ENTRY(X)                                                                      \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                         \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceGetUuid) \
    X(cuDeviceTotalMem) X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain)                      \
    X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice)          \
    X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxSynchronize)                                    \
    X(cuMemGetInfo) X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD8)      \
    X(cuPointerGetAttribute)                                                                      \
    /* managed memory (memory.c; tests' owners allocate it, xseg does not) */                     \
    X(cuMemAllocManaged) X(cuMemPrefetchAsync)                                                    \
    X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate)   \
    X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAccess)                 \
    X(cuMemRetainAllocationHandle) X(cuMemExportToShareableHandle)                                \
    X(cuMemGetAllocationPropertiesFromHandle)                                                     \
    X(cuMemImportFromShareableHandle)                                                             \
    X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery)                  \
    X(cuStreamWaitEvent) X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing)     \
    X(cuStreamGetCaptureInfo) X(cuThreadExchangeStreamCaptureMode) X(cuGraphDestroy)              \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize)    \
    /* the capture graph (graph.c) */                                                             \
    X(cuStreamUpdateCaptureDependencies) X(cuGraphAddEmptyNode) X(cuGraphNodeGetDependencies)     \
    X(cuGraphGetNodes) X(cuGraphNodeGetType)                                                     \
    /* executable graphs (graph.c; tests replay captures, xseg never calls them) */               \
    X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy)                                  \
    /* pinned host memory, async copies and memset (host.c; services) */                \
    X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemsetD8Async) \
    X(cuMemcpyDtoDAsync)                                                                          \
    /* batched async copies, CUDA 12.8+ (host.c; ABI cuMemcpyBatchAsync_v2, CUDA 13.0's form) */   \
    X(cuMemcpyBatchAsync)                                                                         \
    /* dma-buf export of a range (vmm.c; tests probe it, xseg does not call it) */               \
    X(cuMemGetHandleForAddressRange)                                                              \
    /* modules and launches: the allocator's two range kernels, run natively (kernel.c) */        \
    X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel)

#define EMU_STR2(x) #x
#define EMU_ABI_NAME(fn) EMU_STR2(fn)

enum emu_entry {
#define EMU_ENUM(fn) EMU_E_##fn,
    EMU_FOREACH_ENTRY(EMU_ENUM)
#undef EMU_ENUM
    EMU_E_COUNT
};

/* API and ABI names of entry @p e. */
extern const char *const emu_api_names[EMU_E_COUNT];
extern const char *const emu_abi_names[EMU_E_COUNT];
/* Entry by API or ABI name, or -1. */
int emu_entry_lookup(const char *name);
/* CUresult by name ("CUDA_ERROR_OUT_OF_MEMORY"), or by decimal number; -1 if unknown. */
int emu_result_lookup(const char *name);

/* ---- configuration (env.c) ---- */
struct emu_config {
    int devices;
    size_t total_mem;
    size_t granularity;
    bool vmm;
    bool report;
    bool fabric;      /* CUDAEMU_FABRIC=1: emulated CU_MEM_HANDLE_TYPE_FABRIC */
    bool dma_buf;     /* CUDAEMU_DMA_BUF=1: dma-buf export of mapped ranges (cuMemGetHandleForAddressRange) */
    bool rdma;        /* CUDAEMU_RDMA=1: GPUDirect RDMA on VMM memory (the device attribute) */
    bool kernels;     /* CUDAEMU_KERNELS=0: cuModuleLoadData answers NOT_SUPPORTED (kernel.c) */
    int fresh;        /* CUDAEMU_FRESH: what new cuMemCreate memory holds (EMU_FRESH_*) */
    unsigned host_vmm; /* CUDAEMU_HOST_VMM: host locations cuMemCreate takes (EMU_HOST_VMM_* bits) */
    int host_numa_id[EMU_MAX_DEVICES]; /* CUDAEMU_HOST_NUMA_ID: each device's host node (-1: no NUMA) */
    int numa_nodes;   /* host NUMA nodes: one past the largest node named, at least 1 */
    char shared[49];  /* CUDAEMU_SHARED: devices shared among processes under this name (shared.c) */
};
/* New physical memory: the driver promises nothing about it (stale data is possible), so by
 * default it does not read as zero where code might assume it does. */
enum { EMU_FRESH_SPARSE, EMU_FRESH_GARBAGE, EMU_FRESH_ZERO };
/* Host-located VMM memory the device supports: location HOST_NUMA, location HOST (CUDA 12.2+). */
enum { EMU_HOST_VMM_NUMA = 1, EMU_HOST_VMM_HOST = 2 };

/* ---- open-addressed map from nonzero 64-bit keys to pointers (map.c) ---- */
struct emu_map {
    uint64_t *keys;   /* 0 = empty slot */
    void **vals;
    size_t cap, count;
};
void *emu_map_get(const struct emu_map *m, uint64_t key);
/* @return 0, or -1 when out of host memory. */
int emu_map_put(struct emu_map *m, uint64_t key, void *val);
void *emu_map_del(struct emu_map *m, uint64_t key);
void emu_map_free(struct emu_map *m);
/* Iterate: start with *pos = 0; returns the next value or NULL at the end. */
void *emu_map_next(const struct emu_map *m, size_t *pos, uint64_t *key);

/* ---- objects ---- */
struct CUctx_st {
    int ordinal;
};

/* Physical memory: a range of its device's sparse memory file (offset off), or, for handles
 * exported (vmm_phys_promote) and for imports, a sparse memfd of its own (off 0). Lives while any handle
 * object refers to it. */
struct emu_phys {
    int fd;
    bool own_fd;        /* fd is this object's own memfd (closed with it), not the device file */
    off_t off;          /* offset of the memory in fd */
    int dev;            /* its device; -1: host memory (location HOST or HOST_NUMA) */
    size_t size;
    bool counted;       /* counted in the device's used bytes (not for foreign imports, host memory) */
    unsigned handle_types; /* CUmemAllocationHandleType bits requested at create (or imported) */
    CUmemAllocationProp prop; /* what cuMemCreate was given (an import: its device's, as far as known) */
    unsigned handles;   /* live handle objects pointing here (a cuMemAlloc block: 1 while allocated) */
    unsigned pins;      /* copies moving its bytes now (devmem.c): it outlives them */
    bool classic;       /* a cuMemAlloc block's memory, not a handle's (not in emu.nphys) */
    unsigned char *view;       /* the emulator's own mapping of [off, off + size) of fd, or NULL (devmem.c);
                                * a cuMemAlloc block's (fd -1): its anonymous memory */
    unsigned char *stale_view; /* a view of its old file range a copy still used when it moved */
};

/* A CUmemGenericAllocationHandle value. user_refs: cuMemCreate/Import/Retain minus cuMemRelease;
 * map_refs: mappings made through it. It is destroyed when both reach 0. */
struct emu_handle {
    uint64_t id;
    struct emu_phys *phys;
    unsigned user_refs;
    unsigned map_refs;
};

struct emu_mapping {
    uintptr_t base;
    size_t size;
    size_t offset;
    struct emu_handle *handle;
    unsigned char access[EMU_MAX_DEVICES]; /* CUmemAccess_flags per device */
    unsigned char host_access;             /* the CPU's (HOST_NUMA descriptors; host memory only) */
};

struct emu_resv {
    uintptr_t base;
    size_t size;
    struct emu_mapping *maps;   /* sorted by base, non-overlapping */
    size_t nmaps, capmaps;
};

/* A cuMemAlloc block: PROT_NONE address space (never host-accessible, as on a GPU); its bytes
 * are its phys's view, an anonymous mapping (fd -1) where devmem.c moves them. A
 * cuMemAllocManaged block (managed) is host-accessible at its address: its view is that address
 * range itself, so host loads and stores and the emulated operations see the same bytes. */
struct emu_alloc {
    uintptr_t base;
    size_t size;      /* requested */
    size_t mapped;    /* length of the address range and of its phys (host-page multiple) */
    int dev;
    bool managed;     /* cuMemAllocManaged: base == phys->view, unmapped with the view alone */
    struct emu_phys *phys;
};

/* What a memset or memcpy node does when its graph is launched: the captured call's arguments.
 * Device-side operands are access-checked at launch (host-side ones are the caller's). */
struct emu_op {
    enum { EMU_OP_MEMSET = 1, EMU_OP_MEMCPY } kind;
    uintptr_t dst, src;        /* src: memcpy only */
    size_t size;
    unsigned char value;       /* memset only */
    bool dst_dev, src_dev;     /* operand is device memory (HtoD: dst; DtoH: src; DtoD: both) */
};

/* A graph node: its graph, type and the nodes it depends on (fixed at creation). */
struct CUgraphNode_st {
    CUgraph graph;
    CUgraphNodeType type;
    CUgraphNode *deps;
    size_t ndeps;
    struct emu_op op;   /* MEMSET / MEMCPY nodes: what a launch performs (kind 0 otherwise) */
};

struct CUgraph_st {
    struct emu_capseq *capture;  /* the capture still building it, or NULL */
    CUgraphNode *nodes;          /* in creation order */
    size_t nnodes, capnodes;
};

/* An executable graph: its graph's memset/memcpy operations in a topological order, copied at
 * instantiation (the driver's exec does not depend on the graph afterwards). */
struct CUgraphExec_st {
    struct emu_op *ops;
    size_t nops;
};

/* A capture sequence: begun on `origin`; other streams join it by waiting on an event recorded
 * in it. It builds `graph`, which becomes the caller's at cuStreamEndCapture. */
struct emu_capseq {
    uint64_t id;
    CUgraph graph;
    CUstream origin;
    CUstreamCaptureMode mode;
    const void *thread;   /* identity of the thread that began the capture */
    bool invalidated;
};

/* A set of nodes (a stream's capture dependencies, an event's captured ones). */
struct emu_nodeset {
    CUgraphNode *v;
    CUgraphEdgeData *edges;  /* as many zeroed edge records, for cuStreamGetCaptureInfo */
    size_t n, cap;
};

struct CUstream_st {
    unsigned flags;
    bool held;
    uint64_t submitted;   /* sequence number of the last work recorded while held */
    uint64_t completed;   /* work up to this sequence number has finished */
    struct emu_capseq *cap;    /* the capture this stream takes part in, or NULL */
    struct emu_nodeset deps;   /* while capturing: what the next captured node depends on */
    struct emu_pend *pend;     /* device ranges of async work queued while held (pruned as it completes) */
    uint64_t model_ready;      /* modelled time (emu_model_now) its last async copy completes */
    size_t npend, cappend;
    bool defer;                /* its memsets and fill kernels move bytes only when the work completes */
    struct emu_dset *dset;     /* those deferred, in queue order */
    size_t ndset, capdset;
};

/* A deferred byte fill (a memset or a fill kernel's range) of a deferring stream: it runs when
 * the stream's work up to @p seq completes (someone waits for it). */
struct emu_dset {
    uintptr_t addr;
    size_t size;
    unsigned char value;
    uint64_t seq;
};

/* A device range that pending work (sequence number seq) of a held stream still reads or writes. */
struct emu_pend {
    uintptr_t addr;
    size_t size;
    uint64_t seq;
};

struct CUevent_st {
    unsigned flags;
    CUstream stream;      /* stream of the last record, or NULL when complete at record time */
    uint64_t seq;
    uint64_t cap_id;      /* recorded in this capture (0: not in a capture) */
    uint64_t model_ready; /* the recording stream's model_ready at the record */
    struct emu_nodeset deps;  /* the recording stream's dependencies at that point */
};

struct emu_state {
    pthread_mutex_t lock;
    bool initialized;             /* cuInit succeeded */
    struct emu_config cfg;
    size_t used[EMU_MAX_DEVICES];
    unsigned primary_refs[EMU_MAX_DEVICES];
    /* A descriptor a device's primary context holds while retained (device.c): the driver opens
     * files of its own when a context becomes active, so a process's descriptor count is not the
     * allocator's to compare across a first use of the device. -1: none open. */
    int ctx_fd[EMU_MAX_DEVICES];
    struct CUctx_st ctx[EMU_MAX_DEVICES];

    struct emu_map handles;       /* id -> emu_handle */
    uint64_t next_handle;
    size_t nphys;                 /* live emu_phys objects */
    struct emu_resv **resv;       /* sorted by base, all inside the arena */
    /* Address arena (vmm.c): one PROT_NONE range from which every reservation is carved, handed
     * out rising from arena_next like the real driver, so placements repeat from run to run. */
    uintptr_t arena_base;
    size_t arena_size;
    uintptr_t arena_next;
    /* Device memory files (vmm.c): one sparse memfd per device, created on first use; each
     * non-exportable cuMemCreate takes the next dev_off[dev] bytes (never reused: released
     * ranges are punched out, so the file stays sparse). No descriptor per handle. */
    int dev_fd[EMU_MAX_DEVICES];
    bool dev_fd_open[EMU_MAX_DEVICES];
    off_t dev_off[EMU_MAX_DEVICES];
    size_t nresv, capresv;
    size_t mapped_bytes;
    struct emu_map allocs;        /* base -> emu_alloc */
    struct emu_map streams;       /* pointer -> stream */
    struct emu_map events;
    struct emu_map graphs;
    struct emu_map nodes;         /* every live graph node (handle validation) */
    struct emu_map execs;         /* live executable graphs */
    struct emu_map captures;      /* capture id -> live emu_capseq */
    struct CUstream_st null_stream;
    uint64_t capture_seq;
    size_t captures_active;       /* streams taking part in a capture (cap != NULL) */
    bool hold_all;                /* cudaemu_stream_hold_all: new streams start held */
    bool defer_new;               /* cudaemu_stream_defer_new: new non-blocking streams defer their bytes */
    struct emu_dset *ready;       /* deferred fills whose work completed, to run (emu_deferred_run) */
    size_t nready, capready;
};
extern struct emu_state emu;

/* ---- device memory shared among processes (shared.c; CUDAEMU_SHARED) ---- */
/* Free bytes of @p dev: its capacity less this process's and every other live sharer's. */
size_t emu_mem_free_locked(int dev);
/* Count @p bytes more (@p add) or fewer in this process's use of @p dev, and publish it. */
void emu_mem_add_locked(int dev, size_t bytes, bool add);
/* Count @p bytes more in this process's use of @p dev if they fit, as one step among every
 * sharer (a memory allocation's check and add): false, nothing counted, when they do not. */
bool emu_mem_take_locked(int dev, size_t bytes);
/* The UUID of @p dev: a hash of CUDAEMU_SHARED's name and the ordinal. */
void emu_device_uuid(int dev, unsigned char out[16]);

/* ---- entry bookkeeping (control.c) ---- */
/* Count the call, apply its latency, and take an armed failure: returns the injected result or
 * CUDA_SUCCESS. Takes emu.lock briefly. Parses the environment on first use. */
CUresult emu_enter(enum emu_entry e);
/* Env parsing once (env.c); exits the process on a bad CUDAEMU_* variable. */
void emu_env_once(void);
void emu_fail_arm(enum emu_entry e, unsigned long nth, CUresult res);  /* lock held */
void emu_latency_set(enum emu_entry e, uint64_t ns);
/* Per-byte cost of a copy entry (0: none): emu_copy_wait busy-waits until a call that moved
 * @p bytes, started at @p t0 (emu_now_ns), has lasted bytes / bandwidth. */
void emu_bandwidth_set(enum emu_entry e, uint64_t bytes_per_s);
uint64_t emu_now_ns(void);
/* Count @p bytes moved by entry @p e (emu_copy_wait counts its own; CUDAEMU_REPORT prints them). */
void emu_bytes_note(enum emu_entry e, size_t bytes);
/* The timeline model (cudaemu_model_ns): a modelled host clock that each call advances by its
 * latency and each synchronous copy by its bytes at its rate; an async copy occupies its stream
 * and its direction's copy engine from max(stream ready, engine ready, now) for bytes / rate, and
 * a wait (stream, context, event synchronize) moves the clock to the completion it waits for. */
uint64_t emu_model_now(void);
void emu_model_advance_to(uint64_t t);
uint64_t emu_bytes_ns(enum emu_entry e, size_t bytes);
/* A copy by @p e of @p bytes of which @p link touch host-located VMM memory: those run at the
 * link's rate (CUDAEMU_LATENCY link:RATE, cudaemu_set_bandwidth("link")), the rest at e's.
 * emu_copy_ns is its modelled duration; emu_copy_wait counts the bytes (link bytes apart as
 * well) and busy-waits until the call, started at @p t0 (emu_now_ns), has lasted that. */
/* With @p pageable (the host side is not pinned: emu_host_pageable) and a pageable rate set
 * (CUDAEMU_LATENCY pageable:RATE), the whole copy runs at that rate instead. */
void emu_link_set(uint64_t bytes_per_s);
void emu_pageable_set(uint64_t bytes_per_s);
bool emu_pageable_modelled(void); /* is a pageable rate set? */
uint64_t emu_copy_ns(enum emu_entry e, size_t bytes, size_t link, bool pageable);
void emu_copy_wait(enum emu_entry e, size_t bytes, size_t link, bool pageable, uint64_t t0);
/* cuMemcpyBatchAsync's cost per copy in the batch (CUDAEMU_LATENCY batch_copy:DURATION), on top of
 * the entry's per-call latency: emu_batch_charge moves the model clock on by @p copies of it and
 * busy-waits as long (the driver builds one descriptor per copy on the host). */
void emu_batch_copy_set(uint64_t ns);
void emu_batch_charge(size_t copies);
/* Charge entry @p e's per-byte cost for @p bytes (pinning or unpinning host memory: cuMemHostAlloc,
 * cuMemFreeHost, cuMemHostRegister, cuMemHostUnregister, CUDAEMU_LATENCY entry:RATE): the model
 * clock moves on by it and the call busy-waits as long. */
void emu_bytes_charge(enum emu_entry e, size_t bytes);
/* Is [p, p + n) host memory the driver did not pin (outside every cuMemHostAlloc allocation and
 * cuMemHostRegister range)? Only asked while a pageable rate is set (false otherwise). Takes
 * emu.lock (host.c). */
bool emu_host_pageable(const void *p, size_t n);

/* The entry point the calling thread is in (the last emu_enter), for messages. */
extern _Thread_local int emu_entry_now;

/* Entry prologue: count/latency/injection, then the initialized check. */
#define EMU_ENTER(fn)                                                                             \
    do {                                                                                          \
        CUresult emu_r_ = emu_enter(EMU_E_##fn);                                                  \
        if (emu_r_ != CUDA_SUCCESS)                                                               \
            return emu_r_;                                                                        \
        if (!atomic_load_explicit(&emu_initialized, memory_order_acquire))                        \
            return CUDA_ERROR_NOT_INITIALIZED;                                                    \
    } while (0)
extern atomic_bool emu_initialized;

/* ---- shared helpers ---- */
static inline bool emu_is_pow2(size_t x) { return x && !(x & (x - 1)); }
static inline void emu_lock(void) { pthread_mutex_lock(&emu.lock); }
static inline void emu_unlock(void) { pthread_mutex_unlock(&emu.lock); }

/* Current context of this thread (device.c), or NULL. */
CUcontext emu_ctx_current(void);
/* Valid device ordinal? (after init) */
bool emu_dev_valid(int dev);

/* Capture rules (stream.c). The "potentially unsafe" call check: when the calling thread may
 * not make unsafe calls, invalidate the captures that forbid it and return
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. Lock held. */
CUresult emu_capture_unsafe_call_locked(void);
/* A call that may not name a capturing stream (cuMemPrefetchAsync, cuGraphLaunch): when @p s
 * captures, invalidate its capture and return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; else
 * CUDA_SUCCESS. Lock held. */
CUresult emu_capture_refuse_locked(CUstream s);
/* Complete every held stream's pending work (cuCtxSynchronize). Lock held. */
void emu_streams_complete_all_locked(void);
/* Complete @p s's work (its deferred fills become ready to run). Lock held. */
void emu_stream_complete_locked(CUstream s);
/* Queue a deferred fill on deferring stream @p s as its work s->submitted (the held path counted
 * it); false: no memory. Lock held. */
bool emu_stream_defer_set_locked(CUstream s, uintptr_t addr, size_t size, unsigned char value);
/* Run the deferred fills whose work completed, in order. Lock not held. */
void emu_deferred_run(void);
/* Resolve a CUstream argument (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD -> the NULL stream);
 * NULL when it is not a live stream. Lock held. */
CUstream emu_stream_resolve_locked(CUstream s);
/* Remember that pending work @p seq of held stream @p s touches device range [addr, addr + size):
 * false when out of host memory. Lock held. */
bool emu_stream_pend_locked(CUstream s, uintptr_t addr, size_t size, uint64_t seq);
/* Does pending work of any stream still touch [addr, addr + size)? (cuMemUnmap's rule.) Lock held. */
bool emu_streams_pending_touch_locked(uintptr_t addr, size_t size);

/* ---- graphs (graph.c); lock held ---- */
/* A new empty graph, registered in emu.graphs; NULL when out of host memory. */
CUgraph emu_graph_new_locked(void);
/* Free @p g and its nodes (unregistered). */
void emu_graph_free_locked(CUgraph g);
/* Add a node of @p type depending on @p deps (valid nodes of @p g, no duplicates); NULL when out
 * of host memory. */
CUgraphNode emu_graph_add_locked(CUgraph g, CUgraphNodeType type, const CUgraphNode *deps, size_t n);
/* Replace (add = false) or extend (add = true) @p set with @p nodes, without duplicates.
 * @return 0, or -1 when out of host memory (set unchanged). */
int emu_nodeset_update(struct emu_nodeset *set, const CUgraphNode *nodes, size_t n, bool add);
void emu_nodeset_free(struct emu_nodeset *set);
/* A valid node handle (of a live graph), or NULL. */
CUgraphNode emu_node_resolve_locked(CUgraphNode n);
/* Append a node of @p type (with @p op's parameters when not NULL) to the capture of @p s after
 * its dependencies, which become that node. @return CUDA_SUCCESS, or the error to return (the
 * capture invalidated, out of host memory). */
CUresult emu_capture_add_locked(CUstream s, CUgraphNodeType type, const struct emu_op *op);

/* ---- physical memory (vmm.c) ---- */
/* Free @p ph once no handle or allocation refers to it and no copy moves its bytes. Lock held. */
void emu_phys_maybe_free_locked(struct emu_phys *ph);
/* Unmap @p ph's views (devmem.c): a stale one no copy uses any more, and with @p all the current
 * one too (its memory goes). Lock held. */
void emu_phys_views_drop_locked(struct emu_phys *ph, bool all);
/* @p ph's fd or offset changed (vmm_phys_promote): its view goes (kept as stale while pinned) and
 * is mapped again at the next copy. Lock held. */
void emu_phys_moved_locked(struct emu_phys *ph);
/* A new range of @p size bytes of device @p dev's sparse memory file: its descriptor (the
 * device's, never closed), *off its offset; -1 when out of memory. Lock held. */
int emu_dev_file_take_locked(int dev, size_t size, off_t *off);
/* What lies at @p addr: 1, *m its VMM mapping; 0, a reservation's unmapped VA; -1, no
 * reservation. Lock held. */
int emu_vmm_lookup_locked(uintptr_t addr, const struct emu_mapping **m);

/* Bytes of [addr, addr + size) mapped to host-located VMM memory (location HOST or HOST_NUMA):
 * what a copy moves over the host link, not within the device. Takes emu.lock. */
size_t emu_vmm_link_bytes(uintptr_t addr, size_t size);

/* Is [addr, addr + 1) in pinned (cuMemHostAlloc) or registered (cuMemHostRegister) host memory?
 * *avail: its bytes from addr to the end of that range (host.c). Lock held. */
bool emu_host_range_locked(uintptr_t addr, size_t *avail);

/* ---- device memory's bytes (devmem.c) ----
 * Device memory is never host-accessible at its device address; every emulated operation moves
 * its bytes through these, which translate device addresses to the emulator's own views of the
 * memory files. */
/* cuMemAlloc blocks by address: index one (0, or -1 out of host memory), drop one, find the one
 * whose pages hold @p addr (NULL: none). Lock held. */
int emu_alloc_index_add_locked(struct emu_alloc *a);
void emu_alloc_index_del_locked(struct emu_alloc *a);
struct emu_alloc *emu_alloc_at_locked(uintptr_t addr);
/* May device @p dev touch every byte of [addr, addr + size) as @p need asks
 * (CU_MEM_ACCESS_FLAGS_PROT_READ or _READWRITE)? Each byte must be in a VMM mapping that grants
 * it (else CUDA_ERROR_ILLEGAL_ADDRESS, as for a reservation's unmapped VA), a cuMemAlloc block, or
 * pinned or registered host memory (UVA); anything else is no device memory:
 * CUDA_ERROR_INVALID_VALUE. @p kernel: a kernel's operand, where only VMM memory and cuMemAlloc
 * blocks of @p dev count and the rest is CUDA_ERROR_ILLEGAL_ADDRESS. emu_dev_check takes the lock. */
CUresult emu_dev_check_locked(uintptr_t addr, size_t size, int dev, unsigned need, bool kernel);
CUresult emu_dev_check(uintptr_t addr, size_t size, int dev, unsigned need);
/* Move bytes (the caller checked the operands; no lock held): host to device, device to host,
 * memset (zeros punch the memory out), device to device (only the source's data extents move,
 * the destination is punched over its holes). The host side of a copy is touched as a staging
 * copy would (a bad host pointer faults). CUDA_ERROR_ILLEGAL_ADDRESS when a range stopped being
 * device memory meanwhile (a concurrent unmap); CUDA_ERROR_OUT_OF_MEMORY when a view cannot be
 * mapped (vm.max_map_count). */
CUresult emu_dev_write(uintptr_t dst, const void *src, size_t n);
CUresult emu_dev_read(void *dst, uintptr_t src, size_t n);
CUresult emu_dev_set(uintptr_t dst, unsigned char v, size_t n);
CUresult emu_dev_copy(uintptr_t dst, uintptr_t src, size_t n);
/* *first: the offset of the first byte of [addr, addr + n) that is not @p v, or n (the check
 * kernel's compare). */
CUresult emu_dev_first_diff(uintptr_t addr, size_t n, unsigned char v, size_t *first);

/* Modules loaded and not unloaded (kernel.c). Lock held. */
size_t emu_modules_locked(void);

/* Free all state at exit (teardown.c); registered by cuInit. */
void emu_report_print(void);

#endif
