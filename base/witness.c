/* The lock-order check of base/witness.h (debug_level >= 1). */
#include "base/witness.h"

#if XSEG_DEBUG_LEVEL >= 1
#include <stdio.h>
#include <stdlib.h>

static const char *const rank_name[FORK_RANK_COUNT] = {
    [FORK_RANK_IDLE_CTL] = "xseg_rt.idle.ctl_lock",
    [FORK_RANK_RUNTIME] = "xseg_rt.rt.lock",
    [FORK_RANK_IDLE] = "xseg_rt.idle.lock",
    [FORK_RANK_GROUP_TABLE] = "a memory group's table lock",
    [FORK_RANK_DEVICE] = "a device lock",
    [FORK_RANK_OBSERVERS] = "xseg_rt.obs.lock",
    [FORK_RANK_SETTINGS] = "xseg_rt.settings.lock",
    [FORK_RANK_CALLBACKS] = "xseg_rt.settings.cb_lock",
    [FORK_RANK_HISTORY] = "xseg_rt.hist.lock",
    [FORK_RANK_OOM_SNAPSHOT] = "xseg_rt.oom.lock",
    [FORK_RANK_IPC_IMPORTS] = "xseg_rt.ipc.imports_lock",
    [FORK_RANK_VMM_LEFT] = "seg_proc.left_lock",
    [FORK_RANK_VMM_CURSOR] = "seg_proc.cursor_lock",
    [FORK_RANK_VMM_HOST] = "host_proc.lock",
    [FORK_RANK_HOSTALLOC_CTL] = "xseg_rt.host.ctl_lock",
    [FORK_RANK_HOSTALLOC] = "xseg_rt.host.lock",
    [FORK_RANK_SLOT] = "a stream slot's lock",
    [FORK_RANK_LANE] = "a front's lane lock",
};

/* Locks of each rank the calling thread holds. */
static _Thread_local unsigned char witness_held[FORK_RANK_COUNT];

void witness_take(enum fork_rank rank)
{
    for (int r = FORK_RANK_COUNT - 1; r >= (int)rank; r--)
        if (witness_held[r]) {
            fprintf(stderr, "xseg: lock order violated: taking %s (rank %d) while holding %s (rank %d); base/fork.h\n",
                    rank_name[rank], (int)rank, rank_name[r], r);
            abort();
        }
    witness_held[rank]++;
}

void witness_took(enum fork_rank rank) { witness_held[rank]++; }

void witness_take_slot(void)
{
    if (!witness_held[FORK_RANK_DEVICE]) {
        fprintf(stderr, "xseg: lock order violated: taking %s (rank %d) without holding %s; base/fork.h\n",
                rank_name[FORK_RANK_SLOT], (int)FORK_RANK_SLOT, rank_name[FORK_RANK_DEVICE]);
        abort();
    }
    witness_held[FORK_RANK_SLOT]++; /* the top rank: any later take aborts (a leaf) */
}

void witness_take_lane(void)
{
    if (witness_held[FORK_RANK_DEVICE])
        witness_held[FORK_RANK_LANE]++; /* the device lock orders its holders' takes, as for slots */
    else
        witness_take(FORK_RANK_LANE);
}

void witness_give(enum fork_rank rank)
{
    if (!witness_held[rank]) {
        fprintf(stderr, "xseg: giving back %s (rank %d), which this thread does not hold\n", rank_name[rank],
                (int)rank);
        abort();
    }
    witness_held[rank]--;
}
#endif
