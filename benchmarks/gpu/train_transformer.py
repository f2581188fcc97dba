#!/usr/bin/env python3
"""Train a small torch.nn transformer with a sequence length that changes every step, under
each allocator, and print one table: peak reserved, peak allocated, utilization, median step time,
and host time per allocation (a torch.empty/del microbenchmark).

Allocators (each in its own process, because PyTorch fixes its allocator at first use):
  native        PyTorch's caching allocator, expandable_segments:False
  native-exp    PyTorch's caching allocator, expandable_segments:True
  async         backend:cudaMallocAsync
  xseg          libxseg installed by xseg.torch.enable() (xseg's default mode), every hook wired
                (record_stream, empty_cache, ...)
  xseg-classic  the same with enable("expandable_segments:False")

For xseg the figures come from the xseg package (xseg.memory_stats, the same keys as
torch.cuda.memory_stats). The package is taken from the source tree beside this script
(python/xseg), with libxseg from --lib.

Usage: train_transformer.py --lib build/libxseg.so [--steps 60] [--modes native,xseg,...] [--json]
(--json: also one JSON line per allocator, as benchmarks/gpu/run.sh's frag check reads them; the
first 5 steps are warm-up, so --steps must be at least 6)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from xseg_source import import_xseg  # beside this script

MODES = ["native", "native-exp", "async", "xseg", "xseg-classic"]
XSEG_CONFIG = {"xseg": None, "xseg-classic": "expandable_segments:False"}


def child(args):
    mode = args.child
    xseg = None
    if mode.startswith("xseg"):
        # Before PyTorch's first CUDA allocation: PyTorch fixes its allocator then.
        xseg = import_xseg(args.lib)
        xseg.torch.enable(XSEG_CONFIG[mode])
    import torch
    import torch.nn as nn

    def stat(key):
        if xseg is not None:
            return xseg.memory_stats(0)[key]
        return torch.cuda.memory_stats().get(key, 0)

    def reset_peak():
        if xseg is not None:
            xseg.reset_peak_memory_stats(0)
        else:
            torch.cuda.reset_peak_memory_stats()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    d_model, nhead, layers, batch, vocab = 1024, 16, 8, 16, 32000
    emb = nn.Embedding(vocab, d_model).to(dev)
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, batch_first=True), layers).to(dev)
    head = nn.Linear(d_model, vocab).to(dev)
    params = list(emb.parameters()) + list(enc.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    lens = [128 + (i * 97) % 896 for i in range(args.steps)]  # 128..1023, changing every step
    times = []
    reset_peak()
    for i, seq in enumerate(lens):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = torch.randint(0, vocab, (batch, seq), device=dev)
        logits = head(enc(emb(x)))
        loss = nn.functional.cross_entropy(logits.view(-1, vocab), x.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    peak_alloc = stat("allocated_bytes.all.peak")
    peak_res = stat("reserved_bytes.all.peak")
    end_res = stat("reserved_bytes.all.current")
    syncs = stat("num_sync_all_streams")
    del x, logits, loss
    # Host time per allocation: cached torch.empty + del pairs of a few sizes on one stream.
    sizes = [4096, 1 << 20, 8 << 20]
    n = 20000
    for s in sizes:  # warm the cache
        t = torch.empty(s, dtype=torch.uint8, device=dev)
        del t
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        t = torch.empty(sizes[i % 3], dtype=torch.uint8, device=dev)
        del t
    pair_ns = (time.perf_counter() - t0) / n * 1e9
    print(json.dumps({
        "mode": mode,
        "peak_allocated": peak_alloc,
        "peak_reserved": peak_res,
        "reserved_end": end_res,
        "utilization": peak_alloc / peak_res if peak_res else 0.0,
        "step_ms_median": statistics.median(times) * 1e3,
        "pair_ns": pair_ns,
        "num_sync_all_streams": syncs,
        "steps": args.steps,
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path to libxseg.so")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", action="store_true", help="also print one JSON line per allocator")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 6:
        ap.error("--steps must be at least 6 (5 warm-up steps are not timed)")
    if args.child:
        return child(args)
    lib = os.path.abspath(args.lib)
    rows = []
    for mode in args.modes.split(","):
        env = dict(os.environ)
        for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "XSEG_ALLOC_CONF"):
            env.pop(k, None)
        env.pop("XSEG_LIBCUDA", None)  # PyTorch and xseg must share the real driver
        if mode == "native":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
        elif mode == "native-exp":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        elif mode == "async":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
        # xseg, xseg-classic: the config goes to xseg.torch.enable (XSEG_CONFIG)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--lib", lib, "--steps", str(args.steps),
                            "--child", mode], env=env, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not line:
            print("%s: failed (exit %d)\n%s" % (mode, p.returncode, p.stderr[-2000:]))
            continue
        # The whole process's seconds too (start, model, steps, pairs): what the acceptance run's
        # share for the loop is sized from (on the H200, 2026-11-27, one allocator took over 30 s).
        row = json.loads(line[-1])
        row["process_s"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    gib = float(1 << 30)
    print("transformer training, d_model 1024, 8 layers, batch 16, seq 128..1023 changing each step")
    print("%-13s %12s %12s %7s %12s %10s %10s" % ("allocator", "peak alloc", "peak resv", "util",
                                                   "resv at end", "step ms", "ns/pair"))
    for r in rows:
        print("%-13s %10.3f G %10.3f G %7.3f %10.3f G %10.2f %10.0f" % (
            r["mode"], r["peak_allocated"] / gib, r["peak_reserved"] / gib, r["utilization"],
            r["reserved_end"] / gib, r["step_ms_median"], r["pair_ns"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
