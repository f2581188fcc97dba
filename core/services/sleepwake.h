/*
 * xseg_sleep / xseg_wake on one device, called by api/ as trim_device is: the device lock around
 * core/services/sleep.h's work, the memory group's budget for a wake's growth, then
 * release_threshold_mb (core/services/trim.h: the pool's streams were waited for, or its pages
 * mapped again). After trim and group in the services wing: it calls both.
 */
#ifndef XSEG_CORE_SLEEPWAKE_H
#define XSEG_CORE_SLEEPWAKE_H

#include "core/device/device.h"

xseg_status sleep_device(struct dev_alloc *d, xseg_pool_id pool, unsigned flags, const char *path);
xseg_status wake_device(struct dev_alloc *d, xseg_pool_id pool);

#endif
