/* base/checksum: SipHash-2-4 against its published vectors; the keyed sum against a plain
 * transcription of its definition (NH-Toeplitz over 256-byte blocks, SipHash-2-4 over the values
 * and the length); every change tried changes the sum, the unkeyed sum's forgery included; keys
 * are fresh and forgotten. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/checksum.h"

static uint64_t rng = 0x243f6a8885a308d3ull; /* xorshift64: the same data every run */

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void fill(void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)p)[i] = (unsigned char)next();
}

/* SipHash's paper (Aumasson, Bernstein 2012), appendix A and its vectors: key 00 01 .. 0f,
 * message 00 01 .. (n-1). */
static void test_siphash_vectors(void **state)
{
    (void)state;
    unsigned char kb[16], msg[64];
    for (int i = 0; i < 16; i++)
        kb[i] = (unsigned char)i;
    for (int i = 0; i < 64; i++)
        msg[i] = (unsigned char)i;
    uint64_t key[2] = {0, 0};
    for (int i = 0; i < 8; i++) { /* little-endian words */
        key[0] |= (uint64_t)kb[i] << (8 * i);
        key[1] |= (uint64_t)kb[8 + i] << (8 * i);
    }
    assert_true(checksum_siphash24(key, msg, 0) == 0x726fdb47dd0e0e31ull);
    assert_true(checksum_siphash24(key, msg, 15) == 0xa129ca6149be45e5ull);
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The definition, written out: words M_1..M_64 of each zero-padded block, NH under K_1..K_64 and
 * under K_5..K_68 (1-based, as the papers write it), then SipHash-2-4 of those values and the
 * length, as little-endian bytes. */
static uint64_t reference(const struct checksum_key *k, const unsigned char *p, size_t n)
{
    size_t blocks = (n + 255) / 256;
    unsigned char *in = malloc(16 * blocks + 8);
    assert_non_null(in);
    for (size_t b = 0; b < blocks; b++) {
        unsigned char blk[256] = {0};
        memcpy(blk, p + 256 * b, n - 256 * b < 256 ? n - 256 * b : 256);
        uint32_t M[65]; /* M[1..64] */
        for (int i = 1; i <= 64; i++)
            M[i] = get32(blk + 4 * (i - 1));
        for (int shift = 0; shift < 2; shift++) {
            uint32_t K[65]; /* K[1..64]: the key's words from 4 * shift on */
            for (int i = 1; i <= 64; i++)
                K[i] = k->nh[4 * shift + i - 1];
            uint64_t y = 0;
            for (int i = 0; i < 64 / 8; i++)
                for (int j = 1; j <= 4; j++)
                    y += (uint64_t)(uint32_t)(M[8 * i + j] + K[8 * i + j]) *
                         (uint64_t)(uint32_t)(M[8 * i + j + 4] + K[8 * i + j + 4]);
            put64(in + 16 * b + 8 * shift, y);
        }
    }
    put64(in + 16 * blocks, (uint64_t)n);
    uint64_t s = checksum_siphash24(k->sip, in, 16 * blocks + 8);
    free(in);
    return s;
}

static void test_matches_definition(void **state)
{
    (void)state;
    struct checksum_key k;
    fill(&k, sizeof k);
    static const size_t lens[] = {0, 1, 7, 8, 9, 255, 256, 257, 511, 512, 1000, 4096, 65536 + 13};
    unsigned char *buf = malloc(65536 + 13);
    assert_non_null(buf);
    fill(buf, 65536 + 13);
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        if (checksum64(&k, buf, lens[i]) != reference(&k, buf, lens[i]))
            fail_msg("length %zu: the sum is not the definition's", lens[i]);
    /* Unaligned starts read the same bytes. */
    for (size_t off = 1; off < 8; off++)
        assert_true(checksum64(&k, buf + off, 4000) == reference(&k, buf + off, 4000));
    free(buf);
}

static void test_detects_changes(void **state)
{
    (void)state;
    struct checksum_key k;
    assert_true(checksum_key_new(&k));
    const size_t n = (64 << 10) + 13; /* 257 blocks, the last partial (kept small: sanitizer builds) */
    unsigned char *buf = malloc(n + 1);
    assert_non_null(buf);
    fill(buf, n);
    const uint64_t sum = checksum64(&k, buf, n);
    assert_true(checksum64(&k, buf, n) == sum); /* the same bytes, the same sum */
    for (int t = 0; t < 2000; t++) { /* one bit anywhere */
        size_t at = (size_t)(next() % n);
        unsigned char bit = (unsigned char)(1u << (next() % 8));
        buf[at] ^= bit;
        if (checksum64(&k, buf, n) == sum)
            fail_msg("flipping bit %d of byte %zu kept the sum", __builtin_ctz(bit), at);
        buf[at] ^= bit;
    }
    for (int t = 0; t < 200; t++) { /* a run of bytes rewritten */
        size_t at = (size_t)(next() % (n - 64)), len = 1 + (size_t)(next() % 64);
        unsigned char keep[64];
        memcpy(keep, buf + at, len);
        for (size_t i = 0; i < len; i++)
            buf[at + i] ^= (unsigned char)(1 + next() % 255);
        assert_true(checksum64(&k, buf, n) != sum);
        memcpy(buf + at, keep, len);
    }
    /* The unkeyed sum's forgery: word 0 replaced, word 8 adjusted for lane 0. */
    uint64_t w0, w8, f0 = 0x2121444547524f46ull;
    memcpy(&w0, buf, 8);
    memcpy(&w8, buf + 64, 8);
    uint64_t x = (0xd1342543de82ef95ull ^ w0) * 0x9e3779b97f4a7c15ull;
    uint64_t y = (0xd1342543de82ef95ull ^ f0) * 0x9e3779b97f4a7c15ull;
    uint64_t f8 = w8 ^ (x ^ (x >> 29)) ^ (y ^ (y >> 29));
    memcpy(buf, &f0, 8);
    memcpy(buf + 64, &f8, 8);
    assert_true(checksum64(&k, buf, n) != sum);
    memcpy(buf, &w0, 8);
    memcpy(buf + 64, &w8, 8);
    /* Two blocks swapped; a zero byte more (the padding is not the data). */
    unsigned char tmp[256], tmp2[256];
    memcpy(tmp, buf, 256);
    memcpy(tmp2, buf + 256, 256);
    memcpy(buf, tmp2, 256);
    memcpy(buf + 256, tmp, 256);
    assert_true(checksum64(&k, buf, n) != sum);
    memcpy(buf + 256, buf, 256);
    memcpy(buf, tmp, 256);
    assert_true(checksum64(&k, buf, n) == sum);
    buf[n] = 0;
    assert_true(checksum64(&k, buf, n + 1) != sum);
    free(buf);
}

static void test_keys(void **state)
{
    (void)state;
    struct checksum_key a, b, zero;
    memset(&zero, 0, sizeof zero);
    assert_true(checksum_key_new(&a));
    assert_true(checksum_key_new(&b));
    assert_memory_not_equal(&a, &b, sizeof a);
    assert_memory_not_equal(&a, &zero, sizeof a);
    unsigned char buf[1000];
    fill(buf, sizeof buf);
    assert_true(checksum64(&a, buf, sizeof buf) != checksum64(&b, buf, sizeof buf));
    checksum_key_forget(&a);
    assert_memory_equal(&a, &zero, sizeof a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_vectors),
        cmocka_unit_test(test_matches_definition),
        cmocka_unit_test(test_detects_changes),
        cmocka_unit_test(test_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
