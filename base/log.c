/* The warnings' one way out (see log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

static _Atomic(log_sink_fn) log_sink;

log_sink_fn log_set_sink(log_sink_fn sink) { return atomic_exchange(&log_sink, sink); }

void log_warn(const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "xseg: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    log_sink_fn sink = atomic_load(&log_sink);
    if (sink)
        sink(line);
    else
        fprintf(stderr, "%s\n", line); /* one call: lines of two threads do not interleave */
}
