#!/usr/bin/env python3
"""Wall clock of xseg-replay variants on the same traces, side by side.

    benchmarks/replay_ab.py [--reps N] NAME=REPLAY[,VAR=VALUE...] ... -- TRACE...

Each variant is an xseg-replay binary (another build, e.g. a scratch build of a change) with
optional environment variables. Per trace, the variants take turns within each repetition; the
figure is the host time in xseg_malloc + xseg_free (`--summary=json`'s host_ns_per_alloc x allocs
+ host_ns_per_free x frees, summed over classic and expandable: `--compare`) in ms, median of N
(default 21). The first variant is the baseline: its min-max spread is printed, the others as
a ratio of medians to it. TRACE: a trace file or builtin:NAME (tools/snapshot2trace.py converts
PyTorch snapshots).
"""
import json
import os
import statistics
import subprocess
import sys


def usage(msg):
    sys.exit("replay_ab.py: %s\nusage: replay_ab.py [--reps N] NAME=REPLAY[,VAR=VALUE...] ... -- TRACE..." % msg)


def host_ms(replay, env, trace):
    out = subprocess.run([replay, "--compare", "--summary=json", "--marks=none", "--no-progress", trace],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        usage("%s %s failed: %s" % (replay, trace, out.stderr.strip().splitlines()[-1:]))
    total = 0.0
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            total += j["host_ns_per_alloc"] * j["allocs"] + j["host_ns_per_free"] * j["frees"]
    return total / 1e6


def main(argv):
    reps, variants, traces = 21, [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--reps" and i + 1 < len(argv):
            try:
                reps = int(argv[i + 1])
            except ValueError:
                usage("--reps takes a number")
            i += 2
            continue
        if a == "--":
            traces = argv[i + 1:]
            break
        name, sep, spec = a.partition("=")
        if not sep or not spec:
            usage("a variant is NAME=REPLAY[,VAR=VALUE...], not %r" % a)
        parts = spec.split(",")
        env = dict(os.environ)
        for kv in parts[1:]:
            k, s2, v = kv.partition("=")
            if not s2:
                usage("%r: an environment setting is VAR=VALUE" % kv)
            env[k] = v
        if not os.access(parts[0], os.X_OK):
            usage("%s is not an executable" % parts[0])
        variants.append((name, parts[0], env))
        i += 1
    if reps < 1 or not variants or not traces:
        usage("needs at least one variant, one trace and --reps >= 1")
    res = {t: {v[0]: [] for v in variants} for t in traces}
    for _ in range(reps):
        for t in traces:
            for name, replay, env in variants:
                res[t][name].append(host_ms(replay, env, t))
    base = variants[0][0]
    print("| trace | %s ms (min-max) | %s |" % (base, " | ".join(v[0] for v in variants[1:])))
    print("|---|---|%s" % "---|" * (len(variants) - 1))
    for t in traces:
        b = statistics.median(res[t][base])
        cells = ["%.2f (%.2f-%.2f)" % (b, min(res[t][base]), max(res[t][base]))]
        cells += ["%.2fx" % (statistics.median(res[t][v[0]]) / b) for v in variants[1:]]
        print("| %s | %s |" % (os.path.basename(t), " | ".join(cells)))


if __name__ == "__main__":
    main(sys.argv[1:])
