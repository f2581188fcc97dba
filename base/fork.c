/* The fork handlers of base/fork.h: one table of mutexes and child hooks, indexed by rank. */
#include "base/fork.h"

#include <stdbool.h>
#include <stdlib.h>

#include "base/assert.h"
#include "base/witness.h"

/* Written only by library constructors (one thread, before main or during dlopen). A rank may
 * carry a mutex and one child hook; a second registration of either is a bug. */
#define FORK_HOOKS 4
static pthread_mutex_t *fork_mutex[FORK_RANK_COUNT];
static void (*fork_child_hook[FORK_RANK_COUNT][FORK_HOOKS])(void);
static bool fork_installed;

static void fork_prepare(void)
{
    for (int r = 0; r < FORK_RANK_COUNT; r++)
        if (fork_mutex[r])
            pthread_mutex_lock(fork_mutex[r]);
}

static void fork_parent(void)
{
    for (int r = FORK_RANK_COUNT - 1; r >= 0; r--)
        if (fork_mutex[r])
            pthread_mutex_unlock(fork_mutex[r]);
}

/* The child's one thread took them all in fork_prepare: make them fresh (a plain unlock would
 * do for PTHREAD_MUTEX_NORMAL, but init also clears what a vanished waiter left behind). */
static void fork_child(void)
{
    for (int r = 0; r < FORK_RANK_COUNT; r++)
        if (fork_mutex[r])
            pthread_mutex_init(fork_mutex[r], NULL);
    for (int r = 0; r < FORK_RANK_COUNT; r++)
        for (int i = 0; i < FORK_HOOKS && fork_child_hook[r][i]; i++)
            fork_child_hook[r][i]();
}

#if XSEG_DEBUG_LEVEL >= 1
enum fork_rank fork_rank_of(const pthread_mutex_t *m)
{
    for (int r = 0; r < FORK_RANK_COUNT; r++)
        if (fork_mutex[r] == m)
            return (enum fork_rank)r;
    abort(); /* a process-wide mutex not registered: a bug in xseg */
}
#endif

void fork_register(enum fork_rank rank, pthread_mutex_t *m, void (*child)(void))
{
    if (rank < 0 || rank >= FORK_RANK_COUNT || rank == FORK_RANK_DEVICE || (m && fork_mutex[rank]))
        abort(); /* a bug in xseg's own registrations, found at load */
    if (!fork_installed) {
        /* Fails only with ENOMEM at load; xseg then works, but a fork may hang as before. */
        fork_installed = pthread_atfork(fork_prepare, fork_parent, fork_child) == 0;
    }
    if (m)
        fork_mutex[rank] = m;
    if (child) {
        int i = 0;
        while (i < FORK_HOOKS && fork_child_hook[rank][i])
            i++;
        if (i == FORK_HOOKS)
            abort();
        fork_child_hook[rank][i] = child;
    }
}
