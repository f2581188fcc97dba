/*
 * xseg — a CUDA caching allocator over expandable (virtual-memory) segments.
 *
 * The public header (with xseg_torch.h, PyTorch's entry points, which it includes). It compiles on
 * its own, as C99 or later and as C++, without the CUDA headers: streams are taken as
 * `struct CUstream_st *`, which is the same type as the driver's CUstream and the runtime's
 * cudaStream_t. A NULL stream is the legacy default stream.
 *
 * Every function that can fail returns an ::xseg_status and writes its results through
 * out-parameters. On failure, xseg_last_error() returns a message (thread-local) that names what
 * was wrong. The allocator stays usable after every error.
 */
#ifndef XSEG_H
#define XSEG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(XSEG_BUILDING_DLL) && (defined(__GNUC__) || defined(__clang__))
#define XSEG_API __attribute__((visibility("default")))
#else
#define XSEG_API
#endif

/** API version: bumped major on incompatible change. Also the shared library's soversion. */
#define XSEG_API_VERSION_MAJOR 0
#define XSEG_API_VERSION_MINOR 2
#define XSEG_API_VERSION_PATCH 0

struct CUstream_st;
struct CUgraph_st;

/** Result of every fallible call. */
typedef enum xseg_status {
    XSEG_SUCCESS = 0,
    XSEG_ERROR_INVALID_VALUE = 1,  /**< a bad argument: pointer, size, config string, key */
    XSEG_ERROR_OUT_OF_MEMORY = 2,  /**< the device (or the memory fraction) cannot hold it */
    XSEG_ERROR_DRIVER = 3,         /**< the CUDA driver failed, or could not be loaded ($XSEG_LIBCUDA, else
                                        libcuda.so.1: the message says which) */
    XSEG_ERROR_INVALID_DEVICE = 4, /**< a device index out of range */
    XSEG_ERROR_ILLEGAL_STATE = 5,  /**< not allowed now (stream capture; a child forked after CUDA init) */
    XSEG_ERROR_NOT_SUPPORTED = 6,  /**< the device or driver lacks a needed feature */
} xseg_status;

/** Thread-local text of the last failure on this thread ("" if none). Never NULL. */
XSEG_API const char *xseg_last_error(void);

/** Name of a status ("XSEG_ERROR_OUT_OF_MEMORY"). Never NULL. */
XSEG_API const char *xseg_status_name(xseg_status status);

/** Library version as "MAJOR.MINOR.PATCH". */
XSEG_API const char *xseg_version(void);

/** API version as 0x00MMmmpp. */
XSEG_API unsigned xseg_version_api(void);

/* ---------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------- */

/**
 * Initialize xseg: load the CUDA driver (`$XSEG_LIBCUDA`, else libcuda.so.1) and apply a
 * configuration string in PyTorch's grammar, e.g. "expandable_segments:True,max_split_size_mb:128".
 * @param config the string, or NULL to read XSEG_ALLOC_CONF, then PYTORCH_CUDA_ALLOC_CONF, then
 *               PYTORCH_ALLOC_CONF (the first that is set).
 * Calling it again after a successful init re-applies the configuration. Other calls initialize
 * lazily with NULL.
 * @return XSEG_SUCCESS; XSEG_ERROR_INVALID_VALUE for a bad config (message names the key);
 *         XSEG_ERROR_DRIVER when the driver cannot be loaded or initialized (it is $XSEG_LIBCUDA
 *         when set, else libcuda.so.1; cudaemu's libcudaemu.so runs without a GPU).
 */
XSEG_API xseg_status xseg_init(const char *config);

/**
 * Re-parse a configuration string at run time (like torch.cuda.memory._set_allocator_settings).
 * Keys not named keep their value, except max_split_size_mb, roundup_power2_divisions and
 * garbage_collection_threshold, which reset to their defaults on every parse (as PyTorch does).
 * Changing expandable_segments affects new segments only.
 */
XSEG_API xseg_status xseg_set_config(const char *config);

/**
 * Write the configuration now in force as a config string (every key, canonical spelling).
 * @param buf  where to write (NUL-terminated, truncated to size).
 * @param size bytes available in buf.
 * @param len  if non-NULL, receives the full length (without NUL).
 */
XSEG_API xseg_status xseg_get_config(char *buf, size_t size, size_t *len);

/**
 * Check a configuration string without applying it: parse it as xseg_init would, over the
 * defaults, and write the configuration it would give as a canonical config string. Loads no
 * driver and changes nothing in force.
 * @param config    the string (PyTorch's grammar, as for xseg_init).
 * @param canonical where to write every key in canonical spelling (NUL-terminated, truncated to
 *                  size), or NULL with size 0.
 * @param size      bytes available in canonical.
 * @param len       if non-NULL, receives the canonical string's full length (without NUL).
 * @return XSEG_SUCCESS; XSEG_ERROR_INVALID_VALUE when config is NULL or refused (the message
 *         names the key, as xseg_init's does), or canonical is NULL with a nonzero size.
 */
XSEG_API xseg_status xseg_check_config(const char *config, char *canonical, size_t size, size_t *len);

/** Number of CUDA devices the driver reports. */
XSEG_API xseg_status xseg_device_count(int *count);

/**
 * Give everything back: the process's xseg state returns to where it was before the first call,
 * for leak checkers, a library about to be unloaded, a Python reload or per-test isolation.
 * Every live block on every device is freed (every pointer xseg returned becomes invalid, as
 * after xseg_free: the program must not use them, free them or pass them to xseg again),
 * private pools are ended and released (a CUDA graph captured into one must not be launched
 * again), IPC imports closed (exported blocks are freed like the
 * rest), and every segment, physical page, reservation and pooled event goes back to the driver
 * once the work recorded on the blocks' streams is complete (it waits for that); history is
 * cleared and stops, segment observers, OOM observers and free-memory callbacks are detached,
 * the OOM snapshot path is forgotten, statistics start again, the configuration is back to its
 * defaults, and the idle-reclaim thread is joined. Memory groups are left (each device joins
 * again at its next use). The pinned host cache's thread is joined and its free segments go back;
 * a live xseg_host_malloc block is not freed (it stays the program's), and the cache keeps its
 * books until it is freed and the cache emptied. The next xseg call initializes again, as the
 * first did (reading the environment's configuration; xseg_init may give another). Every host
 * allocation of xseg is freed too (another thread's history stack cache goes when that thread
 * exits); the driver stays loaded, and each device's state keeps its (emptied, non-resident)
 * address range for its next use. No other thread may call xseg while it runs.
 * @return XSEG_SUCCESS; XSEG_ERROR_ILLEGAL_STATE when a capture is under way on a device (end it
 *         first) or a pool sleeps (xseg_wake it first): nothing changes then, and in a process
 *         forked from one that had initialised CUDA; XSEG_ERROR_DRIVER when the driver refuses to
 *         take memory back: what was given back stays given back, and a later xseg_shutdown
 *         tries the rest.
 */
XSEG_API xseg_status xseg_shutdown(void);

/* ---------------------------------------------------------------------------------------------
 * Allocation
 * ------------------------------------------------------------------------------------------- */

/**
 * Allocate device memory on @p device for use on @p stream.
 * A block is reused only by allocations on the stream it was allocated on.
 * Streams: @p stream must stay alive (not cuStreamDestroy'ed) while the block is allocated; once
 * the block is freed the program may destroy it at once: xseg makes no driver call with it after
 * the free (memory cached for it is given back after waiting for the whole context; a call with a
 * destroyed stream is undefined on the driver, which crashes). The exception: with
 * release_threshold_mb or idle_release_ms set, a cached run's stream is queried until the run
 * goes back (docs/services.md), so keep it alive or call xseg_empty_cache before destroying it.
 * @param ptr    receives the device address (NULL for size 0).
 * @param size   bytes; 0 gives *ptr = NULL and XSEG_SUCCESS.
 * @param device device index, 0 .. count-1.
 * @param stream the stream the memory will be used on (NULL: the legacy default stream).
 * @return XSEG_ERROR_OUT_OF_MEMORY after the recovery path (free-memory callbacks, cache release,
 *         retry) fails; the message gives requested size, capacity, free, allocated, reserved.
 *         With expandable_segments_defrag:True (off by default), the recovery path's last step
 *         re-backs partly used pages with 2 MiB chunks to give their free part back: the live
 *         bytes of those pages are copied (their addresses do not change) after a context
 *         synchronize, so no other thread or stream may touch this device's xseg memory while
 *         an allocation that would otherwise fail is served; a write made meanwhile is lost
 *         (docs/configuration.md).
 */
XSEG_API xseg_status xseg_malloc(void **ptr, size_t size, int device, struct CUstream_st *stream);

/**
 * Return memory from xseg_malloc to the cache. NULL is a no-op.
 * @return XSEG_ERROR_INVALID_VALUE (pointer in the message) for a pointer xseg did not return or
 *         freed already; nothing changes then. Otherwise the pointer is freed: a driver failure
 *         while recording the work of streams given to xseg_record_stream only keeps the memory
 *         pending (retried at the next xseg_malloc or xseg_empty_cache, never reused early).
 */
XSEG_API xseg_status xseg_free(void *ptr);

/**
 * Mark @p ptr as used on @p stream: when it is freed, its memory is reused only after the work
 * queued on @p stream up to the free has completed. Recording the allocation's own stream is a
 * no-op. @p stream must stay alive until the block is freed (and, for a block freed during a
 * capture, until that capture ends: its event is recorded then); after that xseg waits on its
 * own events, never the stream.
 * @return XSEG_ERROR_INVALID_VALUE for a pointer that is not a live allocation, or a @p stream
 *         the driver says is not one of this device's streams; nothing is recorded then (a
 *         destroyed stream is undefined on the driver: the program's error).
 */
XSEG_API xseg_status xseg_record_stream(void *ptr, struct CUstream_st *stream);

/**
 * The segment that holds the live block at @p ptr, as PyTorch's getBaseAllocation reports it: the
 * start of the cuMemAlloc range and its size, for sharing through cuIpcGetMemHandle (which names
 * a whole allocation; the block is at @p ptr - *base in it).
 * @param ptr  a live allocation (what xseg_malloc returned).
 * @param base receives the segment's start.
 * @param size if non-NULL, receives the segment's size in bytes.
 * @return XSEG_ERROR_INVALID_VALUE for a pointer that is not a live allocation;
 *         XSEG_ERROR_NOT_SUPPORTED for a block of an expandable segment (its chunks are separate
 *         VMM allocations that cuIpcGetMemHandle cannot share: use xseg_ipc_export).
 */
XSEG_API xseg_status xseg_base_allocation(void *ptr, void **base, size_t *size);

/**
 * Spill (config key spill_to_host:True, docs/configuration.md, docs/services.md): out of memory,
 * after the cache was released, pages of live blocks the program declared cold move to host
 * memory at the same addresses (slower to reach, still valid for kernels and captured graphs),
 * and come back when device memory frees (xseg_empty_cache, xseg_trim, xseg_promote, the idle
 * thread) or when the declaration ends.
 *
 * The contract. The program promises: from xseg_spill_hint(ptr, XSEG_SPILL_COLD) until
 * xseg_spill_hint(ptr, XSEG_SPILL_NONE) returns, nothing touches the block: no kernel, copy or graph
 * launch that reads or writes it is queued on any stream, by any thread or device (work queued on
 * the device's primary context before the declaration may still run; a peer's or another
 * context's must have finished). xseg guarantees: only declared blocks move, and never a
 * byte is lost: before the first move of a block declared since the last time, it synchronizes
 * the device's context (every stream, the program's side streams and destroyed ones included), and
 * copies on a stream of its own; a block not declared is never moved, except by its own
 * XSEG_SPILL_NONE. Host memory is on the device's own NUMA node (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID),
 * else location HOST, else HOST_NUMA node 0 (stats spill_numa_node, spill_numa_fallback). Only
 * pages whose every byte belongs to one live block move; pages exported over IPC or handed out by
 * xseg_block_handles (until the block's free or the last release), registered
 * (xseg_register_range), or any while a segment observer is attached, a capture is underway or
 * debug_stale_access is on, never do.
 */
/** Hints for xseg_spill_hint. */
enum xseg_spill_hint_kind {
    XSEG_SPILL_NONE = 0, /**< not declared (the default): the block never moves */
    XSEG_SPILL_COLD = 1, /**< declared cold: untouched until XSEG_SPILL_NONE; spill may move it */
};
/** Where a block's bytes are (xseg_block_location). */
enum xseg_block_location_kind {
    XSEG_LOCATION_DEVICE = 0, /**< every byte in device memory */
    XSEG_LOCATION_HOST = 1,   /**< every byte spilled to host memory */
    XSEG_LOCATION_MIXED = 2,  /**< some pages on host memory (a block's edge pages shared with
                                   another block stay on the device) */
};
/**
 * Declare the live block at @p ptr (what xseg_malloc returned) cold, or end the declaration.
 * XSEG_SPILL_COLD: from now on nothing touches the block (the contract above) until
 * XSEG_SPILL_NONE returns; spill may move its pages to host memory. Declaring a declared block
 * again changes nothing.
 * XSEG_SPILL_NONE: the block's pages come back to device memory before it returns (waiting for the
 * device's work queued before it, giving the cache back and spilling other declared blocks where
 * the device has no room); then the program may use the block again. Pages that find no room stay
 * on host memory, valid at their address (xseg_block_location tells; a later XSEG_SPILL_NONE
 * tries again). No effect on a block that was never declared and holds no host page.
 * @param ptr  the block's address.
 * @param hint XSEG_SPILL_COLD or XSEG_SPILL_NONE.
 * @return XSEG_ERROR_INVALID_VALUE for a pointer that is not a live allocation or a bad hint; a
 *         driver error while bringing pages back (that page rolled back, the declaration ended).
 */
XSEG_API xseg_status xseg_spill_hint(void *ptr, int hint);
/**
 * Move spilled pages of declared blocks of @p device (-1: every initialized device) back to device
 * memory, newest first, as far as the device and the memory fraction allow. While pages are
 * spilled it first gives the cache back (as xseg_empty_cache) to make room. Waits for the device's
 * work where a block was declared after the last such wait. Pages of blocks whose declaration
 * ended stay (their own xseg_spill_hint(ptr, XSEG_SPILL_NONE) brings them back).
 * @return XSEG_SUCCESS when no declared block is left on host memory; XSEG_ERROR_OUT_OF_MEMORY (the
 *         message names the bytes that stay), XSEG_ERROR_ILLEGAL_STATE (a registered range stays)
 *         or the driver's error (that page rolled back) otherwise.
 */
XSEG_API xseg_status xseg_promote(int device);
/**
 * Where the live block at @p ptr is.
 * @param ptr        the block's address (what xseg_malloc returned).
 * @param location   receives an xseg_block_location_kind.
 * @param host_bytes if non-NULL, receives the bytes of the block on host memory.
 * @param numa_node  if non-NULL, receives the NUMA node of those bytes (location HOST_NUMA); -1
 *                   when none is on host memory, or for location HOST (the driver places them).
 */
XSEG_API xseg_status xseg_block_location(void *ptr, int *location, size_t *host_bytes, int *numa_node);

/**
 * Release cached memory to the driver: every unused segment (classic mode), and every page that
 * holds no live byte (expandable mode), even inside segments still in use.
 * Waits for pending cross-stream frees first. Releases nothing while a stream capture is underway.
 * Pages of declared blocks spilled to host memory (spill_to_host) then move back where device
 * memory allows.
 * @param device a device index, or -1 for every initialized device.
 */
XSEG_API xseg_status xseg_empty_cache(int device);

/**
 * Cap what xseg may reserve on @p device at @p fraction of its total memory.
 * @param fraction in [0, 1]; 1 removes the cap.
 * @param device   a device index.
 */
XSEG_API xseg_status xseg_set_memory_fraction(double fraction, int device);

/**
 * The memory fraction in force on @p device (torch.cuda.get_per_process_memory_fraction): the
 * last xseg_set_memory_fraction, else the per_process_memory_fraction config key (1.0: no limit).
 * @param device the device index
 * @param fraction receives the fraction, in [0, 1]
 * @return XSEG_ERROR_INVALID_VALUE for a bad device or a NULL @p fraction.
 */
XSEG_API xseg_status xseg_get_memory_fraction(int device, double *fraction);

/**
 * Enable access to @p device's memory from @p peer: every page mapped now and every page mapped
 * later, in one cuMemSetAccess per contiguous run (expandable segments; new runs get one call for
 * the owner and all peers). Classic cuMemAlloc segments are not covered (they need
 * cuCtxEnablePeerAccess in the peer's context). Enabling twice is a no-op; @p peer == @p device too.
 * @return XSEG_ERROR_NOT_SUPPORTED when the driver says @p peer cannot access @p device.
 */
XSEG_API xseg_status xseg_enable_peer_access(int device, int peer);

/* ---------------------------------------------------------------------------------------------
 * Statistics (the keys and meaning of torch.cuda.memory_stats())
 * ------------------------------------------------------------------------------------------- */

/** One statistic: its value now, its peak, and the sums of increases and decreases. */
typedef struct xseg_stat_counter {
    int64_t current;
    int64_t peak;
    int64_t allocated;
    int64_t freed;
} xseg_stat_counter;

/** Index into the per-pool arrays of ::xseg_device_stats. */
enum xseg_stat_pool { XSEG_STAT_ALL = 0, XSEG_STAT_SMALL_POOL = 1, XSEG_STAT_LARGE_POOL = 2 };
#define XSEG_STAT_POOLS 3

/** Every statistic of one device, as torch.cuda.memory_stats() reports them. */
typedef struct xseg_device_stats {
    xseg_stat_counter allocation[XSEG_STAT_POOLS];           /**< allocation.{all,small_pool,large_pool} */
    xseg_stat_counter segment[XSEG_STAT_POOLS];              /**< segment.* (classic segments) */
    xseg_stat_counter active[XSEG_STAT_POOLS];               /**< active.* */
    xseg_stat_counter inactive_split[XSEG_STAT_POOLS];       /**< inactive_split.* */
    xseg_stat_counter allocated_bytes[XSEG_STAT_POOLS];      /**< allocated_bytes.* */
    xseg_stat_counter reserved_bytes[XSEG_STAT_POOLS];       /**< reserved_bytes.* (mapped bytes) */
    xseg_stat_counter active_bytes[XSEG_STAT_POOLS];         /**< active_bytes.* */
    xseg_stat_counter inactive_split_bytes[XSEG_STAT_POOLS]; /**< inactive_split_bytes.* */
    xseg_stat_counter requested_bytes[XSEG_STAT_POOLS];      /**< requested_bytes.* */
    xseg_stat_counter oversize_allocations;                  /**< oversize_allocations.* */
    xseg_stat_counter oversize_segments;                     /**< oversize_segments.* */
    int64_t num_alloc_retries;
    int64_t num_ooms;
    int64_t num_sync_all_streams;
    int64_t num_device_alloc; /**< cuMemAlloc calls, and page maps in expandable mode */
    int64_t num_device_free;  /**< cuMemFree calls, and page unmaps in expandable mode */
    int64_t max_split_size;   /**< bytes; SIZE_MAX-like (INT64_MAX) when unlimited */
    /** spilled_bytes.all.*: bytes of live blocks' pages moved to host memory (spill_to_host:True);
     *  not in reserved_bytes while there. xseg only (not a PyTorch key). */
    xseg_stat_counter spilled_bytes;
    int64_t num_spills;     /**< chunks (pages) moved to host memory by spill (xseg only) */
    int64_t num_promotions; /**< chunks moved back to device memory (xseg only) */
    int64_t spill_copied_bytes; /**< bytes spill and promotion copied over the link, both ways (xseg only) */
    /** NUMA node of the host memory spill uses on this device (location HOST_NUMA); -1 for location
     *  HOST or before the first spill (xseg only). */
    int64_t spill_numa_node;
    /** How that place was chosen: 0 the device's own node (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID), 1
     *  location HOST (the device names no node), 2 HOST_NUMA node 0 (neither); -1 before the first
     *  spill (xseg only). */
    int64_t spill_numa_fallback;
} xseg_device_stats;

/** Copy every statistic of @p device. */
XSEG_API xseg_status xseg_get_stats(int device, xseg_device_stats *stats);

/**
 * One statistic by its PyTorch key: "reserved_bytes.all.current",
 * "inactive_split_bytes.large_pool.peak", "num_alloc_retries", ...
 * @return XSEG_ERROR_INVALID_VALUE for an unknown key (named in the message).
 */
XSEG_API xseg_status xseg_stat(int device, const char *key, int64_t *value);

/**
 * Enumerate the keys xseg_stat accepts, in a stable order.
 * @param index 0, 1, ...
 * @param key   receives the index-th key (a static string), or NULL past the last one.
 */
XSEG_API xseg_status xseg_stat_key(size_t index, const char **key);

/** Reset every .peak to .current, for @p device (-1: all). */
XSEG_API xseg_status xseg_reset_peak_stats(int device);

/**
 * Reset the accumulated statistics of @p device (-1: all): every counter's .allocated and .freed,
 * and num_alloc_retries, num_ooms, num_sync_all_streams, num_device_alloc and num_device_free
 * start again from 0 (torch.cuda.reset_accumulated_memory_stats). Current values and peaks stay.
 */
XSEG_API xseg_status xseg_reset_accumulated_stats(int device);

/**
 * The largest cached block of @p device: a free mapped block of any pool, private pools included
 * (PyTorch's cacheInfo, which cuDNN's benchmark mode uses to size its workspace).
 * @param device the device index.
 * @param largest_block in/out: raised to the largest cached block's size when that is larger.
 *        A 0 on entry is first replaced by the driver's free memory on the device
 *        (cuMemGetInfo), as PyTorch does: memory a new segment could still take.
 */
XSEG_API xseg_status xseg_cache_info(int device, size_t *largest_block);

/**
 * The driver's free and total memory of @p device (cuMemGetInfo in its primary context), as
 * torch.cuda.mem_get_info() gives them: free counts what xseg (and anything else) holds as used.
 * @param device the device index.
 * @param free_bytes out: the bytes the driver could still hand out.
 * @param total_bytes out: the device's memory.
 * @return XSEG_ERROR_INVALID_DEVICE, XSEG_ERROR_DRIVER (the driver's message).
 */
XSEG_API xseg_status xseg_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes);

/**
 * A readable table of the device's statistics, like torch.cuda.memory_summary().
 * snprintf semantics: writes at most @p size bytes including the NUL; @p len (if non-NULL)
 * receives the full length without the NUL.
 */
XSEG_API xseg_status xseg_memory_summary(int device, char *buf, size_t size, size_t *len);

/* ---------------------------------------------------------------------------------------------
 * Snapshots: segments and blocks, as torch.cuda.memory_snapshot() describes them
 * ------------------------------------------------------------------------------------------- */

typedef enum xseg_block_state {
    XSEG_BLOCK_INACTIVE = 0,            /**< cached, free */
    XSEG_BLOCK_ACTIVE_ALLOCATED = 1,    /**< handed out */
    XSEG_BLOCK_ACTIVE_PENDING_FREE = 2, /**< freed, waiting for events on other streams */
} xseg_block_state;

typedef struct xseg_block_info {
    uint64_t address;
    size_t size;
    size_t requested_size; /**< 0 unless allocated or pending free */
    xseg_block_state state;
    size_t host_bytes;     /**< bytes of the block spilled to host memory (spill_to_host); snapshots
                                write it as "host_bytes" when not 0 */
    int host_numa_node;    /**< NUMA node of those bytes (-1: none, or location HOST); snapshots
                                write it as "host_numa_node" with host_bytes */
} xseg_block_info;

typedef struct xseg_segment_info {
    int device;
    uint64_t address;
    size_t total_size;
    size_t allocated_size;
    size_t active_size;
    size_t requested_size;
    struct CUstream_st *stream;
    int is_large;      /**< large pool (1) or small pool (0) */
    int is_expandable; /**< one entry per contiguous mapped range of an expandable segment */
    uint64_t pool_id[2]; /**< {0,0}: the default pool */
    size_t nblocks;
    xseg_block_info *blocks;
} xseg_segment_info;

typedef struct xseg_snapshot {
    size_t nsegments;
    xseg_segment_info *segments;
} xseg_snapshot;

/** Take a consistent snapshot of @p device (-1: all devices). Free with xseg_snapshot_free(). */
XSEG_API xseg_status xseg_take_snapshot(int device, xseg_snapshot **snapshot);
XSEG_API void xseg_snapshot_free(xseg_snapshot *snapshot);

/* ---------------------------------------------------------------------------------------------
 * Allocation history and snapshots in PyTorch's format
 *
 * With history on, xseg records what it does as events with PyTorch's action names (alloc,
 * free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap,
 * snapshot, oom) in a bounded ring, and each live block remembers the stack of its allocation.
 * xseg_dump_snapshot writes both, with the allocator's segments and blocks, as the pickle that
 * torch.cuda.memory._dump_snapshot writes: drop it on https://pytorch.org/memory_viz or read it
 * with torch/cuda/_memory_viz.py. Off by default; off, it costs the malloc/free path nothing.
 * ------------------------------------------------------------------------------------------- */

/** What history records (PyTorch's `enabled`: "state" or "all"). */
typedef enum xseg_history_record {
    XSEG_HISTORY_ALL = 0,   /**< events and block state (the default) */
    XSEG_HISTORY_STATE = 1, /**< block state only: live blocks remember their allocation's stack */
    XSEG_HISTORY_TRACE = 2, /**< trace events only (the snapshot's device_traces) */
} xseg_history_record;

/** Which stacks events and blocks carry: bit flags (PyTorch's `stacks`: "python" / "all"). */
enum xseg_history_stacks {
    XSEG_STACKS_NONE = 0,     /**< no frames */
    XSEG_STACKS_C = 1,        /**< the C call stack (return addresses, symbolized at dump time) */
    XSEG_STACKS_CALLBACK = 2, /**< frames from xseg_history_options.callback (e.g. Python's) */
};

/** One frame, as the snapshot shows it: {'filename', 'name', 'line'}. */
typedef struct xseg_frame {
    const char *filename; /**< file of the code (NULL: "") */
    const char *name;     /**< function (NULL: "") */
    int line;             /**< line number (0: unknown) */
} xseg_frame;

/**
 * Supplies frames for an allocation (XSEG_STACKS_CALLBACK): fill @p frames[0 .. max_frames-1],
 * innermost first, and return how many were filled (0 .. max_frames; anything else counts as 0).
 * Called in the thread that calls xseg_malloc, before the allocation, with no xseg lock held. An
 * xseg_malloc the callback makes itself is served without callback frames (the callback is not
 * entered again on that thread). xseg copies the strings before it returns (identical
 * frames and stacks are stored once), so they need to stay valid only during the call.
 * With XSEG_STACKS_C as well, the C frames come first (they are inner to the caller's frames).
 * A Python binding walks the interpreter's frames here (code filename, function name, line).
 */
typedef int (*xseg_stack_callback)(xseg_frame *frames, int max_frames, void *user);

/** Options of xseg_record_memory_history (zero-initialize, then set what you need). */
typedef struct xseg_history_options {
    int enabled;                  /**< 0 stops recording (events and stacks recorded so far stay) */
    xseg_history_record record;   /**< what to record (default: everything) */
    int stacks;                   /**< xseg_history_stacks bits (0: none) */
    size_t max_entries;           /**< ring capacity in events (0: 100000); the oldest are dropped */
    int max_frames;               /**< frames per stack (0: 16; at most 256) */
    xseg_stack_callback callback; /**< required with XSEG_STACKS_CALLBACK */
    void *user;                   /**< passed to callback */
    int clear;                    /**< nonzero: drop the events recorded so far first */
} xseg_history_options;

/**
 * Start, change or stop recording allocation history (process-wide, every device), like
 * torch.cuda.memory._record_memory_history. Blocks live when recording starts get their frees
 * recorded (without an allocation stack). Changing max_entries keeps the newest events that fit.
 * @param opts the options, or NULL to stop.
 * @return XSEG_ERROR_INVALID_VALUE for a bad option (named in the message); nothing changes then.
 */
XSEG_API xseg_status xseg_record_memory_history(const xseg_history_options *opts);

/**
 * Whether history is being recorded (torch._C._cuda_isHistoryEnabled).
 * @param enabled receives 1 while xseg_record_memory_history has recording on, else 0
 * @return XSEG_ERROR_INVALID_VALUE for a NULL @p enabled.
 */
XSEG_API xseg_status xseg_history_enabled(int *enabled);

/**
 * Write a snapshot of @p device (-1: every device) to @p path as a pickle (protocol 2, only
 * dicts, lists, strings, numbers, booleans and tuples: torch.cuda.memory._dump_snapshot's
 * format): `segments` (each with its blocks, their state, requested size and allocation frames),
 * `device_traces` (the history's events, one list per device), `allocator_settings`. An expandable
 * segment appears as one segment per contiguous mapped range, as PyTorch shows them. The file is
 * written to a new temporary file beside @p path (O_EXCL | O_NOFOLLOW, a random name, mode 0666
 * less the umask) and renamed, so readers never see half a file and no symlink planted at either
 * name is written through; on failure the temporary file is removed. Records a `snapshot` event
 * when history is on. xseg_dump_snapshot_json, xseg_dump_trace and the OOM snapshot write the same
 * way.
 * @return XSEG_ERROR_INVALID_VALUE for a NULL path, or naming the path and the system's reason
 *         when it cannot be written; XSEG_ERROR_OUT_OF_MEMORY when host memory runs out.
 */
XSEG_API xseg_status xseg_dump_snapshot(int device, const char *path);

/** xseg_dump_snapshot as JSON (the same keys and values; tuples become arrays). */
XSEG_API xseg_status xseg_dump_snapshot_json(int device, const char *path);

/**
 * Write a snapshot to @p path when an out-of-memory error surfaces to a caller (after the
 * recovery path and the OOM observers), at most once every 10 seconds; the OOM message then names
 * the file. @p path NULL turns it off; without a call, the environment variable XSEG_OOM_SNAPSHOT
 * names the path. Record history first to see how memory got there.
 */
XSEG_API xseg_status xseg_set_oom_snapshot(const char *path);

/**
 * Write the recorded events of @p device (-1: all, each device's own streams) as an xseg-replay
 * trace (tools/replay: alloc/free lines with declared streams), so a live program's allocations
 * can be replayed under other settings. Allocations whose alloc event the ring dropped are seeded
 * at the start; blocks still live are left allocated.
 * @return XSEG_ERROR_ILLEGAL_STATE when history has never recorded trace events;
 *         XSEG_ERROR_OUT_OF_MEMORY when host memory runs out (then nothing is written).
 */
XSEG_API xseg_status xseg_dump_trace(int device, const char *path);

/* ---------------------------------------------------------------------------------------------
 * Callbacks
 * ------------------------------------------------------------------------------------------- */

/**
 * Called on OOM, after recovery failed and before the error returns, with the device, the
 * requested size (rounded), the device total (or the fraction limit) and the driver's free bytes.
 * Called without xseg's locks held; it may call xseg (e.g. take a snapshot).
 */
typedef void (*xseg_oom_observer)(int device, size_t requested, size_t device_total,
                                  size_t device_free, void *user);
/** Attach an OOM observer (several may be attached; called in order). */
XSEG_API xseg_status xseg_attach_oom_observer(xseg_oom_observer fn, void *user);

/**
 * A stale access found by the debug mode `debug_stale_access:True` (docs/troubleshooting.md):
 * a block was written after its free. While the mode is on, a freed block is quarantined (not
 * reused) until it leaves a FIFO of at most `debug_quarantine_mb` MiB; it is filled with all-ones
 * bytes at its free (stream-ordered after its last use) and checked when it leaves, at
 * xseg_empty_cache, at snapshot time and by xseg_check_stale. Frames are those history recorded
 * (xseg_record_memory_history; none when it was off). Valid during the call only.
 * Pinned host blocks (xseg_host_free) are quarantined too, in a FIFO of their own with the same
 * bound: filled by the host once their recorded streams are done, checked by the host (also at
 * xseg_host_empty_cache); their reports have device -1, pool "host" and no stream.
 */
typedef struct xseg_stale_report {
    int device;                  /**< -1 for a pinned host block */
    uintptr_t addr;              /**< the freed block's address */
    size_t size;                 /**< its bytes (rounded) */
    size_t requested;            /**< the bytes its malloc asked for */
    struct CUstream_st *stream;  /**< the stream it was allocated on */
    const char *pool;            /**< "small" or "large"; "host": a block of xseg_host_malloc */
    int expandable;              /**< 1: an expandable segment's block, 0: a classic one */
    size_t first_offset;         /**< the first byte (from addr) that lost the pattern */
    int64_t freed_us, found_us;  /**< when it was freed and found (microseconds since the epoch) */
    const char *when;            /**< "quarantine exit", "empty_cache", "snapshot" or "xseg_check_stale", "xseg_shutdown";
                                      "xseg_host_empty_cache" (host blocks) */
    const xseg_frame *alloc_frames; /**< the allocation's frames, innermost first */
    int n_alloc_frames;
    const xseg_frame *free_frames;  /**< the free's frames, innermost first */
    int n_free_frames;
    const char *message;         /**< all of it as one text, as printed to stderr */
} xseg_stale_report;
typedef void (*xseg_stale_observer)(const xseg_stale_report *report, void *user);
/** Attach a stale-access observer (several may be attached; called in order, with no xseg lock
 * held). While none is attached, each report is printed to stderr. */
XSEG_API xseg_status xseg_attach_stale_observer(xseg_stale_observer fn, void *user);
/**
 * Check every block quarantined on @p device now (debug_stale_access): each one written since
 * its free is reported (observers, else stderr) once, and stays quarantined. Waits for the
 * blocks' streams. @p found (optional): the findings this call made. With the mode off or
 * nothing quarantined: XSEG_SUCCESS, 0 found.
 * Blocks whose record_stream streams finished enter the quarantine first. The pinned host
 * cache's quarantine (process-wide) is checked too, by host reads, also during a capture; its
 * findings count in @p found.
 * @return XSEG_ERROR_ILLEGAL_STATE while a capture is underway on the device (a check would
 *         synchronize its streams; nothing is checked); XSEG_ERROR_INVALID_DEVICE;
 *         XSEG_ERROR_DRIVER when a compare or read-back fails (that block stays unreported);
 *         XSEG_ERROR_OUT_OF_MEMORY when host memory lacks (the blocks it left unchecked or
 *         unrecorded are checked again at the next check).
 */
XSEG_API xseg_status xseg_check_stale(int device, size_t *found);
/**
 * Fill the blocks quarantined on @p device whose fills wait for their batch now
 * (debug_stale_access, `debug_stale_fill_batch`): a freed block is filled with the pattern only
 * when the device holds that many waiting blocks, or at a check; until then a stale read gets its
 * old bytes and a stale write is overwritten by the fill (missed). Call it before replaying a CUDA
 * graph (xseg.torch does, for every CUDAGraph.replay) so that the replay meets the pattern. The
 * fills run on xseg's own stream (one launch) and the call returns once they are done (a wait of
 * that stream only), so work queued afterwards on any stream meets the pattern. A fill that a
 * full batch starts at a free is ordered before what the program queues afterwards on the
 * freeing stream (an event, no wait). With the mode off or nothing waiting: XSEG_SUCCESS. Blocks whose record_stream streams finished enter first.
 * @return XSEG_ERROR_ILLEGAL_STATE while a capture is underway on the device (a fill would join
 *         the captured graph; its blocks wait until it ends); XSEG_ERROR_INVALID_DEVICE;
 *         XSEG_ERROR_DRIVER when a fill fails (its blocks wait for the next flush).
 */
XSEG_API xseg_status xseg_stale_flush(int device);

/**
 * First step of the OOM recovery path: a chance for the program to free memory it holds
 * (PyTorch's FreeMemoryCallback). Return nonzero if anything was freed; xseg then retries.
 * Called with xseg's device lock released.
 */
typedef int (*xseg_free_memory_callback)(int device, size_t requested, void *user);
XSEG_API xseg_status xseg_attach_free_memory_callback(xseg_free_memory_callback fn, void *user);

/* ---------------------------------------------------------------------------------------------
 * Private memory pools and CUDA-graph capture (PyTorch's graph pools)
 *
 * A CUDA graph replays at the addresses it captured, so the memory used during a capture must
 * stay reserved for the graph. While a pool "records" (xseg_begin_allocate_to_pool until
 * xseg_end_allocate_to_pool), allocations on the streams it matches come from the pool's own
 * small and large free lists and segments (expandable or classic, as configured): they never
 * reuse the default pools' cached blocks, and the default pools never reuse theirs. Several
 * captures may share one pool (begin it again after ending it); graphs that share a pool must be
 * replayed in the order they were captured.
 *
 * While any pool records on a device (a capture is taken to be underway), xseg queries no event,
 * defers the frees of blocks used on other streams (xseg_record_stream) until recording ends,
 * unmaps and frees nothing (xseg_empty_cache releases nothing, the OOM path does not release),
 * and refuses an allocation on a capturing stream that no pool matches.
 *
 * Lifetime: each begin adds a use; xseg_release_pool drops one. A pool with no users keeps its
 * live blocks valid; its cached memory returns to the driver at the next xseg_empty_cache (or
 * OOM recovery), and the pool is forgotten once it holds no memory. Statistics count private
 * pools' blocks with the default pools' (as torch.cuda.memory_stats() does); snapshots name each
 * segment's pool (xseg_segment_info.pool_id).
 * ------------------------------------------------------------------------------------------- */

/**
 * A pool id: two 64-bit words, like PyTorch's MempoolId_t (std::pair<unsigned long long,
 * unsigned long long>, the same layout and calling convention). {0, 0} is the default pool.
 */
typedef struct xseg_pool_id {
    uint64_t first;
    uint64_t second;
} xseg_pool_id;

/** A fresh process-unique pool id (like torch.cuda.graph_pool_handle()); nothing is allocated. */
XSEG_API xseg_status xseg_pool_create(xseg_pool_id *id);

/**
 * Chooses which streams' allocations go to a pool: return nonzero for "this stream".
 * Called with xseg's device lock held, during xseg_malloc: it must not call xseg.
 */
typedef int (*xseg_stream_filter)(struct CUstream_st *stream, void *user);

/**
 * Start routing allocations on @p device to @p pool (created on first use; a use is added).
 * Routes are checked newest first, so a nested begin takes precedence for the streams it matches.
 * @param device a device index.
 * @param pool   any id but {0, 0} (xseg_pool_create, or PyTorch's ids through the torch hooks).
 * @param filter the streams to route; NULL routes every stream.
 * @param user   passed to @p filter as is.
 * @return XSEG_ERROR_INVALID_VALUE for the {0, 0} pool; XSEG_ERROR_ILLEGAL_STATE when the pool is
 *         already recording (nothing changes then).
 */
XSEG_API xseg_status xseg_begin_allocate_to_pool(int device, xseg_pool_id pool, xseg_stream_filter filter,
                                                 void *user);

/**
 * Stop routing allocations to @p pool. Its blocks stay where they are; the use stays until
 * xseg_release_pool. @return XSEG_ERROR_ILLEGAL_STATE when the pool is not recording.
 */
XSEG_API xseg_status xseg_end_allocate_to_pool(int device, xseg_pool_id pool);

/**
 * Drop one use of @p pool (a graph that used it was destroyed). With no users left, its cached
 * memory is released by the next xseg_empty_cache; blocks still allocated from it stay valid and
 * return to it when freed. A pool that holds no memory is forgotten at once.
 * @return XSEG_ERROR_INVALID_VALUE for a pool unknown on @p device or with no users left;
 *         XSEG_ERROR_ILLEGAL_STATE when that would drop the last use of a recording pool.
 */
XSEG_API xseg_status xseg_release_pool(int device, xseg_pool_id pool);

/** Current users of @p pool on @p device (0 when unknown), like PyTorch's getPoolUseCount. */
XSEG_API xseg_status xseg_pool_use_count(int device, xseg_pool_id pool, int *count);

/**
 * The blocks allocated from @p pool on @p device and not yet freed: their addresses (what
 * xseg_malloc or xseg_pool_malloc_at returned), on every stream and of both sizes. A block freed
 * but still waiting for its streams' work is not counted. snprintf-style: at most @p cap
 * addresses are written (in no promised order), @p n receives how many there are. This is what
 * PyTorch's checkPoolLiveAllocations compares with the tensors cudagraph trees expect to be
 * alive. It walks the pool's blocks under the device lock: a check, not for a hot path.
 * @param device a device index.
 * @param pool   a private pool (not {0, 0}).
 * @param ptrs   where the addresses go (may be NULL when @p cap is 0).
 * @param cap    room in @p ptrs.
 * @param n      receives the number of live blocks.
 * @return XSEG_ERROR_INVALID_VALUE for {0, 0}, a NULL @p n, NULL @p ptrs with @p cap > 0, or a
 *         pool unknown on @p device (never used there, or forgotten: no users and no memory).
 */
XSEG_API xseg_status xseg_pool_live_blocks(int device, xseg_pool_id pool, void **ptrs, size_t cap, size_t *n);

/**
 * Add a use to @p pool on @p device, creating it when it does not exist, without routing any
 * allocation to it (PyTorch's createOrIncrefPool: a torch.cuda.MemPool holds one use for its
 * lifetime). Drop it with xseg_release_pool.
 * @return XSEG_ERROR_INVALID_VALUE for the {0, 0} pool.
 */
XSEG_API xseg_status xseg_pool_retain(int device, xseg_pool_id pool);

/**
 * A pool's own allocator (its owner's): the segments of a pool created with one come from
 * @c alloc and go back through @c free, as PyTorch's caching allocator does for a MemPool built
 * with a CUDAAllocator (pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp at eb42ad6e:
 * allocPrimitive, relaxed capture mode through cudaMallocMaybeCapturing, and release_block ask
 * the pool's allocator; CUDAPluggableAllocator calls its alloc_fn(size, device, stream) and
 * free_fn(ptr, size, device, stream)). xseg caches, splits and merges the blocks of such a
 * segment as a classic segment's (even with expandable segments in force) and never maps, unmaps,
 * re-backs, fills, moves or puts to sleep its memory: @c free is the only way it goes.
 *
 * Calls are made with xseg's device lock held: a callback must not call xseg on that device. A
 * capture may be underway while @c alloc runs; xseg switches the calling thread to relaxed
 * capture mode around it, as around its own cuMemAlloc.
 */
typedef struct xseg_pool_allocator {
    /** A segment of @p size bytes for @p stream on @p device (the stream of the allocation that
     *  grew the pool), or NULL when there is none: then the allocation fails with
     *  XSEG_ERROR_OUT_OF_MEMORY after xseg's usual recovery. Required. */
    void *(*alloc)(size_t size, int device, struct CUstream_st *stream, void *user);
    /** Give back a segment @c alloc returned, with the same size, device and stream. Called only
     *  for a segment with no allocated block and its stream's work done (xseg_empty_cache, OOM
     *  recovery, idle reclaim, xseg_shutdown). Required. */
    void (*free)(void *ptr, size_t size, int device, struct CUstream_st *stream, void *user);
    /** Optional: called once when xseg forgets the pool (no users and no segment left, or
     *  xseg_shutdown): no callback of this allocator is called after it, so @c user may go. */
    void (*forget)(void *user);
    void *user; /**< passed to each callback as is */
} xseg_pool_allocator;

/**
 * xseg_pool_retain for a pool whose segments come from @p owner (PyTorch's createOrIncrefPool
 * with a MemPool's allocator): adds a use, creating @p pool on @p device with a copy of
 * @p *owner when it does not exist. Allocate in it as in any private pool
 * (xseg_begin_allocate_to_pool, a capture); statistics, snapshots (the segment's pool_id),
 * xseg_pool_use_count, xseg_pool_live_blocks and xseg_release_pool work as for any pool.
 * xseg_sleep refuses such a pool (XSEG_ERROR_NOT_SUPPORTED: it holds classic segments).
 * @return XSEG_ERROR_INVALID_VALUE for the {0, 0} pool, a NULL @p owner or a NULL alloc or free
 *         callback, or a pool that exists on @p device with another allocator (or none);
 *         XSEG_ERROR_OUT_OF_MEMORY when the pool's host record cannot be made (nothing changes).
 */
XSEG_API xseg_status xseg_pool_retain_owned(int device, xseg_pool_id pool, const xseg_pool_allocator *owner);

/**
 * Allocate exactly [@p ptr, @p ptr + @p size) from @p pool on @p device: the bytes must lie in one
 * free, mapped block of one of the pool's segments, expandable or classic (what a block of a
 * checkpointed layout left when it was freed). The block is split there, and its head and tail
 * stay free blocks of the segment (statistics as a split by malloc keeps them: inactive_split in
 * classic segments). It places a block of a layout captured earlier at its address again, as
 * cudagraph trees' setCheckpointPoolState needs; free it with xseg_free. With history on, the
 * placed block is recorded as an alloc (with the caller's stack) and its free as a free.
 * @param device a device index
 * @param pool a private pool (not {0, 0})
 * @param ptr the address to place the block at: a block address of the layout (a multiple of
 *            512 bytes from its segment's base, as every block of xseg starts)
 * @param size its size in bytes: a block size of the layout (as xseg rounds: a nonzero multiple
 *             of 512), as a snapshot gives it, not the size requested
 * @return XSEG_ERROR_INVALID_VALUE when @p ptr is in no segment of the pool, or @p ptr or
 *         @p size is not on that 512-byte grid (size 0 included);
 *         XSEG_ERROR_ILLEGAL_STATE when the range is not inside one free mapped block (part of it
 *         allocated, pending a stream's work, or given back by empty_cache) or the pool is not
 *         awake (xseg_sleep: asleep, going to sleep or waking up);
 *         XSEG_ERROR_OUT_OF_MEMORY (host; nothing changed).
 */
XSEG_API xseg_status xseg_pool_malloc_at(int device, xseg_pool_id pool, void *ptr, size_t size);

/**
 * Begin capturing @p stream into a CUDA graph (cuStreamBeginCapture with @p capture_mode, a
 * CUstreamCaptureMode / cudaStreamCaptureMode value) and route the allocations of that capture
 * to a private pool: those on @p stream and on every stream that joins the same capture.
 * @param device       a device index.
 * @param stream       the stream to capture (not the legacy default stream, NULL).
 * @param pool         in: the pool to use ({0, 0}: a new one); out: the pool used. Release it
 *                     with xseg_release_pool once the graph is destroyed, whether the capture
 *                     succeeded or not.
 * @param capture_mode CU_STREAM_CAPTURE_MODE_GLOBAL (0), THREAD_LOCAL (1) or RELAXED (2).
 * The cache is not emptied here (torch.cuda.graph() calls empty_cache before it begins: call
 * xseg_empty_cache first to do the same).
 * @return XSEG_ERROR_INVALID_VALUE for a NULL stream (the legacy stream cannot capture) or pool,
 *         or a bad mode; XSEG_ERROR_ILLEGAL_STATE when the pool is already recording;
 *         XSEG_ERROR_DRIVER when cuStreamBeginCapture fails (nothing changes then).
 */
XSEG_API xseg_status xseg_capture_begin(int device, struct CUstream_st *stream, xseg_pool_id *pool,
                                        int capture_mode);

/**
 * End the capture begun with xseg_capture_begin on @p stream (cuStreamEndCapture) and stop
 * routing its allocations. Routing stops even when the driver reports the capture invalidated;
 * a failure that leaves the stream capturing (the driver still reports it so) keeps routing,
 * and the call may be repeated.
 * @param device a device index.
 * @param stream the stream passed to xseg_capture_begin.
 * @param graph receives the captured graph (NULL when the capture failed); destroy it with
 *              cuGraphDestroy / cudaGraphDestroy.
 * @return XSEG_ERROR_ILLEGAL_STATE when @p stream has no capture begun by xseg_capture_begin;
 *         XSEG_ERROR_DRIVER when cuStreamEndCapture fails (the message says when the capture is
 *         still open).
 */
XSEG_API xseg_status xseg_capture_end(int device, struct CUstream_st *stream, struct CUgraph_st **graph);

/* ---------------------------------------------------------------------------------------------
 * Many processes and many GPUs.
 *
 * IPC of expandable memory. Expandable memory is mapped in chunks (one a page by default,
 * expandable_chunk_mb), each its own physical allocation, created shareable (config key
 * expandable_segments_ipc, on by default where the driver supports a handle type):
 * CU_MEM_HANDLE_TYPE_FABRIC where the device reports fabric support and a probe allocation with
 * it succeeds (NVLink/IMEX systems), else POSIX file descriptors. A handle describes a live block
 * as the shareable handles of the chunks under it, their sizes, the block's offset in the first
 * chunk and its size.
 *
 * Moving a handle: xseg_ipc_send / xseg_ipc_recv over a connected AF_UNIX socket (file
 * descriptors travel as SCM_RIGHTS ancillary data: no pidfd_getfd, no ptrace rights, so it works
 * in unprivileged containers). Fabric handles are plain bytes and also have a flat form,
 * xseg_ipc_serialize / xseg_ipc_deserialize, for any transport.
 *
 * Lifetime rules:
 *  - The importer maps whole chunks: bytes of other blocks that share the first or last chunk are
 *    visible to it too (as with cudaIpcGetMemHandle, which shares a whole allocation).
 *  - A POSIX-fd handle holds a reference to each chunk's physical memory from export until
 *    xseg_ipc_handle_free; an import holds one from xseg_ipc_import until xseg_ipc_close. So when
 *    the exporter frees the block (and even unmaps its chunks with xseg_empty_cache) while an
 *    importer has it mapped, the physical memory lives on until the importer closes: the importer
 *    never faults. But the exporter's allocator may hand the same memory to a new allocation as
 *    long as it stays mapped in the exporter, and the importer then sees that allocation's data:
 *    keep the block allocated until every importer is done (PyTorch's producer keeps the tensor
 *    alive the same way).
 *  - A fabric handle names the memory without holding it: import it while the exporter still has
 *    the block allocated; afterwards the import fails (XSEG_ERROR_DRIVER) or may map reused memory.
 *  - Importing twice (in the same or another process) creates two independent mappings at
 *    different addresses; each must be closed. A process may import its own export.
 *  - Imports are not blocks of the allocator: xseg_free refuses them, statistics ignore them,
 *    xseg_enable_peer_access does not reach them (the importing device and its peers enabled at
 *    import time get access).
 * ------------------------------------------------------------------------------------------- */

/** An exported block (opaque). Free with xseg_ipc_handle_free. */
typedef struct xseg_ipc_handle xseg_ipc_handle;

/** How the chunks of a handle are shared. */
typedef enum xseg_ipc_handle_type {
    XSEG_IPC_POSIX_FD = 1, /**< one file descriptor per chunk (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) */
    XSEG_IPC_FABRIC = 2,   /**< one 64-byte fabric handle per chunk (CU_MEM_HANDLE_TYPE_FABRIC) */
} xseg_ipc_handle_type;

/** What a handle describes. */
typedef struct xseg_ipc_info {
    xseg_ipc_handle_type type;
    int device;        /**< the exporter's device index */
    size_t size;       /**< the block's size in bytes (what xseg_malloc returned: a rounded size) */
    size_t offset;     /**< the block's offset in its first chunk */
    size_t nchunks;    /**< physical allocations (chunks) under the block, one shareable handle each */
    size_t span;       /**< their total size: the bytes of address space the importer reserves */
} xseg_ipc_info;

/**
 * Export the live block at @p ptr (the address xseg_malloc returned). The block enters the
 * registration ledger as an entry of xseg's own until its free (docs/registrations.md).
 * @return XSEG_ERROR_INVALID_VALUE for a pointer that is not a live allocation;
 *         XSEG_ERROR_NOT_SUPPORTED for a classic (cuMemAlloc) block, or a block of a segment
 *         created without a shareable handle type (expandable_segments_ipc:False, or no driver
 *         support); XSEG_ERROR_ILLEGAL_STATE for a block of a sleeping pool (xseg_sleep);
 *         XSEG_ERROR_DRIVER when an export call fails (nothing is left open then).
 */
XSEG_API xseg_status xseg_ipc_export(void *ptr, xseg_ipc_handle **out);

/** Describe @p handle. */
XSEG_API xseg_status xseg_ipc_handle_info(const xseg_ipc_handle *handle, xseg_ipc_info *info);

/**
 * Send @p handle over the connected AF_UNIX socket @p unix_socket (stream or seqpacket): a
 * header, then the descriptors as SCM_RIGHTS (several messages past 250 chunks). The descriptors
 * stay open in @p handle. Blocks until sent. @return XSEG_ERROR_DRIVER is never used;
 * XSEG_ERROR_INVALID_VALUE when the socket refuses (errno text in the message).
 */
XSEG_API xseg_status xseg_ipc_send(int unix_socket, const xseg_ipc_handle *handle);

/**
 * Receive a handle sent by xseg_ipc_send. Blocks until it has arrived (or the socket's receive
 * timeout, SO_RCVTIMEO, passes: an error then).
 * @return XSEG_ERROR_INVALID_VALUE for a closed socket, malformed data, missing descriptors, or
 *         a message longer than the part of the handle expected next (on a seqpacket or datagram
 *         socket the kernel drops its rest: MSG_TRUNC; a peer must send with xseg_ipc_send);
 *         every descriptor received is closed then.
 */
XSEG_API xseg_status xseg_ipc_recv(int unix_socket, xseg_ipc_handle **out);

/**
 * The flat form of a fabric handle (snprintf-style: @p len receives the bytes needed; nothing is
 * written when @p size is smaller). @return XSEG_ERROR_NOT_SUPPORTED for a POSIX-fd handle
 * (descriptors cannot travel as bytes: use xseg_ipc_send).
 */
XSEG_API xseg_status xseg_ipc_serialize(const xseg_ipc_handle *handle, void *buf, size_t size, size_t *len);

/** Rebuild a fabric handle from its flat form. @return XSEG_ERROR_INVALID_VALUE for bad bytes. */
XSEG_API xseg_status xseg_ipc_deserialize(const void *buf, size_t len, xseg_ipc_handle **out);

/**
 * Map the block of @p handle on @p device: a reservation of exactly the chunks' bytes (span;
 * never a multiple of device memory), each chunk imported and mapped in order, read-write access
 * for @p device and the peers enabled on it in one cuMemSetAccess. *ptr receives the block's
 * address (reservation + offset). Every failure is rolled back (nothing stays reserved, mapped
 * or imported) and reported with the failing driver call.
 */
XSEG_API xseg_status xseg_ipc_import(const xseg_ipc_handle *handle, int device, void **ptr);

/**
 * Unmap an import (the pointer xseg_ipc_import returned) and free its address range.
 * @return XSEG_ERROR_INVALID_VALUE for any other pointer, or one already closed;
 *         XSEG_ERROR_DRIVER when a driver call fails: the import stays open and closing it again
 *         finishes the work (after a failed unmap it is still mapped and usable; after a failed
 *         address free it is unmapped and the next close only frees the range).
 */
XSEG_API xseg_status xseg_ipc_close(void *ptr);

/** Close the handle's descriptors and free it. NULL is a no-op. */
XSEG_API void xseg_ipc_handle_free(xseg_ipc_handle *handle);

/**
 * Registration hooks (NCCL, RDMA). One physical piece behind a range of device addresses:
 * @p handle is the CUmemGenericAllocationHandle (0 for classic cuMemAlloc memory, which has none),
 * @p offset the range's offset inside that handle's memory.
 */
typedef struct xseg_phys_range {
    uint64_t address;
    size_t length;
    uint64_t handle;
    size_t offset;
} xseg_phys_range;

typedef enum xseg_segment_event_kind {
    XSEG_SEGMENT_MAP = 1,   /**< the range was just mapped and is accessible */
    XSEG_SEGMENT_UNMAP = 2, /**< the range is about to be unmapped (still accessible now) */
} xseg_segment_event_kind;

/** One map or unmap: [address, address + size) on @p device, made of @p nranges ranges in
 *  address order that tile it exactly (one per chunk; one for a classic segment). */
typedef struct xseg_segment_event {
    xseg_segment_event_kind kind;
    int device;
    uint64_t address;
    size_t size;
    int is_expandable;
    size_t nranges;
    const xseg_phys_range *ranges; /**< valid during the call only */
} xseg_segment_event;

/**
 * Called on every map and unmap of device memory by xseg (expandable pages, classic segments),
 * with the device lock held: it must not call xseg (NCCL's ncclMemRegister / ibv_reg_mr are
 * fine). A run of chunks is reported in events of at most 64 ranges. If an unmap announced with
 * XSEG_SEGMENT_UNMAP fails, the pages left mapped are reported again with XSEG_SEGMENT_MAP.
 */
typedef void (*xseg_segment_observer)(const xseg_segment_event *event, void *user);

/**
 * Attach @p fn: it is called at once with XSEG_SEGMENT_MAP for every mapping that exists now (on
 * every initialized device), then for every change. Several may be attached; called in order.
 */
XSEG_API xseg_status xseg_attach_segment_observer(xseg_segment_observer fn, void *user);

/** Detach an observer attached with the same (fn, user). @return XSEG_ERROR_INVALID_VALUE when
 *  none is attached. */
XSEG_API xseg_status xseg_detach_segment_observer(xseg_segment_observer fn, void *user);

/**
 * The physical pieces under the live block at @p ptr, in address order: for an expandable block
 * one range per chunk it overlaps (clipped to the block), for a classic block one range with
 * handle 0. snprintf-style: at most @p cap ranges are written, @p n receives how many there are.
 * Once handles are handed out (cap > 0, or xseg_ipc_export), the block's segment is never
 * re-backed by expandable_segments_defrag, so the handles stay those of the memory.
 * Each call with cap > 0 also takes a hold on the block: while it holds any, its pool refuses
 * xseg_sleep (a sleep would give the memory behind the handles back and the wake map new memory
 * at the block's addresses, so whoever holds them would silently part from the block). Drop each
 * hold with xseg_block_handles_release; freeing the block drops them all. cap == 0 (counting
 * only) takes none.
 * @return XSEG_ERROR_INVALID_VALUE for a pointer that is not a live allocation;
 *         XSEG_ERROR_ILLEGAL_STATE for a block of a sleeping pool (its pages have no memory now);
 *         XSEG_ERROR_OUT_OF_MEMORY when the hold cannot be recorded (host memory; nothing written).
 */
XSEG_API xseg_status xseg_block_handles(void *ptr, xseg_phys_range *ranges, size_t cap, size_t *n);

/**
 * Drop one hold xseg_block_handles (cap > 0) took on the live block at @p ptr: call it once per
 * such call, when the handles are no longer used (unregistered from the NIC, unmapped by the
 * other process). Once a block holds none, its pool may sleep again.
 * @param ptr the block's address, as xseg_block_handles was given it.
 * @return XSEG_ERROR_INVALID_VALUE for NULL or a pointer that is not a live allocation (a freed
 *         block's holds ended with its free); XSEG_ERROR_ILLEGAL_STATE when the block holds no
 *         hand-out (never handed out with cap > 0, or released as often as handed out).
 */
XSEG_API xseg_status xseg_block_handles_release(void *ptr);

/* ---------------------------------------------------------------------------------------------
 * Registrations that stay valid (docs/registrations.md)
 *
 * A library that pins device memory for a NIC or another GPU (NCCL's ncclCommRegister, UCX/NIXL,
 * ibv_reg_mr of a dmabuf) registers the range here. Before xseg unmaps or re-backs any page of a
 * registered range (xseg_empty_cache, xseg_trim, xseg_sleep, xseg_shutdown) it calls the
 * range's @c before callback, with no xseg lock held, and waits for it
 * to return: 0 means the registrant dropped its own registration, so the pages may go. When every
 * page of a released range is mapped again (xseg_wake, a later allocation that maps pages there),
 * the @c after callback is called so the registrant registers the new pages (inside that
 * xseg_wake or xseg_malloc, with no xseg lock held). A range whose
 * registrant does not release (non-zero, or no return within timeout_ms) stays mapped and the
 * call that wanted its pages reports it; reclaim that does not call back (idle reclaim, the
 * release threshold, an allocation's out-of-memory retry, the memory group's give-way,
 * defragmentation) leaves the pages of a registered range alone.
 *
 * Classic (cuMemAlloc) segments: their pages never move or get re-backed; the only action that
 * takes them is the release of the whole segment (cuMemFree). A registered range inside one holds
 * that segment instead: no release (xseg_empty_cache, xseg_trim, idle release, the release
 * threshold, garbage collection, the out-of-memory retry, the give-way, a released pool) frees it
 * while the registration lives (it stays cached, counted in reserved bytes), and no before
 * callback is asked for those (no page is taken; the calls succeed); only xseg_shutdown asks.
 * Classic pools never sleep (xseg_sleep refuses them).
 * ------------------------------------------------------------------------------------------- */

/** Why a registration callback runs. */
typedef enum xseg_range_reason {
    XSEG_RANGE_RECLAIM = 1,  /**< before: xseg_empty_cache or xseg_trim may unmap pages */
    XSEG_RANGE_SLEEP = 2,    /**< before: xseg_sleep gives the pool's pages back */
    XSEG_RANGE_SHUTDOWN = 3, /**< before: xseg_shutdown; no after follows */
    XSEG_RANGE_MOVE = 4,     /**< before: pages are moved elsewhere (spill to host) */
    XSEG_RANGE_REMAPPED = 5, /**< after: every page of the range is mapped again (new physical memory) */
    XSEG_RANGE_KEPT = 6,     /**< after: the pages did not go after all (a failed or partial operation) */
} xseg_range_reason;

/** What a registration callback is told. */
typedef struct xseg_range_event {
    int device;
    void *ptr;   /**< the range as registered */
    size_t size;
    xseg_range_reason reason;
} xseg_range_event;

/** A registrant's callbacks (copied by xseg_register_range). */
typedef struct xseg_range_callbacks {
    /** Drop your registration of the range; return 0 once done, else the pages stay mapped. May
     *  call xseg (even xseg_unregister_range of this range). May be NULL: always released. */
    int (*before)(const xseg_range_event *ev, void *ctx);
    /** Register the range again (its pages may be new physical memory); 0 on success. A failure
     *  leaves the range released (asked again at the next after). May be NULL. */
    int (*after)(const xseg_range_event *ev, void *ctx);
    /** 0: wait for each callback as long as it takes, on the calling thread. Otherwise each runs
     *  on a thread of its own and xseg waits at most this long; a callback still running then
     *  counts as not released (its range stays mapped until it returns 0). */
    unsigned timeout_ms;
} xseg_range_callbacks;

/**
 * Register [@p ptr, @p ptr + @p size) of xseg's memory: mapped now, inside one expandable segment
 * (a live block, part of one, or several blocks of one segment), or inside one classic segment
 * (held off release until unregistered; see above).
 * @param ptr       the range's first byte.
 * @param size      its length in bytes.
 * @param callbacks what to call before the pages go and after they are back (copied).
 * @param ctx       passed to the callbacks; (ptr, size, ctx) names the registration.
 * @return XSEG_ERROR_INVALID_VALUE for NULL arguments, size 0, the same (ptr, size, ctx) twice, or
 *         a range that is not mapped memory of one segment of xseg (one running past the end of
 *         its classic segment included; the message says which);
 *         XSEG_ERROR_OUT_OF_MEMORY when host memory runs out (nothing registered).
 */
XSEG_API xseg_status xseg_register_range(void *ptr, size_t size, const xseg_range_callbacks *callbacks, void *ctx);

/**
 * Forget the registration (@p ptr, @p size, @p ctx); no callback runs. Allowed from inside its
 * own callback, and while a timed-out callback still runs (the record goes when it returns).
 * @return XSEG_ERROR_INVALID_VALUE when no such registration exists.
 */
XSEG_API xseg_status xseg_unregister_range(void *ptr, size_t size, void *ctx);

/**
 * One dma-buf file descriptor for [@p ptr, @p ptr + @p size) of xseg's memory (mapped now, inside
 * one expandable segment), however many physical chunks it spans: cuMemGetHandleForAddressRange
 * on the host-page-aligned range around it, for ibv_reg_dmabuf_mr, UCX or NIXL. The dma-buf pins
 * the pages it covers: register the range (xseg_register_range) and close the fd in the before
 * callback, or the pages xseg unmaps would not go back to the driver.
 * The range enters the ledger by itself as an entry of xseg's own until the descriptor is closed
 * (seen by the next action that asks) or a block under it is freed: meanwhile a sleep of its pool
 * is refused naming it, and spill, defragmentation and reclaim leave its pages alone
 * (docs/registrations.md, "Ranges xseg registers itself").
 * @param ptr    the range's first byte.
 * @param size   its length in bytes.
 * @param fd     out: the descriptor (the caller closes it); -1 on failure.
 * @param offset out: where @p ptr sits in it (the range starts at a host page).
 * @return XSEG_ERROR_NOT_SUPPORTED when the driver exports no dma-buf of the range
 *         (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0, or no such entry point; the documented
 *         alternative is one registration per chunk from xseg_block_handles) or for a classic
 *         segment; XSEG_ERROR_INVALID_VALUE for NULL arguments, size 0, or a range that is not
 *         mapped memory of one segment of xseg; XSEG_ERROR_DRIVER when the driver refuses it.
 */
XSEG_API xseg_status xseg_range_dmabuf(void *ptr, size_t size, int *fd, size_t *offset);

/** The registrations of one device (xseg_registration_stats). */
typedef struct xseg_registration_stats {
    size_t active;       /**< registered on their current pages */
    size_t released;     /**< released by their before callback, waiting for their pages */
    size_t kept_bytes;   /**< bytes of pages left mapped because a registrant did not release (cumulative) */
    size_t failures;     /**< callbacks that failed or timed out (cumulative) */
} xseg_registration_stats;

/** The registrations of @p device. @return XSEG_ERROR_INVALID_VALUE for NULL @p stats. */
XSEG_API xseg_status xseg_registration_stats_get(int device, xseg_registration_stats *stats);

/**
 * May memory registered now outside xseg's ledger (a NIC's ibv_reg_mr or dma-buf through NIXL or
 * UCX, NCCL's ncclCommRegister) rely on its physical pages staying put under the configuration in
 * force? Answers whether any action xseg takes on its own could change the pages under a live
 * block without its registrant being asked: expandable_segments_defrag:True and
 * spill_to_host:True could (both skip ranges registered with xseg_register_range); the cache's
 * reclaim (empty_cache, trim, idle release, the release threshold, the memory group's give-way)
 * never unmaps a page holding a live byte. The program's own xseg_sleep / xseg_wake re-back a
 * pool's pages whatever this says (docs/registrations.md).
 * @param safe   out: 1 when no such action is on, else 0.
 * @param reason where to write why, naming the keys that make it unsafe (NUL-terminated,
 *               truncated to @p size; may be NULL with @p size 0).
 * @param size   bytes available in @p reason.
 * @param len    if non-NULL, receives the reason's full length (without NUL).
 * @return XSEG_ERROR_INVALID_VALUE for NULL @p safe, or NULL @p reason with @p size > 0.
 */
XSEG_API xseg_status xseg_registration_safe(int *safe, char *reason, size_t size, size_t *len);

/* ---------------------------------------------------------------------------------------------
 * NCCL user-buffer registration through the ledger (docs/registrations.md, "NCCL through xseg")
 *
 * ncclCommRegister pins the physical pages behind a range for as long as the registration lives
 * (NCCL records it at once and maps or exports the memory when a collective first uses it). These
 * calls make that registration and keep the range in xseg's ledger, as an entry of xseg's own, from
 * before ncclCommRegister runs until ncclCommDeregister has returned: meanwhile no action of xseg
 * unmaps, re-backs, moves or sleeps those pages (a sleep of the pool and xseg_shutdown are refused
 * with XSEG_ERROR_ILLEGAL_STATE naming the registration; xseg_empty_cache and xseg_trim leave its
 * free pages mapped and report it; idle release, the release threshold, the out-of-memory retry,
 * the give-way, defragmentation and spill skip it). A free of a block inside the range does not
 * end it: NCCL registered pages, not a block. Classic (cuMemAlloc) segments too
 * (expandable_segments:False, or a device without VMM): their pages never move, so the entry holds
 * the segment off every release (cuMemFree) until deregistered (it stays cached, counted in
 * reserved bytes; xseg_empty_cache and xseg_trim succeed without it), and xseg_shutdown is refused
 * naming it.
 *
 * NCCL is never loaded by xseg: the symbols come from $XSEG_NCCL_LIBRARY when set (opened with
 * RTLD_NOLOAD: it must already be loaded), else from libnccl.so.2 as loaded (PyTorch's), else from
 * the process's global symbols; none: XSEG_ERROR_NOT_SUPPORTED naming what was looked for.
 * @p comm is the ncclComm_t (PyTorch: ProcessGroupNCCL's _comm_ptr()). An error NCCL returns is
 * XSEG_ERROR_DRIVER with NCCL's result and ncclGetErrorString in the message.
 * ------------------------------------------------------------------------------------------- */

/**
 * ncclCommRegister(@p comm, @p ptr, @p size) with the range held in the ledger until
 * xseg_nccl_deregister. Either both are made or neither: the ledger's refusals come before NCCL is
 * called, and when NCCL fails the ledger entry is removed.
 * @param comm   the NCCL communicator (ncclComm_t).
 * @param ptr    the range's first byte: mapped memory of one expandable segment of xseg (a live
 *               block, part of one, or several blocks of one segment), or a range inside one
 *               classic segment.
 * @param size   its length in bytes.
 * @param handle out: xseg's handle for xseg_nccl_deregister (not NCCL's; never reused).
 * @return XSEG_ERROR_INVALID_VALUE for NULL comm, ptr or handle, size 0, or a range that is not
 *         mapped memory of one segment of xseg (one running past the end of its classic segment
 *         included; the message says which); XSEG_ERROR_NOT_SUPPORTED when no NCCL is loaded;
 *         XSEG_ERROR_DRIVER when ncclCommRegister fails; XSEG_ERROR_OUT_OF_MEMORY for host memory.
 */
XSEG_API xseg_status xseg_nccl_register(void *comm, void *ptr, size_t size, void **handle);

/**
 * PyTorch's register_mem_pool for xseg: xseg_nccl_register of every segment of @p pool on
 * @p device as it is now (each run of mapped pages of each of its expandable segments, each of its
 * classic segments whole: what PyTorch's snapshot lists as segments), all under one handle. Segments the pool grows later are not
 * registered (as PyTorch's registerMemPool registers the snapshot's segments; PyTorch adds later
 * ones from its allocator trace hook, which xseg does not do on its own: call this again, or
 * xseg_nccl_register the new range). Either every segment is registered or none (NCCL's
 * registrations made before a failure are undone).
 * @param comm   the NCCL communicator (ncclComm_t), as for xseg_nccl_register.
 * @param device the device whose segments of @p pool are registered.
 * @param pool   {0, 0} for the default pool, else a private pool's id.
 * @param handle out: one handle for them all; NULL (and success) when the pool maps nothing on
 *               @p device now (a pool id the device never allocated for included).
 * @param count  if non-NULL, receives how many ranges were registered.
 * @return as xseg_nccl_register; XSEG_ERROR_ILLEGAL_STATE when it sleeps; XSEG_ERROR_INVALID_DEVICE
 *         for a bad @p device.
 */
XSEG_API xseg_status xseg_nccl_register_pool(void *comm, int device, xseg_pool_id pool, void **handle, size_t *count);

/**
 * ncclCommDeregister of every range under @p handle (xseg_nccl_register or
 * xseg_nccl_register_pool), then their ledger entries go and the pages are xseg's again. A range
 * NCCL refuses to deregister stays registered, with its entry, and a later call retries it.
 * @return XSEG_ERROR_INVALID_VALUE for NULL comm or handle, an unknown handle (never handed out,
 *         or deregistered already), or a handle registered with another comm;
 *         XSEG_ERROR_ILLEGAL_STATE while another thread deregisters the same handle;
 *         XSEG_ERROR_DRIVER when ncclCommDeregister fails (the others are deregistered).
 */
XSEG_API xseg_status xseg_nccl_deregister(void *comm, void *handle);

/* --- end of many processes and many GPUs --- */

/* ---------------------------------------------------------------------------------------------
 * Long-running services: giving cached memory back (docs/services.md)
 *
 * "Cached" memory is reserved minus allocated bytes. What can be given back: whole pages inside
 * free expandable blocks (unmapped; the virtual addresses stay reserved) and unsplit free classic
 * segments (cuMemFree). Pages shared with a live block, blocks waiting for record_stream events,
 * and the cache of private pools still used by a graph stay. Nothing is released while a stream
 * capture is underway. The config key release_threshold_mb does the same automatically, without
 * ever waiting for the GPU (docs/configuration.md).
 * ------------------------------------------------------------------------------------------- */

/**
 * Give cached memory of @p device back to the driver until at most @p keep_bytes of cache remain
 * (or nothing more can go): the largest free runs first, ties to the older segment; only the
 * pages needed are unmapped. Synchronizes the stream of each segment it unmaps pages of (as
 * xseg_empty_cache does); frees waiting for record_stream events that have not completed are not
 * waited for. xseg_trim(device, 0) releases what xseg_empty_cache releases, except those. Pages
 * of declared blocks spilled to host memory (spill_to_host) then move back where device memory
 * allows.
 * @param device     a device index, or -1 for every initialized device (each keeps @p keep_bytes).
 * @param keep_bytes the cache to keep, in bytes (0: give back all that can go).
 * @return XSEG_ERROR_INVALID_DEVICE for a bad index; XSEG_ERROR_DRIVER when an unmap fails (what
 *         was given back before the failure stays given back; the allocator stays usable).
 */
XSEG_API xseg_status xseg_trim(int device, size_t keep_bytes);

/* ---------------------------------------------------------------------------------------------
 * Sleep and wake at the same addresses (docs/services.md)
 *
 * A pool is put to sleep to lend its device memory to someone else (an RL trainer colocated with
 * an inference engine) and woken later at the same virtual addresses, so pointers held by the
 * program and CUDA graphs captured before stay valid. The pool is the tag: {0, 0} names the
 * default pools of the device (every allocation not routed to a private pool), any other id a
 * private pool (xseg_begin_allocate_to_pool, xseg_capture_begin, PyTorch's MemPool and graph
 * pools), e.g. one for the weights and one for the KV cache.
 *
 * Sleep gives back the physical memory of every page the pool has mapped, live blocks and cached
 * pages alike, and keeps every virtual address reserved. Wake maps a page at each of those
 * addresses again (every page mapped at the sleep, so a graph's free intermediates are mapped
 * too) and restores the live blocks.
 *
 * Only expandable segments can sleep: a classic (cuMemAlloc) segment's address does not survive
 * cuMemFree, so a pool that holds one is refused (XSEG_ERROR_NOT_SUPPORTED) and nothing changes.
 * Nor can a pool holding a block exported with xseg_ipc_export that is still allocated: its
 * importers map that block's physical memory, which a sleep would give back while the wake maps
 * new memory at the exporter's addresses, so the processes would silently part. Such a sleep is
 * refused (XSEG_ERROR_ILLEGAL_STATE, naming the count) and nothing changes; once those blocks are
 * freed (after every importer closed them) the pool sleeps. The same holds for a block whose
 * handles xseg_block_handles handed out (cap > 0), until each hand-out is released
 * (xseg_block_handles_release) or the block freed; the refusal names the first such block.
 *
 * While a pool sleeps: xseg_free of its blocks works (and xseg_record_stream); allocating from it
 * fails with XSEG_ERROR_ILLEGAL_STATE naming the pool (it is never woken implicitly: a wake
 * copies gigabytes and may not fit while the memory is lent out); the program must not touch its
 * memory (the pages are unmapped: a kernel faults); xseg_ipc_export and xseg_block_handles of its
 * blocks are refused; empty_cache, trim and the release policies leave it alone; snapshots leave
 * its segments out; reserved_bytes no longer counts its pages while allocated_bytes still counts
 * its live blocks; while any pool sleeps, mallocs take the allocator's general path.
 *
 * Threads: a sleep or wake waits for streams and copies and does its file I/O without holding
 * the device's lock, so other threads' mallocs and frees of the device's other pools (and their
 * sleeps and wakes) go on meanwhile. Until it returns, its own pool refuses a malloc, a second
 * xseg_sleep or xseg_wake (XSEG_ERROR_ILLEGAL_STATE, "is going to sleep" / "is waking up": the
 * caller that started it owns the outcome), export and block handles; frees of its blocks work,
 * as while it sleeps.
 * ------------------------------------------------------------------------------------------- */

/** How a pool sleeps: exactly one of these. */
typedef enum xseg_sleep_flags {
    /** Copy the bytes of the pool's live blocks (not its free cached pages) to pinned host memory
     *  first; the wake copies them back. */
    XSEG_SLEEP_OFFLOAD = 1,
    /** Drop the bytes: after the wake every page of the pool reads zero (never stale data). */
    XSEG_SLEEP_DISCARD = 2,
    /** Copy the live blocks' bytes to a new file (xseg_sleep_ex's path) through two pinned bounce
     *  buffers of sleep_copy_chunk_mb each, for pools too large for host memory; the wake reads
     *  them back and removes the file. */
    XSEG_SLEEP_OFFLOAD_FILE = 4,
} xseg_sleep_flags;

/**
 * Put @p pool of @p device to sleep: give back the physical memory of each of its mapped pages
 * and keep the virtual addresses. No page goes under running work: first it waits (host-blocking)
 * for the work of every stream xseg knows may use the pool (the streams its blocks were allocated
 * on and the streams given to xseg_record_stream for its live or pending blocks) and, under
 * sleep_wait_device (the default), for the whole device's work (cuCtxSynchronize in the thread's
 * RELAXED capture mode), so work queued on a stream the program never named to xseg finishes,
 * and its bytes are in the backup, before a page is unmapped; with sleep_wait_device:False work
 * on other streams must be complete, as for xseg_free. Frees whose record_stream events completed
 * then return to the pool. A context wait would end a capture underway, so while xseg knows of one
 * (any thread's: a stream that allocated while capturing, xseg_capture_begin,
 * xseg_begin_allocate_to_pool) the sleep is refused, naming it, and the capture goes on; a capture
 * on a stream xseg never saw cannot be known (sleep with sleep_wait_device:False, or after it
 * ends). With sleep_backup_checksum:True an XSEG_SLEEP_OFFLOAD sleep checksums each host backup
 * once its copies are done, and the wake checks it (below). With
 * XSEG_SLEEP_OFFLOAD the live blocks' bytes are copied to pinned host memory before any page is
 * unmapped, in sleep_copy_chunk_mb chunks over xseg's two copy streams: the backup comes from the
 * pinned host cache (the one an earlier wake kept under sleep_keep_host_backup, the default), else
 * cuMemHostAlloc (pinning costs far more than the copy: ~0.5 s per GiB on an H200).
 * @param device a device index.
 * @param pool   {0, 0} for the default pools, or a private pool's id.
 * @param flags  XSEG_SLEEP_OFFLOAD or XSEG_SLEEP_DISCARD.
 * @return XSEG_ERROR_INVALID_VALUE for bad flags or a private pool unknown on @p device;
 *         XSEG_ERROR_ILLEGAL_STATE when the pool sleeps already (or another thread's sleep or
 *         wake of it is underway), a capture is underway on the
 *         device (or a pool records: xseg_begin_allocate_to_pool; also one begun by another thread
 *         while the sleep ran, seen before the sleep unmaps a page; the message names the stream or
 *         pool, and says to sleep after the capture ends), or the pool holds live blocks
 *         exported with xseg_ipc_export (the message gives their count; free them once every
 *         importer has closed them, then sleep) or blocks whose handles xseg_block_handles handed
 *         out (the message names the first; xseg_block_handles_release each hand-out, or free
 *         the block, then sleep); XSEG_ERROR_NOT_SUPPORTED when
 *         the pool holds classic segments; XSEG_ERROR_OUT_OF_MEMORY when pinned host memory cannot
 *         be had; XSEG_ERROR_DRIVER when a driver call fails. A failure leaves the pool awake and
 *         usable with its data, nothing held: pages unmapped before the failure are mapped back
 *         with their own memory. Only if that also fails does the pool stay asleep, with nothing
 *         lost (the message says so): xseg_wake brings it back.
 */
XSEG_API xseg_status xseg_sleep(int device, xseg_pool_id pool, unsigned flags);

/**
 * xseg_sleep with a file: with XSEG_SLEEP_OFFLOAD_FILE the live blocks' bytes are written to a
 * file created at @p path, in sleep_copy_chunk_mb chunks through two pinned bounce buffers from
 * the host cache (a chunk's copy overlaps the previous chunk's write), and read back by
 * xseg_wake, which then removes the file; the wake checks each chunk against a checksum the
 * sleep kept in host memory (not in the file), so bytes changed while asleep fail it. The
 * checksum is keyed with random bits drawn for each sleep and kept only in this process's memory:
 * whoever can write the file (the same user too) cannot make changed bytes pass, short of reading
 * this process's memory (a debugger); a change passes with a chance of about 2^-63 per wake. The file
 * is created with O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC and mode 0600: an existing file or a
 * symbolic link at @p path is refused (XSEG_ERROR_INVALID_VALUE), never followed or
 * overwritten. It lives from the sleep to the wake
 * (xseg_shutdown refuses while a pool sleeps); a failed sleep removes it, a failed wake keeps it
 * for the retry. The file is removed only while @p path still names it.
 * @param device a device index.
 * @param pool   {0, 0} for the default pools, or a private pool's id.
 * @param flags  XSEG_SLEEP_OFFLOAD_FILE, or XSEG_SLEEP_OFFLOAD / XSEG_SLEEP_DISCARD (as
 *               xseg_sleep; @p path must then be NULL).
 * @param path   the file to create with XSEG_SLEEP_OFFLOAD_FILE (a new path), else NULL.
 * @return as xseg_sleep, and XSEG_ERROR_INVALID_VALUE for a missing or unneeded @p path, an
 *         existing file or link at it, or a failed create or write (the message names the path
 *         and the errno: EIO, ...); XSEG_ERROR_OUT_OF_MEMORY when the file system is full (ENOSPC,
 *         EDQUOT), the file would pass RLIMIT_FSIZE (EFBIG: SIGXFSZ is blocked on the writing
 *         thread meanwhile, so the signal does not end the process) or the bounce buffers cannot
 *         be had; XSEG_ERROR_NOT_SUPPORTED when the kernel gives no random bits for the checksums'
 *         key (getrandom and /dev/urandom fail). A failure leaves the pool awake with its data
 *         and the file removed.
 */
XSEG_API xseg_status xseg_sleep_ex(int device, xseg_pool_id pool, unsigned flags, const char *path);

/**
 * Wake @p pool of @p device: map a page at every address the sleep gave back (new physical
 * memory, with access for the device and its enabled peers), restore the live blocks (the
 * offloaded bytes, or every page filled with sleep_discard_fill's byte, 0 by default, after
 * XSEG_SLEEP_DISCARD: a value like 165 (0xA5) makes a tensor wrongly discarded read as garbage
 * at once instead of plausible zeros) on xseg's copy streams, wait
 * for that, and give the pinned host memory back: to the host cache for the next sleep under
 * sleep_keep_host_backup (the default), else to the driver. When it returns, every stream may use
 * the memory, and allocation from the pool works again.
 * @param device a device index.
 * @param pool   the pool given to xseg_sleep.
 * @return XSEG_ERROR_INVALID_VALUE for a private pool unknown on @p device;
 *         XSEG_ERROR_ILLEGAL_STATE when the pool is not asleep (or its sleep or another wake of it
 *         is underway in another thread) or a capture is underway;
 *         XSEG_ERROR_OUT_OF_MEMORY when the device, the memory fraction, memory_budget_mb or
 *         memory_group_budget_mb cannot hold the pages now, counting the process's cached bytes
 *         (checked again before each segment is mapped, as other threads may allocate meanwhile;
 *         a wake gives no cache back and asks no group member: xseg_empty_cache, then retry); XSEG_ERROR_DRIVER when a driver call fails; after
 *         XSEG_SLEEP_OFFLOAD_FILE, XSEG_ERROR_INVALID_VALUE when reading the file fails (the
 *         message names the errno, or a file cut short) or its bytes changed since the sleep (each
 *         chunk is checked against a checksum the sleep kept in host memory; the message names the
 *         file and the chunk); under sleep_backup_checksum, XSEG_ERROR_INVALID_VALUE when a host
 *         backup changed since the sleep (checked before any page is mapped; the message names
 *         the pool and the segment; the pool stays asleep with the backup as it is, and every
 *         retry fails the same way until the bytes are put back or the key is turned off, which
 *         restores the backup as it is). A wake is a transaction: whatever fails (out of memory,
 *         any driver call: cuMemCreate, cuMemMap, cuMemSetAccess, the copies, the events and
 *         streams; the file's reads), the pages it mapped are given back once its queued copies
 *         are done, the pool stays asleep with its offloaded bytes (or file) whole, the message
 *         says "still asleep", nothing leaks and nothing sticks: a retry wakes it with every byte
 *         (tests/services/test_sleep_contract.c sweeps every call). Only where even the wait for
 *         its copies fails do the pages it mapped stay mapped (counted; the message says so).
 */
XSEG_API xseg_status xseg_wake(int device, xseg_pool_id pool);

/* ---------------------------------------------------------------------------------------------
 * Sleep and wake by tag (docs/services.md#by-tag)
 *
 * A pool may carry a tag: "weights", "kv_cache", "graphs" or any name of the program's (1 to 31
 * letters, digits, '_', '.' or '-'). xseg_sleep_tags puts every pool of a device carrying one of
 * the given tags to sleep, each tag with its own mode; xseg_wake_tags wakes them tag by tag in the
 * order given, so that the weights come back before the KV cache (vLLM's sleep levels, RL
 * colocation: the recipe in docs/services.md). A tag belongs to a pool id on one device: it may be
 * set before the pool allocates anything (a MemPool tagged when made), and stays until it is
 * changed or cleared, the pool is released with its memory given back, or xseg_shutdown.
 * ------------------------------------------------------------------------------------------- */

/** The most bytes of a tag, its terminating NUL included. */
#define XSEG_TAG_MAX 32

/**
 * Tag @p pool of @p device with @p tag (replacing its tag), or clear its tag (@p tag NULL or "").
 * @param device a device index.
 * @param pool   {0, 0} for the default pools, or a private pool's id (it need not exist yet).
 * @param tag    1 to 31 characters of [A-Za-z0-9_.-], or NULL / "" to clear.
 * @return XSEG_ERROR_INVALID_VALUE for a tag too long or with another character;
 *         XSEG_ERROR_INVALID_DEVICE for a bad index; XSEG_ERROR_OUT_OF_MEMORY (nothing changed).
 */
XSEG_API xseg_status xseg_pool_set_tag(int device, xseg_pool_id pool, const char *tag);

/**
 * The tag of @p pool on @p device into @p tag ("" when it carries none).
 * @param device   a device index.
 * @param pool     {0, 0} for the default pools, or a private pool's id.
 * @param tag      receives the tag, NUL-terminated.
 * @param capacity bytes at @p tag (XSEG_TAG_MAX always suffices).
 * @return XSEG_ERROR_INVALID_VALUE for a NULL @p tag or a @p capacity the tag does not fit.
 */
XSEG_API xseg_status xseg_pool_get_tag(int device, xseg_pool_id pool, char *tag, size_t capacity);

/** One tag of xseg_sleep_tags and how its pools sleep. */
typedef struct xseg_tag_sleep {
    const char *tag; /**< the pools carrying this tag */
    unsigned flags;  /**< XSEG_SLEEP_OFFLOAD or XSEG_SLEEP_DISCARD */
} xseg_tag_sleep;

/**
 * Put every pool of @p device that carries one of @p tags to sleep, each as its tag's flags say
 * (xseg_sleep's rules for each pool: its streams waited for, every page given back). The offloading
 * pools sleep first, then the discarding ones, each group in the order given. All or nothing: every
 * pool is checked before any sleeps (known tags, each pool awake, no capture, nothing exported or
 * handed out, expandable segments only), and a sleep that fails wakes the pools this call put to
 * sleep before it, newest first (the discarding ones read zero then, as after their wake).
 * A tagged pool that allocated nothing on the device is left alone.
 * @param device a device index.
 * @param tags   @p count tags, each with XSEG_SLEEP_OFFLOAD or XSEG_SLEEP_DISCARD, no tag twice.
 * @param count  how many (at least 1).
 * @return XSEG_ERROR_INVALID_VALUE for bad flags (XSEG_SLEEP_OFFLOAD_FILE: use xseg_sleep_ex per
 *         pool), a malformed or repeated tag, or a tag no pool of @p device carries (the message
 *         lists the device's tags); otherwise as xseg_sleep, the message naming the pool and its
 *         tag, and whether the pools slept before were woken again.
 */
XSEG_API xseg_status xseg_sleep_tags(int device, const xseg_tag_sleep *tags, size_t count);

/**
 * Wake the sleeping pools of @p device that carry @p tags: every pool of the first tag, then of
 * the second, and so on (xseg_wake's rules for each). Pools of these tags that are awake are left
 * alone, so a wake that failed part way is retried with the same call.
 * @param device a device index.
 * @param tags   @p count tags, no tag twice.
 * @param count  how many (at least 1).
 * @return XSEG_ERROR_INVALID_VALUE for a malformed, repeated or unknown tag;
 *         XSEG_ERROR_ILLEGAL_STATE when no pool of these tags sleeps (or one is going to sleep or
 *         waking in another thread); otherwise as xseg_wake, at the first pool that fails: the
 *         pools woken before it stay awake, it and the rest stay asleep (the message names them).
 */
XSEG_API xseg_status xseg_wake_tags(int device, const char *const *tags, size_t count);

/** What sleeps, for one pool or a whole device (xseg_get_sleep_stats). */
typedef struct xseg_sleep_stats {
    int asleep;              /**< pools asleep: 0 or 1 for one pool, the count for a device */
    unsigned flags;          /**< one pool: the flags of its sleep (0 while awake) */
    size_t released_bytes;   /**< device memory given back by the sleeps in force: every page the
                                  pool had mapped, live and cached */
    size_t offloaded_bytes;  /**< bytes of live blocks kept in pinned host memory for the wake */
    size_t discarded_bytes;  /**< bytes of live blocks dropped (they read zero after the wake) */
    int64_t num_sleeps;      /**< sleeps completed on the device so far */
    int64_t num_wakes;       /**< wakes completed on the device so far */
} xseg_sleep_stats;

/**
 * The sleep statistics of @p pool on @p device, or of every pool of the device when @p pool is
 * NULL (sums; num_sleeps and num_wakes are the device's either way).
 * @param device a device index.
 * @param pool   a pool ({0, 0}: the default pools), or NULL for every pool of the device.
 * @param stats  receives the figures.
 * @return XSEG_ERROR_INVALID_VALUE for a NULL @p stats or a private pool unknown on @p device.
 */
XSEG_API xseg_status xseg_get_sleep_stats(int device, const xseg_pool_id *pool, xseg_sleep_stats *stats);

/* ---------------------------------------------------------------------------------------------
 * Pinned host memory: a caching allocator of page-locked host memory (PyTorch's
 * CachingHostAllocator, for torch's pin_memory and KV-cache offload), which also holds the
 * backups of sleeping pools (XSEG_SLEEP_OFFLOAD). Sizes are rounded to 512 B (not to powers of
 * two); a cached block is reused once the streams that used it are done (events recorded at the
 * free, queried, never waited for). Config keys: pinned_use_cuda_host_register,
 * pinned_num_register_threads, pinned_use_background_threads, sleep_keep_host_backup.
 * ------------------------------------------------------------------------------------------- */

/**
 * Allocate @p size bytes of pinned (page-locked, portable) host memory.
 * @param ptr  receives the block (NULL on failure).
 * @param size bytes; 0 gives a 512-byte block.
 * @return XSEG_ERROR_INVALID_VALUE for a NULL @p ptr; XSEG_ERROR_OUT_OF_MEMORY when the driver has
 *         no pinned memory left (after giving back every free cached segment) or host memory
 *         runs out, with the size in the message; nothing changes then.
 */
XSEG_API xseg_status xseg_host_malloc(void **ptr, size_t size);

/**
 * Return a block of xseg_host_malloc to the cache. NULL is a no-op. A block given to
 * xseg_host_record_stream is reused only once the work queued on those streams up to this free
 * has completed. With debug_stale_access on it is then quarantined (xseg_stale_report).
 * @param ptr a block of xseg_host_malloc.
 * @return XSEG_ERROR_INVALID_VALUE (pointer in the message) for a pointer the host allocator did
 *         not return or freed already; nothing changes then.
 */
XSEG_API xseg_status xseg_host_free(void *ptr);

/**
 * Mark the pinned block @p ptr as used by @p stream (a copy from or to it): its free waits for
 * that stream's work.
 * @param ptr    a block of xseg_host_malloc (its start).
 * @param device the device whose context owns @p stream.
 * @param stream the stream (NULL: the legacy stream).
 * @return XSEG_ERROR_INVALID_VALUE for a pointer that is not a live host block;
 *         XSEG_ERROR_INVALID_DEVICE for a bad @p device; nothing is recorded then.
 */
XSEG_API xseg_status xseg_host_record_stream(void *ptr, int device, struct CUstream_st *stream);

/**
 * Give every wholly free cached pinned segment back to the driver, the backups kept by
 * sleep_keep_host_backup:True included (first returning the blocks whose streams are done).
 * @return the first driver failure (what failed stays cached and is retried by the next call).
 */
XSEG_API xseg_status xseg_host_empty_cache(void);

/**
 * One statistic of the host allocator by its key in torch.cuda.host_memory_stats():
 * "allocation.current", "segment.peak", "allocated_bytes.allocated", "reserved_bytes.freed",
 * "host_alloc_time.total" (microseconds; .max, .min, .count, .avg), "num_host_alloc",
 * "num_host_free", ...
 * @param key   the key.
 * @param value receives its value.
 * @return XSEG_ERROR_INVALID_VALUE for an unknown key (named in the message).
 */
XSEG_API xseg_status xseg_host_stat(const char *key, int64_t *value);

/**
 * Enumerate the keys xseg_host_stat accepts, in a stable order.
 * @param index 0, 1, ...
 * @param key   receives the index-th key (a static string), or NULL past the last one.
 */
XSEG_API xseg_status xseg_host_stat_key(size_t index, const char **key);

/**
 * Reset each peak of the host allocator's statistics to its current value, and the max and min
 * of host_alloc_time and host_free_time to 0 (torch.cuda.reset_peak_host_memory_stats()).
 * @return XSEG_SUCCESS.
 */
XSEG_API xseg_status xseg_host_reset_peak_stats(void);

/**
 * Zero the host allocator's accumulated statistics: the ".allocated" and ".freed" of each counter,
 * the total and count of host_alloc_time and host_free_time, num_host_alloc and num_host_free
 * (torch.cuda.reset_accumulated_host_memory_stats()). Current values and peaks stay.
 * @return XSEG_SUCCESS.
 */
XSEG_API xseg_status xseg_host_reset_accumulated_stats(void);

/* ---------------------------------------------------------------------------------------------
 * Memory groups (docs/services.md): processes on one device that set the same memory_group:NAME
 * publish their figures in a shared table and give cached memory way to a member whose malloc
 * would fail. A member installs a SIGBUS handler that takes only a fault on a table's pages (the
 * file truncated by another process): any other SIGBUS, a fault or one a process sent, gets the
 * disposition the process had before (its handler, ignored, or death by the signal).
 * ------------------------------------------------------------------------------------------- */

/** One member of a memory group, as it last published itself (at most ~100 ms old). */
typedef struct xseg_group_member {
    int pid;                    /**< the member's process id */
    uint32_t ask_timeouts;      /**< its asks in which a member asked gave no answer within
                                     memory_group_wait_ms and its grace (modulo 2^32; added in
                                     the padding after pid: the struct's size and offsets are
                                     unchanged) */
    uint64_t reserved_bytes;    /**< device memory xseg holds for it (reserved_bytes.all.current) */
    uint64_t allocated_bytes;   /**< of which live allocations (allocated_bytes.all.current) */
    uint64_t reclaimable_bytes; /**< reserved but unallocated: what it could give way */
    uint64_t budget_bytes;      /**< its memory_budget_mb, capped at the device; 0: none */
    uint64_t gave_way_count;    /**< requests it answered by giving memory back */
    uint64_t gave_way_bytes;    /**< bytes it gave back to other members */
    uint64_t asked_count;       /**< times it asked the group to give way */
    uint64_t foreign_bytes;     /**< its estimate of device memory it holds outside xseg (CUDA
                                     context, libraries' buffers), from cuMemGetInfo at its join,
                                     growth and OOM, less what the members publish (docs/services.md) */
    uint64_t group_budget_bytes; /**< the group's memory_group_budget_mb (its first member's); 0: none */
} xseg_group_member;

/**
 * The members of the memory group @p device is in (this process included).
 * @param device   a device index this process has used with memory_group set.
 * @param members  receives up to @p capacity members (may be NULL when @p capacity is 0).
 * @param capacity the room in @p members.
 * @param count    receives the number of live members (which may exceed @p capacity).
 * @return XSEG_ERROR_ILLEGAL_STATE when the device is in no group, or went on alone (the message
 *         says why: a corrupted table, another user's table, a full group);
 *         XSEG_ERROR_INVALID_VALUE for NULL arguments; XSEG_ERROR_INVALID_DEVICE for a bad index.
 */
XSEG_API xseg_status xseg_group_stats(int device, xseg_group_member *members, size_t capacity, size_t *count);

/**
 * The members of any memory group table of this user, by its name in /dev/shm
 * ("xseg-group-<device uuid>-<group>"), without joining it or loading the driver (xseg-top).
 * @param table    the table's name in /dev/shm.
 * @param members  receives up to @p capacity members (may be NULL when @p capacity is 0).
 * @param capacity the room in @p members.
 * @param count    receives the number of live members.
 * @return XSEG_ERROR_INVALID_VALUE naming the table and what is wrong (not a table name, missing,
 *         another user's, corrupted: the field named).
 */
XSEG_API xseg_status xseg_group_read(const char *table, xseg_group_member *members, size_t capacity,
                                     size_t *count);

#ifdef __cplusplus
}
#endif

/* PyTorch's pluggable-allocator entry points (xseg_torch_*) have their own header, included here
 * so that code written against xseg.h alone compiles unchanged. */
#include "xseg_torch.h"

#endif /* XSEG_H */
