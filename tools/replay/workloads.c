/*
 * The bundled workloads. Each is a small model of a real program's allocation pattern, written as
 * trace text so it goes through the same parser as a user's file (and can be dumped with
 * `xseg-replay --dump builtin:NAME`).
 *
 * training:  a transformer (24 layers, hidden 2048, batch 8, bf16 activations, fp32 weights, Adam)
 *            whose sequence length changes every step. Weights, gradients and optimizer state live
 *            throughout; per-layer activations are allocated in forward order and freed in reverse
 *            during backward, with temporaries in between. Changing lengths leave a sliver at the
 *            end of each cached block, once per layer: the fragmentation that classic split
 *            blocks cannot undo and that expandable segments avoid.
 * inference: an LLM server (a 7B-class model, 32 layers): weights for the whole run, a KV cache
 *            grown in 256-token chunks per request and freed when the request finishes
 *            (continuous batching), bursty prefill temporaries sized by the prompt, and idle
 *            periods in which the server calls empty_cache — where page-level reclaim matters;
 *            then an idle phase without empty_cache that shows each service policy (release
 *            threshold, idle reclaim, trim, sleep and wake).
 */
#define _GNU_SOURCE
#include "tools/replay/workloads.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct wl_info wl_list[] = {
    {"training", "transformer training, sequence length changing every step (24 layers, Adam)"},
    {"inference", "LLM inference server: weights, growing/shrinking KV cache, bursty prefill, idle reclaim, "
                  "then an idle phase (threshold, idle release, trim, sleep/wake)"},
};
const size_t wl_count = sizeof wl_list / sizeof wl_list[0];

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rng_range(uint64_t *s, uint64_t lo, uint64_t hi) { return lo + rng_next(s) % (hi - lo + 1); }

static void gen_training(FILE *f, uint64_t seed)
{
    const uint64_t L = 24, H = 2048, FF = 4 * H, V = 32000, B = 8, HEADS = 16;
    const int steps = 10;
    uint64_t rng = seed;
    fprintf(f, "# builtin:training (seed %llu): transformer training, changing sequence length\n",
            (unsigned long long)seed);
    /* Weights (fp32) and their Adam state, live for the whole run. */
    static const char *const wname[] = {"qkv", "o", "ff1", "ff2", "ln1", "ln2"};
    uint64_t wsize[6] = {3 * H * H * 4, H * H * 4, H * FF * 4, FF * H * 4, 2 * H * 4, 2 * H * 4};
    fprintf(f, "alloc emb %llu\n", (unsigned long long)(V * H * 4));
    for (uint64_t l = 0; l < L; l++)
        for (int k = 0; k < 6; k++)
            fprintf(f, "alloc w%llu.%s %llu\n", (unsigned long long)l, wname[k], (unsigned long long)wsize[k]);
    fprintf(f, "mark weights loaded\n");
    for (int step = 0; step < steps; step++) {
        /* Sequence length: a random multiple of 64 between 512 and 2048, plus 0..3 extra tokens. */
        uint64_t S = 64 * rng_range(&rng, 8, 32) + rng_range(&rng, 0, 3), T = B * S;
        fprintf(f, "# step %d: seq %llu\n", step, (unsigned long long)S);
        fprintf(f, "alloc tokens %llu\nalloc x.in %llu\n", (unsigned long long)(T * 8), (unsigned long long)(T * H * 2));
        for (uint64_t l = 0; l < L; l++) {
            /* Saved for backward: layer norm out, qkv, attention out + logsumexp, ffn in/out. */
            fprintf(f, "alloc a%llu.ln1 %llu\n", (unsigned long long)l, (unsigned long long)(T * H * 2));
            fprintf(f, "alloc a%llu.qkv %llu\n", (unsigned long long)l, (unsigned long long)(T * 3 * H * 2));
            fprintf(f, "alloc a%llu.att %llu\n", (unsigned long long)l, (unsigned long long)(T * H * 2));
            fprintf(f, "alloc a%llu.lse %llu\n", (unsigned long long)l, (unsigned long long)(B * HEADS * S * 4));
            fprintf(f, "alloc tmp.proj %llu\n", (unsigned long long)(T * H * 4));
            fprintf(f, "alloc a%llu.res %llu\nfree tmp.proj\n", (unsigned long long)l, (unsigned long long)(T * H * 2));
            fprintf(f, "alloc a%llu.ln2 %llu\n", (unsigned long long)l, (unsigned long long)(T * H * 2));
            fprintf(f, "alloc a%llu.ff1 %llu\n", (unsigned long long)l, (unsigned long long)(T * FF * 2));
            fprintf(f, "alloc a%llu.gelu %llu\n", (unsigned long long)l, (unsigned long long)(T * FF * 2));
            fprintf(f, "alloc tmp.ff2 %llu\nfree tmp.ff2\n", (unsigned long long)(T * H * 4));
        }
        fprintf(f, "alloc logits %llu\nalloc loss 4\n", (unsigned long long)(T * V * 2));
        fprintf(f, "alloc dlogits %llu\nfree logits\nfree loss\n", (unsigned long long)(T * V * 2));
        fprintf(f, "alloc dx %llu\nfree dlogits\n", (unsigned long long)(T * H * 2));
        if (step == 0)
            fprintf(f, "mark step 0 forward done\n");
        for (uint64_t l = L; l-- > 0;) {
            /* Gradients persist from the first backward on (zero_grad(set_to_none=False)). */
            if (step == 0)
                for (int k = 0; k < 6; k++)
                    fprintf(f, "alloc g%llu.%s %llu\n", (unsigned long long)l, wname[k], (unsigned long long)wsize[k]);
            fprintf(f, "alloc d.ff %llu\n", (unsigned long long)(T * FF * 2));
            fprintf(f, "alloc tmp.wg %llu\nfree tmp.wg\n", (unsigned long long)wsize[3]);
            fprintf(f, "free a%llu.gelu\nfree a%llu.ff1\n", (unsigned long long)l, (unsigned long long)l);
            fprintf(f, "alloc dx2 %llu\nfree d.ff\nfree a%llu.ln2\nfree a%llu.res\n", (unsigned long long)(T * H * 2),
                    (unsigned long long)l, (unsigned long long)l);
            fprintf(f, "alloc d.qkv %llu\n", (unsigned long long)(T * 3 * H * 2));
            fprintf(f, "free a%llu.lse\nfree a%llu.att\nfree a%llu.qkv\n", (unsigned long long)l,
                    (unsigned long long)l, (unsigned long long)l);
            fprintf(f, "free dx\nalloc dx %llu\nfree d.qkv\nfree dx2\nfree a%llu.ln1\n",
                    (unsigned long long)(T * H * 2), (unsigned long long)l);
        }
        fprintf(f, "free dx\nfree x.in\nfree tokens\n");
        /* Adam: the first step creates the state; every step uses a temporary per parameter. */
        for (uint64_t l = 0; l < L; l++)
            for (int k = 0; k < 6; k++) {
                if (step == 0)
                    fprintf(f, "alloc m%llu.%s %llu\nalloc v%llu.%s %llu\n", (unsigned long long)l, wname[k],
                            (unsigned long long)wsize[k], (unsigned long long)l, wname[k], (unsigned long long)wsize[k]);
                fprintf(f, "alloc tmp.adam %llu\nfree tmp.adam\n", (unsigned long long)wsize[k]);
            }
        fprintf(f, "mark after step %d (seq %llu)\n", step, (unsigned long long)S);
    }
}

struct req {
    int active;
    uint64_t id, prompt, out, done, chunks;
};

/* The server of builtin:inference: a 7B-class model (32 layers), a KV cache budget, requests. */
struct server {
    uint64_t rng, next_id, kv_used;
    struct req reqs[64];
};

enum {
    INF_H = 4096, INF_FF = 11008, INF_V = 32000, INF_L = 32,
    INF_CHUNK_TOKENS = 256, INF_MAX_BATCH = 48, INF_TOKENS_PER_TICK = 16,
};
#define INF_KV_PER_TOKEN ((uint64_t)2 * INF_L * INF_H * 2)            /* K and V, bf16: 512 KiB */
#define INF_CHUNK ((uint64_t)INF_CHUNK_TOKENS * INF_KV_PER_TOKEN)   /* 128 MiB */
#define INF_KV_BUDGET (40ull << 30)

/* One tick: admit up to @p arrivals requests (prefill: KV chunks for the prompt, temporaries),
 * then, if any request is active, one decode tick (KV grows chunk by chunk; finished requests
 * free theirs). Returns the requests active after admission (0: nothing was decoded). */
static size_t serve_tick(FILE *f, struct server *sv, uint64_t arrivals)
{
    const uint64_t H = INF_H, FF = INF_FF, V = INF_V, chunk = INF_CHUNK;
    size_t active = 0;
    for (int r = 0; r < 64; r++)
        active += sv->reqs[r].active;
    for (uint64_t a = 0; a < arrivals && active < INF_MAX_BATCH; a++) {
        uint64_t prompt = rng_range(&sv->rng, 32, 3000), out = rng_range(&sv->rng, 16, 1200);
        uint64_t need = (prompt + INF_CHUNK_TOKENS - 1) / INF_CHUNK_TOKENS;
        if (sv->kv_used + need * chunk > INF_KV_BUDGET)
            break;
        int slot = -1;
        for (int r = 0; r < 64 && slot < 0; r++)
            if (!sv->reqs[r].active)
                slot = r;
        if (slot < 0)
            break;
        struct req *q = &sv->reqs[slot];
        *q = (struct req){.active = 1, .id = sv->next_id++, .prompt = prompt, .out = out};
        /* Prefill: KV chunks for the prompt, then temporaries sized by the prompt. */
        for (; q->chunks < need; q->chunks++)
            fprintf(f, "alloc kv%llu.%llu %llu\n", (unsigned long long)q->id, (unsigned long long)q->chunks,
                    (unsigned long long)chunk);
        sv->kv_used += need * chunk;
        fprintf(f, "alloc pf.x %llu\nalloc pf.qkv %llu\nalloc pf.ff %llu\nfree pf.ff\nfree pf.qkv\n"
                   "alloc pf.logits %llu\nfree pf.logits\nfree pf.x\n",
                (unsigned long long)(prompt * H * 2), (unsigned long long)(prompt * 3 * H * 2),
                (unsigned long long)(prompt * FF * 2 * 2), (unsigned long long)(V * 4));
        active++;
    }
    if (!active)
        return 0;
    /* One decode tick: INF_TOKENS_PER_TICK steps for the whole batch, KV grows chunk by chunk. */
    fprintf(f, "alloc dec.x %llu\nalloc dec.logits %llu\n", (unsigned long long)(active * H * 2),
            (unsigned long long)(active * V * 4));
    for (int r = 0; r < 64; r++) {
        struct req *q = &sv->reqs[r];
        if (!q->active)
            continue;
        q->done += INF_TOKENS_PER_TICK;
        uint64_t total = q->prompt + q->done;
        while (q->chunks * INF_CHUNK_TOKENS < total && q->done < q->out) {
            fprintf(f, "alloc kv%llu.%llu %llu\n", (unsigned long long)q->id, (unsigned long long)q->chunks,
                    (unsigned long long)chunk);
            q->chunks++;
            sv->kv_used += chunk;
        }
        if (q->done >= q->out) {
            for (uint64_t c = q->chunks; c-- > 0;)
                fprintf(f, "free kv%llu.%llu\n", (unsigned long long)q->id, (unsigned long long)c);
            sv->kv_used -= q->chunks * chunk;
            q->active = 0;
        }
    }
    fprintf(f, "free dec.logits\nfree dec.x\n");
    return active;
}

static void gen_inference(FILE *f, uint64_t seed)
{
    const uint64_t L = INF_L, H = INF_H, FF = INF_FF, V = INF_V;
    const int ticks = 700;
    struct server sv = {.rng = seed};
    fprintf(f, "# builtin:inference (seed %llu): LLM server with continuous batching\n", (unsigned long long)seed);
    fprintf(f, "alloc emb %llu\nalloc lm_head %llu\n", (unsigned long long)(V * H * 2), (unsigned long long)(V * H * 2));
    for (uint64_t l = 0; l < L; l++)
        fprintf(f, "alloc w%llu.qkv %llu\nalloc w%llu.o %llu\nalloc w%llu.up %llu\nalloc w%llu.down %llu\n"
                   "alloc w%llu.norm %llu\n",
                (unsigned long long)l, (unsigned long long)(3 * H * H * 2), (unsigned long long)l,
                (unsigned long long)(H * H * 2), (unsigned long long)l, (unsigned long long)(2 * H * FF * 2),
                (unsigned long long)l, (unsigned long long)(FF * H * 2), (unsigned long long)l,
                (unsigned long long)(2 * H * 2));
    fprintf(f, "mark weights loaded\n");
    int idle_left = 0, idles = 0;
    for (int tick = 0; tick < ticks; tick++) {
        /* Load: bursts of arrivals, calm stretches, and idle periods with no traffic at all. */
        int phase = (tick / 100) % 4; /* 0 burst, 1 steady, 2 drain + idle, 3 steady */
        uint64_t arrivals = phase == 0 ? rng_range(&sv.rng, 0, 6) : phase == 2 ? 0 : rng_range(&sv.rng, 0, 2);
        if (!serve_tick(f, &sv, arrivals)) {
            /* Idle: the server gives memory back (and must not move the weights). */
            if (!idle_left) {
                fprintf(f, "sync\nempty_cache\nmark idle %d (after empty_cache)\n", ++idles);
                idle_left = 1;
            }
            continue;
        }
        idle_left = 0;
        if (tick % 100 == 99)
            fprintf(f, "mark tick %d\n", tick + 1);
    }
    fprintf(f, "mark end of serving\n");

    /* The idle phase: a last stretch of traffic, then none at all, and this time the server does
     * not call empty_cache. What the cache does next shows each policy (docs/services.md):
     * release_threshold_mb trims at the cache misses of the stretch and where xseg waits for
     * streams (trim, sleep, wake); idle_release_ms gives back what nobody used for that long (at
     * the next malloc: the health checks below; or on its thread, during the idle time); trim
     * gives back on request; a sleep gives back everything, weights included, at the same
     * addresses (DISCARD here: the weights would be reloaded; OFFLOAD would copy them to host). */
    for (int tick = 0; tick < 40; tick++)
        serve_tick(f, &sv, rng_range(&sv.rng, 0, 2));
    while (serve_tick(f, &sv, 0))
        ;
    fprintf(f, "mark idle phase: traffic over (cache held)\n");
    for (int i = 0; i < 2; i++)
        fprintf(f, "idle 300ms\nalloc health %llu\nfree health\n", (unsigned long long)(V * 4));
    fprintf(f, "mark idle phase: 600 ms without traffic\n");
    fprintf(f, "trim 1GiB\nmark idle phase: after trim 1GiB\n");
    fprintf(f, "sleep default discard\nmark idle phase: asleep (sleep default discard)\n");
    fprintf(f, "wake default\nmark idle phase: awake (wake default)\n");
}

xseg_status wl_generate(const char *name, uint64_t seed, char **text, size_t *len, char *err, size_t errlen)
{
    void (*gen)(FILE *, uint64_t) = NULL;
    if (!strcmp(name, "training"))
        gen = gen_training;
    else if (!strcmp(name, "inference"))
        gen = gen_inference;
    if (!gen) {
        int n = snprintf(err, errlen, "unknown workload '%s' (known:", name);
        for (size_t i = 0; i < wl_count && n > 0 && (size_t)n < errlen; i++)
            n += snprintf(err + n, errlen - (size_t)n, " %s", wl_list[i].name);
        if (n > 0 && (size_t)n < errlen)
            snprintf(err + n, errlen - (size_t)n, ")");
        return XSEG_ERROR_INVALID_VALUE;
    }
    *text = NULL;
    *len = 0;
    FILE *f = open_memstream(text, len);
    if (!f) {
        snprintf(err, errlen, "out of host memory");
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    gen(f, seed);
    if (fclose(f) != 0) {
        free(*text);
        snprintf(err, errlen, "out of host memory");
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    return XSEG_SUCCESS;
}
