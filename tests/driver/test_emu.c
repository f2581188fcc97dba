/*
 * cudaemu's own checks (emulator only; the program exits 77 on a real driver): CUDAEMU_*
 * parsing, fault injection, latency, counters, the exit report, calls before cuInit, error
 * names, several devices, and a multi-threaded VMM workout for the TSan build.
 *
 * Environment cases need a fresh process (the environment is read once): this binary
 * re-executes itself with --child=CASE and extra variables, and checks its exit status and
 * stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/testutil.h"
#include "vmm/kernel.h"

extern char **environ;
static char self_path[4096];
#define MiB2 ((size_t)2 << 20)

/* Run this binary with --child=@p mode and @p extra ("NAME=value", NULL-terminated) added to
 * the environment; stderr (and stdout) go to @p out. @return the exit status, or 128 + signal. */
static int run_self(const char *mode, const char *const *extra, char *out, size_t outsz)
{
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    while (extra && extra[k])
        k++;
    char **envp = calloc(n + k + 1, sizeof *envp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        bool overridden = false;
        for (size_t j = 0; j < k; j++) {
            size_t len = strcspn(extra[j], "=");
            overridden |= !strncmp(environ[i], extra[j], len + 1);
        }
        if (!overridden)
            envp[m++] = environ[i];
    }
    for (size_t j = 0; j < k; j++)
        envp[m++] = (char *)extra[j];
    int fds[2];
    if (pipe(fds))
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    char opt[64];
    snprintf(opt, sizeof opt, "--child=%s", mode);
    char *argv[] = {self_path, opt, NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, self_path, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while ((r = read(fds[0], out + got, outsz - 1 - got)) > 0 && got + 1 < outsz)
        got += (size_t)r;
    out[got] = '\0';
    close(fds[0]);
    if (rc)
        return -1;
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void *child_open(void)
{
    void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "child: %s\n", dlerror());
        exit(90);
    }
    return lib;
}

static int child_main(const char *mode)
{
    if (!strcmp(mode, "init"))
        return drv_load() == XSEG_SUCCESS ? 0 : 10;
    if (!strcmp(mode, "before-init")) {
        /* Straight to the library: drv_load would call cuInit. */
        void *lib = child_open();
        CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
        CUresult (*count)(int *) = (CUresult(*)(int *))dlsym(lib, "cuDeviceGetCount");
        CUdeviceptr p;
        int n;
        printf("alloc=%d count=%d\n", (int)alloc(&p, 16), (int)count(&n));
        return 0;
    }
    if (!tu_gpu_available())
        return 11;
    if (!strcmp(mode, "arena-limited")) {
        /* A host that grants less than the arena's first sizes (valgrind: under 64 GiB in all):
         * the address space capped at what is mapped now plus 48 GiB, before the first
         * reservation makes the arena. Halving alone stopped at 32 GiB. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
        printf("skip: a sanitizer's shadow memory needs the address space this caps\n");
        return 77;
#else
        tu_ctx_set();
        unsigned long pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%lu", &pages) != 1)
            return 13;
        fclose(f);
        struct rlimit rl;
        getrlimit(RLIMIT_AS, &rl);
        rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)48 << 30);
        if (setrlimit(RLIMIT_AS, &rl))
            return 14;
        CUdeviceptr va = 0;
        CUresult r = drv->cuMemAddressReserve(&va, (size_t)40 << 30, 0, 0, 0);
        printf("reserve 40 GiB: %d\n", (int)r);
        if (r == CUDA_SUCCESS)
            drv->cuMemAddressFree(va, (size_t)40 << 30);
        return r == CUDA_SUCCESS ? 0 : 15;
#endif
    }
    if (!strcmp(mode, "total")) {
        struct drv_device_info info;
        if (drv_device_query(0, &info))
            return 12;
        printf("total=%zu granularity=%zu\n", info.total_mem, info.granularity);
        return 0;
    }
    if (!strcmp(mode, "fail-env")) {
        CUdeviceptr p[3];
        CUresult r[3];
        for (int i = 0; i < 3; i++)
            r[i] = drv->cuMemAlloc(&p[i], 4096);
        printf("results=%d,%d,%d\n", (int)r[0], (int)r[1], (int)r[2]);
        for (int i = 0; i < 3; i++)
            if (r[i] == CUDA_SUCCESS)
                drv->cuMemFree(p[i]);
        return 0;
    }
    if (!strcmp(mode, "latency-env")) {
        struct timespec a, b;
        size_t f, t;
        clock_gettime(CLOCK_MONOTONIC, &a);
        drv->cuMemGetInfo(&f, &t);
        clock_gettime(CLOCK_MONOTONIC, &b);
        long ns = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
        printf("elapsed_ns=%ld\n", ns);
        return ns >= 3000000 ? 0 : 13;
    }
    if (!strcmp(mode, "fresh")) {
        /* What new memory holds: bytes at the start of the allocation, inside its first host page,
         * at the start of its second granularity unit and in the middle, and after a memset to zero. */
        struct drv_device_info info;
        if (drv_device_query(0, &info))
            return 12;
        size_t g = info.granularity;
        CUmemAllocationProp p = {0};
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (drv->cuMemCreate(&h, 2 * g, &p, 0) || drv->cuMemAddressReserve(&va, 2 * g, 0, 0, 0) ||
            drv->cuMemMap(va, 2 * g, 0, h, 0) || drv->cuMemSetAccess(va, 2 * g, &d, 1))
            return 13;
        unsigned char b[4];
        size_t at[4] = {0, 100, g, g / 2};
        for (int i = 0; i < 4; i++)
            if (drv->cuMemcpyDtoH(&b[i], va + at[i], 1))
                return 14;
        printf("start=%d inside=%d unit2=%d middle=%d\n", b[0] != 0, b[1] != 0, b[2] != 0, b[3] != 0);
        if (drv->cuMemsetD8(va + 1, 0, 2 * g - 2))
            return 15;
        for (int i = 0; i < 4; i++)
            if (drv->cuMemcpyDtoH(&b[i], va + at[i] + (i == 0), 1))
                return 14;
        printf("after-memset=%d%d%d%d\n", b[0], b[1], b[2], b[3]);
        drv->cuMemUnmap(va, 2 * g);
        drv->cuMemRelease(h);
        drv->cuMemAddressFree(va, 2 * g);
        return 0;
    }
    if (!strcmp(mode, "report")) {
        CUdeviceptr va;
        drv->cuMemAddressReserve(&va, MiB2, 0, 0, 0);   /* left reserved on purpose */
        return 0;
    }
    if (!strcmp(mode, "report-kernel")) {
        /* Two launches over 1000 + 5000 bytes: the report counts the calls and their bytes. */
        CUdeviceptr p;
        if (drv->cuMemAlloc(&p, MiB2))
            return 16;
        struct vkern_range r[2] = {{p + 1, 1000}, {p + 4096, 5000}};
        size_t first[2];
        if (vkern_fill(r, 2, 0xff, NULL) != XSEG_SUCCESS || vkern_check(r, 2, 0xff, NULL, first) != XSEG_SUCCESS)
            return 17;
        printf("first=%zu,%zu\n", first[0], first[1]);
        return 0; /* the module stays loaded: the report lists it */
    }
    if (!strcmp(mode, "two-devices")) {
        int n = 0, peer = 0;
        drv->cuDeviceGetCount(&n);
        drv->cuDeviceCanAccessPeer(&peer, 0, 1);
        CUmemAllocationProp p = {0};
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = 1;
        CUmemGenericAllocationHandle h;
        CUresult r = drv->cuMemCreate(&h, MiB2, &p, 0);
        struct cudaemu_live live;
        tu_live(&live);
        printf("count=%d peer=%d create1=%d used0=%zu used1=%zu\n", n, peer, (int)r, live.used_bytes[0],
               live.used_bytes[1]);
        /* Device 1's context: cuMemGetInfo reports its own use. */
        CUcontext c1;
        drv->cuDevicePrimaryCtxRetain(&c1, 1);
        drv->cuCtxSetCurrent(c1);
        size_t f, t;
        drv->cuMemGetInfo(&f, &t);
        printf("free1=%zu total1=%zu\n", f, t);
        drv->cuMemRelease(h);
        drv->cuDevicePrimaryCtxRelease(1);
        return 0;
    }
    return 99;
}

/* ---- environment parsing ---- */

static void expect_bad_env(const char *assignment)
{
    char out[4096];
    const char *extra[] = {assignment, NULL};
    int rc = run_self("init", extra, out, sizeof out);
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(assignment, "="), assignment);
    print_message("%s: exit %d: %s", assignment, rc, out);
    assert_true(rc != 0);
    if (!strstr(out, name))
        fail_msg("the message for %s does not name %s: %s", assignment, name, out);
}

static void test_env_errors(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "CUDAEMU_DEVICES=abc", "CUDAEMU_DEVICES=-1", "CUDAEMU_DEVICES=65",
        "CUDAEMU_TOTAL_MEM=80X", "CUDAEMU_TOTAL_MEM=", "CUDAEMU_TOTAL_MEM=99999999999T",
        "CUDAEMU_GRANULARITY=3000", "CUDAEMU_GRANULARITY=1K", "CUDAEMU_VMM=2", "CUDAEMU_VMM=yes", "CUDAEMU_KERNELS=2",
        "CUDAEMU_FAIL=cuMemMap", "CUDAEMU_FAIL=cuMemMap:x:CUDA_ERROR_OUT_OF_MEMORY",
        "CUDAEMU_FAIL=cuMemMap:0:CUDA_ERROR_OUT_OF_MEMORY", "CUDAEMU_FAIL=cuNope:1:CUDA_ERROR_OUT_OF_MEMORY",
        "CUDAEMU_FAIL=cuMemMap:1:CUDA_ERROR_BOGUS", "CUDAEMU_LATENCY=cuMemMap:12parsecs",
        "CUDAEMU_LATENCY=cuMemMap", "CUDAEMU_LATENCY=h300", "CUDAEMU_REPORT=on", "CUDAEMU_TYPO=1",
        "CUDAEMU_LATENCY=cuMemcpyDtoH:25GB", "CUDAEMU_LATENCY=cuMemcpyDtoH:0GB/s",
        "CUDAEMU_LATENCY=cuMemcpyDtoH:25XB/s", "CUDAEMU_LATENCY=cuMemcpyDtoH:1.2345GB/s", "CUDAEMU_FRESH=maybe",
        "CUDAEMU_LATENCY=link:3us", "CUDAEMU_LATENCY=link:0GB/s", "CUDAEMU_HOST_VMM=maybe",
        "CUDAEMU_LATENCY=pageable:3us", "CUDAEMU_LATENCY=pageable:0GB/s",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_bad_env(bad[i]);
}

static void test_env_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b, *want;
    } ok[] = {
        {"CUDAEMU_TOTAL_MEM=81920M", NULL, "total=85899345920 granularity=2097152"},
        {"CUDAEMU_TOTAL_MEM=1G", "CUDAEMU_GRANULARITY=64K", "total=1073741824 granularity=65536"},
        {"CUDAEMU_TOTAL_MEM=268435456", "CUDAEMU_GRANULARITY=2MiB", "total=268435456 granularity=2097152"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char out[4096];
        const char *extra[] = {ok[i].a, ok[i].b, NULL};
        assert_int_equal(run_self("total", extra, out, sizeof out), 0);
        if (!strstr(out, ok[i].want))
            fail_msg("%s: got \"%s\", want \"%s\"", ok[i].a, out, ok[i].want);
    }
}

static void test_env_fail_latency_report(void **state)
{
    (void)state;
    char out[8192];
    /* API and ABI names both work; the second call fails, the others succeed. */
    const char *f1[] = {"CUDAEMU_FAIL=cuMemAlloc:2:CUDA_ERROR_OUT_OF_MEMORY", NULL};
    assert_int_equal(run_self("fail-env", f1, out, sizeof out), 0);
    assert_non_null(strstr(out, "results=0,2,0"));
    const char *f2[] = {"CUDAEMU_FAIL=cuMemAlloc_v2:1:999,cuMemAlloc:3:CUDA_ERROR_INVALID_VALUE", NULL};
    assert_int_equal(run_self("fail-env", f2, out, sizeof out), 0);
    assert_non_null(strstr(out, "results=999,0,1"));
    const char *l[] = {"CUDAEMU_LATENCY=cuMemGetInfo:3ms,cuMemMap:12us", NULL};
    assert_int_equal(run_self("latency-env", l, out, sizeof out), 0);
    /* The h100 preset, with one entry overridden after it; the report lists what is in force. */
    const char *lp[] = {"CUDAEMU_LATENCY=h100,cuMemMap:2us", "CUDAEMU_REPORT=1", NULL};
    assert_int_equal(run_self("report", lp, out, sizeof out), 0);
    assert_non_null(strstr(out, ", latency 21900 ns")); /* cuMemSetAccess from the preset */
    assert_non_null(strstr(out, ", latency 2000 ns"));  /* cuMemMap, overridden */
    assert_null(strstr(out, ", latency 700 ns"));
    assert_non_null(strstr(out, "cuMemcpyDtoHAsync                  0 call(s), 40 ps per byte")); /* 25 GB/s */
    assert_non_null(strstr(out, "link bytes 0 (")); /* the preset's link rate is listed */
    /* The h200 preset: that machine's per-call medians, 50 GB/s pinned and 25 GB/s pageable copies,
     * pinning at its fitted cost. */
    const char *lh[] = {"CUDAEMU_LATENCY=h200", "CUDAEMU_REPORT=1", NULL};
    assert_int_equal(run_self("report", lh, out, sizeof out), 0);
    assert_non_null(strstr(out, ", latency 21040 ns"));  /* cuMemSetAccess */
    assert_non_null(strstr(out, "cuMemcpyDtoHAsync                  0 call(s), 20 ps per byte"));
    assert_non_null(strstr(out, "cuMemHostAlloc                     0 call(s), 494 ps per byte")); /* 530 ms/GiB */
    assert_non_null(strstr(out, "cuMemFreeHost                      0 call(s), 141 ps per byte")); /* 151 ms/GiB */
    assert_non_null(strstr(out, "pageable host memory copies 40 ps per byte"));
    const char *ll[] = {"CUDAEMU_LATENCY=link:12.5GB/s", "CUDAEMU_REPORT=1", NULL};
    assert_int_equal(run_self("report", ll, out, sizeof out), 0);
    assert_non_null(strstr(out, "link bytes 0 (copies to or from host-located VMM memory"));
    assert_non_null(strstr(out, "80 ps per byte"));
    const char *lr[] = {"CUDAEMU_LATENCY=cuMemcpyHtoD:12.5GB/s", "CUDAEMU_REPORT=1", NULL};
    assert_int_equal(run_self("report", lr, out, sizeof out), 0);
    assert_non_null(strstr(out, ", 80 ps per byte"));
    const char *r[] = {"CUDAEMU_REPORT=1", NULL};
    assert_int_equal(run_self("report", r, out, sizeof out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "cudaemu report: 0 live handle(s), 0 mapped byte(s), 1 reservation(s)"));
    assert_non_null(strstr(out, "cuMemAddressReserve"));
    /* The allocator's kernels: launches, the bytes their ranges hold, a latency of their own. */
    const char *k[] = {"CUDAEMU_REPORT=1", "CUDAEMU_LATENCY=cuLaunchKernel:5us", NULL};
    assert_int_equal(run_self("report-kernel", k, out, sizeof out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "first=1000,5000"));
    assert_non_null(strstr(out, "cuLaunchKernel                     2 call(s), latency 5000 ns"));
    assert_non_null(strstr(out, "cuLaunchKernel                     12000 byte(s) moved"));
    assert_non_null(strstr(out, "cudaemu report: 1 module(s) loaded"));
    const char *d[] = {"CUDAEMU_DEVICES=2", "CUDAEMU_TOTAL_MEM=1G", NULL};
    assert_int_equal(run_self("two-devices", d, out, sizeof out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "count=2 peer=1 create1=0 used0=0 used1=2097152"));
    assert_non_null(strstr(out, "free1=1071644672 total1=1073741824"));
}

static void test_before_init(void **state)
{
    (void)state;
    char out[4096];
    assert_int_equal(run_self("before-init", NULL, out, sizeof out), 0);
    assert_non_null(strstr(out, "alloc=3 count=3"));   /* CUDA_ERROR_NOT_INITIALIZED */
}

/* ---- in-process controls ---- */

static CUmemAllocationProp prop0(void)
{
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    return p;
}

static void test_fault_injection(void **state)
{
    (void)state;
    tu_ctx_set();
    CUmemAllocationProp p = prop0();
    struct cudaemu_live before, after;
    tu_live(&before);
    unsigned long fired = tu_fail_fired();
    /* A failed injected call does nothing else, and counts as fired. */
    assert_true(tu_fail("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY));
    assert_int_equal(tu_fail_fired(), fired);
    CUmemGenericAllocationHandle h = 0;
    tu_assert_cu_eq(drv->cuMemCreate(&h, MiB2, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(h, 0);
    assert_int_equal(tu_fail_fired(), fired + 1);
    tu_live(&after);
    assert_int_equal(after.handles, before.handles);
    assert_int_equal(after.used_bytes[0], before.used_bytes[0]);
    tu_assert_cu(drv->cuMemCreate(&h, MiB2, &p, 0));

    CUdeviceptr va;
    tu_assert_cu(drv->cuMemAddressReserve(&va, 2 * MiB2, 0, 0, 0));
    CUmemGenericAllocationHandle h2;
    tu_assert_cu(drv->cuMemCreate(&h2, MiB2, &p, 0));
    assert_true(tu_fail("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY));
    tu_assert_cu(drv->cuMemMap(va, MiB2, 0, h, 0));
    assert_int_equal(tu_fail_fired(), fired + 1); /* armed, not reached yet */
    tu_assert_cu_eq(drv->cuMemMap(va + MiB2, MiB2, 0, h2, 0), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(tu_fail_fired(), fired + 2);
    tu_live(&after);
    assert_int_equal(after.mapped_bytes, before.mapped_bytes + MiB2);
    tu_assert_cu(drv->cuMemMap(va + MiB2, MiB2, 0, h2, 0));   /* the VA was left unmapped */
    /* ABI names, several armed at once, and clearing. */
    assert_true(tu_fail("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN));
    assert_true(tu_fail("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY));
    assert_false(tu_fail("cuNotAnEntry", 1, CUDA_ERROR_UNKNOWN));
    tu_assert_cu_eq(drv->cuMemUnmap(va, 2 * MiB2), CUDA_ERROR_UNKNOWN);
    tu_fail_clear();
    assert_int_equal(tu_fail_fired(), fired + 3); /* the cleared cuMemAlloc one never fired */
    CUdeviceptr d;
    tu_assert_cu(drv->cuMemAlloc(&d, 100));
    tu_assert_cu(drv->cuMemFree(d));
    tu_assert_cu(drv->cuMemUnmap(va, 2 * MiB2));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemRelease(h2));
    tu_assert_cu(drv->cuMemAddressFree(va, 2 * MiB2));
    tu_live(&after);
    assert_int_equal(after.handles, before.handles);
    assert_int_equal(after.mapped_bytes, before.mapped_bytes);
    assert_int_equal(after.reservations, before.reservations);
}

/* New physical memory is not promised to be zero (CUDAEMU_FRESH); a memset to zero clears it
 * (over VMM memory by punching the memory file, which must read the same). */
static void test_fresh_memory(void **state)
{
    (void)state;
    static const struct {
        const char *env, *want;
    } cases[] = {
        {NULL, "start=1 inside=1 unit2=0 middle=0"},
        {"CUDAEMU_FRESH=sparse", "start=1 inside=1 unit2=0 middle=0"},
        {"CUDAEMU_FRESH=garbage", "start=1 inside=1 unit2=1 middle=1"},
        {"CUDAEMU_FRESH=zero", "start=0 inside=0 unit2=0 middle=0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[4096];
        const char *extra[] = {cases[i].env, NULL};
        assert_int_equal(run_self("fresh", extra, out, sizeof out), 0);
        if (!strstr(out, cases[i].want) || !strstr(out, "after-memset=0000"))
            fail_msg("%s: got \"%s\", want \"%s\" and zeros after the memset", cases[i].env ? cases[i].env : "default",
                     out, cases[i].want);
    }
}

static void test_counters_latency(void **state)
{
    (void)state;
    tu_ctx_set();
    tu_counts_reset();
    size_t f, t;
    for (int i = 0; i < 3; i++)
        tu_assert_cu(drv->cuMemGetInfo(&f, &t));
    assert_int_equal(tu_call_count("cuMemGetInfo"), 3);
    assert_int_equal(tu_call_count("cuMemGetInfo_v2"), 3);
    assert_int_equal(tu_call_count("cuMemMap"), 0);
    assert_int_equal(tu_call_count("nope"), 0);
    /* The busy-wait is a lower bound, so this is not a timing race. */
    assert_true(tu_set_latency("cuMemGetInfo", 2000000));
    assert_false(tu_set_latency("nope", 1));
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    tu_assert_cu(drv->cuMemGetInfo(&f, &t));
    clock_gettime(CLOCK_MONOTONIC, &b);
    long ns = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
    assert_true(ns >= 2000000);
    assert_true(tu_set_latency("cuMemGetInfo", 0));
    /* A rate is a lower bound too: 4 MiB at 1 GB/s take at least 4.19 ms. */
    assert_true(tu_set_bandwidth("cuMemcpyHtoD", 1000000000));
    assert_false(tu_set_bandwidth("nope", 1));
    CUdeviceptr dp;
    tu_assert_cu(drv->cuMemAlloc(&dp, 4 << 20));
    void *hb = calloc(1, 4 << 20);
    assert_non_null(hb);
    clock_gettime(CLOCK_MONOTONIC, &a);
    tu_assert_cu(drv->cuMemcpyHtoD(dp, hb, 4 << 20));
    clock_gettime(CLOCK_MONOTONIC, &b);
    ns = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
    assert_true(ns >= 4194304);
    assert_true(tu_set_bandwidth("cuMemcpyHtoD", 0));
    /* What was set reads back (benchmarks model call times from it). */
    int (*get)(const char *, uint64_t *, uint64_t *) =
        (int (*)(const char *, uint64_t *, uint64_t *))dlsym(RTLD_DEFAULT, "cudaemu_get_latency");
    if (!get) {
        void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
        assert_non_null(lib);
        *(void **)&get = dlsym(lib, "cudaemu_get_latency");
    }
    assert_non_null(get);
    uint64_t lns = 1, lps = 1;
    assert_true(tu_set_latency("cuMemMap", 1500));
    assert_true(tu_set_bandwidth("cuMemcpyDtoH", 25000000000ull));
    assert_int_equal(get("cuMemMap", &lns, &lps), 0);
    assert_int_equal(lns, 1500);
    assert_int_equal(lps, 0);
    assert_int_equal(get("cuMemcpyDtoH_v2", &lns, &lps), 0);
    assert_int_equal(lns, 0);
    assert_int_equal(lps, 40);
    assert_int_equal(get("nope", NULL, NULL), -1);
    assert_true(tu_set_latency("cuMemMap", 0));
    assert_true(tu_set_bandwidth("cuMemcpyDtoH", 0));
    free(hb);
    tu_assert_cu(drv->cuMemFree(dp));
}

/* The timeline model (cudaemu_model_ns): async copies occupy their stream and their direction's
 * copy engine, overlapping host calls and the other direction; a wait moves the clock to the end
 * of what it waited for. 1 GB/s is 1 ns per byte, so every figure is exact. */
static void test_timeline_model(void **state)
{
    (void)state;
    uint64_t (*model)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "cudaemu_model_ns");
    if (!model) {
        void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
        assert_non_null(lib);
        *(void **)&model = dlsym(lib, "cudaemu_model_ns");
    }
    assert_non_null(model);
    const uint64_t n = 1 << 20;
    CUdeviceptr dp;
    void *hb;
    CUstream a, b;
    CUevent ev;
    tu_assert_cu(drv->cuMemAlloc(&dp, n));
    tu_assert_cu(drv->cuMemHostAlloc(&hb, n, 0));
    tu_assert_cu(drv->cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    assert_true(tu_set_bandwidth("cuMemcpyDtoHAsync", 1000000000));
    assert_true(tu_set_bandwidth("cuMemcpyHtoDAsync", 1000000000));
    assert_true(tu_set_latency("cuMemGetInfo", 1000));
    size_t f, t;
    uint64_t t0 = model();
    tu_assert_cu(drv->cuMemcpyDtoHAsync(hb, dp, n, a));      /* DtoH engine: [t0, t0 + n) */
    assert_int_equal(model(), t0);                            /* the host does not wait */
    tu_assert_cu(drv->cuMemGetInfo(&f, &t));                  /* a host call during the copy */
    assert_int_equal(model(), t0 + 1000);
    tu_assert_cu(drv->cuMemcpyHtoDAsync(dp, hb, n, b));      /* HtoD engine: [t0 + 1000, + n) */
    tu_assert_cu(drv->cuMemcpyDtoHAsync(hb, dp, n, b));      /* after both stream b and engine */
    tu_assert_cu(drv->cuStreamSynchronize(a));
    assert_int_equal(model(), t0 + n);                        /* a's copy ended at t0 + n */
    tu_assert_cu(drv->cuEventRecord(ev, b));
    tu_assert_cu(drv->cuStreamWaitEvent(a, ev, 0));
    tu_assert_cu(drv->cuMemcpyDtoHAsync(hb, dp, n, a));      /* a now waits for b's last copy */
    tu_assert_cu(drv->cuEventSynchronize(ev));
    assert_int_equal(model(), t0 + 1000 + 2 * n);
    tu_assert_cu(drv->cuCtxSynchronize());
    assert_int_equal(model(), t0 + 1000 + 3 * n);
    tu_assert_cu(drv->cuMemcpyDtoH(hb, dp, n));               /* no rate set for it: no time */
    assert_int_equal(model(), t0 + 1000 + 3 * n);
    assert_true(tu_set_bandwidth("cuMemcpyDtoHAsync", 0));
    assert_true(tu_set_bandwidth("cuMemcpyHtoDAsync", 0));
    assert_true(tu_set_latency("cuMemGetInfo", 0));
    tu_assert_cu(drv->cuEventDestroy(ev));
    tu_assert_cu(drv->cuStreamDestroy(a));
    tu_assert_cu(drv->cuStreamDestroy(b));
    tu_assert_cu(drv->cuMemFreeHost(hb));
    tu_assert_cu(drv->cuMemFree(dp));
}

/* cuMemcpyBatchAsync (issue 74 item 7) as cudaemu's other async copies: on the timeline model each
 * copy runs on its direction's engine at that entry's rate after the call's latency; on a held
 * stream the copies are pending work (NOT_READY, their device range may not be unmapped) until the
 * release, and only then are the bytes there; in a capture each copy is a memcpy node and nothing
 * moves. The call counts once. */
static void test_batch_async(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    uint64_t (*model)(void) = NULL;
    void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(lib);
    *(void **)&model = dlsym(lib, "cudaemu_model_ns");
    assert_non_null(model);
    assert_non_null(drv_memcpy_batch);
    const size_t n = 1 << 20;
    CUdeviceptr dp;
    unsigned char *hb;
    CUstream s;
    tu_assert_cu(drv->cuMemAlloc(&dp, 2 * n));
    tu_assert_cu(drv->cuMemHostAlloc((void **)&hb, 4 * n, 0));
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (size_t i = 0; i < 2 * n; i++)
        hb[i] = (unsigned char)(i * 7 + 1);
    memset(hb + 2 * n, 0, 2 * n);
    CUmemcpyAttributes a = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
    size_t idx[1] = {0}, z[2] = {n, n};
    CUdeviceptr up_d[2] = {dp, dp + n}, up_s[2] = {(CUdeviceptr)(uintptr_t)hb, (CUdeviceptr)(uintptr_t)(hb + n)};
    CUdeviceptr dn_d[2] = {(CUdeviceptr)(uintptr_t)(hb + 2 * n), (CUdeviceptr)(uintptr_t)(hb + 3 * n)},
                dn_s[2] = {dp, dp + n};
    /* The model: 1 GB/s (1 ns a byte) each way, 1 us per batch call. */
    assert_true(tu_set_bandwidth("cuMemcpyDtoHAsync", 1000000000));
    assert_true(tu_set_bandwidth("cuMemcpyHtoDAsync", 1000000000));
    assert_true(tu_set_latency("cuMemcpyBatchAsync", 1000));
    tu_counts_reset();
    uint64_t t0 = model();
    tu_assert_cu(drv_memcpy_batch(up_d, up_s, z, 2, &a, idx, 1, s));
    assert_int_equal(model(), t0 + 1000); /* the call; its copies run on the HtoD engine */
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(model(), t0 + 1000 + 2 * n);
    assert_int_equal(tu_call_count("cuMemcpyBatchAsync"), 1);
    assert_int_equal(tu_call_count("cuMemcpyHtoDAsync"), 0);
    assert_true(tu_set_bandwidth("cuMemcpyDtoHAsync", 0));
    assert_true(tu_set_bandwidth("cuMemcpyHtoDAsync", 0));
    assert_true(tu_set_latency("cuMemcpyBatchAsync", 0));
    /* Held: pending until released. */
    assert_true(tu_stream_hold(s));
    tu_assert_cu(drv_memcpy_batch(dn_d, dn_s, z, 2, &a, idx, 1, s));
    assert_int_equal(drv->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    assert_true(tu_stream_release(s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_memory_equal(hb, hb + 2 * n, 2 * n);
    /* Captured: two memcpy nodes, nothing copied. */
    memset(hb + 2 * n, 0, 2 * n);
    CUgraph g;
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    tu_assert_cu(drv_memcpy_batch(dn_d, dn_s, z, 2, &a, idx, 1, s));
    tu_assert_cu(drv->cuStreamEndCapture(s, &g));
    size_t nodes = 0;
    tu_assert_cu(drv->cuGraphGetNodes(g, NULL, &nodes));
    assert_int_equal(nodes, 2);
    assert_int_equal(hb[2 * n], 0);
    tu_assert_cu(drv->cuGraphDestroy(g));
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuMemFreeHost(hb));
    tu_assert_cu(drv->cuMemFree(dp));
}

/* Pinning host memory and pageable copies on the timeline model: cuMemHostAlloc, cuMemFreeHost,
 * cuMemHostRegister and cuMemHostUnregister cost their bytes at their entry's rate (the model's
 * clock moves on, the call lasts as long); a copy whose host side is not pinned runs at the
 * pageable rate, and the host waits for it even when asynchronous (the driver's documented
 * synchronization for pageable memory), while a pinned one does not. 1 GB/s is 1 ns per byte. */
static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void test_host_model(void **state)
{
    (void)state;
    void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(lib);
    uint64_t (*model)(void) = (uint64_t (*)(void))dlsym(lib, "cudaemu_model_ns");
    int (*get)(const char *, uint64_t *, uint64_t *) =
        (int (*)(const char *, uint64_t *, uint64_t *))dlsym(lib, "cudaemu_get_latency");
    assert_non_null(model);
    assert_non_null(get);
    const uint64_t n = 1 << 20;
    CUdeviceptr dp;
    CUstream s;
    tu_assert_cu(drv->cuMemAlloc(&dp, n));
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    const char *pin[] = {"cuMemHostAlloc", "cuMemFreeHost", "cuMemHostRegister", "cuMemHostUnregister"};
    for (int i = 0; i < 4; i++)
        assert_true(tu_set_bandwidth(pin[i], 1000000000));
    void *hb;
    uint64_t t0 = model(), ns0 = mono_ns();
    tu_assert_cu(drv->cuMemHostAlloc(&hb, n, 0));
    assert_int_equal(model(), t0 + n);
    assert_true(mono_ns() - ns0 >= n); /* the call lasted as long */
    unsigned char *page = malloc(n);
    assert_non_null(page);
    tu_assert_cu(drv->cuMemHostRegister(page, n / 2, 0));
    assert_int_equal(model(), t0 + n + n / 2);
    tu_assert_cu(drv->cuMemHostUnregister(page));
    tu_assert_cu(drv->cuMemFreeHost(hb));
    assert_int_equal(model(), t0 + 3 * n);
    for (int i = 0; i < 4; i++)
        assert_true(tu_set_bandwidth(pin[i], 0));

    /* Pinned copies at 1 GB/s, pageable ones at 0.5 GB/s. */
    tu_assert_cu(drv->cuMemHostAlloc(&hb, n, 0));
    assert_true(tu_set_bandwidth("cuMemcpyDtoHAsync", 1000000000));
    assert_true(tu_set_bandwidth("cuMemcpyHtoDAsync", 1000000000));
    assert_true(tu_set_bandwidth("cuMemcpyHtoD", 1000000000));
    assert_true(tu_set_bandwidth("pageable", 500000000));
    uint64_t ps = 0;
    assert_int_equal(get("pageable", NULL, &ps), 0);
    assert_int_equal(ps, 2000);
    t0 = model();
    tu_assert_cu(drv->cuMemcpyDtoHAsync(hb, dp, n, s)); /* pinned: the host goes on */
    assert_int_equal(model(), t0);
    tu_assert_cu(drv->cuMemcpyDtoHAsync(page, dp, n, s)); /* pageable: after it, at half the rate */
    assert_int_equal(model(), t0 + n + 2 * n);
    tu_assert_cu(drv->cuMemcpyHtoD(dp, page, n)); /* synchronous, pageable */
    assert_int_equal(model(), t0 + 5 * n);
    tu_assert_cu(drv->cuMemHostRegister(page, n, 0)); /* registered: pinned now */
    tu_assert_cu(drv->cuMemcpyHtoD(dp, page + n / 2, n / 2));
    assert_int_equal(model(), t0 + 5 * n + n / 2);
    tu_assert_cu(drv->cuMemcpyHtoDAsync(dp, page, n, s));
    assert_int_equal(model(), t0 + 5 * n + n / 2);
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(model(), t0 + 6 * n + n / 2);
    tu_assert_cu(drv->cuMemHostUnregister(page));
    tu_assert_cu(drv->cuMemcpyHtoD(dp, page + 1, n - 1)); /* pageable again, the last byte included */
    assert_int_equal(model(), t0 + 6 * n + n / 2 + 2 * (n - 1));
    assert_true(tu_set_bandwidth("pageable", 0)); /* no pageable rate: the entry's */
    tu_assert_cu(drv->cuMemcpyHtoD(dp, page, n));
    assert_int_equal(model(), t0 + 7 * n + n / 2 + 2 * (n - 1));
    assert_true(tu_set_bandwidth("cuMemcpyDtoHAsync", 0));
    assert_true(tu_set_bandwidth("cuMemcpyHtoDAsync", 0));
    assert_true(tu_set_bandwidth("cuMemcpyHtoD", 0));
    free(page);
    tu_assert_cu(drv->cuMemFreeHost(hb));
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuMemFree(dp));
}

/* A range of @p n bytes at a new reservation over one cuMemCreate of location @p type, read and
 * write for device 0. */
static CUdeviceptr link_range(CUmemLocationType type, size_t n, CUmemGenericAllocationHandle *h)
{
    CUmemAllocationProp p = prop0();
    p.location.type = type;
    CUdeviceptr va = 0;
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    tu_assert_cu(drv->cuMemCreate(h, n, &p, 0));
    tu_assert_cu(drv->cuMemAddressReserve(&va, n, 0, 0, 0));
    tu_assert_cu(drv->cuMemMap(va, n, 0, *h, 0));
    tu_assert_cu(drv->cuMemSetAccess(va, n, &a, 1));
    return va;
}

/* Copies to or from host-located VMM memory (location HOST or HOST_NUMA) cross the host link:
 * their bytes count as link bytes (cudaemu_link_bytes, the report's "link bytes") and run at the
 * link's rate on the timeline model, not at the device-to-device rate; copies within the device
 * count none. 1 GB/s is 1 ns per byte, so every figure is exact. */
static void test_link_bytes(void **state)
{
    (void)state;
    void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(lib);
    uint64_t (*link_bytes)(void) = (uint64_t (*)(void))dlsym(lib, "cudaemu_link_bytes");
    uint64_t (*model)(void) = (uint64_t (*)(void))dlsym(lib, "cudaemu_model_ns");
    int (*get)(const char *, uint64_t *, uint64_t *) =
        (int (*)(const char *, uint64_t *, uint64_t *))dlsym(lib, "cudaemu_get_latency");
    assert_non_null(link_bytes);
    assert_non_null(model);
    assert_non_null(get);
    const size_t n = MiB2;
    CUmemGenericAllocationHandle hd, hd2, hh, hn;
    CUdeviceptr dev = link_range(CU_MEM_LOCATION_TYPE_DEVICE, n, &hd);
    CUdeviceptr dev2 = link_range(CU_MEM_LOCATION_TYPE_DEVICE, n, &hd2);
    CUdeviceptr host = link_range(CU_MEM_LOCATION_TYPE_HOST, n, &hh);
    CUdeviceptr numa = link_range(CU_MEM_LOCATION_TYPE_HOST_NUMA, n, &hn);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    assert_true(tu_set_bandwidth("link", 1000000000));
    uint64_t ps = 0;
    assert_int_equal(get("link", NULL, &ps), 0);
    assert_int_equal(ps, 1000);
    /* The device's own copies: no rate for them here, no time, no link bytes. */
    uint64_t b0 = link_bytes(), t0 = model();
    tu_assert_cu(drv->cuMemcpyDtoDAsync(dev2, dev, n, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(link_bytes(), b0);
    assert_int_equal(model(), t0);
    /* Spill's copy (device to HOST memory) and promotion's (HOST_NUMA to device): the link. */
    tu_assert_cu(drv->cuMemcpyDtoDAsync(host, dev, n, s));
    tu_assert_cu(drv->cuMemcpyDtoDAsync(dev, numa, n / 2, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(link_bytes(), b0 + n + n / 2);
    assert_int_equal(model(), t0 + n + n / 2);
    /* Synchronous copies between pageable host memory and host-located VMM memory: the link. */
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    tu_assert_cu(drv->cuMemcpyDtoH(buf, host, n));
    tu_assert_cu(drv->cuMemcpyHtoD(numa, buf, n));
    tu_assert_cu(drv->cuMemcpyHtoD(dev, buf, n)); /* device memory: not the link */
    assert_int_equal(link_bytes(), b0 + 3 * n + n / 2);
    assert_int_equal(model(), t0 + 3 * n + n / 2);
    assert_true(tu_set_bandwidth("link", 0));
    free(buf);
    tu_assert_cu(drv->cuStreamDestroy(s));
    CUdeviceptr va[] = {dev, dev2, host, numa};
    CUmemGenericAllocationHandle hs[] = {hd, hd2, hh, hn};
    for (int i = 0; i < 4; i++) {
        tu_assert_cu(drv->cuMemUnmap(va[i], n));
        tu_assert_cu(drv->cuMemAddressFree(va[i], n));
        tu_assert_cu(drv->cuMemRelease(hs[i]));
    }
}

/* cudaemu_stream_hold_all: every stream is held, a stream created afterwards too, until the
 * release, which completes their work. */
static void test_stream_hold_all(void **state)
{
    (void)state;
    CUstream a, b;
    CUevent ea, eb;
    tu_assert_cu(drv->cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuEventCreate(&ea, CU_EVENT_DISABLE_TIMING));
    tu_assert_cu(drv->cuEventCreate(&eb, CU_EVENT_DISABLE_TIMING));
    assert_true(tu_stream_hold_all(true));
    tu_assert_cu(drv->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING)); /* held from its start */
    tu_assert_cu(drv->cuEventRecord(ea, a));
    tu_assert_cu(drv->cuEventRecord(eb, b));
    assert_int_equal(drv->cuEventQuery(ea), CUDA_ERROR_NOT_READY);
    assert_int_equal(drv->cuEventQuery(eb), CUDA_ERROR_NOT_READY);
    assert_int_equal(drv->cuStreamQuery(NULL), CUDA_SUCCESS); /* nothing recorded on it */
    assert_true(tu_stream_hold_all(false));
    assert_int_equal(drv->cuEventQuery(ea), CUDA_SUCCESS);
    assert_int_equal(drv->cuEventQuery(eb), CUDA_SUCCESS);
    tu_assert_cu(drv->cuEventRecord(eb, b)); /* released: completes at once again */
    assert_int_equal(drv->cuEventQuery(eb), CUDA_SUCCESS);
    tu_assert_cu(drv->cuEventDestroy(ea));
    tu_assert_cu(drv->cuEventDestroy(eb));
    tu_assert_cu(drv->cuStreamDestroy(a));
    tu_assert_cu(drv->cuStreamDestroy(b));
}

static void test_error_names(void **state)
{
    (void)state;
    static const CUresult codes[] = {
        CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_NOT_INITIALIZED,
        CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_CONTEXT,
        CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_NOT_READY,
        CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, CUDA_ERROR_UNKNOWN,
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *n = NULL, *s = NULL;
        tu_assert_cu(drv->cuGetErrorName(codes[i], &n));
        tu_assert_cu(drv->cuGetErrorString(codes[i], &s));
        assert_non_null(n);
        assert_non_null(s);
        assert_true(!strncmp(n, "CUDA_", 5));
    }
    const char *n = "x";
    tu_assert_cu_eq(drv->cuGetErrorName((CUresult)12345, &n), CUDA_ERROR_INVALID_VALUE);
    assert_null(n);
    assert_string_equal(drv_error_name(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
}

/* After fork, the child of a process that ran cuInit is refused the parent's driver state, as
 * the real driver refuses it: every call (cuInit too) returns CUDA_ERROR_NOT_INITIALIZED, the
 * error-name lookups and cuDriverGetVersion keep working, and nothing hangs on emu.lock (a
 * thread holds it across the fork here: an armed failure's list walk cannot be paused, so a
 * thread loops cuDeviceGetCount while armed, taking the lock on every call). */
static atomic_int fork_stop;
static void *fork_churn(void *arg)
{
    (void)arg;
    int n;
    while (!atomic_load(&fork_stop))
        (void)drv->cuDeviceGetCount(&n);
    return NULL;
}

static void test_fork_child(void **state)
{
    (void)state;
    assert_true(tu_fail("cuMemAddressFree", 1000000000UL, CUDA_ERROR_UNKNOWN)); /* arms the locked path */
    atomic_store(&fork_stop, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fork_churn, NULL), 0);
    for (int round = 0; round < 10; round++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            alarm(20); /* a hang on emu.lock fails instead of hanging CI */
            int n = -1, v = 0;
            CUdevice dev;
            const char *name = NULL;
            int bad = drv->cuInit(0) != CUDA_ERROR_NOT_INITIALIZED;
            bad |= (drv->cuDeviceGetCount(&n) != CUDA_ERROR_NOT_INITIALIZED) << 1;
            bad |= (drv->cuDeviceGet(&dev, 0) != CUDA_ERROR_NOT_INITIALIZED) << 2;
            bad |= (drv->cuCtxSetCurrent(tu_ctx()) != CUDA_ERROR_NOT_INITIALIZED) << 3;
            bad |= (drv->cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name) != CUDA_SUCCESS || !name ||
                    strcmp(name, "CUDA_ERROR_NOT_INITIALIZED")) << 4;
            bad |= (drv->cuDriverGetVersion(&v) != CUDA_SUCCESS) << 5;
            _exit(bad);
        }
        int ws = 0;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        if (WIFSIGNALED(ws))
            fail_msg("child killed by signal %d (14: it hung on emu.lock)", WTERMSIG(ws));
        assert_int_equal(WEXITSTATUS(ws), 0);
    }
    atomic_store(&fork_stop, 1);
    assert_int_equal(pthread_join(t, NULL), 0);
    tu_fail_clear();
    /* The parent keeps its state. */
    int n = 0;
    tu_assert_cu(drv->cuDeviceGetCount(&n));
    assert_true(n > 0);
}

/* Threads hammer the VMM paths on their own reservations, plus cuMemAlloc and events; TSan and
 * the final leak check do the judging. */
static void *worker(void *arg)
{
    (void)arg;
    tu_ctx_set();
    CUmemAllocationProp p = prop0();
    size_t rounds = tu_scaled(200, 10);
    CUdeviceptr va;
    if (drv->cuMemAddressReserve(&va, 4 * MiB2, 0, 0, 0))
        return (void *)1;
    CUevent e;
    CUstream s;
    if (drv->cuEventCreate(&e, 0) || drv->cuStreamCreate(&s, 0))
        return (void *)1;
    for (size_t i = 0; i < rounds; i++) {
        CUmemGenericAllocationHandle h;
        CUdeviceptr d;
        if (drv->cuMemCreate(&h, 2 * MiB2, &p, 0) || drv->cuMemMap(va + (i % 2) * 2 * MiB2, 2 * MiB2, 0, h, 0) ||
            drv->cuMemRelease(h))
            return (void *)2;
        CUmemAccessDesc a = {.location = p.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (drv->cuMemSetAccess(va + (i % 2) * 2 * MiB2, 2 * MiB2, &a, 1) ||
            drv->cuMemsetD8(va + (i % 2) * 2 * MiB2, (unsigned char)i, 4096) ||
            drv->cuMemUnmap(va + (i % 2) * 2 * MiB2, 2 * MiB2))
            return (void *)3;
        if (drv->cuMemAlloc(&d, 4096 + i) || drv->cuMemFree(d))
            return (void *)4;
        if (drv->cuEventRecord(e, s) || drv->cuEventQuery(e))
            return (void *)5;
    }
    drv->cuEventDestroy(e);
    drv->cuStreamDestroy(s);
    return drv->cuMemAddressFree(va, 4 * MiB2) ? (void *)6 : NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct cudaemu_live before, after;
    tu_live(&before);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    tu_live(&after);
    assert_int_equal(after.handles, before.handles);
    assert_int_equal(after.mapped_bytes, before.mapped_bytes);
    assert_int_equal(after.reservations, before.reservations);
    assert_int_equal(after.allocs, before.allocs);
}

/* ---- address arena and device memory files ---- */

/* Reservations come back rising and repeat: the same sequence of calls gets the same relative
 * placement; a 32 MiB-or-larger reservation honours only a 32 MiB-aligned hint (H100 rule) and
 * comes back 32 MiB-aligned; a free aligned hint is honoured. */
static void test_arena_rising(void **state)
{
    (void)state;
    tu_ctx_set();
    const size_t M32 = (size_t)32 << 20;
    CUdeviceptr a = 0, b = 0, c = 0, d = 0, e = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&a, M32, 0, 0, 0));
    tu_assert_cu(drv->cuMemAddressReserve(&b, MiB2, 0, 0, 0));
    tu_assert_cu(drv->cuMemAddressReserve(&c, 3 * M32, 0, 0, 0));
    assert_int_equal(a % M32, 0);
    assert_int_equal(c % M32, 0);
    assert_true(b >= a + M32);
    assert_true(c >= b + MiB2);
    assert_int_equal(c, a + 2 * M32); /* b's 2 MiB, then c at the next 32 MiB boundary */
    /* A 2 MiB-aligned (not 32 MiB-aligned) free hint for 32 MiB is refused... */
    CUdeviceptr hint = c + 3 * M32 + MiB2;
    tu_assert_cu(drv->cuMemAddressReserve(&d, M32, 0, hint, 0));
    assert_int_not_equal(d, hint);
    assert_int_equal(d % M32, 0);
    /* ...a 32 MiB-aligned one is honoured, and so is a 2 MiB hint for a small range. */
    CUdeviceptr hint2 = d + 4 * M32;
    tu_assert_cu(drv->cuMemAddressReserve(&e, M32, 0, hint2, 0));
    assert_int_equal(e, hint2);
    CUdeviceptr f = 0, hint3 = e + M32 + MiB2;
    tu_assert_cu(drv->cuMemAddressReserve(&f, MiB2, 0, hint3, 0));
    assert_int_equal(f, hint3);
    tu_assert_cu(drv->cuMemAddressFree(f, MiB2));
    tu_assert_cu(drv->cuMemAddressFree(e, M32));
    tu_assert_cu(drv->cuMemAddressFree(d, M32));
    tu_assert_cu(drv->cuMemAddressFree(c, 3 * M32));
    tu_assert_cu(drv->cuMemAddressFree(b, MiB2));
    tu_assert_cu(drv->cuMemAddressFree(a, M32));
    /* The next reservation keeps rising (next fit from the last one), it does not reuse a's. */
    CUdeviceptr g = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&g, M32, 0, 0, 0));
    assert_true(g > a);
    tu_assert_cu(drv->cuMemAddressFree(g, M32));
}

/* The arena is the largest the host grants, within 1 GiB: with the process's address space
 * capped at 48 GiB more than it maps, a 40 GiB reservation succeeds (the arena was 32 GiB). */
static void test_arena_under_limit(void **state)
{
    (void)state;
    char out[512];
    int rc = run_self("arena-limited", NULL, out, sizeof out);
    if (rc == 77)
        skip();
    if (rc != 0)
        fail_msg("child exited %d: %s", rc, out);
}

/* Physical handles take no file descriptor each: with the descriptor limit at what is open now
 * plus a few, thousands of 2 MiB pages are still created, mapped, written and read back. */
static void test_handles_without_descriptors(void **state)
{
    (void)state;
    tu_ctx_set();
    size_t n = (size_t)(2000 * tu_scale());
    if (n < 200)
        n = 200;
    struct rlimit old, rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    rl = old;
    rl.rlim_cur = 64;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    CUdeviceptr va = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&va, n * MiB2, 0, 0, 0));
    CUmemGenericAllocationHandle *h = calloc(n, sizeof *h);
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemAccessDesc acc = {0};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (size_t i = 0; i < n; i++) {
        tu_assert_cu(drv->cuMemCreate(&h[i], MiB2, &p, 0));
        tu_assert_cu(drv->cuMemMap(va + i * MiB2, MiB2, 0, h[i], 0));
    }
    tu_assert_cu(drv->cuMemSetAccess(va, n * MiB2, &acc, 1));
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)i;
        tu_assert_cu(drv->cuMemcpyHtoD(va + i * MiB2 + 7, &b, 1));
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char b = 0;
        tu_assert_cu(drv->cuMemcpyDtoH(&b, va + i * MiB2 + 7, 1));
        assert_int_equal(b, (unsigned char)i);
    }
    /* Unmapped and mapped again elsewhere, a page keeps its data. */
    tu_assert_cu(drv->cuMemUnmap(va, MiB2));
    tu_assert_cu(drv->cuMemUnmap(va + MiB2, MiB2));
    tu_assert_cu(drv->cuMemMap(va, MiB2, 0, h[1], 0));
    tu_assert_cu(drv->cuMemSetAccess(va, MiB2, &acc, 1));
    unsigned char b = 0;
    tu_assert_cu(drv->cuMemcpyDtoH(&b, va + 7, 1));
    assert_int_equal(b, 1);
    tu_assert_cu(drv->cuMemUnmap(va, MiB2));
    for (size_t i = 2; i < n; i++)
        tu_assert_cu(drv->cuMemUnmap(va + i * MiB2, MiB2));
    for (size_t i = 0; i < n; i++)
        tu_assert_cu(drv->cuMemRelease(h[i]));
    tu_assert_cu(drv->cuMemAddressFree(va, n * MiB2));
    free(h);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
}
/* ---- end frag ---- */

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n > 0)
        self_path[n] = '\0';
    if (argc > 1 && !strncmp(argv[1], "--child=", 8))
        return child_main(argv[1] + 8);
    tu_exit_skip_without_gpu();
    if (!tu_emulated()) {
        fprintf(stderr, "SKIP: cudaemu's own checks need cudaemu\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_errors),
        cmocka_unit_test(test_env_sizes),
        cmocka_unit_test(test_env_fail_latency_report),
        cmocka_unit_test(test_before_init),
        cmocka_unit_test(test_fault_injection),
        cmocka_unit_test(test_counters_latency),
        cmocka_unit_test(test_fresh_memory), /* services */
        cmocka_unit_test(test_timeline_model),
        cmocka_unit_test(test_host_model), /* services: sleep's pinning */
        cmocka_unit_test(test_link_bytes), /* spill */
        cmocka_unit_test(test_stream_hold_all),
        cmocka_unit_test(test_error_names),
        cmocka_unit_test(test_fork_child), cmocka_unit_test(test_batch_async),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_arena_rising),               /* frag */
        cmocka_unit_test(test_arena_under_limit),
        cmocka_unit_test(test_handles_without_descriptors), /* frag */
    };
    return cmocka_run_group_tests_name("driver-cudaemu", tests, NULL, NULL);
}
