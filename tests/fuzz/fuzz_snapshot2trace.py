#!/usr/bin/env python3
"""A mutation fuzzer for tools/snapshot2trace.py (its pickle reader and converter): every input
must convert or fail with SnapshotError (one line for the user), never raise anything else,
never run code and never take more than the memory limit.

    fuzz_snapshot2trace.py SNAPSHOT2TRACE_PY [--seconds N] [--seed S] [--corpus DIR]
                           [--regressions DIR] [--save DIR]

Inputs: the seed snapshots of --corpus (tests/fuzz/corpus/snapshot2trace: written by xseg's own
snapshot writer, tests/fuzz/make_snapshot_corpus.sh) and pickles of random snapshot-shaped data
in every protocol, then byte flips, insertions (of pickle opcodes too), deletions, truncations
and splices of them. The seeds must convert as they are (and read as pickle.loads reads them);
the files in --regressions (inputs that once failed) need only be handled. Both run first. A failing input is written to --save (default
the current directory) as snapshot2trace-crash-<sha1> and the program exits 1.
Standard library only (no atheris): a coverage-blind fuzzer, but a fast one.
"""
import argparse
import hashlib
import importlib.util
import io
import os
import pickle
import random
import sys
import time
import traceback

# Opcodes worth inserting: every structural one, and the refused ones.
OPCODES = b"().0123NIJKLMFGSTUVXBC]}lted\x85\x86\x87asue\x90\x91\x8f\x94pqrghj\x88\x89\x8a\x8b\x8c\x8d\x8e\x95\x96" \
          b"cR\x93b\x81\x92io\x82PQ\x97\x98\x80"


def random_snapshot(rng):
    def addr():
        return rng.choice([0, 1, 512, 2**20, 2**40 + rng.randrange(2**20) * 512, 2**64 - 1, rng.randrange(2**64)])

    def event():
        e = {"action": rng.choice(["alloc", "free_requested", "free_completed", "segment_alloc",
                                    "segment_free", "segment_map", "segment_unmap", "oom", "snapshot"]),
             "addr": addr(), "size": rng.choice([0, 1, 512, 2**21, rng.randrange(2**34)]),
             "stream": rng.choice([0, 0, 0x55, rng.randrange(2**48)]), "time_us": rng.randrange(2**40)}
        if rng.random() < 0.3:
            e["frames"] = [{"filename": "f%d.py" % i, "line": i, "name": "fn"} for i in range(rng.randrange(3))]
        return e

    def block():
        b = {"address": addr(), "size": rng.choice([512, 2**20, rng.randrange(2**30)]),
             "requested_size": rng.choice([0, 100, 2**20]),
             "state": rng.choice(["active_allocated", "active_pending_free", "inactive"])}
        if rng.random() < 0.3:  # PyTorch 2.0: no address, the request in history
            del b["address"]
            b["history"] = [{"addr": addr(), "real_size": rng.choice([0, 100, 2**20]), "frames": []}]
        return b

    segs = [{"device": rng.choice([0, 0, 1]), "address": addr(), "total_size": rng.randrange(2**32),
             "stream": rng.choice([0, 0x55]),
             "segment_pool_id": rng.choice([(0, 0), (0, rng.randrange(3)), (rng.randrange(3), 1), None]),
             "blocks": [block() for _ in range(rng.randrange(4))]} for _ in range(rng.randrange(4))]
    snap = {"segments": segs, "device_traces": [[event() for _ in range(rng.randrange(12))]
                                                for _ in range(rng.randrange(1, 3))]}
    if rng.random() < 0.5:
        snap["allocator_settings"] = {"expandable_segments": rng.random() < 0.5,
                                      "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:%d" % rng.randrange(512)}
    if rng.random() < 0.2:  # shared references: the memo
        snap["segments"] = snap["segments"] * 3
    return snap


def mutate(rng, data, pool):
    b = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        k = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if k == 0 and b:
            b[min(pos, len(b) - 1)] = rng.randrange(256)
        elif k == 1:
            b[pos:pos] = bytes([rng.choice(OPCODES)])
        elif k == 2 and b:
            del b[pos:pos + rng.randrange(1, 9)]
        elif k == 3:
            del b[pos:]
        elif k == 4:
            other = rng.choice(pool)
            at = rng.randrange(len(other) + 1)
            b[pos:pos] = other[at:at + rng.randrange(1, 64)]
        elif k == 5:
            w = rng.choice([1, 2, 4, 8])
            b[pos:pos] = rng.randrange(2 ** (8 * w)).to_bytes(w, "little")
        else:
            b[pos:pos] = bytes([rng.choice(OPCODES)]) * rng.randrange(1, 300)
    return bytes(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("converter")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--regressions", default=None)
    ap.add_argument("--save", default=".")
    args = ap.parse_args()
    # Under the sanitizer test setups (XSEG_TEST_SCALE < 1) Python gains nothing: run less.
    args.seconds *= min(1.0, float(os.environ.get("XSEG_TEST_SCALE", "1") or 1))
    spec = importlib.util.spec_from_file_location("snapshot2trace", args.converter)
    s2t = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s2t)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)

    def one(data):
        """None when the input is handled correctly, else a description of the failure."""
        try:
            snap = s2t.load_snapshot(data, max_memory=64 << 20)
            work = s2t._Work(2 * len(data) + 1024)  # as the command line bounds a file's devices
            for device in sorted({0, 1} | set(s2t.devices(snap, "fuzz"))):
                s2t.convert(snap, device, io.StringIO(), source="fuzz", work=work)
        except s2t.SnapshotError as e:
            msg = str(e)
            if "\n" in msg or not msg:
                return "SnapshotError message is not one non-empty line: %r" % msg
        except Exception:
            return traceback.format_exc()
        return None

    failures = 0

    def report(data, why, origin):
        nonlocal failures
        failures += 1
        name = os.path.join(args.save, "snapshot2trace-crash-" + hashlib.sha1(data).hexdigest())
        with open(name, "wb") as f:
            f.write(data)
        print("FAIL (%s) saved as %s:\n%s" % (origin, name, why), file=sys.stderr)

    def files(d):
        for fn in sorted(os.listdir(d)) if d and os.path.isdir(d) else []:
            if not fn.startswith("."):
                with open(os.path.join(d, fn), "rb") as f:
                    yield fn, f.read()

    regressions = 0
    for fn, data in files(args.regressions):
        regressions += 1
        why = one(data)
        if why:
            report(data, why, "regression " + fn)

    # The seeds are real snapshots (the repository's own files, so pickle.loads may read them):
    # each converts, and stays in the mutation pool for the whole run.
    seeds = []
    for fn, data in files(args.corpus):
        try:
            snap = s2t.load_snapshot(data, max_memory=64 << 20)
            s2t.convert(snap, 0, io.StringIO(), source=fn, work_limit=len(data) + 1024)
            if snap != pickle.loads(data):
                report(data, "the reader and pickle.loads disagree", "corpus " + fn)
        except Exception:
            report(data, traceback.format_exc(), "corpus " + fn + " does not convert")
        seeds.append(data)

    # The reader agrees with pickle.loads on unmutated plain data (a differential check).
    pool = []
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        snap = random_snapshot(rng)
        data = pickle.dumps(snap, protocol=proto)
        if s2t.load_snapshot(data) != pickle.loads(data):
            report(data, "the reader and pickle.loads disagree", "protocol %d" % proto)
        pool.append(data)

    n = 0
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and failures < 5:
        if n % 50 == 0:
            pool[rng.randrange(len(pool))] = pickle.dumps(random_snapshot(rng),
                                                          protocol=rng.randrange(pickle.HIGHEST_PROTOCOL + 1))
        data = mutate(rng, rng.choice(pool + seeds), pool + seeds)
        why = one(data)
        if why:
            report(data, why, "seed %d, input %d" % (seed, n))
        n += 1
    print("snapshot2trace fuzz: seed %d, %d corpus and %d regression inputs, %d mutated inputs in %.0f s, "
          "%d failures" % (seed, len(seeds), regressions, n, args.seconds, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
