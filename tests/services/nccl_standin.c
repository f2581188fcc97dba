/* The stand-in NCCL (tests/services/nccl_standin.h says what it does and why). Only NCCL's three
 * registration-related symbols are exported (gnu_symbol_visibility hidden elsewhere). */
#include "tests/services/nccl_standin.h"

#define NCCL_EXPORT __attribute__((visibility("default")))

static CUmemGenericAllocationHandle handle_at(const struct drv_api *api, uintptr_t addr)
{
    CUmemGenericAllocationHandle h = 0;
    if (api->cuMemRetainAllocationHandle(&h, (void *)addr) != CUDA_SUCCESS)
        return 0;
    (void)api->cuMemRelease(h);
    return h;
}

/* Undo what a registration holds: its own mappings, then the retained handles. */
static void drop(const struct drv_api *api, struct standin_reg *g)
{
    for (int k = 0; k < g->nchunks && !g->legacy; k++) {
        if (g->chunk[k].mine) {
            (void)api->cuMemUnmap(g->chunk[k].mine, g->chunk[k].size);
            (void)api->cuMemAddressFree(g->chunk[k].mine, g->chunk[k].size);
        }
    }
    for (size_t i = 0; i < (g->hi - g->lo) / STANDIN_GRAN; i++)
        if (g->gran[i])
            (void)api->cuMemRelease(g->gran[i]);
    memset(g, 0, sizeof *g);
}

static int take(const struct drv_api *api, struct standin_reg *g)
{
    size_t n = (g->hi - g->lo) / STANDIN_GRAN;
    for (size_t i = 0; i < n; i++)
        if (api->cuMemRetainAllocationHandle(&g->gran[i], (void *)(g->lo + i * STANDIN_GRAN)) != CUDA_SUCCESS) {
            g->gran[i] = 0;
            return STANDIN_CUDA_ERROR;
        }
    for (size_t i = 0; i < n; i++) { /* each physical chunk once, found on either side */
        bool known = false;
        for (int k = 0; k < g->nchunks; k++)
            known |= g->chunk[k].h == g->gran[i];
        if (known)
            continue;
        if (g->nchunks == STANDIN_MAX_CHUNKS)
            return STANDIN_INTERNAL_ERROR;
        uintptr_t lo = g->lo + i * STANDIN_GRAN, hi = lo + STANDIN_GRAN;
        while (handle_at(api, lo - STANDIN_GRAN) == g->gran[i])
            lo -= STANDIN_GRAN;
        while (handle_at(api, hi) == g->gran[i])
            hi += STANDIN_GRAN;
        int k = g->nchunks++;
        g->chunk[k].va = lo;
        g->chunk[k].size = hi - lo;
        g->chunk[k].h = g->gran[i];
        CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (api->cuMemAddressReserve(&g->chunk[k].mine, hi - lo, 0, 0, 0) != CUDA_SUCCESS) {
            g->chunk[k].mine = 0;
            return STANDIN_CUDA_ERROR;
        }
        if (api->cuMemMap(g->chunk[k].mine, hi - lo, 0, g->gran[i], 0) != CUDA_SUCCESS) {
            (void)api->cuMemAddressFree(g->chunk[k].mine, hi - lo);
            g->chunk[k].mine = 0;
            return STANDIN_CUDA_ERROR;
        }
        if (api->cuMemSetAccess(g->chunk[k].mine, hi - lo, &acc, 1) != CUDA_SUCCESS)
            return STANDIN_CUDA_ERROR; /* mapped: drop() unmaps it */
    }
    return STANDIN_SUCCESS;
}

NCCL_EXPORT int ncclCommRegister(void *comm, void *buff, size_t size, void **handle)
{
    struct standin_comm *c = comm;
    if (!c || !handle)
        return STANDIN_INVALID_ARGUMENT;
    *handle = NULL;
    if (c->fail_register && c->fail_skip) {
        c->fail_skip--;
    } else if (c->fail_register) {
        int r = c->fail_register;
        c->fail_register = 0;
        return r;
    }
    uintptr_t lo = (uintptr_t)buff & ~(STANDIN_GRAN - 1);
    uintptr_t hi = ((uintptr_t)buff + size + STANDIN_GRAN - 1) & ~(STANDIN_GRAN - 1);
    if (!buff || !size || (hi - lo) / STANDIN_GRAN > STANDIN_MAX_GRANS)
        return STANDIN_INVALID_ARGUMENT;
    for (int r = 0; r < STANDIN_MAX_REGS; r++)
        if (c->reg[r].used && c->reg[r].lo <= lo && hi <= c->reg[r].hi) { /* NCCL's cache: a reference more */
            c->reg[r].refs++;
            *handle = &c->reg[r];
            c->registers++;
            return STANDIN_SUCCESS;
        }
    struct standin_reg *g = NULL;
    for (int r = 0; r < STANDIN_MAX_REGS && !g; r++)
        if (!c->reg[r].used)
            g = &c->reg[r];
    if (!g)
        return STANDIN_INTERNAL_ERROR;
    *g = (struct standin_reg){.used = true, .refs = 1, .lo = lo, .hi = hi};
    CUmemGenericAllocationHandle probe_h = 0;
    CUresult pr = c->drv->cuMemRetainAllocationHandle(&probe_h, buff);
    if (pr == CUDA_SUCCESS) {
        (void)c->drv->cuMemRelease(probe_h);
    } else if (pr != CUDA_ERROR_INVALID_VALUE) {
        memset(g, 0, sizeof *g);
        return STANDIN_CUDA_ERROR;
    } else {
        /* cuMemAlloc memory (no allocation handle): NCCL registers the allocation itself
         * (cuIpcGetMemHandle, ibv_reg_mr); a peer reaches these very pages while it lives. */
        uint8_t probe;
        if (c->drv->cuMemcpyDtoH(&probe, (CUdeviceptr)buff, 1) != CUDA_SUCCESS) {
            memset(g, 0, sizeof *g);
            return STANDIN_CUDA_ERROR;
        }
        g->legacy = true;
        g->nchunks = 1;
        g->chunk[0].va = (uintptr_t)buff;
        g->chunk[0].size = size;
        g->chunk[0].mine = (CUdeviceptr)buff;
        c->registers++;
        c->live++;
        *handle = g;
        return STANDIN_SUCCESS;
    }
    int res = take(c->drv, g);
    if (res != STANDIN_SUCCESS) {
        drop(c->drv, g);
        return res;
    }
    c->registers++;
    c->live++;
    *handle = g;
    return STANDIN_SUCCESS;
}

NCCL_EXPORT int ncclCommDeregister(void *comm, void *handle)
{
    struct standin_comm *c = comm;
    if (!c)
        return STANDIN_INVALID_ARGUMENT;
    if (!handle) /* NCCL: a registration it skipped */
        return STANDIN_SUCCESS;
    if (c->fail_deregister) {
        int r = c->fail_deregister;
        c->fail_deregister = 0;
        return r;
    }
    struct standin_reg *g = handle;
    if (g < c->reg || g >= c->reg + STANDIN_MAX_REGS || !g->used)
        return STANDIN_INVALID_USAGE; /* NCCL: "Deregister: Could not find handle" */
    c->deregisters++;
    if (--g->refs)
        return STANDIN_SUCCESS;
    uint8_t probe;
    if (g->legacy && c->drv->cuMemcpyDtoH(&probe, g->chunk[0].mine, 1) != CUDA_SUCCESS)
        c->handle_changes++; /* the allocation went (cuMemFree) while registered */
    for (size_t i = 0; i < (g->hi - g->lo) / STANDIN_GRAN && !g->legacy; i++)
        if (handle_at(c->drv, g->lo + i * STANDIN_GRAN) != g->gran[i])
            c->handle_changes++;
    drop(c->drv, g);
    c->live--;
    return STANDIN_SUCCESS;
}

NCCL_EXPORT const char *ncclGetErrorString(int result)
{
    switch (result) {
    case STANDIN_SUCCESS:
        return "stand-in: success";
    case STANDIN_CUDA_ERROR:
        return "stand-in: a driver call failed";
    case STANDIN_INTERNAL_ERROR:
        return "stand-in: out of registration slots";
    case STANDIN_INVALID_ARGUMENT:
        return "stand-in: bad argument";
    case STANDIN_INVALID_USAGE:
        return "stand-in: no such registration";
    default:
        return "stand-in: unknown result";
    }
}
