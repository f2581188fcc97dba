/*
 * Every key of the allocator configuration string, one row each, in the order xseg_get_config
 * writes them. core/process/config.c expands the rows into the parse dispatch, the defaults, the reset
 * rule, the canonical string and the known keys a typo is matched against; core/snapshot.c into
 * a snapshot's allocator_settings; tests/unit/test_config_doc.c checks docs/configuration.md's
 * key table against them. Adding a key is adding a row (and its field in struct cfg, a parse
 * function when no existing one fits, and its line in docs/configuration.md).
 *
 * K(name, alias, kind, field, default, parse, flags, snap, doc): a key held in struct cfg.
 *   name     the key as written (stringified); alias: another accepted spelling, or NULL
 *   kind     BOOL (True/False), MIB (held in bytes, written in whole MiB), FRACTION (a double),
 *            ROUNDUP (one division count per size bucket), MS (milliseconds, unsigned), COUNT
 *            (a count, unsigned), NAME (1 to 32 letters, digits, '_', '.', '-'; "" when unset)
 *   field    its member of struct cfg
 *   default  its value in cfg_default (bytes for MIB; every bucket's for ROUNDUP)
 *   parse    the function in core/process/config.c that reads the value and checks it; keys whose
 *            bounds depend on large_segment_size_mb leave the final check to cfg_finish; or
 *            CFG_BOUNDED(max, unit, pow2) for a bounded integer (MS, COUNT): a whole number from
 *            0 (1 and powers of 2 with pow2) to max, in unit; CFG_BOUNDED_MIB(min, max) for a
 *            byte size (MIB; or an IGNORED row, checked only) from min to max MiB. One parser
 *            reads both, and its error names the key and the range
 *   flags    CFG_RESET: back to the default on every parse (PyTorch's rule);
 *            CFG_OMIT_DEFAULT: left out of the canonical string while at the default (PyTorch's
 *            grammar has no spelling for "unlimited" or "off")
 *   snap     its place among the fields of a snapshot's allocator_settings (PyTorch's), 0: none
 *   doc      the default as docs/configuration.md's key table starts to spell it
 * A(name, alias, kind, parse, flags, doc): a key accepted with no field: ENUM (backend and
 *   throw_on_cudamalloc_oom, whose values change nothing in xseg) or IGNORED with CFG_IGNORED
 *   (the pinned_* keys of PyTorch's host allocator that xseg's does not need, and 2.12's VA
 *   bounds: checked, then ignored with a one-time warning naming them).
 *
 * Leaf header: macros only, expanded where struct cfg and the parse functions are in scope.
 */
#ifndef XSEG_CORE_CONFIG_KEYS_H
#define XSEG_CORE_CONFIG_KEYS_H

/* The parse column of a bounded number: the parser and the row's bounds (struct cfg_key). */
#define CFG_BOUNDED(max, unit, pow2) cfg_parse_bounded, (pow2) ? 1 : 0, max, unit, pow2
#define CFG_BOUNDED_MIB(min, max) cfg_parse_bounded, min, max, "MiB", false
/* A count from min (not 0) to max, in unit (COUNT). */
#define CFG_BOUNDED_COUNT(min, max, unit) cfg_parse_bounded, min, max, unit, false
/* The largest budget: a pebibyte, far beyond any device. */
#define CFG_MAX_BUDGET_MB (1ull << 30)

#define CFG_KEYS(K, A)                                                                             \
    K(expandable_segments, NULL, BOOL, expandable_segments, true, cfg_parse_flag, 0, 3, "True")    \
    K(expandable_segments_recycle, NULL, BOOL, expandable_segments_recycle, true, cfg_parse_flag,  \
      0, 0, "True")                                                                                \
    K(expandable_segments_ipc, NULL, BOOL, expandable_segments_ipc, true, cfg_parse_flag, 0, 0,    \
      "True")                                                                                      \
    K(expandable_segments_defrag, NULL, BOOL, expandable_segments_defrag, false, cfg_parse_flag,   \
      0, 0, "False")                                                                               \
    K(gpu_direct_rdma, NULL, BOOL, gpu_direct_rdma, false, cfg_parse_flag, CFG_OMIT_DEFAULT, 0,    \
      "False")                                                                                     \
    K(expandable_segments_rdma, NULL, BOOL, expandable_segments_rdma, true, cfg_parse_flag,        \
      CFG_OMIT_DEFAULT, 0, "True")                                                                 \
    K(large_segment_size_mb, NULL, MIB, large_segment_size, CFG_DEFAULT_LARGE_SEGMENT,             \
      cfg_parse_large_segment, 0, 0, "20")                                                         \
    K(expandable_page_size_mb, NULL, MIB, expandable_page_size, CFG_DEFAULT_LARGE_SEGMENT,         \
      cfg_parse_page, 0, 0, "= large_segment_size_mb (20)")                                        \
    K(expandable_chunk_mb, NULL, MIB, expandable_chunk, 0, cfg_parse_chunk, 0, 0, "0")             \
    K(max_split_size_mb, NULL, MIB, max_split_size, SIZE_MAX, cfg_parse_max_split,                 \
      CFG_RESET | CFG_OMIT_DEFAULT, 1, "unlimited")                                                \
    K(max_non_split_rounding_mb, NULL, MIB, max_non_split_rounding, CFG_DEFAULT_LARGE_SEGMENT,     \
      cfg_parse_non_split, 0, 0, "= large_segment_size_mb (20)")                                   \
    K(garbage_collection_threshold, NULL, FRACTION, garbage_collection_threshold, 0.0,             \
      cfg_parse_open_fraction, CFG_RESET | CFG_OMIT_DEFAULT, 2, "0 (off)")                         \
    K(roundup_power2_divisions, NULL, ROUNDUP, roundup_power2_divisions, 0, cfg_parse_roundup,     \
      CFG_RESET | CFG_OMIT_DEFAULT, 5, "0 (off)")                                                  \
    K(release_lock_on_cudamalloc, "release_lock_on_hipmalloc", BOOL, release_lock_on_cudamalloc,   \
      false, cfg_parse_flag, 0, 4, "False")                                                        \
    K(per_process_memory_fraction, NULL, FRACTION, per_process_memory_fraction, 1.0,               \
      cfg_parse_closed_fraction, 0, 0, "1.0")                                                      \
    K(graph_capture_record_stream_reuse, NULL, BOOL, graph_capture_record_stream_reuse, false,     \
      cfg_parse_flag, 0, 0, "False")                                                               \
    A(backend, NULL, ENUM, cfg_parse_backend, 0, "native")                                         \
    /* PyTorch 2.12+: fail fast over the fraction (what xseg always does); VA bounds */           \
    A(throw_on_cudamalloc_oom, NULL, ENUM, cfg_parse_checked_flag, 0, "False")                     \
    A(expandable_segments_reserve, NULL, IGNORED, cfg_parse_va_hint, CFG_IGNORED, "")              \
    A(expandable_segments_reserve_by_class, NULL, IGNORED, cfg_parse_va_hint, CFG_IGNORED, "")     \
    /* services (core/services/trim.c, core/services/idle.c) */                                                      \
    K(release_threshold_mb, NULL, MIB, release_threshold, SIZE_MAX, cfg_parse_release_threshold,   \
      CFG_OMIT_DEFAULT, 0, "unset")                                                                \
    K(idle_release_ms, NULL, MS, idle_release_ms, 0, CFG_BOUNDED(86400000, "ms", false), 0, 0,     \
      "0 (off)")                                                                                   \
    K(idle_release_thread, NULL, BOOL, idle_release_thread, false, cfg_parse_flag, 0, 0, "False")  \
    /* the memory group of processes on one device (core/services/group.c) */                               \
    K(memory_group, NULL, NAME, memory_group, "", cfg_parse_name, CFG_OMIT_DEFAULT, 0, "unset")    \
    K(memory_group_wait_ms, NULL, MS, memory_group_wait_ms, 500, CFG_BOUNDED(60000, "ms", false),  \
      0, 0, "500")                                                                                 \
    K(memory_budget_mb, NULL, MIB, memory_budget, 0, CFG_BOUNDED_MIB(0, CFG_MAX_BUDGET_MB),        \
      CFG_OMIT_DEFAULT, 0, "0 (none)")                                                             \
    K(memory_group_budget_mb, NULL, MIB, memory_group_budget, 0,                                   \
      CFG_BOUNDED_MIB(0, CFG_MAX_BUDGET_MB), CFG_OMIT_DEFAULT, 0, "0 (none)")                      \
    K(sleep_keep_host_backup, NULL, BOOL, sleep_keep_host_backup, true, cfg_parse_flag,            \
      CFG_OMIT_DEFAULT, 0, "True")                                                                 \
    K(sleep_copy_chunk_mb, NULL, MIB, sleep_copy_chunk, (size_t)64 << 20,                          \
      CFG_BOUNDED_MIB(1, 1024), CFG_OMIT_DEFAULT, 0, "64")                                         \
    K(sleep_copy_batch_kb, NULL, COUNT, sleep_copy_batch_kb, 128,                                     \
      CFG_BOUNDED(65536, "KiB", false), CFG_OMIT_DEFAULT, 0, "128")                               \
    K(sleep_wait_device, NULL, BOOL, sleep_wait_device, true, cfg_parse_flag, CFG_OMIT_DEFAULT,    \
      0, "True")                                                                                   \
    K(sleep_discard_fill, NULL, COUNT, sleep_discard_fill, 0, CFG_BOUNDED(255, "byte value", false), \
      CFG_OMIT_DEFAULT, 0, "0")                                                                    \
    K(sleep_backup_checksum, NULL, BOOL, sleep_backup_checksum, false, cfg_parse_flag,             \
      CFG_OMIT_DEFAULT, 0, "False")                                                                \
    /* the stale-access debug mode (core/device/quarantine.c) */                                 \
    K(debug_stale_access, NULL, BOOL, debug_stale_access, false, cfg_parse_flag,                   \
      CFG_OMIT_DEFAULT, 0, "False")                                                                \
    K(debug_quarantine_mb, NULL, MIB, debug_quarantine, (size_t)1024 << 20,                        \
      CFG_BOUNDED_MIB(1, 1048576), CFG_OMIT_DEFAULT, 0, "1024")                                    \
    K(debug_stale_full_check, NULL, BOOL, debug_stale_full_check, false, cfg_parse_flag,           \
      CFG_OMIT_DEFAULT, 0, "False")                                                                \
    K(debug_stale_fill_batch, NULL, COUNT, debug_stale_fill_batch, 64,                             \
      CFG_BOUNDED_COUNT(1, 4096, "blocks"), CFG_OMIT_DEFAULT, 0, "64")                             \
    /* spill to host memory out of memory (core/services/spill.c) */                               \
    K(spill_to_host, NULL, BOOL, spill_to_host, false, cfg_parse_flag, CFG_OMIT_DEFAULT, 0,        \
      "False")                                                                                     \
    K(spill_host_limit_mb, NULL, MIB, spill_host_limit, 0, CFG_BOUNDED_MIB(0, CFG_MAX_BUDGET_MB),  \
      CFG_OMIT_DEFAULT, 0, "0 (no limit)")                                                         \
    /* the registration ledger's own entries (core/policy/registry.c, issue 76) */                 \
    K(register_blocks_above_mb, NULL, MIB, register_blocks_above, 0,                               \
      CFG_BOUNDED_MIB(0, CFG_MAX_BUDGET_MB), CFG_OMIT_DEFAULT, 0, "0 (off)")                       \
    /* PyTorch's pinned host allocator (core/services/hostalloc.c) */                                       \
    K(pinned_use_cuda_host_register, "pinned_use_hip_host_register", BOOL,                         \
      pinned_use_cuda_host_register, false, cfg_parse_flag, CFG_OMIT_DEFAULT, 0, "False")          \
    K(pinned_num_register_threads, NULL, COUNT, pinned_num_register_threads, 1,                    \
      CFG_BOUNDED(128, "threads", true), CFG_OMIT_DEFAULT, 0, "1")                                 \
    K(pinned_use_background_threads, NULL, BOOL, pinned_use_background_threads, false,             \
      cfg_parse_flag, CFG_OMIT_DEFAULT, 0, "False")                                                \
    A(pinned_reserve_segment_size_mb, NULL, IGNORED, CFG_BOUNDED_MIB(1, CFG_MAX_MB), CFG_IGNORED,  \
      "")                                                                                          \
    A(pinned_free_catch_all, NULL, IGNORED, cfg_parse_checked_flag, CFG_IGNORED, "")

#endif
