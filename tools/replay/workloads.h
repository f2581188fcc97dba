/* The bundled workloads: deterministic generators that write the trace language. */
#ifndef XSEG_TOOLS_REPLAY_WORKLOADS_H
#define XSEG_TOOLS_REPLAY_WORKLOADS_H

#include <stddef.h>
#include <stdint.h>

#include "xseg.h"

struct wl_info {
    const char *name;        /* "training", used as builtin:training */
    const char *description;
};

extern const struct wl_info wl_list[];
extern const size_t wl_count;

/* Generate workload @p name with @p seed as trace text (malloc'd, NUL-terminated, caller frees).
 * @return XSEG_ERROR_INVALID_VALUE naming the known workloads for an unknown name. */
xseg_status wl_generate(const char *name, uint64_t seed, char **text, size_t *len, char *err,
                        size_t errlen);

#endif
