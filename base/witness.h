/*
 * The lock order, checked (debug_level >= 1; nothing at 0): every thread keeps the ranks it holds
 * (base/fork.h's enum fork_rank, the one place the order is written), and taking a lock whose rank
 * is not above every rank it holds aborts naming both: the order a deadlock needs two threads to
 * break is caught the first time one thread breaks it. A try-lock cannot deadlock: it is recorded,
 * never checked. Two locks of one rank (two devices) may not be held at once, save by a try.
 *
 * The process-wide mutexes are taken with mutex_lock / mutex_unlock, which find their rank in the
 * fork table (fork_register); the per-device locks (base/lock.h) check FORK_RANK_DEVICE.
 */
#ifndef XSEG_BASE_WITNESS_H
#define XSEG_BASE_WITNESS_H

#include <pthread.h>

#include "base/common.h"
#include "base/fork.h"

#if XSEG_DEBUG_LEVEL >= 1
/* The calling thread takes (blocking) a lock of @p rank: aborts if it holds one of rank >= it. */
void witness_take(enum fork_rank rank);
/* The calling thread took a lock of @p rank with a try (no order to check). */
void witness_took(enum fork_rank rank);
/* The calling thread takes (blocking) a stream slot's lock (FORK_RANK_SLOT): aborts unless it
 * holds a device lock; other slots' locks may be held (the device lock orders those takers). */
void witness_take_slot(void);
/* The calling thread takes (blocking) a front's lane lock (FORK_RANK_LANE): under a device lock,
 * as a slot's; else it aborts if it holds one of that rank (its own slot's lock may be held). */
void witness_take_lane(void);
/* The calling thread gives back a lock of @p rank. */
void witness_give(enum fork_rank rank);
/* The rank @p m was registered at (fork_register); aborts for a mutex never registered. */
enum fork_rank fork_rank_of(const pthread_mutex_t *m);
#else
#define witness_take(rank) ((void)0)
#define witness_took(rank) ((void)0)
#define witness_take_slot() ((void)0)
#define witness_take_lane() ((void)0)
#define witness_give(rank) ((void)0)
#endif

/* pthread_mutex_lock / unlock of a registered mutex, with the order checked. */
static inline void mutex_lock(pthread_mutex_t *m)
{
#if XSEG_DEBUG_LEVEL >= 1
    witness_take(fork_rank_of(m));
#endif
    pthread_mutex_lock(m);
}

static inline void mutex_unlock(pthread_mutex_t *m)
{
#if XSEG_DEBUG_LEVEL >= 1
    witness_give(fork_rank_of(m));
#endif
    pthread_mutex_unlock(m);
}

#endif
