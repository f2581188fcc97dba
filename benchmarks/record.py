#!/usr/bin/env python3
"""The measurement record (docs/benchmarks*.md) as generated tables.

Every table of the record stands between two markers that name it and the command writing it:

    <!-- table:NAME begin: benchmarks/SCRIPT ARGS... -->
    *`benchmarks/SCRIPT ARGS...` · MACHINE · DATE*      (the header line, written here)

    | the table, as the command printed it |
    <!-- table:NAME end -->

usage: benchmarks/record.py --list                  the tables: name, page, command
       benchmarks/record.py --write NAME...         run each table's command, replace its block
       benchmarks/record.py --write NAME --from F   the block from F, what that command printed
                                                    here earlier (a run of many minutes)
       benchmarks/record.py --check [ROOT]          every table has its markers, naming a script
                                                    under benchmarks/ that exists (build suite)

The command runs from the project root with bash, as written in the marker; what it prints on
stdout from its first table on becomes the block, with the paragraph just before that table (its
caption). A first line "machine: TEXT" names the machine the figures come from (raw outputs of
another machine, say); otherwise it is this one.
The command names its generator: a script under benchmarks/, or a benchmark run from a build
folder (BUILD/benchmarks/NAME, written by benchmarks/NAME.c). Standard library only.
"""
import datetime
import glob
import os
import re
import shlex
import subprocess
import sys

BEGIN = re.compile(r"^<!-- table:([a-z0-9-]+) begin: (.+?) -->$")
END = re.compile(r"^<!-- table:([a-z0-9-]+) end -->$")
SEP = re.compile(r"^\|\s*:?-{3,}")


def pages(root):
    return sorted(glob.glob(os.path.join(root, "docs", "benchmarks*.md")))


def blocks(path):
    """(name, command, begin line index, end line index) of each marked block; problems as text."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found, problems, open_ = [], [], None
    for i, line in enumerate(lines):
        b, e = BEGIN.match(line), END.match(line)
        if b:
            if open_:
                problems.append("%s:%d: table:%s begins inside table:%s" % (path, i + 1, b[1], open_[0]))
            open_ = (b[1], b[2], i)
        elif e:
            if not open_ or open_[0] != e[1]:
                problems.append("%s:%d: table:%s ends where it did not begin" % (path, i + 1, e[1]))
            else:
                found.append(open_ + (i,))
            open_ = None
        elif line.startswith("<!-- table:"):
            problems.append("%s:%d: malformed marker (want '<!-- table:NAME begin: COMMAND -->' "
                            "or '<!-- table:NAME end -->')" % (path, i + 1))
    if open_:
        problems.append("%s:%d: table:%s never ends" % (path, open_[2] + 1, open_[0]))
    return lines, found, problems


def generator(cmd):
    """The file under benchmarks/ that writes a table: the command's first word after any
    VAR=value, or for a benchmark run from a build folder (BUILD/benchmarks/NAME) its source."""
    words = [w for w in shlex.split(cmd) if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]
    first = words[0] if words else ""
    m = re.match(r"^[\w.-]+/benchmarks/(\w+)$", first)
    return "benchmarks/%s.c" % m[1] if m else first


def check(root):
    """Every Markdown table of the record lies in a block whose command is a script of benchmarks/."""
    problems, names = [], {}
    docs = pages(root)
    if not docs:
        problems.append("%s: no docs/benchmarks*.md" % root)
    for path in docs:
        lines, found, bad = blocks(path)
        problems += bad
        inside = set()
        for name, cmd, b, e in found:
            rel = os.path.relpath(path, root)
            if name in names:
                problems.append("%s:%d: table:%s already in %s" % (rel, b + 1, name, names[name]))
            names[name] = rel
            script = generator(cmd)
            if not script.startswith("benchmarks/") or not os.path.isfile(os.path.join(root, script)):
                problems.append("%s:%d: table:%s names no script of benchmarks/: '%s'" % (rel, b + 1, name, script))
            if not any(SEP.match(l) for l in lines[b:e]):
                problems.append("%s:%d: table:%s holds no table" % (rel, b + 1, name))
            inside.update(range(b, e))
        for i, line in enumerate(lines):
            if SEP.match(line) and i not in inside:
                problems.append("%s:%d: a table outside any '<!-- table:NAME begin: COMMAND -->' marker"
                                % (os.path.relpath(path, root), i + 1))
    for p in problems:
        print(p, file=sys.stderr)
    print("%d tables in %d pages%s" % (len(names), len(docs), ", %d problems" % len(problems) if problems else ""))
    return 1 if problems else 0


def this_machine():
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = "no GPU (cudaemu)"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            gpu = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "%d cores %s, %s, load %.1f" % (os.cpu_count() or 0, model, gpu, os.getloadavg()[0])


def write(root, names, saved=None):
    todo = set(names)
    for path in pages(root):
        lines, found, bad = blocks(path)
        if bad:
            raise SystemExit("\n".join(bad))
        changed = False
        for name, cmd, b, e in reversed(found):  # from the end: earlier indices stay valid
            if name not in todo:
                continue
            todo.discard(name)
            machine = this_machine()
            print("record.py: table:%s: %s" % (name, cmd), file=sys.stderr)
            if saved is not None:
                text = open(saved, encoding="utf-8").read()
            else:
                run = subprocess.run(["bash", "-c", cmd], cwd=root, stdout=subprocess.PIPE, text=True)
                if run.returncode != 0:
                    raise SystemExit("record.py: table:%s: '%s' exited %d; %s left as it was"
                                     % (name, cmd, run.returncode, path))
                text = run.stdout
            out = text.strip("\n").split("\n")
            if out and out[0].startswith("machine: "):
                machine = out.pop(0)[len("machine: "):]
            first = next((i for i, l in enumerate(out) if l.startswith("|")), None)
            if first is None or not any(SEP.match(l) for l in out):
                raise SystemExit("record.py: table:%s: '%s' printed no table" % (name, cmd))
            cap = first - 1 if first > 0 and not out[first - 1].strip() else first
            while cap > 0 and out[cap - 1].strip():  # the paragraph before it is its caption
                cap -= 1
            first = cap if cap < first and out[cap].strip() else first
            out = out[first:]  # what a command prints before that is its own preamble
            head = "*`%s` · %s · %s*" % (cmd, machine, datetime.date.today().isoformat())
            lines[b + 1:e] = [head, ""] + out
            changed = True
        if changed:
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
    if todo:
        raise SystemExit("record.py: no such table: %s (--list)" % " ".join(sorted(todo)))
    return 0


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if argv[:1] == ["--check"]:
        return check(argv[1] if len(argv) > 1 else root)
    if argv[:1] == ["--list"]:
        for path in pages(root):
            for name, cmd, _, _ in blocks(path)[1]:
                print("%-20s %-22s %s" % (name, os.path.basename(path), cmd))
        return 0
    if argv[:1] == ["--write"] and len(argv) == 4 and argv[2] == "--from":
        return write(root, argv[1:2], argv[3])
    if argv[:1] == ["--write"] and len(argv) > 1 and "--from" not in argv:
        return write(root, argv[1:])
    print(__doc__.split("\n\n")[2], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
