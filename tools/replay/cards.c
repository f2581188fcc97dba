/* Common cards by reported memory (cards.h); the figures and their sources: docs/cards.md. */
#include "tools/replay/cards.h"

#include <stdio.h>

#define MIB(x) ((uint64_t)(x) << 20)

static const struct replay_card cards[] = {
    {"A10", 24146608128ULL},           /* NVML total */
    {"RTX 4090", MIB(24564)},          /* nvidia-smi */
    {"RTX 3090", MIB(24576)},          /* nvidia-smi */
    {"RTX 5090", MIB(32607)},          /* nvidia-smi */
    {"A100 40GB", 42298834944ULL},     /* cudaGetDeviceProperties totalGlobalMem */
    {"L40S", MIB(46068)},              /* nvidia-smi */
    {"H100 80GB", 85040070656ULL},     /* 79.2 GiB as bench_vmm_costs printed it here (rounded) */
    {"A100 80GB", MIB(81920)},         /* nvidia-smi */
    {"H200", 150109880320ULL},         /* cuMemGetInfo total, measured here */
    {"B200", MIB(183359)},             /* nvidia-smi */
};

const struct replay_card *replay_cards(size_t *n)
{
    *n = sizeof cards / sizeof cards[0];
    return cards;
}

/* "n" where the name is read with a vowel first ("an H100", "an RTX 4090", "a B200"). */
static const char *an(const char *name)
{
    return name[0] == 'A' || name[0] == 'H' || name[0] == 'L' || name[0] == 'R' ? "n" : "";
}

void replay_cards_sentence(char *buf, size_t len, uint64_t bytes)
{
    size_t n = sizeof cards / sizeof cards[0], k = 0;
    buf[0] = '\0';
    while (k < n && cards[k].total < bytes)
        k++; /* cards[k]: the smallest that holds it */
    if (k == 0)
        return;
    const struct replay_card *no = &cards[k - 1];
    if (k == n)
        snprintf(buf, len, " On common cards (docs/cards.md) that is more than any holds: the largest, a %s, "
                 "reports %.1f GiB.", no->name, (double)no->total / (1 << 30));
    else
        snprintf(buf, len, " On common cards (docs/cards.md) that fits a%s %s (%.1f GiB) and larger, not a%s %s "
                 "(%.1f GiB).", an(cards[k].name), cards[k].name, (double)cards[k].total / (1 << 30), an(no->name),
                 no->name, (double)no->total / (1 << 30));
}
