/*
 * Modules and kernel launches, for the allocator's own two kernels (vmm/kernel.c). cudaemu has no
 * PTX compiler: cuModuleLoadData checks that the image is PTX text and records its `.entry` names;
 * cuModuleGetFunction hands out only the kernels cudaemu runs natively, by entry name:
 *   xseg_fill_ranges(.param .align 8 .b8 [2056])  = {u64 addr[128], u64 len[128], u32 n, u32 value}
 *   xseg_check_ranges(.param .align 8 .b8 [2072]) = {u64 addr[128], u64 len[128], u64 result,
 *                                                    u32 n, u32 value, u32 gen, u32 pad}
 * (range i is block row i; the fill sets every byte of each range to value; where range i has a
 * byte that differs, the check raises the u64 result[i] in device memory to
 * (gen << 40) | (len - the first such offset), as atom.max would). Any other entry of a loaded module is refused (CUDA_ERROR_NOT_SUPPORTED, the
 * reason on stderr); CUDAEMU_KERNELS=0 refuses every module (the caller's fallback path).
 *
 * Rules, from the driver API documentation: NULL out-parameters or images are
 * CUDA_ERROR_INVALID_VALUE; an unknown module is CUDA_ERROR_INVALID_HANDLE; a name the module does
 * not have is CUDA_ERROR_NOT_FOUND; text that is not PTX (no .version, .target and .entry, or
 * unbalanced braces) is CUDA_ERROR_INVALID_PTX, bytes that are not text CUDA_ERROR_INVALID_IMAGE.
 * cuLaunchKernel checks its dimensions like the driver (none 0; grid x < 2^31, y and z < 2^16;
 * block x, y <= 1024, z <= 64, x*y*z <= 1024; dynamic shared memory <= 48 KiB;
 * CUDA_ERROR_INVALID_VALUE) and takes kernelParams only (`extra` is cudaemu's
 * CUDA_ERROR_INVALID_VALUE). Before anything runs, every range a row will touch (rows i < min(n,
 * gridDimY)) and the check's result words must be mapped device memory the launch's device may
 * access (a VMM mapping with access, or a cuMemAlloc block of that device), else
 * CUDA_ERROR_ILLEGAL_ADDRESS from the launch and nothing runs: cudaemu's way of reporting a kernel
 * fault, as cuGraphLaunch's (a GPU reports it at a later synchronization and loses the context).
 * Stream model as host.c's async calls: runs at once; on a held stream it is pending work (its
 * ranges may not be unmapped until it completes); on a capturing stream it becomes a kernel node,
 * which a replay does not run (README, infidelities). The launch counts the bytes of its ranges
 * (CUDAEMU_REPORT's "bytes moved") and is charged their time at the entry's rate when one is set
 * (CUDAEMU_LATENCY cuLaunchKernel:5us,cuLaunchKernel:2TB/s). All state is under emu.lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudaemu/emu.h"

#define KERN_MAX_RANGES 128
#define KERN_MAX_ENTRIES 32
#define KERN_NAME_MAX 128

struct kern_fill_args {
    uint64_t addr[KERN_MAX_RANGES];
    uint64_t len[KERN_MAX_RANGES];
    uint32_t n;
    uint32_t value;
};
struct kern_check_args {
    uint64_t addr[KERN_MAX_RANGES];
    uint64_t len[KERN_MAX_RANGES];
    uint64_t result;
    uint32_t n;
    uint32_t value;
    uint32_t gen;
    uint32_t pad;
};
_Static_assert(sizeof(struct kern_fill_args) == 2056, "the fill kernel's parameter block");
_Static_assert(sizeof(struct kern_check_args) == 2072, "the check kernel's parameter block");

enum kern_kind { KERN_FILL = 1, KERN_CHECK };

static const struct {
    const char *name;
    enum kern_kind kind;
    size_t param_bytes;
} kern_native[] = {
    {"xseg_fill_ranges", KERN_FILL, sizeof(struct kern_fill_args)},
    {"xseg_check_ranges", KERN_CHECK, sizeof(struct kern_check_args)},
};
#define KERN_NATIVE (sizeof kern_native / sizeof kern_native[0])

struct CUfunc_st {
    CUmodule mod;
    enum kern_kind kind;
};

struct CUmod_st {
    int dev;
    size_t nentries;
    char entries[KERN_MAX_ENTRIES][KERN_NAME_MAX];
    /* Per native kernel: its function, when the module has that entry with cudaemu's parameter
     * block; else NULL (cuModuleGetFunction refuses it). */
    struct CUfunc_st *fn[KERN_NATIVE];
    bool sig_ok[KERN_NATIVE];
};

/* Live modules and functions (handle validation). Under emu.lock. */
static struct emu_map kern_mods, kern_fns;

size_t emu_modules_locked(void) { return kern_mods.count; }

static void kern_mod_free(CUmodule m)
{
    for (size_t k = 0; k < KERN_NATIVE; k++)
        free(m->fn[k]);
    free(m);
}

static bool kern_ident_char(char c, bool first)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == '$' ||
           (!first && c >= '0' && c <= '9');
}

/* Parse PTX text: CUDA_SUCCESS with the entries recorded in @p m, or the load's error. */
static CUresult kern_parse(const char *img, CUmodule m)
{
    size_t len = strlen(img);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)img[i];
        if (c < 0x20 && c != '\n' && c != '\r' && c != '\t' && c != '\f' && c != '\v')
            return CUDA_ERROR_INVALID_IMAGE;
    }
    if (!strstr(img, ".version") || !strstr(img, ".target"))
        return CUDA_ERROR_INVALID_PTX;
    long depth = 0;
    for (size_t i = 0; i < len; i++) {
        depth += img[i] == '{' ? 1 : img[i] == '}' ? -1 : 0;
        if (depth < 0)
            return CUDA_ERROR_INVALID_PTX;
    }
    if (depth)
        return CUDA_ERROR_INVALID_PTX;
    for (const char *p = img; (p = strstr(p, ".entry"));) {
        p += 6;
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            continue;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        size_t n = 0;
        while (kern_ident_char(p[n], n == 0))
            n++;
        if (!n || n >= KERN_NAME_MAX)
            return CUDA_ERROR_INVALID_PTX;
        if (m->nentries == KERN_MAX_ENTRIES)
            return CUDA_ERROR_INVALID_PTX; /* cudaemu's limit, far above its two kernels */
        memcpy(m->entries[m->nentries], p, n);
        m->entries[m->nentries][n] = '\0';
        /* A native kernel's signature: one parameter, the block of cudaemu's layout. */
        for (size_t k = 0; k < KERN_NATIVE; k++) {
            if (strcmp(m->entries[m->nentries], kern_native[k].name))
                continue;
            const char *close = strchr(p + n, ')');
            char want[32];
            snprintf(want, sizeof want, "[%zu]", kern_native[k].param_bytes);
            const char *at = strstr(p + n, want);
            m->sig_ok[k] = close && at && at < close && !memchr(p + n, ',', (size_t)(close - (p + n)));
        }
        m->nentries++;
        p += n;
    }
    return m->nentries ? CUDA_SUCCESS : CUDA_ERROR_INVALID_PTX;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    EMU_ENTER(cuModuleLoadData);
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = emu_ctx_current();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!emu.cfg.kernels)
        return CUDA_ERROR_NOT_SUPPORTED;
    const unsigned char *b = image;
    /* A cubin (ELF) or fatbin: the driver loads those; cudaemu runs no machine code. */
    if ((b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') ||
        (b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba)) {
        fprintf(stderr, "cudaemu: cuModuleLoadData: a cubin or fatbin image; cudaemu loads PTX text only\n");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUmodule m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->dev = ctx->ordinal;
    CUresult r = kern_parse(image, m);
    for (size_t k = 0; r == CUDA_SUCCESS && k < KERN_NATIVE; k++) {
        if (!m->sig_ok[k])
            continue;
        if (!(m->fn[k] = calloc(1, sizeof *m->fn[k])))
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *m->fn[k] = (struct CUfunc_st){m, kern_native[k].kind};
    }
    if (r != CUDA_SUCCESS) {
        kern_mod_free(m);
        return r;
    }
    emu_lock();
    size_t k = 0;
    if (emu_map_put(&kern_mods, (uint64_t)(uintptr_t)m, m))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    for (; r == CUDA_SUCCESS && k < KERN_NATIVE; k++)
        if (m->fn[k] && emu_map_put(&kern_fns, (uint64_t)(uintptr_t)m->fn[k], m->fn[k]))
            r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        emu_map_del(&kern_mods, (uint64_t)(uintptr_t)m);
        for (size_t j = 0; j < KERN_NATIVE; j++)
            if (m->fn[j])
                emu_map_del(&kern_fns, (uint64_t)(uintptr_t)m->fn[j]);
    }
    emu_unlock();
    if (r != CUDA_SUCCESS) {
        kern_mod_free(m);
        return r;
    }
    *module = m;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    EMU_ENTER(cuModuleUnload);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    emu_lock();
    CUmodule m = hmod ? emu_map_del(&kern_mods, (uint64_t)(uintptr_t)hmod) : NULL;
    if (m)
        for (size_t k = 0; k < KERN_NATIVE; k++)
            if (m->fn[k])
                emu_map_del(&kern_fns, (uint64_t)(uintptr_t)m->fn[k]);
    emu_unlock();
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    kern_mod_free(m);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    EMU_ENTER(cuModuleGetFunction);
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    emu_lock();
    CUresult r = CUDA_ERROR_NOT_FOUND;
    CUmodule m = hmod ? emu_map_get(&kern_mods, (uint64_t)(uintptr_t)hmod) : NULL;
    if (!m) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        for (size_t i = 0; i < m->nentries && r == CUDA_ERROR_NOT_FOUND; i++) {
            if (strcmp(m->entries[i], name))
                continue;
            r = CUDA_ERROR_NOT_SUPPORTED;
            size_t k = 0;
            while (k < KERN_NATIVE && strcmp(name, kern_native[k].name))
                k++;
            if (k < KERN_NATIVE && m->fn[k]) {
                *hfunc = m->fn[k];
                r = CUDA_SUCCESS;
            } else if (k < KERN_NATIVE) {
                fprintf(stderr, "cudaemu: cuModuleGetFunction(%s): its parameters are not one block of %zu "
                        "bytes, the layout cudaemu runs natively\n", name, kern_native[k].param_bytes);
            } else {
                fprintf(stderr, "cudaemu: cuModuleGetFunction(%s): cudaemu runs only the kernels it implements "
                        "natively (xseg_fill_ranges, xseg_check_ranges)\n", name);
            }
        }
    }
    emu_unlock();
    return r;
}

/* Can device @p dev's kernel touch [addr, addr + size) as @p need asks (VMM memory mapped with
 * that access, or cuMemAlloc blocks of @p dev)? Lock held. */
static bool kern_range_ok_locked(uint64_t addr, uint64_t size, int dev, unsigned need)
{
    if (addr + size < addr)
        return false;
    return emu_dev_check_locked((uintptr_t)addr, (size_t)size, dev, need, true) == CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    EMU_ENTER(cuLaunchKernel);
    CUcontext ctx = emu_ctx_current();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!gridDimX || !gridDimY || !gridDimZ || !blockDimX || !blockDimY || !blockDimZ ||
        gridDimX > 0x7fffffffu || gridDimY > 65535 || gridDimZ > 65535 || blockDimX > 1024 ||
        blockDimY > 1024 || blockDimZ > 64 || (uint64_t)blockDimX * blockDimY * blockDimZ > 1024 ||
        sharedMemBytes > 48u * 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (extra || !kernelParams || !kernelParams[0])
        return CUDA_ERROR_INVALID_VALUE;
    int dev = ctx->ordinal;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    struct CUfunc_st *fn = f ? emu_map_get(&kern_fns, (uint64_t)(uintptr_t)f) : NULL;
    struct kern_check_args a; /* the fill's block is a prefix of the check's but for result */
    size_t rows = 0;
    enum kern_kind kind = fn ? fn->kind : KERN_FILL; /* kept: the module may be unloaded after the lock */
    if (!fn) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (fn->mod->dev != dev) {
        r = CUDA_ERROR_INVALID_HANDLE; /* cudaemu's choice: a function of another context's module */
    } else {
        memset(&a, 0, sizeof a);
        if (fn->kind == KERN_FILL) {
            struct kern_fill_args fa;
            memcpy(&fa, kernelParams[0], sizeof fa);
            memcpy(a.addr, fa.addr, sizeof a.addr);
            memcpy(a.len, fa.len, sizeof a.len);
            a.n = fa.n;
            a.value = fa.value;
        } else {
            memcpy(&a, kernelParams[0], sizeof a);
        }
        if (a.n > KERN_MAX_RANGES) {
            /* The kernel would read past its parameter block: refused here, with the reason. */
            fprintf(stderr, "cudaemu: cuLaunchKernel: %u ranges, more than the %d the block holds\n", a.n,
                    KERN_MAX_RANGES);
            r = CUDA_ERROR_INVALID_VALUE;
        }
        rows = a.n < gridDimY ? a.n : gridDimY;
        unsigned need = fn->kind == KERN_FILL ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
        for (size_t i = 0; i < rows && r == CUDA_SUCCESS; i++)
            if (!kern_range_ok_locked(a.addr[i], a.len[i], dev, need))
                r = CUDA_ERROR_ILLEGAL_ADDRESS;
        if (r == CUDA_SUCCESS && fn->kind == KERN_CHECK && rows &&
            !kern_range_ok_locked(a.result, 8 * (uint64_t)rows, dev, CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
            r = CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    CUstream s = r == CUDA_SUCCESS ? emu_stream_resolve_locked(hStream) : NULL;
    bool run = false;
    if (r == CUDA_SUCCESS && !s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (r == CUDA_SUCCESS && s->cap) {
        r = emu_capture_add_locked(s, CU_GRAPH_NODE_TYPE_KERNEL, NULL);
    } else if (r == CUDA_SUCCESS) {
        run = true;
        if (s->held) {
            if (s->defer && kind != KERN_FILL)
                emu_stream_complete_locked(s); /* a compare reads after the stream's earlier fills */
            uint64_t seq = s->submitted + 1;
            for (size_t i = 0; i < rows && r == CUDA_SUCCESS; i++)
                if (a.len[i] && !emu_stream_pend_locked(s, (uintptr_t)a.addr[i], (size_t)a.len[i], seq))
                    r = CUDA_ERROR_OUT_OF_MEMORY;
            if (r == CUDA_SUCCESS && kind == KERN_CHECK && rows &&
                !emu_stream_pend_locked(s, (uintptr_t)a.result, 8 * rows, seq))
                r = CUDA_ERROR_OUT_OF_MEMORY;
            if (r == CUDA_SUCCESS)
                s->submitted = seq;
            run = r == CUDA_SUCCESS;
            /* A deferring stream's fill moves its bytes when its work completes. */
            for (size_t i = 0; run && s->defer && kind == KERN_FILL && i < rows; i++)
                if (a.len[i] && !emu_stream_defer_set_locked(s, (uintptr_t)a.addr[i], (size_t)a.len[i],
                                                             (unsigned char)a.value))
                    r = CUDA_ERROR_OUT_OF_MEMORY;
            if (s->defer && kind == KERN_FILL)
                run = false;
        }
    }
    emu_unlock();
    emu_deferred_run();
    if (!run)
        return r;
    /* The bytes move at once, outside the lock (devmem.c takes it per piece), as the async calls'. */
    uint64_t t0 = emu_now_ns();
    size_t bytes = 0;
    for (size_t i = 0; i < rows && r == CUDA_SUCCESS; i++) {
        uintptr_t p = (uintptr_t)a.addr[i];
        size_t len = (size_t)a.len[i];
        bytes += len;
        if (!len)
            continue;
        if (kind == KERN_FILL) {
            r = emu_dev_set(p, (unsigned char)a.value, len);
            continue;
        }
        size_t off = len;
        uint64_t cur = 0, res = a.result + 8 * i;
        r = emu_dev_first_diff(p, len, (unsigned char)a.value, &off);
        uint64_t w = ((uint64_t)a.gen << 40) | (len - off);
        if (r == CUDA_SUCCESS && off < len)
            r = emu_dev_read(&cur, (uintptr_t)res, 8);
        if (r == CUDA_SUCCESS && off < len && w > cur)
            r = emu_dev_write((uintptr_t)res, &w, 8);
    }
    emu_copy_wait(EMU_E_cuLaunchKernel, bytes, 0, false, t0);
    return r;
}
