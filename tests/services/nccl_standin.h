/*
 * A stand-in NCCL for cudaemu (tests/services/nccl_standin.c, built as a shared module): its
 * library exports what real NCCL exports for user-buffer registration, with NCCL's signatures
 * (nccl.h: ncclCommRegister, ncclCommDeregister, ncclGetErrorString), and nothing else. The
 * communicator is this struct: the test makes it (as ncclCommInitRank would) and steers and reads
 * the stand-in through it, so the library needs no entry point of its own.
 *
 * Like NCCL with cuMem memory once a collective used the buffer, a registration retains the
 * allocation handle behind every granule of the (granule-aligned) range and maps those physical
 * chunks at addresses of its own (what a peer or the NIC reaches). Deregistration checks that the
 * handle behind every granule is still the one retained (xseg re-backed nothing), counts any that
 * changed in handle_changes, then unmaps and releases. Same range twice: one registration with a
 * reference count, as NCCL's cache does (src/register/register.cc, NVIDIA/nccl 0fa47ced).
 * cuMemAlloc memory (no allocation handle) is registered as the allocation itself, as NCCL's IPC
 * and network paths do (cuIpcGetMemHandle, ibv_reg_mr): reads go through the program's address,
 * and deregistration counts in handle_changes an allocation that went meanwhile.
 */
#ifndef XSEG_TESTS_NCCL_STANDIN_H
#define XSEG_TESTS_NCCL_STANDIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vmm/driver.h"

#define STANDIN_GRAN ((size_t)2 << 20) /* cudaemu's and an H100's VMM granularity */
#define STANDIN_MAX_REGS 32
#define STANDIN_MAX_CHUNKS 32
#define STANDIN_MAX_GRANS 128

/* ncclResult_t values the stand-in returns. */
enum { STANDIN_SUCCESS = 0, STANDIN_CUDA_ERROR = 1, STANDIN_INTERNAL_ERROR = 3, STANDIN_INVALID_ARGUMENT = 4,
       STANDIN_INVALID_USAGE = 5 };

struct standin_reg {
    bool used;
    bool legacy; /* cuMemAlloc memory: one chunk, the allocation itself (no handle, no mapping) */
    int refs;
    uintptr_t lo, hi; /* granule-aligned */
    CUmemGenericAllocationHandle gran[STANDIN_MAX_GRANS]; /* retained */
    int nchunks;
    struct {
        uintptr_t va; /* the chunk in the registrant's address space */
        size_t size;
        CUmemGenericAllocationHandle h;
        CUdeviceptr mine; /* the stand-in's own mapping of it */
    } chunk[STANDIN_MAX_CHUNKS];
};

struct standin_comm {
    const struct drv_api *drv; /* the driver the test loaded */
    int fail_register;         /* non-zero: ncclCommRegister returns it once fail_skip calls passed (then 0) */
    unsigned fail_skip;
    int fail_deregister;       /* likewise for ncclCommDeregister */
    unsigned registers, deregisters, handle_changes, live; /* handle_changes: also a cuMemAlloc allocation gone */
    struct standin_reg reg[STANDIN_MAX_REGS];
};

/* NCCL's signatures (nccl.h; ncclResult_t an int-sized enum, ncclComm_t a pointer). */
int ncclCommRegister(void *comm, void *buff, size_t size, void **handle);
int ncclCommDeregister(void *comm, void *handle);
const char *ncclGetErrorString(int result);

/* The test's read of [addr, + len) through the stand-in's own mapping of a registered chunk (a
 * peer's DMA read): false when no registration covers it. */
static inline bool standin_read(const struct standin_comm *c, uintptr_t addr, void *buf, size_t len)
{
    for (int r = 0; r < STANDIN_MAX_REGS; r++) {
        const struct standin_reg *g = &c->reg[r];
        for (int k = 0; g->used && k < g->nchunks; k++)
            if (addr >= g->chunk[k].va && addr + len <= g->chunk[k].va + g->chunk[k].size)
                return c->drv->cuMemcpyDtoH(buf, g->chunk[k].mine + (addr - g->chunk[k].va), len) == CUDA_SUCCESS;
    }
    return false;
}

#endif
