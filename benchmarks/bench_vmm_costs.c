/*
 * bench_vmm_costs: what one page costs the driver, per VMM call and page size.
 *
 * For each page size it times, per repetition, one cuMemCreate, cuMemMap, cuMemSetAccess,
 * cuMemUnmap and cuMemRelease of a single page, and one cuMemAlloc/cuMemFree of the same size,
 * and prints median, p10 and p90 in microseconds per call. It goes through drv_load()/drv, so it
 * runs on cudaemu (numbers meaningless there, but it must run) and on a real GPU.
 *
 *   bench_vmm_costs [--reps N] [--max-size MiB] [--device N] [--csv FILE]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "vmm/driver.h"

enum { OP_CREATE, OP_MAP, OP_SETACCESS, OP_UNMAP, OP_RELEASE, OP_ALLOC, OP_FREE, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                                               "cuMemRelease", "cuMemAlloc", "cuMemFree"};
static const size_t sizes_mib[] = {2, 20, 64, 512, 1024};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void check(CUresult res, const char *what, size_t size)
{
    if (res == CUDA_SUCCESS)
        return;
    fprintf(stderr, "bench_vmm_costs: %s (%zu MiB) failed: %s\n", what, size >> 20, drv_error_name(res));
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[n]. */
static double pct(const double *v, int n, double p)
{
    int i = (int)(p / 100.0 * (n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static long parse_long(const char *flag, const char *s, long min)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || v < min) {
        fprintf(stderr, "bench_vmm_costs: %s needs an integer >= %ld (got '%s')\n", flag, min, s ? s : "");
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    int reps = 20, device = 0;
    long max_mib = 1024;
    const char *csv_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--reps"))
            reps = (int)parse_long(a, i + 1 < argc ? argv[++i] : NULL, 1);
        else if (!strcmp(a, "--max-size"))
            max_mib = parse_long(a, i + 1 < argc ? argv[++i] : NULL, 1);
        else if (!strcmp(a, "--device"))
            device = (int)parse_long(a, i + 1 < argc ? argv[++i] : NULL, 0);
        else if (!strcmp(a, "--csv")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "bench_vmm_costs: --csv needs a file name\n");
                return 2;
            }
            csv_path = argv[++i];
        }
        else {
            fprintf(stderr, "usage: %s [--reps N (20)] [--max-size MiB (1024)] [--device N (0)] [--csv FILE]\n",
                    argv[0]);
            return !strcmp(a, "--help") || !strcmp(a, "-h") ? 0 : 2;
        }
    }

    struct drv_device_info info;
    if (drv_device_query(device, &info) != XSEG_SUCCESS || drv_ctx_ensure(info.primary_ctx) != XSEG_SUCCESS) {
        fprintf(stderr, "bench_vmm_costs: %s\n", xseg_last_error());
        return 1;
    }
    if (!info.vmm_supported) {
        fprintf(stderr, "bench_vmm_costs: device %d (%s) does not support VMM\n", device, info.name);
        return 1;
    }
    int version = 0;
    check(drv->cuDriverGetVersion(&version), "cuDriverGetVersion", 0);
    FILE *csv = NULL;
    if (csv_path) {
        csv = fopen(csv_path, "w");
        if (!csv) {
            fprintf(stderr, "bench_vmm_costs: cannot write %s: %s\n", csv_path, strerror(errno));
            return 1;
        }
        fprintf(csv, "device,driver_version,page_mib,op,reps,median_us,p10_us,p90_us\n");
    }

    printf("# bench_vmm_costs: device %d \"%s\", driver %d.%d (%d), %.1f GiB, granularity %zu KiB, %d reps\n",
           device, info.name, version / 1000, version % 1000 / 10, version, (double)info.total_mem / (1 << 30),
           info.granularity >> 10, reps);
    printf("# microseconds per call (one page per call)\n");
    printf("%9s  %-15s %10s %10s %10s\n", "page", "call", "median", "p10", "p90");

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    double *t[OP_COUNT];
    for (int k = 0; k < OP_COUNT; k++) {
        t[k] = calloc((size_t)reps, sizeof(double));
        if (!t[k]) {
            fprintf(stderr, "bench_vmm_costs: out of host memory\n");
            return 1;
        }
    }
    for (size_t si = 0; si < sizeof(sizes_mib) / sizeof(sizes_mib[0]); si++) {
        if ((long)sizes_mib[si] > max_mib)
            continue;
        size_t size = sizes_mib[si] << 20;
        if (size % info.granularity) {
            printf("%6zuMiB  (not a multiple of the granularity: skipped)\n", sizes_mib[si]);
            continue;
        }
        CUdeviceptr va = 0;
        check(drv->cuMemAddressReserve(&va, size, 0, 0, 0), "cuMemAddressReserve", size);
        for (int r = 0; r < reps; r++) {
            CUmemGenericAllocationHandle h;
            double t0 = now_us();
            check(drv->cuMemCreate(&h, size, &prop, 0), "cuMemCreate", size);
            double t1 = now_us();
            check(drv->cuMemMap(va, size, 0, h, 0), "cuMemMap", size);
            double t2 = now_us();
            check(drv->cuMemSetAccess(va, size, &acc, 1), "cuMemSetAccess", size);
            double t3 = now_us();
            check(drv->cuMemUnmap(va, size), "cuMemUnmap", size);
            double t4 = now_us();
            check(drv->cuMemRelease(h), "cuMemRelease", size);
            double t5 = now_us();
            CUdeviceptr p;
            check(drv->cuMemAlloc(&p, size), "cuMemAlloc", size);
            double t6 = now_us();
            check(drv->cuMemFree(p), "cuMemFree", size);
            double t7 = now_us();
            t[OP_CREATE][r] = t1 - t0;
            t[OP_MAP][r] = t2 - t1;
            t[OP_SETACCESS][r] = t3 - t2;
            t[OP_UNMAP][r] = t4 - t3;
            t[OP_RELEASE][r] = t5 - t4;
            t[OP_ALLOC][r] = t6 - t5;
            t[OP_FREE][r] = t7 - t6;
        }
        check(drv->cuMemAddressFree(va, size), "cuMemAddressFree", size);
        for (int k = 0; k < OP_COUNT; k++) {
            qsort(t[k], (size_t)reps, sizeof(double), cmp_double);
            double med = pct(t[k], reps, 50), p10 = pct(t[k], reps, 10), p90 = pct(t[k], reps, 90);
            printf("%6zuMiB  %-15s %10.1f %10.1f %10.1f\n", sizes_mib[si], op_names[k], med, p10, p90);
            if (csv)
                fprintf(csv, "\"%s\",%d,%zu,%s,%d,%.3f,%.3f,%.3f\n", info.name, version, sizes_mib[si],
                        op_names[k], reps, med, p10, p90);
        }
    }
    for (int k = 0; k < OP_COUNT; k++)
        free(t[k]);
    if (csv && fclose(csv) != 0) {
        fprintf(stderr, "bench_vmm_costs: writing %s failed\n", csv_path);
        return 1;
    }
    return 0;
}
