/*
 * libFuzzer target: the trace language parser (tools/replay/parse.c) and the size reader.
 * Any input must parse or fail with "SOURCE:LINE: message", never crash, leak or read out of
 * bounds; a trace that parses has only actions whose indices are in range.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/replay/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_trace: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[TRACE_ERR_MAX];
    struct trace t;
    if (trace_init(&t, "fuzz") != XSEG_SUCCESS)
        return 0;
    /* The parser works on (text, len): no terminating NUL, so reads past the end are caught. */
    err[0] = '\0';
    xseg_status st = trace_parse_text(&t, (const char *)data, size, err, sizeof err);
    if (st == XSEG_SUCCESS) {
        for (size_t i = 0; i < t.count; i++) {
            const struct trace_action *a = &t.actions[i];
            check(a->buf < (int32_t)t.bufs.count, "buffer index out of range");
            check(a->pool < (int32_t)t.pools.count, "pool index out of range");
            check(a->stream < (int32_t)t.streams.count && a->stream >= TRACE_ALL_STREAMS,
                  "stream index out of range");
            check(a->text < t.strings_len + 1, "text offset out of range");
        }
    } else {
        check(st == XSEG_ERROR_INVALID_VALUE || st == XSEG_ERROR_OUT_OF_MEMORY, "unexpected status");
        check(strncmp(err, "fuzz:", 5) == 0, "the message does not start with SOURCE:LINE");
    }
    trace_destroy(&t);

    /* The size reader alone, on the first line: parse, format, parse back to the same bytes. */
    const uint8_t *nl = memchr(data, '\n', size);
    size_t len = nl ? (size_t)(nl - data) : size;
    uint64_t bytes, again;
    if (trace_parse_size((const char *)data, len, &bytes, err, sizeof err) == XSEG_SUCCESS) {
        char buf[32];
        const char *f = trace_format_size(bytes, buf, sizeof buf);
        check(trace_parse_size(f, strlen(f), &again, err, sizeof err) == XSEG_SUCCESS && again == bytes,
              "a formatted size does not read back");
    }
    return 0;
}
