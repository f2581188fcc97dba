/* Internal conveniences shared by every module. Not installed. */
#ifndef XSEG_BASE_COMMON_H
#define XSEG_BASE_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "xseg.h"

/* Internal extern data and functions are hidden by the build (gnu_symbol_visibility: hidden);
 * this marks data explicitly so a static link keeps it private as well. */
#define XSEG_HIDDEN __attribute__((visibility("hidden")))

#define XSEG_LIKELY(x) __builtin_expect(!!(x), 1)
#define XSEG_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* A local pinned to register @p r on x86-64 (`register T x XSEG_REG("r9") = ...;`, with an empty
 * asm that names it), where GCC would put it in an argument's register and move the arguments
 * around it on both paths; a plain local elsewhere. For the hot paths' hit tests only, each
 * measured (benchmarks/callgrind_pairs.sh), and only where nothing between the pin and the last
 * use calls a function: GCC keeps no call-clobbered pin across a call. So a plain local in the
 * sanitizer builds, whose checks are calls (with it, the TSan build's lane try read the rounded
 * size from r9 after a check had clobbered it, and every lane missed). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define XSEG_REG(r) __asm__(r)
#else
#define XSEG_REG(r)
#endif

#define XSEG_KiB ((size_t)1 << 10)
#define XSEG_MiB ((size_t)1 << 20)
#define XSEG_GiB ((size_t)1 << 30)

#define XSEG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define XSEG_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Round up to a multiple of align; align is a power of two. */
static inline size_t xseg_align_up(size_t n, size_t align) { return (n + align - 1) & ~(align - 1); }
static inline size_t xseg_align_down(size_t n, size_t align) { return n & ~(align - 1); }

#endif
