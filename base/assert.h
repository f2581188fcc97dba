/*
 * Assertions at two levels (mimalloc's mi_assert_internal / mi_assert_expensive), chosen at build
 * time by XSEG_DEBUG_LEVEL (meson option debug_level, passed to every file):
 *   0  release: nothing is checked, nothing is compiled in; the hot path pays nothing.
 *   1  cheap:   xseg_assert (O(1) conditions: argument contracts, the device lock held by the
 *               caller, counters that must not go negative).
 *   2  expensive: also xseg_assert_expensive and the XSEG_CHECK_EXPENSIVE walks (dev_check in
 *               core/device/check.c: every block, index and counter of a device after each state
 *               transition). CI's sanitizer builds run at this level.
 * A failed assertion prints the condition, file, line and function to stderr and aborts: it is a
 * bug in xseg, never a user error (user errors are status codes with a message).
 */
#ifndef XSEG_BASE_ASSERT_H
#define XSEG_BASE_ASSERT_H

#ifndef XSEG_DEBUG_LEVEL
#define XSEG_DEBUG_LEVEL 0
#endif

/* Print "xseg: assertion failed: ..." and abort. */
_Noreturn void assert_fail(const char *cond, const char *file, int line, const char *func);

#if XSEG_DEBUG_LEVEL >= 1
#define xseg_assert(cond) ((cond) ? (void)0 : assert_fail(#cond, __FILE__, __LINE__, __func__))
#else
/* sizeof keeps the condition compiled (names checked, no unused-variable warnings) but unevaluated. */
#define xseg_assert(cond) ((void)sizeof(!(cond)))
#endif

#if XSEG_DEBUG_LEVEL >= 2
#define XSEG_CHECK_EXPENSIVE 1
#define xseg_assert_expensive(cond) xseg_assert(cond)
#else
#define XSEG_CHECK_EXPENSIVE 0
#define xseg_assert_expensive(cond) ((void)sizeof(!(cond)))
#endif

#endif
