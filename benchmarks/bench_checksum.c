/*
 * bench_checksum: what the file sleep's chunk check costs (base/checksum.h, docs/services.md).
 *
 *   bench_checksum [--mib M] [--reps R]
 *
 * GB/s over one chunk of M MiB (64: sleep_copy_chunk_mb's default) in pinned-like host memory
 * touched once before, median of R repetitions, in the same run: a memcpy of the chunk (the copy a
 * sleep does into its bounce buffer anyway), the keyed sum a file sleep takes of each chunk and
 * its wake checks (checksum64: NH-Toeplitz, then SipHash-2-4 over the values), SipHash-2-4 over the
 * whole chunk (the plain keyed hash, for scale) and the unkeyed eight-lane sum the keyed one
 * replaced (written out here: it is no longer in the library). No device, no driver.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "bench_util.h"

/* The unkeyed sum xseg kept before (eight lanes of 8-byte words; invertible steps), as it was. */
static inline uint64_t old_step(uint64_t lane, uint64_t word)
{
    lane = (lane ^ word) * 0x9e3779b97f4a7c15ull;
    return lane ^ (lane >> 29);
}

static inline uint64_t old_finish(uint64_t x)
{
    x ^= x >> 32;
    x *= 0xd1342543de82ef95ull;
    x ^= x >> 29;
    x *= 0x9e3779b97f4a7c15ull;
    return x ^ (x >> 32);
}

__attribute__((noinline)) static uint64_t old_sum(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t lane[8];
    for (int k = 0; k < 8; k++)
        lane[k] = 0xd1342543de82ef95ull + (uint64_t)k;
    size_t i = 0;
    for (; n - i >= 64; i += 64)
        for (int k = 0; k < 8; k++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * k, 8);
            lane[k] = old_step(lane[k], w);
        }
    for (int k = 0; n - i >= 8; i += 8, k++) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        lane[k] = old_step(lane[k], w);
    }
    if (i < n) {
        unsigned char tail[8] = {0};
        memcpy(tail, p + i, n - i);
        uint64_t w;
        memcpy(&w, tail, 8);
        lane[7] = old_step(lane[7], w);
    }
    uint64_t h = old_finish(lane[0]);
    for (int k = 1; k < 8; k++)
        h = old_finish(h ^ lane[k]) + (uint64_t)k;
    return old_finish(h ^ (uint64_t)n);
}

static volatile uint64_t sink;

int main(int argc, char **argv)
{
    size_t mib = 64;
    int reps = 9;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (size_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_checksum [--mib M] [--reps R]\n");
            return 2;
        }
    }
    if (!mib || reps < 1 || reps > 99) {
        fprintf(stderr, "bench_checksum: --mib must be at least 1 and --reps 1 to 99\n");
        return 2;
    }
    size_t n = mib << 20;
    unsigned char *src = malloc(n), *dst = malloc(n);
    if (!src || !dst)
        return 1;
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 131 + (i >> 12));
    memcpy(dst, src, n); /* both touched */
    struct checksum_key k;
    if (!checksum_key_new(&k)) {
        perror("bench_checksum: checksum_key_new");
        return 1;
    }
    enum { COPY, KEYED, SIP, OLD, NF };
    static const char *names[NF] = {
        "memcpy of the chunk (the copy into the bounce buffer)",
        "checksum64: keyed, NH-Toeplitz + SipHash-2-4 (the sum a file sleep keeps)",
        "SipHash-2-4 over the whole chunk (keyed, for scale)",
        "the unkeyed eight-lane sum it replaced",
    };
    double gbs[NF][99];
    for (int r = 0; r < reps; r++)
        for (int f = 0; f < NF; f++) { /* interleaved: drift in the machine's load hits all alike */
            uint64_t t0 = now_ns();
            switch (f) {
            case COPY:
                memcpy(dst, src, n);
                sink += dst[n / 2];
                break;
            case KEYED:
                sink += checksum64(&k, src, n);
                break;
            case SIP:
                sink += checksum_siphash24(k.sip, src, n);
                break;
            default:
                sink += old_sum(src, n);
            }
            gbs[f][r] = (double)n / (double)(now_ns() - t0);
        }
    double med[NF];
    for (int f = 0; f < NF; f++)
        med[f] = bench_median(gbs[f], (size_t)reps);
    printf("bench_checksum: a %zu MiB chunk, %d repetitions (median), one thread\n\n", mib, reps);
    printf("| function | GB/s | ms per GiB | time against the unkeyed sum |\n|---|---|---|---|\n");
    for (int f = 0; f < NF; f++)
        printf("| %s | %.2f | %.0f | %.2fx |\n", names[f], med[f], 1073.741824 / med[f], med[OLD] / med[f]);
    checksum_key_forget(&k);
    free(src);
    free(dst);
    return 0;
}
