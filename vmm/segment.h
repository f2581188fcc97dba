/*
 * Expandable segments: one virtual-address range per (device, stream, pool) into which physical
 * pages are mapped on demand.
 *
 * A segment is a contiguous VA range [base, base + va_size) made of one or more driver
 * reservations laid end to end. Each page (page_size bytes, a multiple of the device's
 * granularity) is either unmapped, or mapped to its own cuMemCreate handle so that any page can
 * be unmapped alone. The block allocator above decides which byte ranges are live; this module
 * only maps and unmaps whole pages and never reads device memory. Metadata lives in host memory.
 *
 * Locking: a segment belongs to one device allocator; callers hold that device's lock.
 * Context: the segment retains its device's primary context at seg_create and makes it current
 * (drv_ctx_ensure) on the calling thread in every function that calls the driver; callers need
 * not set one, and find it current afterwards.
 * Errors: every function returns XSEG_SUCCESS or an xseg status with the message set; on failure
 * nothing has changed (all driver work of the failed call is rolled back).
 */
#ifndef XSEG_VMM_SEGMENT_H
#define XSEG_VMM_SEGMENT_H

#include <cuda.h>

#include "base/common.h"

struct seg;

/* Reservation policy (vmm/README.md): a new segment reserves max(min_size, SEG_INITIAL_PAGES
 * pages) of VA; seg_grow reserves directly after the end a piece of max(needed, min(VA so far,
 * SEG_GROW_STEP_MAX)) bytes, so a segment holds at most about twice its extent in O(log) pieces.
 * Every piece is a multiple of lcm(page_size, SEG_VA_ALIGN): the H100's driver (13.0) honours an
 * address hint for a reservation of 32 MiB or more only at a 32 MiB-aligned address. */
#define SEG_INITIAL_PAGES 16
#define SEG_VA_ALIGN ((size_t)32 << 20)
#define SEG_GROW_STEP_MAX ((size_t)16 << 30)
/* seg_create places the initial piece at the start of a free hole of at least this many bytes
 * more (found by a probe reservation given straight back), so that growth has room. */
#define SEG_GROW_ROOM ((size_t)16 << 30)

struct seg_params {
    int device;             /* xseg device index (also the CUDA ordinal) */
    CUdevice cudev;
    CUstream stream;        /* synchronized before pages are unmapped */
    size_t page_size;       /* 2 MiB small pool, large_segment_size_mb for the large pool */
    const int *peers;       /* devices given read-write access as well (copied) */
    int npeers;
    /* Issue 15: shareable handle types every page is created with (CUmemAllocationHandleType
     * bits; CU_MEM_HANDLE_TYPE_NONE: not exportable). Chosen by ipc_handle_types (vmm/ipc.h). */
    unsigned handle_types;
    /* Issue 15: called after pages [first, last) of the segment were mapped (access granted), and
     * before they are unmapped (then again with mapped = 1 for pages a failed unmap left mapped),
     * so that memory registrations can follow the mappings. Runs never span two reservation
     * pieces. NULL: no calls. It must not call into the segment. */
    void (*observe)(void *user, struct seg *seg, size_t first, size_t last, int mapped);
    void *observe_user;
};

/*
 * Create a segment able to hold at least @p min_size bytes (rounded up to pages) without moving.
 * Reserves VA only; maps nothing. The reservation policy (initial size, growth) is documented in
 * docs/design.md; it never reserves a multiple of device memory up front.
 */
xseg_status seg_create(const struct seg_params *params, size_t min_size, struct seg **out);

/* Unmap and release every page still mapped (after synchronizing the stream), free every
 * reservation, free the metadata. NULL is a no-op. Never fails visibly: driver errors are
 * reported through the return value but the segment is gone either way. */
xseg_status seg_destroy(struct seg *seg);

/*
 * Make sure the VA range covers [0, @p size) of the segment, reserving more address space
 * directly after the current end. Fails with XSEG_ERROR_OUT_OF_MEMORY (message says the
 * address space could not be had contiguously) when the driver places the new range elsewhere;
 * the caller then starts a new segment. Never moves base.
 */
xseg_status seg_grow(struct seg *seg, size_t size);

/*
 * Map every unmapped page in [offset, offset + size): offset and size are multiples of
 * page_size and lie inside the current VA range. Creates one handle per page, maps it, and grants
 * access with one cuMemSetAccess per contiguous newly mapped run (and per peer). On any failure
 * every page mapped by this call is unmapped and released again. Pages already mapped are left
 * alone. @p mapped (optional) receives the bytes newly mapped.
 */
xseg_status seg_map(struct seg *seg, size_t offset, size_t size, size_t *mapped);

/*
 * Unmap and release every mapped page in [offset, offset + size) (page multiples), after
 * synchronizing the segment's stream. @p unmapped (optional) receives the bytes unmapped.
 * On a driver failure the pages not yet unmapped stay mapped and usable.
 */
xseg_status seg_unmap(struct seg *seg, size_t offset, size_t size, size_t *unmapped);

/*
 * Driver failures that leave memory with the driver (issue 11). Nothing is forgotten:
 *  - a page whose unmap fails while seg_map rolls back is "stranded": the driver still maps it,
 *    perhaps without access rights, so it counts as unmapped (seg_page_is_mapped is 0, not in
 *    seg_mapped_bytes: it was never handed out); a later seg_map of that page reuses it and
 *    grants access, and seg_reclaim unmaps and releases it;
 *  - a handle whose cuMemRelease fails (the page is unmapped all the same), a page of a destroyed
 *    segment whose unmap fails, a reservation whose cuMemAddressFree fails: kept in a
 *    process-wide list and retried by seg_leftovers_retry.
 * The allocator runs both on every reclaim (empty_cache, the OOM path).
 */
/* Unmap and release the stranded pages of @p seg. On a failure they stay stranded. */
xseg_status seg_reclaim(struct seg *seg);
/* Retry every leftover (unmaps, then releases, then address frees), with each one's device's
 * primary context made current (the calling thread's current context may change). What fails
 * again stays for the next retry; the first failure is reported. Thread-safe. */
xseg_status seg_leftovers_retry(void);
/* Leftovers waiting for a retry (tests, diagnostics). */
size_t seg_leftovers_pending(void);
/* seg_unmap without the synchronize, for callers that know every use of these pages on the GPU
 * has completed (services, core/trim.c: the stream was queried idle). */
xseg_status seg_unmap_idle(struct seg *seg, size_t offset, size_t size, size_t *unmapped);

/*
 * Sleep and wake (services, core/sleep.c): give back the physical memory of every mapped page of
 * a segment while its virtual addresses stay reserved, and map pages at the same addresses again.
 * The caller has waited for every use of the pages on the GPU and copied what it keeps. A pool
 * of several segments sleeps in two steps, so that one segment's failure can undo the others:
 *  - seg_sleep_unmap: unmap every mapped page (announced to the observer first), keeping its
 *    handle, so the memory and its bytes still exist; the pages are asleep. On a failed unmap the
 *    pages unmapped so far stay asleep (and held) and the error comes back: seg_sleep_undo.
 *  - seg_sleep_undo: map the held pages back with their own handles and access (the bytes are
 *    intact), announcing each. A page that cannot be mapped back stays asleep and held: a wake
 *    maps it, so nothing is lost; the first failure is returned.
 *  - seg_sleep_commit: release the held handles: the memory goes back to the driver (a failed
 *    release is kept for seg_leftovers_retry).
 * Asleep pages are neither mapped (seg_page_is_mapped, seg_mapped_bytes) nor unmapped: seg_map
 * refuses them, seg_unmap and seg_reclaim leave them alone, seg_destroy releases held handles.
 * @p unmapped / @p remapped receive the bytes.
 */
xseg_status seg_sleep_unmap(struct seg *seg, size_t *unmapped);
xseg_status seg_sleep_undo(struct seg *seg, size_t *remapped);
void seg_sleep_commit(struct seg *seg);
/*
 * Map every asleep page at its address again (its held handle, else a new cuMemCreate) and grant
 * access to the owner and peers (one cuMemSetAccess per run, per piece). The new contents are
 * whatever the driver gives (the caller restores or clears them). On failure every page this
 * call mapped is unmapped again (new handles released, held ones kept): all asleep as before.
 * Announced to the observer on success. seg_wake_undo puts the pages of a successful
 * seg_wake_map back to sleep (a later step of the pool's wake failed); seg_wake_commit ends the
 * wake (its scratch flags). @p mapped receives the bytes mapped.
 */
xseg_status seg_wake_map(struct seg *seg, size_t *mapped);
xseg_status seg_wake_undo(struct seg *seg);
void seg_wake_commit(struct seg *seg);
size_t seg_asleep_bytes(const struct seg *seg);  /* bytes of asleep pages */
int seg_page_is_asleep(const struct seg *seg, size_t page_index);

/* Grant @p peer read-write access to every mapped page, and to pages mapped from now on: one
 * cuMemSetAccess per run of mapped pages (new mappings get one call for the owner and every peer
 * together). */
xseg_status seg_add_peer(struct seg *seg, int peer);

/* Accessors. */
/* Issue 15: the cuMemCreate handle of page @p page_index (0 when unmapped or out of range). It
 * stays owned by the segment: export or retain it, never release it. */
CUmemGenericAllocationHandle seg_page_handle(const struct seg *seg, size_t page_index);
unsigned seg_handle_types(const struct seg *seg);
int seg_device(const struct seg *seg);
size_t seg_npages(const struct seg *seg);
/* Call params.observe for every run of mapped pages (within a piece), as if just mapped:
 * a new observer learns the current mappings. */
void seg_replay_mapped(const struct seg *seg, void (*fn)(void *user, struct seg *seg, size_t first, size_t last, int mapped),
                       void *user);
CUdeviceptr seg_base(const struct seg *seg);
size_t seg_va_size(const struct seg *seg);      /* bytes of VA reserved, a page multiple */
size_t seg_page_size(const struct seg *seg);
size_t seg_mapped_bytes(const struct seg *seg); /* bytes currently mapped */
size_t seg_stranded_bytes(const struct seg *seg); /* bytes of stranded pages (see seg_reclaim) */
int seg_page_is_mapped(const struct seg *seg, size_t page_index);

#endif
