/*
 * The CUDAEMU_* environment, read once on the first call into the emulator. A malformed value or
 * an unknown CUDAEMU_ name stops the process with a message naming the variable: a test that
 * misspells CUDAEMU_TOTAL_MEM must not silently run on an 80 GiB device.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudaemu/emu.h"

extern char **environ;

#ifndef CUDAEMU_DRIVER_ONLY /* the driver-only build reads no environment (env_get) */
static const char *const env_known[] = {
    "CUDAEMU_DEVICES", "CUDAEMU_TOTAL_MEM", "CUDAEMU_GRANULARITY", "CUDAEMU_VMM",
    "CUDAEMU_FAIL",    "CUDAEMU_LATENCY",   "CUDAEMU_REPORT",
    "CUDAEMU_FABRIC", /* emulated fabric handles */
    "CUDAEMU_DMA_BUF", /* dma-buf export of mapped ranges */
    "CUDAEMU_RDMA",   /* GPUDirect RDMA on VMM memory */
    "CUDAEMU_HOST_VMM", /* which host locations VMM memory may have */
    "CUDAEMU_HOST_NUMA_ID", /* each device's host NUMA node */
    "CUDAEMU_FRESH",  /* what new physical memory holds */
    "CUDAEMU_SHARED", /* devices shared among processes (shared.c) */
    "CUDAEMU_KERNELS", /* 0: modules refused (kernel.c) */
};
#endif

static _Noreturn __attribute__((format(printf, 2, 3))) void env_die(const char *var, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudaemu: bad environment variable %s: %s\n", var, msg);
    fflush(stderr);
    _exit(2);
}

/* "80G", "81920M", "2MiB", "4096": bytes with an optional binary K/M/G/T suffix. */
static int env_parse_size(const char *s, size_t *out)
{
    if (!isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'B' || end[1] == 'b'))
        end += 2;
    else if (shift && (end[0] == 'B' || end[0] == 'b'))
        end++;
    if (*end || (shift && v > (~0ULL >> shift)))
        return -1;
    *out = (size_t)(v << shift);
    return 0;
}

/* "12us", "3ms", "500ns", "500" (ns). */
static int env_parse_duration(const char *s, uint64_t *ns)
{
    if (!isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    uint64_t mul = 1;
    if (!strcmp(end, "us"))
        mul = 1000;
    else if (!strcmp(end, "ms"))
        mul = 1000000;
    else if (!strcmp(end, "s"))
        mul = 1000000000;
    else if (*end && strcmp(end, "ns"))
        return -1;
    if (v > UINT64_MAX / mul)
        return -1;
    *ns = v * mul;
    return 0;
}

/* "25GB/s", "12.5GB/s", "1GiB/s", "500MB/s": bytes per second; decimal units (k, M, G: 10^3,
 * 10^6, 10^9) unless spelled binary (KiB, MiB, GiB). At most 3 fraction digits. */
static int env_parse_rate(const char *s, uint64_t *bytes_per_s)
{
    size_t len = strlen(s);
    if (len < 4 || strcmp(s + len - 2, "/s") || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long whole = strtoull(s, &end, 10), frac = 0, div = 1;
    if (errno)
        return -1;
    if (*end == '.') {
        for (end++; isdigit((unsigned char)*end) && div < 1000; end++) {
            frac = frac * 10 + (unsigned long long)(*end - '0');
            div *= 10;
        }
        if (isdigit((unsigned char)*end))
            return -1;
    }
    static const struct {
        const char *unit;
        unsigned long long mul;
    } units[] = {{"B/s", 1},           {"kB/s", 1000ull},      {"KB/s", 1000ull},  {"MB/s", 1000000ull},
                 {"GB/s", 1000000000ull}, {"KiB/s", 1ull << 10}, {"MiB/s", 1ull << 20}, {"GiB/s", 1ull << 30}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit))
            continue;
        unsigned long long mul = units[i].mul;
        if (whole > UINT64_MAX / mul)
            return -1;
        *bytes_per_s = whole * mul + frac * mul / div;
        return *bytes_per_s ? 0 : -1;
    }
    return -1;
}

static long env_int(const char *var, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        env_die(var, "'%s' is not an integer in [%ld, %ld]", s, lo, hi);
    return v;
}

/* Call @p fn on each comma-separated item of a writable copy of @p list. */
static void env_each(const char *var, const char *list, void (*fn)(const char *var, char *item))
{
    char *copy = strdup(list);
    if (!copy)
        env_die(var, "out of host memory");
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save))
        fn(var, item);
    free(copy);
}

static void env_fail_item(const char *var, char *item)
{
    /* entry:N:RESULT */
    char *n = strchr(item, ':');
    char *r = n ? strchr(n + 1, ':') : NULL;
    if (!n || !r)
        env_die(var, "'%s' is not entry:N:CUresult", item);
    *n++ = '\0';
    *r++ = '\0';
    int e = emu_entry_lookup(item);
    if (e < 0)
        env_die(var, "'%s' is not an emulated entry point", item);
    long nth = env_int(var, n, 1, __LONG_MAX__);
    int res = emu_result_lookup(r);
    if (res < 0)
        env_die(var, "'%s' is not a CUresult name", r);
    emu_fail_arm((enum emu_entry)e, (unsigned long)nth, (CUresult)res);
}

/* The presets: per-call latencies (ns), per-byte costs (rates, bytes/s) and the rates of the host
 * link and of pageable copies. A rate of 0 charges nothing. */
struct env_cost {
    const char *entry;
    uint64_t ns, bytes_per_s;
};
struct env_preset {
    const char *name;
    const struct env_cost *costs;
    size_t ncosts;
    uint64_t link, pageable;
};

#define GB 1000000000ull
/* A cost of @p ms milliseconds per GiB as a rate in bytes per second. */
#define MS_PER_GIB(ms) ((1ull << 30) * 1000ull / (ms))

/* h100: per-call medians measured on an NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0) by
 * benchmarks/bench_vmm_costs with 20 MiB pages, the large pool's page size (docs/gpu-h100/
 * vmm_costs.txt; docs/benchmarks.md). cuMemAddressReserve/Free were not measured and stay 0.
 * Host<->device copies: 25 GB/s per direction, not measured there. PCIe 4.0 x16 carries 16 GT/s x
 * 16 lanes with 128b/130b encoding = 31.5 GB/s per direction, and pinned copies reach about 80 %
 * of that (the CUDA samples' bandwidthTest on PCIe 4.0 hosts); an H100 on PCIe 5.0 doubles the
 * link, so this is the conservative figure. Copies to or from host-located VMM memory (spill)
 * cross the same link: the same rate. It charges nothing for pinning host memory nor for pageable
 * copies (not measured on that machine): the h200 preset models those. */
static const struct env_cost env_h100[] = {
    {"cuMemCreate", 8600, 0},    {"cuMemMap", 700, 0},      {"cuMemSetAccess", 21900, 0},
    {"cuMemUnmap", 15500, 0},    {"cuMemRelease", 20400, 0}, {"cuMemAlloc", 39000, 0},
    {"cuMemFree", 42800, 0},     {"cuMemcpyHtoD", 0, 25 * GB}, {"cuMemcpyDtoH", 0, 25 * GB},
    {"cuMemcpyHtoDAsync", 0, 25 * GB}, {"cuMemcpyDtoHAsync", 0, 25 * GB},
};

/* h200: the machine of the first acceptance run (../shared/gpu-runs/2026-11-26-h200: NVIDIA H200,
 * driver 580.159.04, CUDA 13.0, in a Firecracker VM). Per-call medians: its vmm_costs.csv (bench_
 * vmm_costs, 20 MiB pages). Pinned copies: 50 GB/s per direction, PCIe 5.0 x16 (32 GT/s x 16 lanes,
 * 128b/130b: 63 GB/s) at about 80 %, as h100's; not measured on that machine (bench_services
 * prints the rate it measures beside each figure). Pageable copies: half of that, as pageable
 * copies ran beside pinned ones where both were measured (dask-cuda#98: 5-6 against 11-12 GB/s).
 * Pinning: cuMemHostAlloc 530 ms and cuMemFreeHost 151 ms per GiB, the two costs that make that
 * run's sleep (offload) of 4.06 GiB 2,246 ms and its wake 705 ms with everything else above
 * (docs/benchmarks.md#services: fitted to those two figures, so they agree by construction; the
 * published figures bracket them: cudaHostAlloc 420 ms/GiB at 1-8 GiB on an RTX 3090 host,
 * rmm#2523; 238 ms/GiB for 33 GiB, ik_llama.cpp#1517; 983 ms/GiB to pin and 225 ms/GiB to unpin
 * 512 MiB, kekzl/imp#1653). cuMemHostRegister of touched pages: 0.26 of cuMemHostAlloc (rmm#2523:
 * first touch on 16 threads plus cudaHostRegister 445 ms against cudaHostAlloc 1,681 ms for
 * 4 GiB), cuMemHostUnregister as cuMemFreeHost. */
static const struct env_cost env_h200[] = {
    {"cuMemCreate", 8128, 0},    {"cuMemMap", 644, 0},        {"cuMemSetAccess", 21040, 0},
    {"cuMemUnmap", 14874, 0},    {"cuMemRelease", 15116, 0},  {"cuMemAlloc", 40356, 0},
    {"cuMemFree", 40045, 0},     {"cuMemcpyHtoD", 0, 50 * GB}, {"cuMemcpyDtoH", 0, 50 * GB},
    {"cuMemcpyHtoDAsync", 0, 50 * GB}, {"cuMemcpyDtoHAsync", 0, 50 * GB},
    {"cuMemHostAlloc", 0, MS_PER_GIB(530)}, {"cuMemFreeHost", 0, MS_PER_GIB(151)},
    {"cuMemHostRegister", 0, MS_PER_GIB(138)}, {"cuMemHostUnregister", 0, MS_PER_GIB(151)},
};

static const struct env_preset env_presets[] = {
    {"h100", env_h100, sizeof env_h100 / sizeof env_h100[0], 25 * GB, 0},
    {"h200", env_h200, sizeof env_h200 / sizeof env_h200[0], 50 * GB, 25 * GB},
};

/* A preset by name: its costs set (later items may override single entries). False: none such. */
static bool env_preset(const char *name)
{
    for (size_t p = 0; p < sizeof env_presets / sizeof env_presets[0]; p++) {
        const struct env_preset *ps = &env_presets[p];
        if (strcmp(name, ps->name))
            continue;
        for (size_t i = 0; i < ps->ncosts; i++) {
            enum emu_entry e = (enum emu_entry)emu_entry_lookup(ps->costs[i].entry);
            if (ps->costs[i].ns)
                emu_latency_set(e, ps->costs[i].ns);
            if (ps->costs[i].bytes_per_s)
                emu_bandwidth_set(e, ps->costs[i].bytes_per_s);
        }
        emu_link_set(ps->link);
        emu_pageable_set(ps->pageable);
        return true;
    }
    return false;
}

static void env_latency_item(const char *var, char *item)
{
    if (env_preset(item))
        return;
    char *d = strchr(item, ':');
    if (!d)
        env_die(var, "'%s' is neither entry:duration, entry:rate nor a preset (h100, h200)", item);
    *d++ = '\0';
    if (!strcmp(item, "link") || !strcmp(item, "pageable")) {
        /* link:RATE, the host link (host-located VMM memory's copies); pageable:RATE, copies whose
         * host side is not pinned */
        uint64_t rate;
        if (!strstr(d, "/s") || env_parse_rate(d, &rate))
            env_die(var, "'%s' is not a rate (e.g. %s:25GB/s)", d, item);
        if (item[0] == 'l')
            emu_link_set(rate);
        else
            emu_pageable_set(rate);
        return;
    }
    if (!strcmp(item, "batch_copy")) {
        /* batch_copy:DURATION, cuMemcpyBatchAsync's cost per copy beyond its per-call latency */
        uint64_t ns;
        if (env_parse_duration(d, &ns))
            env_die(var, "'%s' is not a duration (e.g. batch_copy:100ns)", d);
        emu_batch_copy_set(ns);
        return;
    }
    int e = emu_entry_lookup(item);
    if (e < 0)
        env_die(var, "'%s' is not an emulated entry point", item);
    uint64_t ns, rate;
    if (strstr(d, "/s")) {
        /* A rate: the per-byte cost of a copy (entry:25GB/s), or of pinning host memory
         * (cuMemHostAlloc:2GiB/s). */
        if (env_parse_rate(d, &rate))
            env_die(var, "'%s' is not a rate (e.g. 25GB/s, 12.5GB/s, 800MiB/s)", d);
        emu_bandwidth_set((enum emu_entry)e, rate);
        return;
    }
    if (env_parse_duration(d, &ns))
        env_die(var, "'%s' is not a duration (e.g. 12us, 3ms, 500ns) or a rate (25GB/s)", d);
    emu_latency_set((enum emu_entry)e, ns);
}

static void env_report_atexit(void) { emu_report_print(); }

static pthread_once_t env_once = PTHREAD_ONCE_INIT;

/* The driver-only build (CUDAEMU_DRIVER_ONLY) stands in for a real libcuda.so.1: it reads no
 * CUDAEMU_ variable (a real driver ignores them: no emulated device size, latency or injected
 * failure) and exports no control API, so a program sees what it would see on a GPU. */
#ifdef CUDAEMU_DRIVER_ONLY
#define env_get(name) ((void)(name), (const char *)NULL)
#else
#define env_get(name) getenv(name)
#endif

static void env_load(void)
{
#ifndef CUDAEMU_DRIVER_ONLY
    for (char **ep = environ; ep && *ep; ep++) {
        if (strncmp(*ep, "CUDAEMU_", 8))
            continue;
        size_t len = strcspn(*ep, "=");
        bool known = false;
        for (size_t i = 0; i < sizeof env_known / sizeof env_known[0]; i++)
            known |= strlen(env_known[i]) == len && !strncmp(env_known[i], *ep, len);
        if (!known) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(len < 100 ? len : 100), *ep);
            env_die(name, "unknown variable (known: CUDAEMU_DEVICES, CUDAEMU_TOTAL_MEM, "
                          "CUDAEMU_GRANULARITY, CUDAEMU_VMM, CUDAEMU_FAIL, CUDAEMU_LATENCY, "
                          "CUDAEMU_REPORT, CUDAEMU_FABRIC, CUDAEMU_FRESH, CUDAEMU_SHARED, CUDAEMU_DMA_BUF, "
                          "CUDAEMU_RDMA, CUDAEMU_HOST_VMM, CUDAEMU_KERNELS)");
        }
    }
#endif

    struct emu_config *c = &emu.cfg;
    c->devices = 1;
    c->total_mem = (size_t)80 << 30;
    c->granularity = (size_t)2 << 20;
    c->vmm = true;
    c->report = false;
    c->fabric = false;
    c->dma_buf = false;
    c->rdma = false;
    c->kernels = true;
    const char *v;
    if ((v = env_get("CUDAEMU_DEVICES")))
        c->devices = (int)env_int("CUDAEMU_DEVICES", v, 0, EMU_MAX_DEVICES);
    if ((v = env_get("CUDAEMU_TOTAL_MEM")) && env_parse_size(v, &c->total_mem))
        env_die("CUDAEMU_TOTAL_MEM", "'%s' is not a size (bytes, or with K/M/G/T: 80G, 81920M)", v);
    if ((v = env_get("CUDAEMU_GRANULARITY"))) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        if (env_parse_size(v, &c->granularity) || !emu_is_pow2(c->granularity) ||
            c->granularity % page)
            env_die("CUDAEMU_GRANULARITY", "'%s' is not a power of two multiple of the host page "
                    "size (%zu)", v, page);
    }
    if ((v = env_get("CUDAEMU_VMM")))
        c->vmm = env_int("CUDAEMU_VMM", v, 0, 1);
    if ((v = env_get("CUDAEMU_REPORT")))
        c->report = env_int("CUDAEMU_REPORT", v, 0, 1);
    if ((v = env_get("CUDAEMU_FABRIC")))
        c->fabric = env_int("CUDAEMU_FABRIC", v, 0, 1);
    if ((v = env_get("CUDAEMU_DMA_BUF")))
        c->dma_buf = env_int("CUDAEMU_DMA_BUF", v, 0, 1);
    if ((v = env_get("CUDAEMU_RDMA")))
        c->rdma = env_int("CUDAEMU_RDMA", v, 0, 1);
    if ((v = env_get("CUDAEMU_KERNELS")))
        c->kernels = env_int("CUDAEMU_KERNELS", v, 0, 1);
    c->host_vmm = EMU_HOST_VMM_NUMA | EMU_HOST_VMM_HOST;
    if ((v = env_get("CUDAEMU_HOST_VMM"))) {
        if (!strcmp(v, "all"))
            c->host_vmm = EMU_HOST_VMM_NUMA | EMU_HOST_VMM_HOST;
        else if (!strcmp(v, "numa"))
            c->host_vmm = EMU_HOST_VMM_NUMA;
        else if (!strcmp(v, "none"))
            c->host_vmm = 0;
        else
            env_die("CUDAEMU_HOST_VMM", "'%s' is not all, numa or none", v);
    }
    /* "1" or "0,1" (device by device, the last repeating) or "-1" (a system without NUMA). */
    c->numa_nodes = 1;
    for (int i = 0; i < EMU_MAX_DEVICES; i++)
        c->host_numa_id[i] = 0;
    if ((v = env_get("CUDAEMU_HOST_NUMA_ID"))) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", v);
        int i = 0, last = 0;
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (i == EMU_MAX_DEVICES)
                env_die("CUDAEMU_HOST_NUMA_ID", "more than %d devices", EMU_MAX_DEVICES);
            last = (int)env_int("CUDAEMU_HOST_NUMA_ID", tok, -1, 63);
            c->host_numa_id[i++] = last;
            if (last + 1 > c->numa_nodes)
                c->numa_nodes = last + 1;
        }
        if (!i)
            env_die("CUDAEMU_HOST_NUMA_ID", "'%s' names no node", v);
        for (; i < EMU_MAX_DEVICES; i++)
            c->host_numa_id[i] = last;
    }
    c->fresh = EMU_FRESH_SPARSE;
    if ((v = env_get("CUDAEMU_FRESH"))) {
        if (!strcmp(v, "sparse"))
            c->fresh = EMU_FRESH_SPARSE;
        else if (!strcmp(v, "garbage"))
            c->fresh = EMU_FRESH_GARBAGE;
        else if (!strcmp(v, "zero"))
            c->fresh = EMU_FRESH_ZERO;
        else
            env_die("CUDAEMU_FRESH", "'%s' is not sparse, garbage or zero", v);
    }
    if ((v = env_get("CUDAEMU_SHARED"))) {
        size_t n = strlen(v);
        if (!n || n >= sizeof c->shared || strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                     "0123456789_.-") != n)
            env_die("CUDAEMU_SHARED", "'%s' is not a name of 1 to 48 letters, digits, '_', '.', '-'", v);
        memcpy(c->shared, v, n + 1);
    }
    if ((v = env_get("CUDAEMU_FAIL"))) {
        emu_lock();
        env_each("CUDAEMU_FAIL", v, env_fail_item);
        emu_unlock();
    }
    if ((v = env_get("CUDAEMU_LATENCY")))
        env_each("CUDAEMU_LATENCY", v, env_latency_item);
    if (c->report)
        atexit(env_report_atexit);
}

void emu_env_once(void) { pthread_once(&env_once, env_load); }
