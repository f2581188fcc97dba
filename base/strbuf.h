/* Formatting into a caller's buffer with snprintf semantics, for the functions that hand text
 * out (xseg_get_config, xseg_memory_summary): writes what fits, always NUL-terminates when the
 * buffer has room for it, and counts the full length so callers can report what was needed. */
#ifndef XSEG_BASE_STRBUF_H
#define XSEG_BASE_STRBUF_H

#include <stddef.h>

struct strbuf {
    char *buf;   /* may be NULL when size is 0 */
    size_t size; /* bytes available in buf, the NUL included */
    size_t len;  /* full length written so far, the part that did not fit included */
};

/* Append printf-style text. */
void strbuf_printf(struct strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
