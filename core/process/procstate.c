/* The process's one state object (core/process/procstate.h), at its initial values: what a fresh load
 * has and what xseg_shutdown brings each sub-state back to. */
#include "core/process/procstate.h"

XSEG_HIDDEN struct xseg_runtime xseg_rt = {
    .rt = {.lock = PTHREAD_MUTEX_INITIALIZER},
    .settings = {.lock = PTHREAD_MUTEX_INITIALIZER, .cb_lock = PTHREAD_MUTEX_INITIALIZER},
    .idle = {.ctl_lock = PTHREAD_MUTEX_INITIALIZER, .lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT},
    .hist = {.lock = PTHREAD_MUTEX_INITIALIZER, .opt_max_frames = HIST_DEFAULT_FRAMES},
    .obs = {.lock = PTHREAD_MUTEX_INITIALIZER},
    .reg = {.lock = PTHREAD_MUTEX_INITIALIZER},
    .ipc = {.imports_lock = PTHREAD_MUTEX_INITIALIZER},
    .oom = {.lock = PTHREAD_MUTEX_INITIALIZER},
    .host = {.lock = PTHREAD_MUTEX_INITIALIZER, .ctl_lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT},
};
