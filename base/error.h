/* The thread-local error message behind xseg_last_error(). */
#ifndef XSEG_BASE_ERROR_H
#define XSEG_BASE_ERROR_H

#include "base/common.h"

/* Record a failure for this thread and return @p status unchanged, so callers can write
 * `return err_set(XSEG_ERROR_INVALID_VALUE, "bad size %zu", n);`. The message is truncated at
 * 1 KiB. */
xseg_status err_set(xseg_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Append context in front of the current message: "ctx: previous message". Returns @p status. */
xseg_status err_prefix(xseg_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Append context after the current message: "previous message" followed by the formatted text,
 * which brings its own separator ("; ...", " (...)"). Returns @p status. */
xseg_status err_suffix(xseg_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A copy of this thread's message, for a failure reported only after steps that may write their
 * own (a rollback, a second attempt): err_set(st, "...%s...", kept.msg) puts it back. */
struct err_kept {
    char msg[512];
};
struct err_kept err_keep(void);

/* Forget the last failure (xseg_last_error() returns "" afterwards). */
void err_clear(void);

/* This thread's message ("" when none): what xseg_last_error() returns. */
const char *err_message(void);

/* Format a byte count the way PyTorch's messages do: "20.00 MiB", "1.50 GiB", "512 bytes". */
const char *err_format_size(size_t bytes, char buf[32]);

#endif
