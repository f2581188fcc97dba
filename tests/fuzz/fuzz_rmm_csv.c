/*
 * libFuzzer target: the RMM logging_resource_adaptor CSV importer (tools/replay/rmm_csv.c).
 * The first row is the header (the importer skips it; trace_load_file checks it first). Any
 * input must import or fail with "SOURCE:ROW: message"; an imported trace frees only buffers it
 * allocated (seeds included) and never allocates a live one twice.
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
        fprintf(stderr, "fuzz_rmm_csv: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[TRACE_ERR_MAX];
    struct trace t;
    if (trace_init(&t, "fuzz.csv") != XSEG_SUCCESS)
        return 0;
    err[0] = '\0';
    xseg_status st = trace_import_rmm_csv(&t, (const char *)data, size, err, sizeof err);
    if (st == XSEG_SUCCESS) {
        unsigned char *live = calloc(t.bufs.count + 1, 1);
        check(live != NULL, "out of memory");
        for (size_t i = 0; i < t.count; i++) {
            const struct trace_action *a = &t.actions[i];
            check(a->buf < (int32_t)t.bufs.count, "buffer index out of range");
            check(a->stream < (int32_t)t.streams.count, "stream index out of range");
            if (a->op == TRACE_ALLOC) {
                check(!live[a->buf], "a live buffer allocated again");
                live[a->buf] = 1;
            } else if (a->op == TRACE_FREE) {
                check(live[a->buf], "a buffer freed while not live");
                live[a->buf] = 0;
            }
        }
        free(live);
    } else {
        check(st == XSEG_ERROR_INVALID_VALUE || st == XSEG_ERROR_OUT_OF_MEMORY, "unexpected status");
        check(strncmp(err, "fuzz.csv:", 9) == 0, "the message does not start with SOURCE:ROW");
    }
    trace_destroy(&t);
    return 0;
}
