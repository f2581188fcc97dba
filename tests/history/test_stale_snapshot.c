/*
 * `test_stale_snapshot DIR`: snapshots written in the stale-access mode (issue 50) for
 * test_snapshot.py --stale, which reads them as PyTorch's viewers do. Seed 003's cases played on
 * the public API with graph replays and history on (callback frames), in classic and expandable
 * segments: an input freed while a graph still writes it, found when it leaves the quarantine
 * (the bound is small: later frees push it out), and a tensor reassigned instead of updated in
 * place, found at the snapshot (still quarantined then). Writes DIR/stale_MODE.pickle and .json.
 * Exit 77 without a device; 1, naming the call, on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define N (3 * MiB)

static const char *phase = "setup";
static int line = 1;

/* The "Python" frames of each malloc and free: the step the program is at, under <module>. */
static int frames_cb(xseg_frame *frames, int max, void *user)
{
    (void)user;
    if (max < 2)
        return 0;
    frames[0] = (xseg_frame){"seed003.py", phase, line};
    frames[1] = (xseg_frame){"train.py", "<module>", 40};
    return 2;
}

#define CHECK(call)                                                                                          \
    do {                                                                                                     \
        if (!(call)) {                                                                                       \
            fprintf(stderr, "test_stale_snapshot: %s failed: %s\n", #call, xseg_last_error());              \
            return 1;                                                                                        \
        }                                                                                                    \
    } while (0)
#define XS(call) CHECK((call) == XSEG_SUCCESS)
#define CU(call) CHECK((call) == CUDA_SUCCESS)

static void *at(const char *where, int l, size_t size, CUstream s)
{
    phase = where;
    line = l;
    void *p = NULL;
    if (xseg_malloc(&p, size, 0, s) != XSEG_SUCCESS)
        p = NULL;
    phase = "elsewhere";
    return p;
}

static xseg_status free_at(const char *where, int l, void *p)
{
    phase = where;
    line = l;
    xseg_status st = xseg_free(p);
    phase = "elsewhere";
    return st;
}

/* A graph that fills [p, p + N) (a captured in-place update), and copies it to @p out when given. */
static int capture(CUstream s, void *p, void *out, CUgraphExec *x)
{
    CU(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)p, 0x11, N, s));
    if (out)
        CU(tu_graph()->memcpy_dtod_async((CUdeviceptr)(uintptr_t)out, (CUdeviceptr)(uintptr_t)p, N, s));
    CUgraph g = NULL;
    CU(drv->cuStreamEndCapture(s, &g));
    CU(tu_graph()->instantiate(x, g, 0));
    CU(drv->cuGraphDestroy(g));
    return 0;
}

static int play(const char *dir, const char *mode, bool expandable)
{
    char cfg[160];
    snprintf(cfg, sizeof cfg, "expandable_segments:%s,debug_stale_access:True,debug_quarantine_mb:16",
             expandable ? "True" : "False");
    XS(xseg_init(cfg));
    if (!tu_gpu_available()) {
        fprintf(stderr, "no device: %s\n", tu_last_load_error());
        exit(77);
    }
    xseg_history_options o = {.enabled = 1, .stacks = XSEG_STACKS_CALLBACK, .callback = frames_cb};
    XS(xseg_record_memory_history(&o));
    CUstream s;
    CU(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *weights = at("load_weights", 3, 5 * MiB, s);
    void *out = at("make_output", 11, N, s);
    void *in = at("make_input", 12, N, s);
    CHECK(weights && out && in);
    CUgraphExec step, upd;
    if (capture(s, in, out, &step))
        return 1;
    /* 1. The input goes out of scope while the graph holds its address; the replay writes it. */
    XS(free_at("input_out_of_scope", 20, in));
    CU(tu_graph()->launch(step, s));
    CU(drv->cuStreamSynchronize(s));
    /* Later frees pass the quarantine's 16 MiB: the input leaves it, is checked, and is found. */
    for (int i = 0; i < 5; i++) {
        void *act = at("forward", 30 + i, N, s);
        CHECK(act);
        XS(free_at("backward", 50 + i, act));
    }
    /* 2. x = new instead of x.copy_(new): the graph's tensor was freed; the replay writes it. */
    void *x = at("make_state", 60, N, s);
    CHECK(x);
    if (capture(s, x, NULL, &upd))
        return 1;
    XS(free_at("state_reassigned", 61, x));
    void *fresh = at("make_state", 62, N, s);
    CHECK(fresh);
    CU(tu_graph()->launch(upd, s));
    CU(drv->cuStreamSynchronize(s));
    /* The snapshot checks the quarantine: x is found there, still quarantined. */
    char path[512];
    snprintf(path, sizeof path, "%s/stale_%s.pickle", dir, mode);
    XS(xseg_dump_snapshot(-1, path));
    snprintf(path, sizeof path, "%s/stale_%s.json", dir, mode);
    XS(xseg_dump_snapshot_json(-1, path));
    CU(tu_graph()->exec_destroy(step));
    CU(tu_graph()->exec_destroy(upd));
    XS(xseg_free(fresh));
    XS(xseg_free(out));
    XS(xseg_free(weights));
    CU(drv->cuStreamDestroy(s));
    o = (xseg_history_options){0};
    XS(xseg_record_memory_history(&o));
    XS(xseg_shutdown());
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_stale_snapshot DIR\n");
        return 2;
    }
    if (play(argv[1], "classic", false) || play(argv[1], "expandable", true))
        return 1;
    return 0;
}
