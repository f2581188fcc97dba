/*
 * libFuzzer target: the config-string parser (core/process/config.c), what xseg_set_config,
 * XSEG_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF feed it. Any input must give XSEG_SUCCESS or
 * XSEG_ERROR_INVALID_VALUE with a message, never a crash; and what parses must print back
 * (cfg_format) as a string that parses to the same config: xseg_get_config's string is always
 * accepted by xseg_set_config.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/process/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0; /* config strings are short; longer inputs only slow the search */
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0'; /* a NUL inside ends the string, as it would for a C caller */
    struct cfg base, out;
    cfg_default(&base);
    xseg_status st = cfg_parse(s, &base, &out);
    if (st != XSEG_SUCCESS) {
        const char *msg = err_message();
        if (st != XSEG_ERROR_INVALID_VALUE || !msg || !*msg) {
            fprintf(stderr, "cfg_parse(\"%s\"): status %d, message '%s'\n", s, (int)st, msg ? msg : "(null)");
            abort();
        }
    } else {
        char buf[2048], buf2[2048];
        size_t len, len2;
        cfg_format(&out, buf, sizeof buf, &len);
        struct cfg again;
        if (len >= sizeof buf || cfg_parse(buf, &base, &again) != XSEG_SUCCESS) {
            fprintf(stderr, "cfg_parse(\"%s\") succeeded but its canonical form \"%s\" does not parse: %s\n", s,
                    buf, err_message());
            abort();
        }
        cfg_format(&again, buf2, sizeof buf2, &len2);
        if (len != len2 || memcmp(buf, buf2, len) != 0) {
            fprintf(stderr, "config \"%s\": canonical form \"%s\" reads back as \"%s\"\n", s, buf, buf2);
            abort();
        }
    }
    free(s);
    return 0;
}
