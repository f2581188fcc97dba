/* A 64-bit checksum of a byte range (checksum.h). */
#include <string.h>

#include "base/checksum.h"

#define CK_MUL0 0x9e3779b97f4a7c15ull /* odd: multiplying by it is a bijection */
#define CK_MUL1 0xd1342543de82ef95ull
#define CK_LANES 8 /* independent chains: a step's multiply latency overlaps the others' */

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

static inline uint64_t step(uint64_t lane, uint64_t word)
{
    lane = (lane ^ word) * CK_MUL0;
    return lane ^ (lane >> 29);
}

/* A bijection that spreads every input bit over the whole word. */
static inline uint64_t finish(uint64_t x)
{
    x ^= x >> 32;
    x *= CK_MUL1;
    x ^= x >> 29;
    x *= CK_MUL0;
    return x ^ (x >> 32);
}

uint64_t checksum64(const void *data, size_t n)
{
    const unsigned char *p = data;
    /* Distinct starts, so equal stripes in different lanes sum apart. */
    uint64_t lane[CK_LANES];
    for (int k = 0; k < CK_LANES; k++)
        lane[k] = CK_MUL1 + (uint64_t)k;
    size_t i = 0;
    for (; n - i >= 8 * CK_LANES; i += 8 * CK_LANES)
        for (int k = 0; k < CK_LANES; k++)
            lane[k] = step(lane[k], load64(p + i + 8 * k));
    for (int k = 0; n - i >= 8; i += 8, k++)
        lane[k] = step(lane[k], load64(p + i));
    if (i < n) { /* the last bytes, zero-padded (the length below tells them apart) */
        unsigned char tail[8] = {0};
        memcpy(tail, p + i, n - i);
        lane[CK_LANES - 1] = step(lane[CK_LANES - 1], load64(tail));
    }
    /* Lanes folded one after the other (each fold a bijection of the running sum for the next
     * lane's value, so a difference in one lane alone is never lost), then the length. */
    uint64_t h = finish(lane[0]);
    for (int k = 1; k < CK_LANES; k++)
        h = finish(h ^ lane[k]) + (uint64_t)k;
    return finish(h ^ (uint64_t)n);
}
