/* The allocator's own device kernels: range fill and range compare (see kernel.h).
 *
 * Both take their range list by value in the parameter block (so no host buffer has to outlive a
 * launch): fill {u64 addr[128], u64 len[128], u32 n, u32 value} (2056 bytes), check the same with
 * a u64 device pointer to the result words after len and a u32 generation after value (2072
 * bytes). Grid: block row y = range y, gridDim.x blocks of 256 threads striding over it; the
 * unaligned head and tail bytes one at a time, the aligned middle in 8-byte words.
 *
 * The check's answer: each thread that finds a differing byte raises result[i] with
 * atom.global.max.u64 to (gen << 40) | (len - offset), so the largest is the smallest offset of
 * this call's generation, and a word left from an earlier call (a smaller generation) reads as "no
 * byte differs". No copy in before the launch: one launch per 128 ranges, one copy out, one wait.
 * The words are zeroed when made and when the 24-bit generation wraps; ranges are under 2^40
 * bytes (1 TiB, more than any device holds).
 *
 * Per context: the module (JIT-compiled from the PTX below), its two functions, a device result
 * buffer and a pinned host staging buffer of as many words (grown when a check asks for more),
 * made on first use under the lock. A refusal of the module is remembered per context; every
 * other failure rolls back what it made and is tried again by the next call. */
#include "vmm/kernel.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fork.h"
#include "base/vec.h"
#include "base/witness.h"
#include "vmm/driver.h"

/* Hand-written PTX, JIT-compiled by the driver: .version 7.0 / sm_75 as benchmarks/gpu/
 * device_probe.py's probe kernel (any driver of CUDA 11+ and any GPU from Turing on takes it).
 * The parameter block's address is taken with mov (a kernel parameter is addressable in the
 * .param space), so a block row can index its range; device pointers are generic addresses of
 * global memory, hence cvta.to.global. Not static: tests/driver/test_vmm.c's module rows load the
 * same text on cudaemu and on the GPU. */
extern const char vkern_ptx[];
const char vkern_ptx[] =
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    "// fill: every byte of range ctaid.y set to value\n"
    ".visible .entry xseg_fill_ranges(.param .align 8 .b8 xseg_fill_args[2056])\n"
    "{\n"
    "    .reg .pred %p<6>;\n"
    "    .reg .b16 %rs<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<24>;\n"
    "    ld.param.u32 %r1, [xseg_fill_args+2048];\n"
    "    mov.u32 %r2, %ctaid.y;\n"
    "    setp.ge.u32 %p1, %r2, %r1;\n"
    "    @%p1 bra FILL_DONE;\n"
    "    mov.u64 %rd1, xseg_fill_args;\n"
    "    mul.wide.u32 %rd2, %r2, 8;\n"
    "    add.s64 %rd3, %rd1, %rd2;\n"
    "    ld.param.u64 %rd4, [%rd3];\n"
    "    ld.param.u64 %rd5, [%rd3+1024];\n"
    "    ld.param.u32 %r3, [xseg_fill_args+2052];\n"
    "    and.b32 %r3, %r3, 255;\n"
    "    cvt.u16.u32 %rs1, %r3;\n"
    "    cvt.u64.u32 %rd6, %r3;\n"
    "    mul.lo.u64 %rd7, %rd6, 72340172838076673;\n" /* value in every byte: 0x0101010101010101 */
    "    cvta.to.global.u64 %rd4, %rd4;\n"
    "    mov.u32 %r4, %ctaid.x;\n"
    "    mov.u32 %r5, %ntid.x;\n"
    "    mov.u32 %r6, %tid.x;\n"
    "    mov.u32 %r7, %nctaid.x;\n"
    "    mul.wide.u32 %rd8, %r4, %r5;\n"
    "    cvt.u64.u32 %rd9, %r6;\n"
    "    add.s64 %rd8, %rd8, %rd9;\n"          /* this thread's first index */
    "    mul.wide.u32 %rd10, %r7, %r5;\n"      /* the stride */
    "    neg.s64 %rd11, %rd4;\n"
    "    and.b64 %rd11, %rd11, 7;\n"
    "    min.u64 %rd11, %rd11, %rd5;\n"        /* head bytes before the first 8-byte boundary */
    "    sub.s64 %rd12, %rd5, %rd11;\n"
    "    shr.u64 %rd13, %rd12, 3;\n"           /* whole words */
    "    shl.b64 %rd14, %rd13, 3;\n"
    "    add.s64 %rd14, %rd14, %rd11;\n"       /* where the tail starts */
    "    sub.s64 %rd15, %rd5, %rd14;\n"
    "    add.s64 %rd16, %rd11, %rd15;\n"       /* edge bytes: head and tail */
    "    mov.u64 %rd17, %rd8;\n"
    "FILL_EDGE:\n"
    "    setp.ge.u64 %p2, %rd17, %rd16;\n"
    "    @%p2 bra FILL_BODY;\n"
    "    setp.lt.u64 %p3, %rd17, %rd11;\n"
    "    sub.s64 %rd18, %rd17, %rd11;\n"
    "    add.s64 %rd18, %rd18, %rd14;\n"
    "    selp.b64 %rd18, %rd17, %rd18, %p3;\n"
    "    add.s64 %rd19, %rd4, %rd18;\n"
    "    st.global.u8 [%rd19], %rs1;\n"
    "    add.s64 %rd17, %rd17, %rd10;\n"
    "    bra FILL_EDGE;\n"
    "FILL_BODY:\n"
    "    add.s64 %rd20, %rd4, %rd11;\n"
    "    mov.u64 %rd17, %rd8;\n"
    "FILL_WORD:\n"
    "    setp.ge.u64 %p4, %rd17, %rd13;\n"
    "    @%p4 bra FILL_DONE;\n"
    "    shl.b64 %rd21, %rd17, 3;\n"
    "    add.s64 %rd22, %rd20, %rd21;\n"
    "    st.global.u64 [%rd22], %rd7;\n"
    "    add.s64 %rd17, %rd17, %rd10;\n"
    "    bra FILL_WORD;\n"
    "FILL_DONE:\n"
    "    ret;\n"
    "}\n"
    "\n"
    "// check: result[ctaid.y] raised to (gen << 40) | (len - the offset of the first byte that is not value)\n"
    ".visible .entry xseg_check_ranges(.param .align 8 .b8 xseg_check_args[2072])\n"
    "{\n"
    "    .reg .pred %p<10>;\n"
    "    .reg .b16 %rs<3>;\n"
    "    .reg .b32 %r<10>;\n"
    "    .reg .b64 %rd<36>;\n"
    "    ld.param.u32 %r1, [xseg_check_args+2056];\n"
    "    mov.u32 %r2, %ctaid.y;\n"
    "    setp.ge.u32 %p1, %r2, %r1;\n"
    "    @%p1 bra CHECK_DONE;\n"
    "    mov.u64 %rd1, xseg_check_args;\n"
    "    mul.wide.u32 %rd2, %r2, 8;\n"
    "    add.s64 %rd3, %rd1, %rd2;\n"
    "    ld.param.u64 %rd4, [%rd3];\n"
    "    ld.param.u64 %rd5, [%rd3+1024];\n"
    "    ld.param.u32 %r3, [xseg_check_args+2060];\n"
    "    and.b32 %r3, %r3, 255;\n"
    "    cvt.u16.u32 %rs1, %r3;\n"
    "    cvt.u64.u32 %rd6, %r3;\n"
    "    mul.lo.u64 %rd7, %rd6, 72340172838076673;\n"
    "    cvta.to.global.u64 %rd4, %rd4;\n"
    "    ld.param.u64 %rd23, [xseg_check_args+2048];\n"
    "    cvta.to.global.u64 %rd23, %rd23;\n"
    "    add.s64 %rd23, %rd23, %rd2;\n"        /* &result[i] */
    "    mov.u64 %rd24, %rd5;\n"               /* this thread's smallest differing offset so far */
    "    mov.u32 %r4, %ctaid.x;\n"
    "    mov.u32 %r5, %ntid.x;\n"
    "    mov.u32 %r6, %tid.x;\n"
    "    mov.u32 %r7, %nctaid.x;\n"
    "    mul.wide.u32 %rd8, %r4, %r5;\n"
    "    cvt.u64.u32 %rd9, %r6;\n"
    "    add.s64 %rd8, %rd8, %rd9;\n"
    "    mul.wide.u32 %rd10, %r7, %r5;\n"
    "    neg.s64 %rd11, %rd4;\n"
    "    and.b64 %rd11, %rd11, 7;\n"
    "    min.u64 %rd11, %rd11, %rd5;\n"
    "    sub.s64 %rd12, %rd5, %rd11;\n"
    "    shr.u64 %rd13, %rd12, 3;\n"
    "    shl.b64 %rd14, %rd13, 3;\n"
    "    add.s64 %rd14, %rd14, %rd11;\n"
    "    sub.s64 %rd15, %rd5, %rd14;\n"
    "    add.s64 %rd16, %rd11, %rd15;\n"
    "    mov.u64 %rd17, %rd8;\n"
    "CHECK_EDGE:\n"
    "    setp.ge.u64 %p2, %rd17, %rd16;\n"
    "    @%p2 bra CHECK_BODY;\n"
    "    setp.lt.u64 %p3, %rd17, %rd11;\n"
    "    sub.s64 %rd18, %rd17, %rd11;\n"
    "    add.s64 %rd18, %rd18, %rd14;\n"
    "    selp.b64 %rd18, %rd17, %rd18, %p3;\n"
    "    add.s64 %rd19, %rd4, %rd18;\n"
    "    ld.global.u8 %rs2, [%rd19];\n"
    "    setp.ne.u16 %p5, %rs2, %rs1;\n"
    "    min.u64 %rd25, %rd24, %rd18;\n"
    "    selp.b64 %rd24, %rd25, %rd24, %p5;\n"
    "    add.s64 %rd17, %rd17, %rd10;\n"
    "    bra CHECK_EDGE;\n"
    "CHECK_BODY:\n"
    "    add.s64 %rd20, %rd4, %rd11;\n"
    "    mov.u64 %rd17, %rd8;\n"
    "CHECK_WORD:\n"
    "    setp.ge.u64 %p4, %rd17, %rd13;\n"
    "    @%p4 bra CHECK_REPORT;\n"
    "    shl.b64 %rd21, %rd17, 3;\n"
    "    add.s64 %rd22, %rd20, %rd21;\n"
    "    ld.global.u64 %rd26, [%rd22];\n"
    "    xor.b64 %rd27, %rd26, %rd7;\n"
    "    setp.ne.u64 %p6, %rd27, 0;\n"
    "    @%p6 bra CHECK_FOUND;\n"
    "    add.s64 %rd17, %rd17, %rd10;\n"
    "    bra CHECK_WORD;\n"
    "CHECK_FOUND:\n"                        /* little-endian: the lowest differing byte comes first */
    "    brev.b64 %rd28, %rd27;\n"
    "    clz.b64 %r8, %rd28;\n"
    "    shr.u32 %r8, %r8, 3;\n"
    "    cvt.u64.u32 %rd29, %r8;\n"
    "    add.s64 %rd29, %rd29, %rd21;\n"
    "    add.s64 %rd29, %rd29, %rd11;\n"
    "    min.u64 %rd24, %rd24, %rd29;\n"      /* a thread's later words lie further on */
    "CHECK_REPORT:\n"
    "    setp.ge.u64 %p7, %rd24, %rd5;\n"
    "    @%p7 bra CHECK_DONE;\n"
    "    ld.param.u32 %r9, [xseg_check_args+2064];\n"
    "    cvt.u64.u32 %rd31, %r9;\n"
    "    shl.b64 %rd31, %rd31, 40;\n"
    "    sub.s64 %rd32, %rd5, %rd24;\n"
    "    or.b64 %rd32, %rd32, %rd31;\n"
    "    atom.global.max.u64 %rd30, [%rd23], %rd32;\n"
    "CHECK_DONE:\n"
    "    ret;\n"
    "}\n";

/* The parameter blocks, as the PTX declares them. */
struct vkern_fill_args {
    uint64_t addr[VKERN_MAX_RANGES];
    uint64_t len[VKERN_MAX_RANGES];
    uint32_t n;
    uint32_t value;
};
struct vkern_check_args {
    uint64_t addr[VKERN_MAX_RANGES];
    uint64_t len[VKERN_MAX_RANGES];
    uint64_t result;
    uint32_t n;
    uint32_t value;
    uint32_t gen;
    uint32_t pad;
};
_Static_assert(VKERN_MAX_RANGES == 128, "the PTX's parameter blocks hold 128 ranges");
_Static_assert(sizeof(struct vkern_fill_args) == 2056, "xseg_fill_ranges' parameter block");
_Static_assert(sizeof(struct vkern_check_args) == 2072, "xseg_check_ranges' parameter block");

/* The check's result word: generation above bit 40, len - offset below. */
#define VKERN_LEN_BITS 40
#define VKERN_GEN_MAX ((1u << 24) - 1)

#define VKERN_THREADS 256u
/* Blocks per range row at most: enough to keep an H100's SMs busy on a few large ranges. */
#define VKERN_MAX_BLOCKS_X 512u

enum vkern_state { VKERN_UNTRIED, VKERN_READY, VKERN_REFUSED };

struct vkern_ctx {
    CUcontext ctx;
    enum vkern_state state;
    char why[200];          /* VKERN_REFUSED: the driver's answer */
    CUmodule mod;
    CUfunction fill, check;
    CUdeviceptr res;        /* cap result words on the device */
    uint64_t *stage;        /* cap words of pinned host memory: the result words out */
    size_t cap;
    uint32_t gen;           /* the last check's generation (0: none since the words were zeroed) */
};

static struct vkern_proc {
    pthread_mutex_t lock;
    struct vkern_ctx *v;
    size_t n, cap;
} vkern_proc = {.lock = PTHREAD_MUTEX_INITIALIZER};
FORK_MUTEX_AT(FORK_RANK_VMM_KERNEL, vkern_lock, vkern_proc.lock)

/* The child forgets the parent's modules and buffers: they belong to the parent's contexts. */
static void vkern_fork_child(void)
{
    free(vkern_proc.v);
    vkern_proc.v = NULL;
    vkern_proc.n = vkern_proc.cap = 0;
}
FORK_CHILD(FORK_RANK_VMM_KERNEL, vkern_fork_child)

/* The entry of @p ctx, added (untried) when missing; NULL when out of host memory. Lock held. */
static struct vkern_ctx *vkern_entry(CUcontext ctx, bool add)
{
    for (size_t i = 0; i < vkern_proc.n; i++)
        if (vkern_proc.v[i].ctx == ctx)
            return &vkern_proc.v[i];
    if (!add)
        return NULL;
    if (!VEC_RESERVE(vkern_proc.v, vkern_proc.cap, vkern_proc.n + 1)) {
        err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for the allocator's kernel table");
        return NULL;
    }
    struct vkern_ctx *k = &vkern_proc.v[vkern_proc.n++];
    memset(k, 0, sizeof *k);
    k->ctx = ctx;
    return k;
}

/* Device result words and pinned staging for @p words ranges, replacing smaller ones only once
 * both new buffers exist (a failure keeps the old ones). Lock held. */
static xseg_status vkern_buffers(struct vkern_ctx *k, size_t words)
{
    if (words <= k->cap)
        return XSEG_SUCCESS;
    size_t cap = k->cap ? k->cap : VKERN_MAX_RANGES;
    while (cap < words)
        cap *= 2;
    CUdeviceptr res = 0;
    void *stage = NULL;
    char what[96];
    CUresult r = drv->cuMemAlloc(&res, cap * sizeof(uint64_t));
    if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemAlloc(%zu bytes) for the allocator's kernel results", cap * sizeof(uint64_t));
        return drv_fail(r, what);
    }
    /* Zero: a fresh word must not look like an answer of some generation. */
    r = drv->cuMemsetD8(res, 0, cap * sizeof(uint64_t));
    if (r != CUDA_SUCCESS) {
        (void)drv->cuMemFree(res);
        snprintf(what, sizeof what, "cuMemsetD8(%zu bytes) of the allocator's kernel results", cap * sizeof(uint64_t));
        return drv_fail(r, what);
    }
    r = drv->cuMemHostAlloc(&stage, cap * sizeof(uint64_t), CU_MEMHOSTALLOC_PORTABLE);
    if (r != CUDA_SUCCESS) {
        (void)drv->cuMemFree(res);
        snprintf(what, sizeof what, "cuMemHostAlloc(%zu bytes) for the allocator's kernel results",
                 cap * sizeof(uint64_t));
        return drv_fail(r, what);
    }
    if (k->res)
        (void)drv->cuMemFree(k->res);
    if (k->stage)
        (void)drv->cuMemFreeHost(k->stage);
    k->res = res;
    k->stage = stage;
    k->cap = cap;
    k->gen = 0;
    return XSEG_SUCCESS;
}

/* Load the module of the current context if not yet done. Lock held. */
static xseg_status vkern_load(struct vkern_ctx **out)
{
    *out = NULL;
    CUcontext ctx = NULL;
    CUresult r = drv->cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS)
        return drv_fail(r, "cuCtxGetCurrent() for the allocator's kernels");
    if (!ctx)
        return err_set(XSEG_ERROR_DRIVER, "the allocator's kernels: no current context");
    struct vkern_ctx *k = vkern_entry(ctx, true);
    if (!k)
        return XSEG_ERROR_OUT_OF_MEMORY;
    if (k->state == VKERN_READY) {
        *out = k;
        return XSEG_SUCCESS;
    }
    if (k->state == VKERN_REFUSED)
        return err_set(XSEG_ERROR_NOT_SUPPORTED, "%s", k->why);
    const char *call = "cuModuleLoadData(the PTX of xseg_fill_ranges, xseg_check_ranges)";
    CUmodule mod = NULL;
    CUfunction fill = NULL, check = NULL;
    r = drv->cuModuleLoadData(&mod, vkern_ptx);
    if (r == CUDA_SUCCESS) {
        call = "cuModuleGetFunction(xseg_fill_ranges)";
        r = drv->cuModuleGetFunction(&fill, mod, "xseg_fill_ranges");
    }
    if (r == CUDA_SUCCESS) {
        call = "cuModuleGetFunction(xseg_check_ranges)";
        r = drv->cuModuleGetFunction(&check, mod, "xseg_check_ranges");
    }
    if (r != CUDA_SUCCESS) {
        if (mod)
            (void)drv->cuModuleUnload(mod);
        /* Out of memory may pass; any other answer is the driver's refusal of the module, kept. */
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            return drv_fail(r, call);
        snprintf(k->why, sizeof k->why, "the allocator's kernels cannot run here: %s failed: %s", call,
                 drv_error_name(r));
        k->state = VKERN_REFUSED;
        return err_set(XSEG_ERROR_NOT_SUPPORTED, "%s", k->why);
    }
    xseg_status st = vkern_buffers(k, VKERN_MAX_RANGES);
    if (st != XSEG_SUCCESS) {
        (void)drv->cuModuleUnload(mod);
        return st;
    }
    k->mod = mod;
    k->fill = fill;
    k->check = check;
    k->state = VKERN_READY;
    *out = k;
    return XSEG_SUCCESS;
}

xseg_status vkern_ready(void)
{
    xseg_status st = drv_load();
    if (st != XSEG_SUCCESS)
        return st;
    mutex_lock(&vkern_proc.lock);
    struct vkern_ctx *k;
    st = vkern_load(&k);
    mutex_unlock(&vkern_proc.lock);
    return st;
}

/* Blocks per row for ranges[0, n): enough threads for the longest range's words, capped. */
static unsigned vkern_blocks(const struct vkern_range *ranges, size_t n)
{
    size_t longest = 0;
    for (size_t i = 0; i < n; i++)
        if (ranges[i].len > longest)
            longest = ranges[i].len;
    size_t words = longest / 8 + 1;
    size_t blocks = (words + VKERN_THREADS - 1) / VKERN_THREADS;
    return blocks > VKERN_MAX_BLOCKS_X ? VKERN_MAX_BLOCKS_X : (unsigned)blocks;
}

/* One launch of @p fn over ranges[0, n) (n <= VKERN_MAX_RANGES) with parameter block @p args. */
static xseg_status vkern_launch(CUfunction fn, const char *name, const struct vkern_range *ranges, size_t n,
                                void *args, CUstream stream)
{
    void *params[] = {args};
    CUresult r = drv->cuLaunchKernel(fn, vkern_blocks(ranges, n), (unsigned)n, 1, VKERN_THREADS, 1, 1, 0, stream,
                                     params, NULL);
    if (r == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    char what[160];
    snprintf(what, sizeof what, "cuLaunchKernel(%s, %zu ranges from %#" PRIx64 ", stream %p)", name, n,
             (uint64_t)ranges[0].addr, (void *)stream);
    return drv_fail(r, what);
}

xseg_status vkern_fill(const struct vkern_range *ranges, size_t n, unsigned char value, CUstream stream)
{
    if (n && !ranges)
        return err_set(XSEG_ERROR_INVALID_VALUE, "vkern_fill: %zu ranges at NULL", n);
    xseg_status st = drv_load();
    if (st != XSEG_SUCCESS)
        return st;
    mutex_lock(&vkern_proc.lock);
    struct vkern_ctx *k;
    st = vkern_load(&k);
    for (size_t at = 0; st == XSEG_SUCCESS && at < n; at += VKERN_MAX_RANGES) {
        size_t m = n - at < VKERN_MAX_RANGES ? n - at : VKERN_MAX_RANGES;
        struct vkern_fill_args a;
        memset(&a, 0, sizeof a);
        for (size_t i = 0; i < m; i++) {
            a.addr[i] = ranges[at + i].addr;
            a.len[i] = ranges[at + i].len;
        }
        a.n = (uint32_t)m;
        a.value = value;
        st = vkern_launch(k->fill, "xseg_fill_ranges", ranges + at, m, &a, stream);
    }
    mutex_unlock(&vkern_proc.lock);
    return st;
}

xseg_status vkern_check(const struct vkern_range *ranges, size_t n, unsigned char value, CUstream stream,
                        size_t *first)
{
    if (n && (!ranges || !first))
        return err_set(XSEG_ERROR_INVALID_VALUE, "vkern_check: %zu ranges at %p, results at %p", n,
                       (const void *)ranges, (void *)first);
    for (size_t i = 0; i < n; i++)
        if ((uint64_t)ranges[i].len >> VKERN_LEN_BITS)
            return err_set(XSEG_ERROR_INVALID_VALUE, "vkern_check: range %zu of %zu bytes, 1 TiB or more", i,
                           ranges[i].len);
    xseg_status st = drv_load();
    if (st != XSEG_SUCCESS)
        return st;
    mutex_lock(&vkern_proc.lock);
    struct vkern_ctx *k;
    st = vkern_load(&k);
    if (st == XSEG_SUCCESS && n)
        st = vkern_buffers(k, n);
    if (st != XSEG_SUCCESS || !n) {
        mutex_unlock(&vkern_proc.lock);
        return st;
    }
    /* A new generation (the words zeroed again when it wraps), one launch per 128 ranges, the
     * words out, one wait. The staging buffer is this context's: the lock is held throughout. The
     * generation advances before any launch, so a failed call's words never count later. */
    char what[160];
    CUresult r = CUDA_SUCCESS;
    if (k->gen == VKERN_GEN_MAX) {
        if ((r = drv->cuMemsetD8Async(k->res, 0, k->cap * sizeof(uint64_t), stream)) != CUDA_SUCCESS) {
            snprintf(what, sizeof what, "cuMemsetD8Async(%zu bytes, stream %p) of the check's words at the "
                     "generation's wrap", k->cap * sizeof(uint64_t), (void *)stream);
            mutex_unlock(&vkern_proc.lock);
            return drv_fail(r, what);
        }
        k->gen = 0;
    }
    uint32_t gen = ++k->gen;
    for (size_t at = 0; st == XSEG_SUCCESS && at < n; at += VKERN_MAX_RANGES) {
        size_t m = n - at < VKERN_MAX_RANGES ? n - at : VKERN_MAX_RANGES;
        struct vkern_check_args a;
        memset(&a, 0, sizeof a);
        for (size_t i = 0; i < m; i++) {
            a.addr[i] = ranges[at + i].addr;
            a.len[i] = ranges[at + i].len;
        }
        a.result = k->res + at * sizeof(uint64_t);
        a.n = (uint32_t)m;
        a.value = value;
        a.gen = gen;
        st = vkern_launch(k->check, "xseg_check_ranges", ranges + at, m, &a, stream);
    }
    if (st == XSEG_SUCCESS && (r = drv->cuMemcpyDtoHAsync(k->stage, k->res, n * sizeof(uint64_t), stream)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuMemcpyDtoHAsync(%zu bytes, stream %p) of the check's offsets",
                 n * sizeof(uint64_t), (void *)stream);
        st = drv_fail(r, what);
    }
    /* Waited for even after a failed launch: its earlier launches and the copy out are queued. */
    r = drv->cuStreamSynchronize(stream);
    if (r != CUDA_SUCCESS && st == XSEG_SUCCESS) {
        snprintf(what, sizeof what, "cuStreamSynchronize(%p) after the allocator's range check", (void *)stream);
        st = drv_fail(r, what);
    }
    if (st == XSEG_SUCCESS)
        for (size_t i = 0; i < n; i++) {
            uint64_t w = k->stage[i], back = w & (((uint64_t)1 << VKERN_LEN_BITS) - 1);
            bool found = w >> VKERN_LEN_BITS == gen && back && back <= ranges[i].len;
            first[i] = found ? ranges[i].len - (size_t)back : ranges[i].len;
        }
    mutex_unlock(&vkern_proc.lock);
    return st;
}

void vkern_release(CUcontext ctx)
{
    if (!drv || !ctx)
        return;
    mutex_lock(&vkern_proc.lock);
    struct vkern_ctx *k = vkern_entry(ctx, false);
    if (k) {
        /* The frees and the unload in their own context, whichever is current here. */
        bool pushed = drv->cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
        if (k->mod)
            (void)drv->cuModuleUnload(k->mod);
        if (k->res)
            (void)drv->cuMemFree(k->res);
        if (k->stage)
            (void)drv->cuMemFreeHost(k->stage);
        if (pushed) {
            CUcontext popped;
            (void)drv->cuCtxPopCurrent(&popped);
        }
        *k = vkern_proc.v[--vkern_proc.n];
    }
    mutex_unlock(&vkern_proc.lock);
}
