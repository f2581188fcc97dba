/* A keyed 64-bit checksum of a byte range: what a file-backed sleep keeps in host memory for each
 * chunk it writes, so the wake refuses bytes changed in the file while the pool slept
 * (core/services/sleep.c), even by someone who can read and write the file.
 *
 * The key is random, drawn per sleep from the kernel, and never leaves the process (nor do the
 * sums): whoever edits the file cannot compute the sum of what they write. The construction is
 * UMAC's (Black, Halevi, Krawczyk, Krovetz, Rogaway, CRYPTO 1999; NH as in RFC 4418): the range
 * in 256-byte blocks (the last zero-padded), each hashed by NH twice under the key's NH words and
 * the same words shifted by four (the Toeplitz construction: two blocks that differ give equal
 * pairs with a chance of at most 2^-64 over the key), then SipHash-2-4 (Aumasson and Bernstein,
 * 2012) under its own 128-bit key over the pairs and the length. A changed range, of any shape,
 * keeps its sum with a chance of at most about 2^-63 per try; each try costs the forger a wake.
 * Not a signature: a process that can read this process's memory (a debugger) can read the key.
 * NH is about as fast as memory reads (benchmarks/bench_checksum.c; docs/benchmarks-host.md), so
 * the check costs about what the unkeyed sum it replaced cost. */
#ifndef XSEG_BASE_CHECKSUM_H
#define XSEG_BASE_CHECKSUM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHECKSUM_NH_WORDS 64 /* 32-bit words of a block: 256 bytes */

struct checksum_key {
    uint64_t sip[2];                    /* SipHash-2-4's key */
    uint32_t nh[CHECKSUM_NH_WORDS + 4]; /* NH's: words [0, 64) and, shifted, [4, 68) */
};

/* Draw a new key from the kernel's random bits (getrandom, else /dev/urandom). @return false
 * (errno set) when neither gives them: no key is made up from predictable bits. */
bool checksum_key_new(struct checksum_key *k);

/* Zero @p k (a sleep's key does not outlive it in freed memory). */
void checksum_key_forget(struct checksum_key *k);

/* The checksum of [@p p, @p p + @p n) under @p k. */
uint64_t checksum64(const struct checksum_key *k, const void *p, size_t n);

/* SipHash-2-4 of [@p p, @p p + @p n) under the key (@p key[0], @p key[1]) (each word the key's
 * 8 bytes read little-endian): the function checksum64 ends with, exposed for its test vectors. */
uint64_t checksum_siphash24(const uint64_t key[2], const void *p, size_t n);

#endif
