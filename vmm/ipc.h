/*
 * The driver side of sharing expandable memory between processes.
 *
 * Every chunk of an expandable segment is its own cuMemCreate handle. Exporting a block means
 * exporting the handles of the chunks under it as shareable handles (POSIX file descriptors, or
 * fabric handles where the device and the system support them); importing means reserving exactly
 * those chunks' bytes of address space, importing and mapping each handle in order, and granting
 * access with one cuMemSetAccess. Each function rolls back its own driver work on failure and
 * reports the failing call with its CUresult name.
 *
 * Locking: none here. ipc_export_pages reads the segment, so its caller holds the segment's device
 * lock; the import functions touch no allocator state.
 */
#ifndef XSEG_VMM_IPC_H
#define XSEG_VMM_IPC_H

#include <stdbool.h>

#include <cuda.h>

#include "base/common.h"

struct seg;

/* Bytes of one exported fabric handle. */
#define IPC_FABRIC_BYTES ((size_t)sizeof(CUmemFabricHandle))

/*
 * The shareable handle types new pages of @p device should be created with (a
 * CUmemAllocationHandleType bit mask): POSIX file descriptors where the device reports them, plus
 * CU_MEM_HANDLE_TYPE_FABRIC where the device reports fabric support *and* a probe cuMemCreate with
 * it succeeds (a GPU without an IMEX channel reports the attribute but refuses the allocation,
 * pytorch #179220). Decided once per device and cached; a failed query gives NONE this time and is
 * asked again next time. Never fails: @return the mask (CU_MEM_HANDLE_TYPE_NONE: not shareable).
 */
unsigned ipc_handle_types(int device, CUdevice cudev);

/*
 * Export the chunks of @p seg whose first granules are @p firsts[0..n) (all mapped) as @p type
 * (CU_MEM_HANDLE_TYPE_FABRIC or CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, which the segment must
 * have been created with). POSIX: @p fds receives n new descriptors (the caller closes them).
 * Fabric: @p fabric receives n * IPC_FABRIC_BYTES bytes. On failure the descriptors exported so
 * far are closed.
 */
xseg_status ipc_export_chunks(const struct seg *seg, const size_t *firsts, size_t n, unsigned type, int *fds,
                              unsigned char *fabric);

/*
 * Map @p n chunks of @p sizes[i] bytes, given as shareable handles of @p type (@p fds or
 * @p fabric as ipc_export_chunks wrote them), into a new reservation of exactly their total size,
 * in order, and grant @p access (naccess descriptors, the importing device first) with one
 * cuMemSetAccess. @p ctx is made current first. The imported handles are released once mapped:
 * the mappings keep the memory alive. Descriptors are not closed. On failure everything is undone.
 */
xseg_status ipc_import_map(CUcontext ctx, unsigned type, const int *fds, const unsigned char *fabric, size_t n,
                           const uint64_t *sizes, const CUmemAccessDesc *access, int naccess, CUdeviceptr *base);

/* Unmap [base, base + size) (whole imported chunks) with one cuMemUnmap, unless *@p unmapped says
 * an earlier call did, and free the reservation. *@p unmapped becomes true once the pages are
 * unmapped, so that a call again after a failed address free only frees the address range (the
 * unmap is never redone). @return XSEG_SUCCESS once both are done. */
xseg_status ipc_unmap(CUcontext ctx, CUdeviceptr base, size_t size, bool *unmapped);

#endif
