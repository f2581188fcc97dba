/*
 * Private pools and CUDA-graph capture (pools.c): allocate-to-pool routes, the capture pair,
 * release and reaping. The structs (struct priv_pool, struct pool_route) are in device.h.
 */
#ifndef XSEG_CORE_POOLS_H
#define XSEG_CORE_POOLS_H

#include "core/device/device.h"

/* The public pool operations (api/pools.c checks the arguments first). Each takes the device lock
 * itself; the capture pair makes its driver calls with the lock released. */
xseg_status pools_begin(struct dev_alloc *d, xseg_pool_id pool, xseg_stream_filter filter, void *user);
xseg_status pools_end(struct dev_alloc *d, xseg_pool_id pool);
xseg_status pools_release(struct dev_alloc *d, xseg_pool_id pool);
int pools_use_count(struct dev_alloc *d, xseg_pool_id pool);
/* The private pool @p id of @p d, or NULL (lock held). */
struct priv_pool *pools_find(struct dev_alloc *d, xseg_pool_id id);
/* The addresses of @p pool's allocated blocks, all streams and both sizes (snprintf-style: at most
 * @p cap written, @p n receives how many); XSEG_ERROR_INVALID_VALUE for a pool unknown on @p d.
 * Takes the lock and walks the pool's blocks: for checks, never the malloc/free path. */
xseg_status pools_live_blocks(struct dev_alloc *d, xseg_pool_id pool, void **ptrs, size_t cap, size_t *n);
/* Add a use to @p pool, creating it (no route). */
xseg_status pools_retain(struct dev_alloc *d, xseg_pool_id pool);
/* pools_retain for a pool of @p owner's memory (xseg_pool_retain_owned; api/ checked @p owner):
 * XSEG_ERROR_INVALID_VALUE when @p pool exists with another allocator or none. */
xseg_status pools_retain_owned(struct dev_alloc *d, xseg_pool_id pool, const xseg_pool_allocator *owner);
/* Route @p id's pool to the capture of @p stream, then begin it in @p capture_mode. */
xseg_status pools_capture_begin(struct dev_alloc *d, CUstream stream, xseg_pool_id id, int capture_mode);
xseg_status pools_capture_end(struct dev_alloc *d, CUstream stream, CUgraph *graph);
/* The private pool for an allocation on @p stream: the newest route that matches it (PyTorch's
 * get_pool checks captures_underway in LIFO order), or NULL for the default pools. Fails only
 * when the driver cannot tell a stream's capture. */
xseg_status pools_select(struct dev_alloc *d, CUstream stream, struct priv_pool **out);
/* Free the structs of pools with no users and no segments left. */
void pools_reap(struct dev_alloc *d);
/* xseg_shutdown, once no route is left and every pool was released: forget the pools and free
 * the route list (lock held). */
void pools_destroy(struct dev_alloc *d);
/* Bytes cached free in private pools (the OOM message's "allocated in private pools"). */
size_t pools_cached_bytes(struct dev_alloc *d);

#endif
