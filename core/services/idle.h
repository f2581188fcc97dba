/*
 * idle_release_thread (services, docs/services.md): an optional background thread that does the
 * idle reclaim of idle_release_ms (and applies release_threshold_mb) for every device, so a
 * service that stops calling the allocator still gives its idle cache back. Same safety rule as
 * in malloc: a page is unmapped only when its last use on the GPU is known complete (a default
 * stream's cuStreamQuery, or xseg's event recorded at the free for a program's stream, which may be
 * destroyed by now: core/policy/release.h); nothing waits for the GPU. While the thread runs, malloc keeps its
 * fast path (it does not tick).
 *
 * It runs while the configuration in force has idle_release_thread:True and idle_release_ms > 0:
 * runtime.c calls idle_thread_sync after every configuration change, handing it the devices to
 * serve (so this module never calls up into the device table), and an atexit handler joins it at
 * process exit. Whether it runs is published through core/process/settings.h (settings_idle_thread_running),
 * which malloc reads. Its queries run in relaxed capture mode, and it does nothing on a device
 * while a capture is known there (a pool records, or a stream was seen capturing).
 */
#ifndef XSEG_CORE_IDLE_H
#define XSEG_CORE_IDLE_H

#include <stdbool.h>

#include "base/common.h"
#include "core/device/device.h"

/* Start or stop the thread to match the configuration in force; a started thread serves devices
 * 0 .. @p ndevices - 1 through @p device_at. Call with no xseg lock held (it may join the thread,
 * which takes device locks and the settings lock). @return XSEG_ERROR_OUT_OF_MEMORY naming the
 * system's reason when the thread cannot be created (the configuration stays; malloc then ticks
 * as without the thread). */
xseg_status idle_thread_sync(dev_peek_fn device_at, int ndevices);

#endif
