/* Public: private pools and CUDA-graph capture (the routes and pools live in core/policy/pools.c). */
#include <stdatomic.h>

#include "base/error.h"
#include "core/alloc.h"
#include "core/policy/pools.h"
#include "core/runtime.h"

/* First word of the ids xseg_pool_create hands out ("xseg"): keeps them apart from PyTorch's own
 * ids ({uid, 0} for graphs, {0, uid} for graph_pool_handle / MemPool) in a process using both. */
#define POOLS_ID_TAG UINT64_C(0x78736567)

static _Atomic uint64_t pools_seq;

static inline bool id_is_default(xseg_pool_id id) { return id.first == 0 && id.second == 0; }

XSEG_API xseg_status xseg_pool_create(xseg_pool_id *id)
{
    if (!id)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_create: id is NULL");
    id->first = POOLS_ID_TAG;
    id->second = atomic_fetch_add(&pools_seq, 1) + 1;
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_begin_allocate_to_pool(int device, xseg_pool_id pool, xseg_stream_filter filter,
                                                 void *user)
{
    if (id_is_default(pool))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_begin_allocate_to_pool: pool {0, 0} is the default pool; use xseg_pool_create");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : pools_begin(d, pool, filter, user);
}

XSEG_API xseg_status xseg_end_allocate_to_pool(int device, xseg_pool_id pool)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : pools_end(d, pool);
}

XSEG_API xseg_status xseg_release_pool(int device, xseg_pool_id pool)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : pools_release(d, pool);
}

XSEG_API xseg_status xseg_pool_use_count(int device, xseg_pool_id pool, int *count)
{
    if (!count)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_use_count: count is NULL");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st != XSEG_SUCCESS)
        return st;
    *count = pools_use_count(d, pool);
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_pool_live_blocks(int device, xseg_pool_id pool, void **ptrs, size_t cap, size_t *n)
{
    if (!n)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_live_blocks: n is NULL");
    if (cap && !ptrs)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_live_blocks: ptrs is NULL with cap %zu", cap);
    if (id_is_default(pool))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_pool_live_blocks: pool {0, 0} is the default pool; name a private pool");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : pools_live_blocks(d, pool, ptrs, cap, n);
}

XSEG_API xseg_status xseg_pool_retain(int device, xseg_pool_id pool)
{
    if (id_is_default(pool))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_pool_retain: pool {0, 0} is the default pool; use xseg_pool_create");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : pools_retain(d, pool);
}

XSEG_API xseg_status xseg_pool_retain_owned(int device, xseg_pool_id pool, const xseg_pool_allocator *owner)
{
    if (id_is_default(pool))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_pool_retain_owned: pool {0, 0} is the default pool; use xseg_pool_create");
    if (!owner)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_retain_owned: owner is NULL");
    if (!owner->alloc || !owner->free)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_retain_owned: owner->%s is NULL (alloc and free are required)",
                       !owner->alloc ? "alloc" : "free");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : pools_retain_owned(d, pool, owner);
}

XSEG_API xseg_status xseg_pool_malloc_at(int device, xseg_pool_id pool, void *ptr, size_t size)
{
    if (id_is_default(pool))
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_malloc_at: pool {0, 0} is the default pool");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : alloc_malloc_at(d, pool, (uintptr_t)ptr, size);
}

XSEG_API xseg_status xseg_capture_begin(int device, struct CUstream_st *stream, xseg_pool_id *pool,
                                        int capture_mode)
{
    if (!pool)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_capture_begin: pool is NULL");
    if (!stream)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_capture_begin: the legacy default stream (NULL) cannot be captured; use a stream "
                       "of your own");
    if (capture_mode != CU_STREAM_CAPTURE_MODE_GLOBAL && capture_mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_capture_begin: capture mode %d is not GLOBAL (0), THREAD_LOCAL (1) or RELAXED (2)",
                       capture_mode);
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st != XSEG_SUCCESS)
        return st;
    xseg_pool_id id = *pool;
    if (id_is_default(id))
        (void)xseg_pool_create(&id);
    st = pools_capture_begin(d, stream, id, capture_mode);
    if (st == XSEG_SUCCESS)
        *pool = id;
    return st;
}

XSEG_API xseg_status xseg_capture_end(int device, struct CUstream_st *stream, struct CUgraph_st **graph)
{
    if (!graph)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_capture_end: graph is NULL");
    *graph = NULL;
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : pools_capture_end(d, stream, graph);
}

/* ---- PyTorch pluggable hooks (void(int, MempoolId_t)) -------------------------------------- */

XSEG_API void xseg_torch_end_allocate_to_pool(int device, xseg_pool_id id)
{
    (void)xseg_end_allocate_to_pool(device, id);
}

XSEG_API void xseg_torch_release_pool(int device, xseg_pool_id id) { (void)xseg_release_pool(device, id); }
