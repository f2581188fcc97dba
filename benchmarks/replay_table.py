#!/usr/bin/env python3
"""The bundled workloads in classic mode (docs/benchmarks-replay.md): peak allocated, peak
reserved and utilization, reserved after empty_cache, and the driver's memory calls per GiB
reserved, from `xseg-replay --summary=json --config expandable_segments:False` on cudaemu (its
placements repeat exactly, so the figures do on any machine). Standard library only.

usage: benchmarks/replay_table.py [BUILD_DIR]      (default build)
"""
import json
import os
import subprocess
import sys

GiB = float(1 << 30)


def main(argv):
    build = argv[0] if argv else "build"
    replay = os.path.join(build, "tools", "xseg-replay")
    if not os.access(replay, os.X_OK):
        sys.exit("replay_table.py: %s not built (ninja -C %s)" % (replay, build))
    print("| workload | peak allocated | classic reserved (util) | classic after empty_cache "
          "| classic memory calls per GiB reserved |")
    print("|---|---|---|---|---|")
    for w in ("builtin:training", "builtin:inference"):
        out = subprocess.run([replay, "--summary=json", "--marks=none", "--config",
                              "expandable_segments:False", w], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit("replay_table.py: %s %s failed: %s" % (replay, w, out.stderr.strip()[-300:]))
        s = json.loads(out.stdout.strip().splitlines()[-1])
        resv = s["peak_reserved_bytes"] / GiB
        print("| %s | %.2f GiB | %.2f GiB (%.4f) | %.2f GiB | %.1f |" % (
            w, s["peak_allocated_bytes"] / GiB, resv, s["utilization"],
            s["reserved_after_empty_cache_bytes"] / GiB, s["driver_memory_calls"] / resv))


if __name__ == "__main__":
    main(sys.argv[1:])
