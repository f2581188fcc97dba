/*
 * Common cards by the memory their driver reports, for answers that name what a device size fits
 * ("fits an L40S (45.0 GiB) and larger cards, not an A100 40GB (39.4 GiB)"). The table and the
 * source of each figure are in docs/cards.md; keep the two in step.
 */
#ifndef XSEG_TOOLS_REPLAY_CARDS_H
#define XSEG_TOOLS_REPLAY_CARDS_H

#include <stddef.h>
#include <stdint.h>

struct replay_card {
    const char *name;
    uint64_t total; /* bytes, as its driver reports them (docs/cards.md) */
};

/* The table, smallest total first; *@p n its length. */
const struct replay_card *replay_cards(size_t *n);

/* " On common cards (docs/cards.md) that fits an L40S (45.0 GiB) and larger, not an A100 40GB
 * (39.4 GiB)." for a device of @p bytes, into @p buf; "" when every card in the table holds it (a
 * device of a few GiB: naming cards says nothing). A card holds the device when its total is at
 * least the device: the CUDA context and other libraries take their share of the total too. */
void replay_cards_sentence(char *buf, size_t len, uint64_t bytes);

#endif
