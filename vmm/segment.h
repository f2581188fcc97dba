/*
 * Expandable segments: one virtual-address range per (device, stream, pool) into which physical
 * memory is mapped on demand.
 *
 * A segment is a contiguous VA range [base, base + va_size) made of one or more driver
 * reservations laid end to end. The VA is divided into granules (the device's VMM granularity,
 * 2 MiB on current GPUs). Physical memory comes in chunks: one cuMemCreate handle each, a whole
 * number of granules, mapped whole at one place (the driver maps a handle only whole), never
 * across two reservations. A chunk is unmapped only whole, so chunk boundaries are where memory
 * can later be given back: the caller chooses them when it maps (seg_map's max_chunk and cut).
 * The block allocator above decides which byte ranges are live; this module only maps and
 * unmaps chunks and never reads device memory. Metadata lives in host memory.
 *
 * "Page" below is the caller's rounding unit (seg_params.page_size: 2 MiB for the small pool,
 * expandable_page_size_mb for the large one): VA pieces are multiples of it, and the allocator
 * rounds growth to it, as PyTorch's expandable segments map whole pages. It does not constrain
 * chunks, which are any granule multiple.
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

#include <stdbool.h>

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
    CUstream stream;        /* synchronized before memory is unmapped */
    size_t page_size;       /* the caller's rounding unit, a multiple of the granularity */
    const int *peers;       /* devices given read-write access as well (copied) */
    int npeers;
    /* Shareable handle types every chunk is created with (CUmemAllocationHandleType bits;
     * CU_MEM_HANDLE_TYPE_NONE: not exportable). Chosen by ipc_handle_types (vmm/ipc.h). */
    unsigned handle_types;
    /* Called after granules [first, last) of the segment were mapped (access granted), and before
     * they are unmapped (then again with mapped = 1 for chunks a failed unmap left mapped), so that
     * memory registrations can follow the mappings. Ranges are whole chunks and never span two
     * reservation pieces. NULL: no calls. It must not change the segment. */
    void (*observe)(void *user, struct seg *seg, size_t first, size_t last, int mapped);
    void *observe_user;
    /* Chunks are created GPUDirect-RDMA capable where the device supports it with VMM memory;
     * with require_rdma a device without it is XSEG_ERROR_NOT_SUPPORTED (gpu_direct_rdma:True);
     * with rdma_off never (expandable_segments_rdma:False; the config never sets both). */
    bool require_rdma;
    bool rdma_off;
};

/*
 * Create a segment able to hold at least @p min_size bytes (rounded up to pages) without moving.
 * Reserves VA only; maps nothing. The reservation policy (initial size, growth) is documented in
 * vmm/README.md; it never reserves a multiple of device memory up front.
 */
xseg_status seg_create(const struct seg_params *params, size_t min_size, struct seg **out);

/* Unmap and release every chunk still mapped (after synchronizing the stream), free every
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
 * Map every unmapped granule in [offset, offset + size) (granule multiples inside the VA range).
 * Each unmapped run is cut into chunks of at most @p max_chunk bytes (0: no limit) counted from
 * the run's start, and never across offset @p cut (SIZE_MAX: none) or a reservation piece; each
 * chunk is one cuMemCreate + cuMemMap, and each run of new chunks inside a piece gets one
 * cuMemSetAccess (for the owner and every peer). Chunks already mapped are left alone; a stranded
 * chunk (seg_reclaim) that lies inside the range is used again, one that crosses its edge is
 * released first. On any failure every chunk mapped by this call is unmapped and released again.
 * @p mapped and @p chunks (optional) receive the bytes newly mapped and the chunks they came in.
 */
xseg_status seg_map(struct seg *seg, size_t offset, size_t size, size_t max_chunk, size_t cut, size_t *mapped,
                    size_t *chunks);

/*
 * Handles kept for reuse (pytorch#166116): under memory pressure the allocator gives cached
 * chunks back and at once maps new ones for the growth that needed them. Kept in a seg_spares
 * list, an unmapped handle is mapped again by that growth (cuMemUnmap + cuMemMap) instead of
 * being released and a new one created (for a 20 MiB page, cuMemRelease + cuMemCreate took 29 us
 * on an H100 against 16 us for cuMemUnmap + cuMemMap: benchmarks/bench_vmm_costs.c,
 * docs/gpu-h100/vmm_costs.txt). One list per device, shared by all its segments (any stream,
 * any pool): a handle is only device memory of a size. The caller owns the list, fills it with
 * seg_unmap_keep, passes it to seg_map_from, and empties it with seg_spares_drain before its lock
 * is given back, so kept handles never outlive the operation that made them.
 */
struct seg_spare {
    CUmemGenericAllocationHandle handle;
    size_t bytes;
    CUdevice dev;          /* the handle's properties: only a segment creating the same takes it */
    unsigned handle_types;
    unsigned rdma;
};
struct seg_spares {
    struct seg_spare *v;
    size_t n, cap;
    size_t reused; /* handles mapped again instead of created, since the list was made */
};

/* seg_unmap_idle, keeping the handle of every chunk it unmaps in @p keep (when there is no host
 * memory to list it, the handle is released as seg_unmap_idle does). */
xseg_status seg_unmap_keep(struct seg *seg, size_t offset, size_t size, struct seg_spares *keep, size_t *unmapped,
                           size_t *chunks);
/* seg_map, taking each chunk's handle from @p spares (NULL: none) where one of the chunk's exact
 * size and properties is kept there, else from cuMemCreate; a cuMemCreate refused for lack of
 * memory while handles are kept releases them all (seg_spares_drain) and tries once more. A handle
 * taken from @p spares belongs to the segment from then on (a rollback releases it). */
xseg_status seg_map_from(struct seg *seg, size_t offset, size_t size, size_t max_chunk, size_t cut,
                         struct seg_spares *spares, size_t *mapped, size_t *chunks);
/* Release every handle kept in @p sp (a failed cuMemRelease goes to the leftovers,
 * seg_leftovers_retry) and free the list; @p sp is empty afterwards. */
void seg_spares_drain(struct seg_spares *sp);

/*
 * Unmap and release every mapped chunk that lies wholly inside [offset, offset + size) (granule
 * multiples), after synchronizing the segment's stream; chunks crossing the range's edges stay.
 * One cuMemUnmap per run of adjacent chunks inside a piece, one cuMemRelease per chunk.
 * @p unmapped and @p chunks (optional) receive the bytes and chunks unmapped. On a driver failure
 * the chunks not yet unmapped stay mapped and usable.
 */
xseg_status seg_unmap(struct seg *seg, size_t offset, size_t size, size_t *unmapped, size_t *chunks);
/* seg_unmap without the synchronize, for callers that know every use of this memory on the GPU
 * has completed (the stream was queried idle, or its event completed). */
xseg_status seg_unmap_idle(struct seg *seg, size_t offset, size_t size, size_t *unmapped, size_t *chunks);

/*
 * Re-back the mapped chunk holding granule @p g (more than one granule) with one-granule chunks for
 * the granules @p keep marks (keep[i] for the chunk's i-th granule) and give the others back:
 * under memory pressure this returns the free part of a partly used page, whose live bytes stay
 * at the same addresses. Steps: cuMemCreate of a one-granule chunk per kept granule, each mapped
 * (cuMemMap) at a scratch reservation, cuMemSetAccess (owner), cuCtxSynchronize (every stream's queued work on
 * the old chunk is done), cuMemcpyDtoDAsync of each run of kept granules, cuCtxSynchronize,
 * cuMemUnmap of the old chunk (announced to the observer first), cuMemMap of the new chunks at the
 * old places, cuMemSetAccess per run (owner and peers), cuMemRelease of the old handle, then the
 * scratch range goes (unmap, address free). Until the old handle is released its bytes are
 * intact, so any failure puts the old chunk back as it was (mapped, same handle, access granted):
 * nothing changes and every new handle and the scratch range are given back (a failed give-back
 * goes to the leftovers). Only a failure to map the old handle back after a failed remap is
 * unrecoverable (the live bytes would be gone): abort(). The caller guarantees that no work is
 * queued on this memory by anyone else while the allocator's lock is held (see docs/design.md).
 * With @p host the live bytes are staged in host memory instead (cuMemcpyDtoH, then the old
 * chunk is unmapped and released before the new ones are created, and cuMemcpyHtoD): for a device
 * with no room for the new chunks beside the old one. Its window: if the new chunks cannot be had
 * once the old memory went back (another process took it), a chunk of the old size is mapped
 * again and the bytes restored; only if that fails too are they lost (abort()).
 * @p freed receives the bytes given back, @p created the new chunks (0 and 0 on failure).
 */
xseg_status seg_refine(struct seg *seg, size_t g, const unsigned char *keep, bool host, size_t *freed,
                       size_t *created);

/*
 * Driver failures that leave memory with the driver. Nothing is forgotten:
 *  - a chunk whose unmap fails while seg_map rolls back is "stranded": the driver still maps it,
 *    perhaps without access rights, so it counts as unmapped (seg_gran_is_mapped is 0, not in
 *    seg_mapped_bytes: it was never handed out); a later seg_map over it uses it again and
 *    grants access, and seg_reclaim unmaps and releases it;
 *  - a handle whose cuMemRelease fails (the chunk is unmapped all the same), a chunk of a
 *    destroyed segment whose unmap fails, a reservation whose cuMemAddressFree fails: kept in a
 *    process-wide list and retried by seg_leftovers_retry.
 * The allocator runs both on every reclaim (empty_cache, the OOM path).
 */
/* Unmap and release the stranded chunks of @p seg. On a failure they stay stranded. */
xseg_status seg_reclaim(struct seg *seg);
/* Retry every leftover (unmaps, then releases, then address frees), with each one's device's
 * primary context made current (the calling thread's current context may change). What fails
 * again stays for the next retry; the first failure is reported. Thread-safe. */
xseg_status seg_leftovers_retry(void);
/* Leftovers waiting for a retry (tests, diagnostics). */
size_t seg_leftovers_pending(void);

/*
 * Sleep and wake (services, core/services/sleep.c): give back the physical memory of every mapped chunk
 * of a segment while its virtual addresses stay reserved, and map chunks of the same sizes at the
 * same places again. The caller has waited for every use of the memory on the GPU and copied what
 * it keeps. A pool of several segments sleeps in two steps, so that one segment's failure can
 * undo the others:
 *  - seg_sleep_unmap: unmap every mapped chunk (announced to the observer first, one cuMemUnmap
 *    per run), keeping its handle, so the memory and its bytes still exist; the chunks are
 *    asleep. On a failed unmap the chunks unmapped so far stay asleep (and held) and the error
 *    comes back: seg_sleep_undo.
 *  - seg_sleep_undo: map the held chunks back with their own handles and access (the bytes are
 *    intact), announcing each. A chunk that cannot be mapped back stays asleep and held: a wake
 *    maps it, so nothing is lost; the first failure is returned.
 *  - seg_sleep_commit: release the held handles: the memory goes back to the driver (a failed
 *    release is kept for seg_leftovers_retry).
 * Asleep chunks are neither mapped (seg_gran_is_mapped, seg_mapped_bytes) nor unmapped: seg_map
 * refuses them, seg_unmap and seg_reclaim leave them alone, seg_destroy releases held handles.
 * @p unmapped / @p remapped receive the bytes.
 */
xseg_status seg_sleep_unmap(struct seg *seg, size_t *unmapped);
xseg_status seg_sleep_undo(struct seg *seg, size_t *remapped);
void seg_sleep_commit(struct seg *seg);
/*
 * Map every asleep chunk at its place again (its held handle, else a new cuMemCreate of its size)
 * and grant access to the owner and peers (one cuMemSetAccess per run, per piece). The new
 * contents are whatever the driver gives (the caller restores or clears them). On failure every
 * chunk this call mapped is unmapped again (new handles released, held ones kept): all asleep as
 * before. Announced to the observer on success. seg_wake_undo puts the chunks of a successful
 * seg_wake_map back to sleep (a later step of the pool's wake failed); seg_wake_commit ends the
 * wake (its scratch flags). @p mapped receives the bytes mapped.
 */
xseg_status seg_wake_map(struct seg *seg, size_t *mapped);
xseg_status seg_wake_undo(struct seg *seg);
void seg_wake_commit(struct seg *seg);
size_t seg_asleep_bytes(const struct seg *seg);            /* bytes of asleep chunks */
int seg_gran_is_asleep(const struct seg *seg, size_t g);    /* granule @p g belongs to an asleep chunk */
size_t seg_asleep_chunks(const struct seg *seg);           /* asleep chunks (a walk) */
size_t seg_live_chunks(const struct seg *seg);             /* mapped chunks (a walk) */

/*
 * Spill (core/services/spill.h): move the whole mapped chunk holding granule @p g to host memory
 * (@p host: a cuMemCreate at that location, seg_host_location's answer) or, for NULL, back to the
 * device, at the same addresses. Steps:
 * cuMemCreate, cuMemAddressReserve + cuMemMap + cuMemSetAccess (owner) of a scratch range,
 * cuMemcpyDtoDAsync on @p stream and cuStreamSynchronize of it, cuMemUnmap of the old chunk
 * (announced to the observer first), cuMemMap of the new handle at its place, cuMemSetAccess
 * (owner and peers), cuMemRelease of the old handle; the scratch range goes. @p stream is the
 * caller's own (never a program's: it may be destroyed). Until the old handle is released its bytes
 * are intact: any failure maps it back (nothing changed; only a failure to map it back aborts).
 * The caller guarantees that nothing touches the chunk from before the copy to the end of the
 * call: no work queued (a program's stream, a graph, a peer) and none still running. A host chunk is
 * live (seg_gran_is_mapped) but counts in seg_host_bytes, not seg_mapped_bytes; seg_unmap,
 * seg_sleep_unmap and seg_inner_range's callers never unmap it (only seg_drop_host, seg_move_chunk,
 * seg_destroy). Already where asked: success, nothing done. @p bytes receives the chunk's bytes moved.
 */
xseg_status seg_move_chunk(struct seg *seg, size_t g, const CUmemLocation *host, CUstream stream, size_t *bytes);
/* Unmap and release the host chunks wholly inside [offset, offset + size) (granule multiples):
 * their contents are dead (the caller freed the block and waited for its streams). @p dropped
 * receives the bytes no longer counted as host chunks; a chunk whose unmap fails becomes stranded
 * (counted unmapped; seg_reclaim unmaps it, seg_map unmaps it before mapping device memory
 * there) and the failure is returned after the others went. With @p strand no driver call is
 * made (a capture is underway): every such chunk becomes stranded so, and its first unmap after
 * (seg_reclaim, seg_map, seg_destroy) synchronizes the context first, since the freed block's
 * work was not waited for; the caller unmaps none of them during the capture
 * (seg_stranded_within). */
xseg_status seg_drop_host(struct seg *seg, size_t offset, size_t size, bool strand, size_t *dropped);
size_t seg_host_bytes(const struct seg *seg);           /* bytes of host chunks */
int seg_gran_is_host(const struct seg *seg, size_t g);  /* granule @p g is in a host chunk */
/* Where host memory for the segment's device's chunks goes (VMM with location HOST or HOST_NUMA,
 * CUDA 12.2+), by the first rule that applies: HOST_NUMA at the device's own node
 * (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID), location HOST (the driver places the pages), HOST_NUMA node 0.
 * *@p rule names the one taken. false when the device maps no host memory. Three attribute queries. */
enum seg_host_rule { SEG_HOST_OWN_NODE, SEG_HOST_ANY_NODE, SEG_HOST_NODE_ZERO };
bool seg_host_location(const struct seg *seg, CUmemLocation *loc, enum seg_host_rule *rule);

/* Grant @p peer read-write access to every mapped chunk, and to chunks mapped from now on: one
 * cuMemSetAccess per run of mapped granules in a piece (new mappings get one call for the owner
 * and every peer together). */
xseg_status seg_add_peer(struct seg *seg, int peer);

/*
 * debug_stale_access's canary (core/device/quarantine.h), for a freed block held in quarantine:
 * the whole chunks inside [offset, offset + size) (granule multiples; the first one and those
 * following it without a gap) are given back and one canary page takes their place. After a
 * synchronize of the segment's stream, for each chunk in address order: the observer hears it
 * unmapped, cuMemUnmap, and its handle goes to @p spares (NULL: none; host memory never) or
 * cuMemRelease; its granules become a canary span, counted in seg_canary_bytes, not in
 * seg_mapped_bytes or seg_host_bytes. Then the canary (one granule, cuMemCreate'd first) is
 * mapped over each granule of the span and access granted (owner and peers) per run: the range
 * reads and writes one page. Span granules count as mapped for seg_gran_is_mapped (the block
 * above still covers them) and nowhere else: no other function maps, unmaps, exports or
 * announces them. Outcome in @p out: the span [first, end) (equal: nothing changed, the canary
 * released), the canary (the caller's reference, for seg_canary_release), whether every granule
 * maps it with access (whole), and the device bytes and chunks and the host bytes (spill) given
 * back. A failed unmap ends the span before that chunk (it stays as it was); a granule the canary
 * cannot be mapped on stays bare (maps nothing), and a run whose access cannot be granted is
 * unmapped again (or, if that fails too, stays mapped without access until the release): then
 * whole is false and the error returned; the chunks given back stay given back.
 */
struct seg_canary {
    size_t first, end;
    CUmemGenericAllocationHandle canary;
    bool whole;
    size_t bytes, chunks, host_bytes;
};
xseg_status seg_canary_swap(struct seg *seg, size_t offset, size_t size, struct seg_spares *spares,
                            struct seg_canary *out);
/* End the canary span [@p first, @p end) (a seg_canary_swap's outcome): its canary mappings are
 * unmapped (one cuMemUnmap per run inside a piece) and the granules left unmapped, as after
 * seg_unmap (a later seg_map maps new chunks there); then @p canary is released (a failed
 * release goes to the leftovers). Needs no memory. On a failed unmap the span stays (the runs
 * unmapped so far bare) and the caller tries again later with the same arguments. */
xseg_status seg_canary_release(struct seg *seg, size_t first, size_t end, CUmemGenericAllocationHandle canary);
size_t seg_canary_bytes(const struct seg *seg); /* bytes of canary spans */

/* Accessors. Offsets are bytes from seg_base, granule indexes are offset / seg_gran. */
CUdeviceptr seg_base(const struct seg *seg);
size_t seg_va_size(const struct seg *seg);        /* bytes of VA reserved, a page multiple */
size_t seg_page_size(const struct seg *seg);      /* seg_params.page_size */
size_t seg_gran(const struct seg *seg);           /* the granule: the device's VMM granularity */
size_t seg_ngran(const struct seg *seg);          /* va_size / granule */
size_t seg_mapped_bytes(const struct seg *seg);   /* bytes currently mapped */
size_t seg_stranded_bytes(const struct seg *seg); /* bytes of stranded chunks (see seg_reclaim) */
/* Does a stranded chunk overlap [@p offset, @p offset + @p size) (clipped to the segment)? seg_map
 * over such a range unmaps the chunk first. */
bool seg_stranded_within(const struct seg *seg, size_t offset, size_t size);
unsigned seg_handle_types(const struct seg *seg);
int seg_device(const struct seg *seg);
/* Is granule @p g mapped (and not stranded)? 0 out of range; 1 in a canary span. */
int seg_gran_is_mapped(const struct seg *seg, size_t g);
/* The mapped chunk holding granule @p g: its handle (owned by the segment: export or retain it,
 * never release it), first granule and granule count. @return 0 (outputs untouched) when @p g is
 * unmapped, stranded, in a canary span or out of range. */
int seg_chunk(const struct seg *seg, size_t g, CUmemGenericAllocationHandle *handle, size_t *first, size_t *n);
/* The largest [*lo, *hi) inside [offset, offset + size) (granule multiples) that no mapped chunk
 * crosses: what seg_unmap of that range can give back. *lo == *hi when there is none. */
void seg_inner_range(const struct seg *seg, size_t offset, size_t size, size_t *lo, size_t *hi);
/* Call @p fn for every run of mapped chunks (within a piece), as if just mapped: a new observer
 * learns the current mappings. */
void seg_replay_mapped(const struct seg *seg, void (*fn)(void *user, struct seg *seg, size_t first, size_t last, int mapped),
                       void *user);

#endif
