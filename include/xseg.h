/*
 * xseg — a CUDA caching allocator over expandable (virtual-memory) segments.
 *
 * This is the only public header. It compiles on its own, as C99 or later and as C++, without
 * the CUDA headers: streams are taken as `struct CUstream_st *`, which is the same type as the
 * driver's CUstream and the runtime's cudaStream_t. A NULL stream is the legacy default stream.
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
#define XSEG_API_VERSION_MINOR 1
#define XSEG_API_VERSION_PATCH 0

struct CUstream_st;
struct CUgraph_st;

/** Result of every fallible call. */
typedef enum xseg_status {
    XSEG_SUCCESS = 0,
    XSEG_ERROR_INVALID_VALUE = 1,  /**< a bad argument: pointer, size, config string, key */
    XSEG_ERROR_OUT_OF_MEMORY = 2,  /**< the device (or the memory fraction) cannot hold it */
    XSEG_ERROR_DRIVER = 3,         /**< the CUDA driver failed or could not be loaded */
    XSEG_ERROR_INVALID_DEVICE = 4, /**< a device index out of range */
    XSEG_ERROR_ILLEGAL_STATE = 5,  /**< not allowed now (e.g. during stream capture) */
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
 *         XSEG_ERROR_DRIVER when the driver cannot be loaded or initialized.
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

/** Number of CUDA devices the driver reports. */
XSEG_API xseg_status xseg_device_count(int *count);

/* ---------------------------------------------------------------------------------------------
 * Allocation
 * ------------------------------------------------------------------------------------------- */

/**
 * Allocate device memory on @p device for use on @p stream.
 * A block is reused only by allocations on the stream it was allocated on.
 * @param ptr    receives the device address (NULL for size 0).
 * @param size   bytes; 0 gives *ptr = NULL and XSEG_SUCCESS.
 * @param device device index, 0 .. count-1.
 * @param stream the stream the memory will be used on (NULL: the legacy default stream).
 * @return XSEG_ERROR_OUT_OF_MEMORY after the recovery path (free-memory callbacks, cache release,
 *         retry) fails; the message gives requested size, capacity, free, allocated, reserved.
 */
XSEG_API xseg_status xseg_malloc(void **ptr, size_t size, int device, struct CUstream_st *stream);

/**
 * Return memory from xseg_malloc to the cache. NULL is a no-op.
 * @return XSEG_ERROR_INVALID_VALUE (pointer in the message) for a pointer xseg did not return or
 *         freed already; nothing changes then.
 */
XSEG_API xseg_status xseg_free(void *ptr);

/**
 * Mark @p ptr as used on @p stream: when it is freed, its memory is reused only after the work
 * queued on @p stream up to the free has completed. Recording the allocation's own stream is a
 * no-op.
 */
XSEG_API xseg_status xseg_record_stream(void *ptr, struct CUstream_st *stream);

/**
 * Release cached memory to the driver: every unused segment (classic mode), and every page that
 * holds no live byte (expandable mode), even inside segments still in use.
 * Waits for pending cross-stream frees first. Releases nothing while a stream capture is underway.
 * @param device a device index, or -1 for every initialized device.
 */
XSEG_API xseg_status xseg_empty_cache(int device);

/**
 * Cap what xseg may reserve on @p device at @p fraction of its total memory.
 * @param fraction in [0, 1]; 1 removes the cap.
 */
XSEG_API xseg_status xseg_set_memory_fraction(double fraction, int device);

/** Enable access to @p device's memory from @p peer (existing and future segments). */
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
 * @param index 0, 1, ...; @p key receives NULL past the last one.
 */
XSEG_API xseg_status xseg_stat_key(size_t index, const char **key);

/** Reset every .peak to .current, for @p device (-1: all). */
XSEG_API xseg_status xseg_reset_peak_stats(int device);

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
 * @param pool   any id but {0, 0} (xseg_pool_create, or PyTorch's ids through the torch hooks).
 * @param filter the streams to route; NULL routes every stream.
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
 * Begin capturing @p stream into a CUDA graph (cuStreamBeginCapture with @p capture_mode, a
 * CUstreamCaptureMode / cudaStreamCaptureMode value) and route the allocations of that capture
 * to a private pool: those on @p stream and on every stream that joins the same capture.
 * @param pool in: the pool to use ({0, 0}: a new one); out: the pool used. Release it with
 *             xseg_release_pool once the graph is destroyed, whether the capture succeeded or not.
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
 * routing its allocations. Routing stops even when the driver reports the capture invalidated.
 * @param graph receives the captured graph (NULL when the capture failed); destroy it with
 *              cuGraphDestroy / cudaGraphDestroy.
 * @return XSEG_ERROR_ILLEGAL_STATE when @p stream has no capture begun by xseg_capture_begin;
 *         XSEG_ERROR_DRIVER when cuStreamEndCapture fails.
 */
XSEG_API xseg_status xseg_capture_end(int device, struct CUstream_st *stream, struct CUgraph_st **graph);

/* ---------------------------------------------------------------------------------------------
 * PyTorch pluggable-allocator entry points:
 *   torch.cuda.memory.CUDAPluggableAllocator("libxseg.so", "xseg_torch_malloc", "xseg_torch_free")
 * They report failures through xseg_last_error() and return NULL / nothing.
 * ------------------------------------------------------------------------------------------- */

XSEG_API void *xseg_torch_malloc(size_t size, int device, struct CUstream_st *stream);
XSEG_API void xseg_torch_free(void *ptr, size_t size, int device, struct CUstream_st *stream);
XSEG_API void xseg_torch_init(int device_count);
XSEG_API void xseg_torch_empty_cache(void);
XSEG_API void xseg_torch_set_memory_fraction(double fraction, int device);
XSEG_API void xseg_torch_record_stream(void *ptr, struct CUstream_st *stream);

/*
 * Private-pool hooks, for allocator.set_end_allocate_to_pool_fn / set_release_pool. They take
 * (int, MempoolId_t): a struct of two 64-bit integers passed by value has the same calling
 * convention as std::pair<unsigned long long, unsigned long long> (Itanium C++ ABI).
 *
 * set_begin_allocate_to_pool takes a std::function<void(int, MempoolId_t,
 * std::function<bool(cudaStream_t)>)>, which no C function can be. Without it, xseg refuses
 * allocations on a capturing stream (XSEG_ERROR_ILLEGAL_STATE), so torch.cuda.graph() fails
 * cleanly instead of capturing into the default pool. To capture graphs through the pluggable
 * allocator, register a small C++ adapter as the begin hook: keep the std::function filter alive
 * (e.g. in a map keyed by the pool id, erased by the end hook) and call
 * xseg_begin_allocate_to_pool(device, {id.first, id.second}, trampoline, &filter), where
 * trampoline(stream, user) returns (*(std::function<bool(cudaStream_t)> *)user)(stream).
 */
XSEG_API void xseg_torch_end_allocate_to_pool(int device, xseg_pool_id id);
XSEG_API void xseg_torch_release_pool(int device, xseg_pool_id id);

#ifdef __cplusplus
}
#endif

#endif /* XSEG_H */
