/*
 * NCCL's user-buffer registration through the ledger (include/xseg.h, docs/registrations.md
 * "NCCL through xseg"): xseg_nccl_register calls ncclCommRegister of the NCCL already loaded in
 * the process and keeps the range in the ledger, as an entry of xseg's own, until
 * xseg_nccl_deregister has called ncclCommDeregister. The ledger's work is core/policy/registry.c
 * (reg_nccl_*).
 *
 * Why xseg holds the range for the whole registration: NCCL (src/register/register.cc, NVIDIA/nccl
 * 0fa47cedc553e039710de03b4781e8ffba79f342) records the page-aligned range at ncclCommRegister and
 * pins the memory behind it later, when a collective first uses it (peer IPC, NVLS, the network:
 * with cuMem it retains the allocation handles and maps them elsewhere), and lets go only at
 * ncclCommDeregister. Whatever xseg unmapped or re-backed in between would leave NCCL reading
 * other pages. So the entry exists before ncclCommRegister runs (the ledger refuses a bad range
 * before NCCL hears of it, and nothing can move the pages while NCCL takes them) and goes only
 * after ncclCommDeregister returned success.
 *
 * NCCL is never loaded here: a second copy would not know the communicator. Its symbols come from
 * $XSEG_NCCL_LIBRARY when set (a path or soname, opened with RTLD_NOLOAD: it must be loaded
 * already), else from libnccl.so.2 as loaded (PyTorch's wheels load it from the nvidia-nccl
 * package), else from the process's global symbols (a program linked with NCCL). Looked up at each
 * call: nothing is kept, and none of this is on the malloc/free path.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#include "api/dispatch.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "core/policy/registry.h"
#include "core/runtime.h"

/* NCCL's signatures (nccl.h): ncclResult_t is an int-sized enum, ncclComm_t a pointer. */
typedef int (*nccl_register_fn)(void *comm, void *buff, size_t size, void **handle);
typedef int (*nccl_deregister_fn)(void *comm, void *handle);
typedef const char *(*nccl_errstr_fn)(int result);

struct nccl_lib {
    void *dl; /* dlclose'd by nccl_close; NULL for the global symbols */
    nccl_register_fn reg;
    nccl_deregister_fn dereg;
    nccl_errstr_fn errstr; /* optional */
};

static void nccl_close(struct nccl_lib *n)
{
    if (n->dl)
        dlclose(n->dl); /* drops the reference RTLD_NOLOAD took; NCCL stays loaded */
}

static xseg_status nccl_open(const char *what, struct nccl_lib *n)
{
    *n = (struct nccl_lib){0};
    const char *path = getenv("XSEG_NCCL_LIBRARY");
    void *dl = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (!dl && path && *path)
        return err_set(XSEG_ERROR_NOT_SUPPORTED, "%s: XSEG_NCCL_LIBRARY=%s is not loaded in this process (xseg "
                       "calls the NCCL that made the communicator and never loads one)", what, path);
    void *from = dl ? dl : RTLD_DEFAULT;
    n->dl = dl;
    n->reg = (nccl_register_fn)(uintptr_t)dlsym(from, "ncclCommRegister");
    n->dereg = (nccl_deregister_fn)(uintptr_t)dlsym(from, "ncclCommDeregister");
    n->errstr = (nccl_errstr_fn)(uintptr_t)dlsym(from, "ncclGetErrorString");
    if (n->reg && n->dereg)
        return XSEG_SUCCESS;
    nccl_close(n);
    if (!dl)
        return err_set(XSEG_ERROR_NOT_SUPPORTED, "%s: no NCCL is loaded in this process (neither libnccl.so.2 nor "
                       "global ncclCommRegister; set XSEG_NCCL_LIBRARY to the one that made the communicator)", what);
    return err_set(XSEG_ERROR_NOT_SUPPORTED, "%s: %s has no ncclCommRegister / ncclCommDeregister (NCCL 2.19 or "
                   "later registers user buffers)", what, path && *path ? path : "libnccl.so.2");
}

static const char *nccl_words(const struct nccl_lib *n, int res)
{
    const char *s = n->errstr ? n->errstr(res) : NULL;
    return s ? s : "no ncclGetErrorString";
}

struct nccl_own_args {
    size_t size;
    void *comm;
    uint64_t id;
};

static xseg_status nccl_own_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    const struct nccl_own_args *a = ctx;
    return reg_nccl_own(d, (uintptr_t)ptr, a->size, a->comm, a->id, owned);
}

/* ncclCommRegister for each entry of @p id (@p items, whose nccl fields receive NCCL's handles),
 * recorded in the ledger; on a failure every one registered so far is deregistered and every entry
 * of @p id dropped: nothing of the call stays, with NCCL or in the ledger. */
static xseg_status nccl_take(const char *what, const struct nccl_lib *n, void *comm, uint64_t id,
                             struct reg_nccl_item *items, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        int res = n->reg(comm, (void *)items[i].addr, items[i].size, &items[i].nccl);
        if (res == 0 && reg_nccl_set(id, items[i].addr, items[i].nccl))
            continue;
        if (res == 0) /* the entry went meanwhile (nothing drops NCCL entries today): undo NCCL's too */
            (void)n->dereg(comm, items[i].nccl);
        for (size_t j = 0; j < i; j++)
            (void)n->dereg(comm, items[j].nccl);
        reg_nccl_settle(id, 0, true);
        if (res != 0)
            return err_set(XSEG_ERROR_DRIVER, "%s: ncclCommRegister(comm %p, %p, %zu) returned %d (%s); nothing is "
                           "registered", what, comm, (void *)items[i].addr, items[i].size, res, nccl_words(n, res));
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "%s: the ledger entry of [%p, +%zu) went while NCCL registered it; "
                       "NCCL's registration was undone", what, (void *)items[i].addr, items[i].size);
    }
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_nccl_register(void *comm, void *ptr, size_t size, void **handle)
{
    static const char what[] = "xseg_nccl_register";
    if (!comm || !ptr || !size || !handle)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: %s", what, !comm ? "comm is NULL" : !ptr ? "ptr is NULL"
                       : !size ? "size is 0" : "handle is NULL");
    *handle = NULL;
    if ((uintptr_t)ptr + size < (uintptr_t)ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: [%p, +%zu) wraps around", what, ptr, size);
    struct nccl_lib n;
    xseg_status st = nccl_open(what, &n);
    if (st != XSEG_SUCCESS)
        return st;
    struct nccl_own_args a = {size, comm, reg_nccl_next_id()};
    st = api_on_owner_or(ptr, nccl_own_on, &a, "%s: [%p, +%zu) is not inside one segment of xseg (a "
                         "range across two segments, or memory xseg did not allocate)", what, ptr, size);
    if (st == XSEG_SUCCESS) {
        struct reg_nccl_item it = {0, (uintptr_t)ptr, size, NULL};
        st = nccl_take(what, &n, comm, a.id, &it, 1);
    }
    nccl_close(&n);
    if (st == XSEG_SUCCESS)
        *handle = (void *)(uintptr_t)a.id;
    return st;
}

struct nccl_pool_args {
    xseg_pool_id pool;
    void *comm;
    uint64_t id;
    size_t n;
};

static xseg_status nccl_pool_on(struct dev_alloc *d, void *ctx)
{
    struct nccl_pool_args *a = ctx;
    return reg_nccl_own_pool(d, a->pool, a->comm, a->id, &a->n);
}

XSEG_API xseg_status xseg_nccl_register_pool(void *comm, int device, xseg_pool_id pool, void **handle, size_t *count)
{
    static const char what[] = "xseg_nccl_register_pool";
    if (!comm || !handle)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: %s", what, !comm ? "comm is NULL" : "handle is NULL");
    *handle = NULL;
    if (count)
        *count = 0;
    if (device < 0)
        return err_set(XSEG_ERROR_INVALID_DEVICE, "%s: device %d (one device: the communicator's)", what, device);
    struct nccl_lib n;
    xseg_status st = nccl_open(what, &n);
    if (st != XSEG_SUCCESS)
        return st;
    struct nccl_pool_args a = {pool, comm, reg_nccl_next_id(), 0};
    st = api_each_device(device, nccl_pool_on, &a);
    struct reg_nccl_item *items = NULL;
    size_t k = 0;
    if (st == XSEG_SUCCESS && a.n) { /* the runs just entered, claimed while NCCL takes them */
        st = reg_nccl_claim(a.id, comm, &items, &k);
        if (st == XSEG_SUCCESS) {
            st = nccl_take(what, &n, comm, a.id, items, k);
            if (st == XSEG_SUCCESS)
                for (size_t i = 0; i < k; i++)
                    reg_nccl_settle(a.id, items[i].addr, false);
        } else {
            reg_nccl_settle(a.id, 0, true);
        }
    }
    xs_free(items);
    nccl_close(&n);
    if (st == XSEG_SUCCESS && a.n) {
        *handle = (void *)(uintptr_t)a.id;
        if (count)
            *count = a.n;
    }
    return st;
}

XSEG_API xseg_status xseg_nccl_deregister(void *comm, void *handle)
{
    static const char what[] = "xseg_nccl_deregister";
    if (!comm || !handle)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: %s", what, !comm ? "comm is NULL" : "handle is NULL");
    struct nccl_lib n;
    xseg_status st = nccl_open(what, &n);
    if (st != XSEG_SUCCESS)
        return st;
    uint64_t id = (uint64_t)(uintptr_t)handle;
    struct reg_nccl_item *items = NULL;
    size_t k = 0;
    st = reg_nccl_claim(id, comm, &items, &k);
    struct err_kept first = {{0}};
    for (size_t i = 0; i < k; i++) {
        int res = n.dereg(comm, items[i].nccl);
        /* The entry goes only once NCCL let go; a refusal keeps it (and the pages), claimable again. */
        reg_nccl_settle(id, items[i].addr, res == 0);
        if (res != 0 && st == XSEG_SUCCESS) {
            st = err_set(XSEG_ERROR_DRIVER, "%s: ncclCommDeregister(comm %p, handle %p) of [%p, +%zu) returned %d "
                         "(%s); that range stays registered (call again to retry)", what, comm, items[i].nccl,
                         (void *)items[i].addr, items[i].size, res, nccl_words(&n, res));
            first = err_keep();
        }
    }
    xs_free(items);
    nccl_close(&n);
    if (st != XSEG_SUCCESS && k)
        return err_set(st, "%s", first.msg);
    return st;
}
