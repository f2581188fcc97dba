/* A keyed 64-bit checksum of a byte range (checksum.h): NH-Toeplitz over 256-byte blocks, then
 * SipHash-2-4 over the blocks' NH values and the length. Written from the published definitions
 * (UMAC's NH, RFC 4418; SipHash's paper); checked against SipHash's published vectors and a
 * plain transcription of the definitions (tests/unit/test_checksum.c). */
#define _DEFAULT_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/checksum.h"

#define BLOCK (4 * CHECKSUM_NH_WORDS) /* bytes NH takes at once */

/* Little-endian loads (a no-op on the hosts xseg runs on; the sum is the same on any host). */
static inline uint32_t load32(const unsigned char *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap32(w);
#endif
    return w;
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, sizeof w);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* ---- SipHash-2-4, one 8-byte word at a time ---- */

struct sip {
    uint64_t v0, v1, v2, v3;
};

static inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

static inline void sip_round(struct sip *s)
{
    s->v0 += s->v1;
    s->v1 = rotl(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = rotl(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = rotl(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = rotl(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = rotl(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = rotl(s->v2, 32);
}

static inline void sip_init(struct sip *s, const uint64_t k[2])
{
    /* "somepseudorandomlygeneratedbytes" */
    s->v0 = k[0] ^ 0x736f6d6570736575ull;
    s->v1 = k[1] ^ 0x646f72616e646f6dull;
    s->v2 = k[0] ^ 0x6c7967656e657261ull;
    s->v3 = k[1] ^ 0x7465646279746573ull;
}

/* Compress one message word (two rounds). */
static inline void sip_word(struct sip *s, uint64_t m)
{
    s->v3 ^= m;
    sip_round(s);
    sip_round(s);
    s->v0 ^= m;
}

/* The last word (the tail's bytes, the length mod 256 in its top byte), then four rounds. */
static inline uint64_t sip_end(struct sip *s, uint64_t last)
{
    sip_word(s, last);
    s->v2 ^= 0xff;
    for (int r = 0; r < 4; r++)
        sip_round(s);
    return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

uint64_t checksum_siphash24(const uint64_t key[2], const void *data, size_t n)
{
    const unsigned char *p = data;
    struct sip s;
    sip_init(&s, key);
    size_t i = 0;
    for (; n - i >= 8; i += 8)
        sip_word(&s, load64(p + i));
    uint64_t last = (uint64_t)(n & 0xff) << 56;
    for (size_t j = 0; i + j < n; j++)
        last |= (uint64_t)p[i + j] << (8 * j);
    return sip_end(&s, last);
}

/* ---- NH ---- */

/* NH of one block under the key's words k[0, 64) (into *a) and k[4, 68) (into *b): the sum over
 * each group of eight words m0..m7 of (m_j + k_j mod 2^32) * (m_j+4 + k_j+4 mod 2^32), j < 4,
 * modulo 2^64. Plain loops: the compiler vectorizes them. */
static inline void nh_block(const uint32_t *k, const unsigned char *m, uint64_t *a, uint64_t *b)
{
    uint64_t x = 0, y = 0;
    for (int i = 0; i < CHECKSUM_NH_WORDS; i += 8)
        for (int j = 0; j < 4; j++) {
            uint32_t lo = load32(m + 4 * (i + j)), hi = load32(m + 4 * (i + j + 4));
            x += (uint64_t)(uint32_t)(lo + k[i + j]) * (uint32_t)(hi + k[i + j + 4]);
            y += (uint64_t)(uint32_t)(lo + k[i + j + 4]) * (uint32_t)(hi + k[i + j + 8]);
        }
    *a = x;
    *b = y;
}

uint64_t checksum64(const struct checksum_key *k, const void *data, size_t n)
{
    const unsigned char *p = data;
    struct sip s;
    sip_init(&s, k->sip);
    uint64_t a, b, words = 1; /* the SipHash input: two words a block, then the length */
    size_t i = 0;
    for (; n - i >= BLOCK; i += BLOCK, words += 2) {
        nh_block(k->nh, p + i, &a, &b);
        sip_word(&s, a);
        sip_word(&s, b);
    }
    if (i < n) { /* zero-padded: the length below tells it from a longer range */
        unsigned char pad[BLOCK] = {0};
        memcpy(pad, p + i, n - i);
        nh_block(k->nh, pad, &a, &b);
        sip_word(&s, a);
        sip_word(&s, b);
        words += 2;
    }
    sip_word(&s, (uint64_t)n);
    return sip_end(&s, (uint64_t)((8 * words) & 0xff) << 56);
}

/* ---- keys ---- */

bool checksum_key_new(struct checksum_key *k)
{
    unsigned char *out = (unsigned char *)k;
    size_t got = 0;
    while (got < sizeof *k) {
        ssize_t r = getrandom(out + got, sizeof *k - got, GRND_NONBLOCK);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got < sizeof *k) { /* no getrandom (old kernel, seccomp) or not seeded yet: urandom */
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return false;
        while (got < sizeof *k) {
            ssize_t r = read(fd, out + got, sizeof *k - got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        int e = errno;
        close(fd);
        errno = e;
    }
    if (got < sizeof *k) {
        checksum_key_forget(k);
        if (!errno)
            errno = EIO;
        return false;
    }
    return true;
}

void checksum_key_forget(struct checksum_key *k) { explicit_bzero(k, sizeof *k); }
