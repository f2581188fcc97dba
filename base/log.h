/*
 * The library's warnings to the user: one line each, "xseg: " and the text, written to stderr
 * unless a sink is set (log_set_sink, internal: tests and a host that routes them). Errors are not
 * logged: they are returned, with the message behind xseg_last_error() (base/error.h).
 */
#ifndef XSEG_BASE_LOG_H
#define XSEG_BASE_LOG_H

#include "base/common.h"

/* Receives one warning line: "xseg: " and the text, without a newline, truncated at 1 KiB. */
typedef void (*log_sink_fn)(const char *line);

/* Write a warning line (see above): to the sink in force, else stderr with a newline, in one
 * write. Safe from any thread. */
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Route the warnings to @p sink (NULL: stderr again); returns the sink it replaces. */
log_sink_fn log_set_sink(log_sink_fn sink);

#endif
