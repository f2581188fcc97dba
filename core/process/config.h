/*
 * The configuration string, in PyTorch's PYTORCH_CUDA_ALLOC_CONF grammar:
 *   key:value[,key:value...]   lists in brackets: roundup_power2_divisions:[256:1,512:2,>:4]
 * Tokens are ',', ':', '[', ']' and words; whitespace is ignored; booleans are True/False.
 */
#ifndef XSEG_CORE_CONFIG_H
#define XSEG_CORE_CONFIG_H

#include <stdbool.h>

#include "base/common.h"

/* roundup_power2_divisions has one value per power-of-two size bucket: bucket i covers
 * [2^i MiB, 2^(i+1) MiB), the first also everything below 1 MiB, the last everything above. */
#define CFG_ROUNDUP_BUCKETS 16

/* The longest NAME value (memory_group): it names a shared-memory object. */
#define CFG_NAME_MAX 32

struct cfg {
    size_t max_split_size;              /* bytes; SIZE_MAX when unlimited (the default) */
    size_t max_non_split_rounding;      /* bytes; defaults to large_segment_size */
    size_t large_segment_size;          /* bytes; classic segment size for 1-10 MiB requests */
    size_t expandable_page_size;        /* bytes; page size of large-pool expandable segments, an
                                         * even MiB count <= large_segment_size; follows
                                         * large_segment_size while equal to it (the default) */
    double garbage_collection_threshold; /* 0 = off, else in (0, 1) */
    unsigned roundup_power2_divisions[CFG_ROUNDUP_BUCKETS]; /* 0 or 1 = plain 512 B rounding */
    bool expandable_segments;           /* default true; falls back where VMM is unsupported */
    size_t expandable_chunk;            /* bytes; the largest physical chunk of a large-pool
                                         * mapping, an even MiB count <= expandable_page_size;
                                         * 0 (default): the page (PyTorch's one handle a page) */
    bool expandable_segments_recycle;   /* default true: under pressure give back only what a
                                         * growth needs, idle streams first (core/services/trim.h) */
    bool expandable_segments_defrag;    /* default false: an allocation the OOM path cannot serve
                                         * re-backs partly used pages with granule chunks, giving
                                         * their free granules back (exp_defragment); copies live
                                         * bytes, so it needs the device's xseg memory unused */
    bool expandable_segments_ipc;       /* default true: pages are created exportable (POSIX fd,
                                         * fabric where supported) so xseg_ipc_export works */
    bool gpu_direct_rdma;               /* default false: RDMA-capable pages where the device says
                                         * so; true: required, a segment fails without it */
    bool expandable_segments_rdma;      /* default true: new pages carry the GPUDirect RDMA flag where
                                         * the device supports it; false: never (a NIC cannot
                                         * register them); contradicts gpu_direct_rdma:True */
    bool release_lock_on_cudamalloc;
    double per_process_memory_fraction; /* [0, 1]; 1 = no cap */
    bool graph_capture_record_stream_reuse; /* reuse record_stream'ed blocks in capture (capreuse.c) */
    /* Services (core/services/trim.c, core/services/idle.c). */
    size_t release_threshold;           /* bytes of cache kept; SIZE_MAX (default) keeps all */
    unsigned idle_release_ms;           /* give back free runs idle this long; 0 (default): off */
    bool idle_release_thread;           /* a background thread does idle reclaim (core/services/idle.c) */
    /* The memory group (core/services/group.c). */
    char memory_group[CFG_NAME_MAX + 1]; /* the group's name; "" (default): no group */
    unsigned memory_group_wait_ms;      /* how long a malloc waits for members to give way */
    size_t memory_budget;               /* bytes this process may hold on a device, foreign bytes
                                         * included (core/services/group.c); 0 (default): none */
    size_t memory_group_budget;         /* the same for the group's sum (its first member's value) */
    bool sleep_keep_host_backup;        /* a woken pool's pinned backup stays in the host cache */
    size_t sleep_copy_chunk;            /* bytes: the largest copy sleep and wake queue at once */
    bool sleep_wait_device;             /* a sleep waits for the whole device's work (cuCtxSynchronize) */
    unsigned sleep_copy_batch_kb;       /* KiB: runs shorter go in cuMemcpyBatchAsync batches (0: off) */
    unsigned sleep_discard_fill;        /* the byte a DISCARD wake fills pages with (default 0) */
    bool sleep_backup_checksum;         /* sleep sums host backups, wake checks them */
    bool debug_stale_access;            /* freed blocks go through a quarantine (core/device/quarantine.h) */
    size_t debug_quarantine;            /* bytes: the quarantine's bound */
    /* Spill (core/services/spill.c). */
    bool spill_to_host;                 /* default false: out of memory moves live pages to host memory */
    size_t spill_host_limit;            /* bytes of host memory spill may hold; 0 (default): no limit */
    size_t register_blocks_above;       /* bytes: live blocks this large are in the registration
                                         * ledger from malloc to free (core/policy/registry.c); 0: off */
    bool debug_stale_full_check;        /* checks read every quarantined byte, not samples */
    unsigned debug_stale_fill_batch;    /* quarantined blocks whose fills wait to go in one launch */
    /* PyTorch's pinned host allocator keys (core/services/hostalloc.c). */
    bool pinned_use_cuda_host_register; /* pin malloc'd pages (cuMemHostRegister), not cuMemHostAlloc */
    unsigned pinned_num_register_threads; /* threads faulting in the pages before registering */
    bool pinned_use_background_threads; /* a thread returns blocks whose events completed */
};

/* The kinds of value a key takes (core/process/config_keys.h). */
enum cfg_kind {
    CFG_KIND_BOOL,
    CFG_KIND_MIB,
    CFG_KIND_FRACTION,
    CFG_KIND_ROUNDUP,
    CFG_KIND_MS,
    CFG_KIND_COUNT,
    CFG_KIND_NAME,
    CFG_KIND_ENUM,
    CFG_KIND_IGNORED,
};

/* Row attributes (core/process/config_keys.h). */
enum {
    CFG_RESET = 1,        /* back to its default on every parse (PyTorch's rule) */
    CFG_OMIT_DEFAULT = 2, /* not in the canonical string while at its default */
    CFG_IGNORED = 4,      /* accepted, checked and ignored (pinned_*) */
};

struct cfg_parser;

/* One row of core/process/config_keys.h as data, for the code that walks the keys. */
struct cfg_key {
    const char *name;
    const char *alias;  /* another accepted spelling, or NULL */
    enum cfg_kind kind;
    size_t off;         /* offset of the field in struct cfg (keys with a field) */
    unsigned flags;
    unsigned snap;      /* place in a snapshot's allocator_settings, 0: not there */
    const char *doc;    /* the default as docs/configuration.md spells it */
    xseg_status (*parse)(struct cfg_parser *p, const struct cfg_key *k, const char *key);
    /* A bounded number's row (CFG_BOUNDED, CFG_BOUNDED_MIB in core/process/config_keys.h): its smallest
     * and largest value (in MiB for MIB rows), its unit as the error spells it, whether only
     * powers of 2 are accepted. */
    unsigned long long min, max;
    const char *unit;
    bool pow2;
};

/* Every key, in the canonical string's order; cfg_nkeys rows. */
extern const struct cfg_key cfg_keys[];
extern const size_t cfg_nkeys;

/* The field of @p k in @p cfg (a key with a field). */
static inline const void *cfg_field(const struct cfg *cfg, const struct cfg_key *k)
{
    return (const char *)cfg + k->off;
}

/* xseg's defaults (expandable_segments on, everything else as PyTorch). */
void cfg_default(struct cfg *cfg);

/*
 * Parse @p str on top of @p base into @p out (out may equal base). Keys not named keep their
 * value from base, except max_split_size_mb, roundup_power2_divisions and
 * garbage_collection_threshold, which reset to their defaults first (PyTorch's rule).
 * PyTorch's pinned_* host-allocator keys are accepted and ignored with a one-time note on stderr.
 * @return XSEG_ERROR_INVALID_VALUE with a message naming the key and the accepted form; @p out is
 *         left untouched then.
 */
xseg_status cfg_parse(const char *str, const struct cfg *base, struct cfg *out);

/* The first of XSEG_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF that is set, or NULL.
 * @p var (optional) receives the variable's name, for messages. */
const char *cfg_from_env(const char **var);

/* Write @p cfg as a canonical config string (snprintf semantics, @p len gets the full length). */
void cfg_format(const struct cfg *cfg, char *buf, size_t size, size_t *len);

/* The number of power-of-two divisions for an allocation of @p size bytes (0 when none). */
unsigned cfg_roundup_divisions(const struct cfg *cfg, size_t size);

#endif
