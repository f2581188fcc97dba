/* A 64-bit checksum of a byte range: what a file-backed sleep keeps in host memory for each chunk
 * it writes, so the wake finds bytes changed in the file while the pool slept (core/services/sleep.c).
 *
 * Eight lanes of 8-byte words; each step of a lane (xor the word, multiply by an odd constant, xor
 * the high bits down) is a bijection of the lane for a fixed word and injective in the word for
 * a fixed lane, so changing any one word always changes the sum; other changes go unseen with a
 * chance near 2^-64. Not keyed, not cryptographic: it catches corruption and edits, not a forger
 * who recomputes it (whoever may write the 0600 file may also debug the process). The length is
 * mixed in: a zero tail does not look like a shorter range. */
#ifndef XSEG_BASE_CHECKSUM_H
#define XSEG_BASE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* The checksum of [@p p, @p p + @p n); the same bytes give the same sum on one machine. */
uint64_t checksum64(const void *p, size_t n);

#endif
