#!/usr/bin/env python3
"""core/'s include graph by wing, read from the #include lines and tests/build/layering.sh's
wing_order (the one statement of the wings and their order).

usage: tools/core_graph.py [--root DIR] --edges        module -> module includes, one a line
       tools/core_graph.py [--root DIR] --svg FILE     the drawing (docs/core-wings.svg)
       tools/core_graph.py [--root DIR] --check FILE   exit 1 if FILE is not the drawing of today's
                                                       sources (the build suite's core-wings test)

A module is NAME.c with NAME.h (`wing/NAME`, the top's without a folder); an edge is a module
including another module's header. The drawing: one band a wing, highest on top, each band's
modules in their order; beside it the count of module edges from each wing to each wing, which
layering.sh keeps on and below the diagonal. Standard library only.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"core/([a-z_/]+)\.h"')
ROWS = (("top",), ("services",), ("policy",), ("device",), ("process", "index"))


def wings(root):
    """([(wing, [module, ...])] in wing_order's order, {wing: rank}), read from layering.sh."""
    text = open(os.path.join(root, "tests", "build", "layering.sh")).read()
    block = re.search(r'wing_order="([^"]*)"', text).group(1)
    ranks = re.search(r'wing_rank="([^"]*)"', text).group(1)
    order = [(w, mods.split(",")) for w, mods in (line.split(":", 1) for line in block.split())]
    return order, {w: int(r) for w, r in (x.split(":") for x in ranks.split())}


def module_of(rel):
    """core/WING/NAME.[ch] -> WING/NAME; core/NAME.[ch] -> top/NAME."""
    rel = os.path.splitext(rel)[0][len("core/"):]
    return rel if "/" in rel else "top/" + rel


def edges(root):
    found = set()
    for d, _, files in os.walk(os.path.join(root, "core")):
        for f in sorted(files):
            if not f.endswith((".c", ".h")):
                continue
            rel = os.path.relpath(os.path.join(d, f), root)
            me = module_of(rel)
            for line in open(os.path.join(d, f), encoding="utf-8"):
                m = INCLUDE.match(line)
                if m:
                    to = module_of("core/" + m.group(1) + ".h")
                    if to != me:
                        found.add((me, to))
    return sorted(found)


def box(x, y, w, h, fill, stroke, rx=6):
    return ('<rect x="%d" y="%d" width="%d" height="%d" rx="%d" fill="%s" stroke="%s"/>'
            % (x, y, w, h, rx, fill, stroke))


def text(x, y, s, size=13, weight="normal", anchor="start", fill="#1b2631"):
    return ('<text x="%d" y="%d" font-size="%d" font-weight="%s" text-anchor="%s" fill="%s">%s</text>'
            % (x, y, size, weight, anchor, fill, s))


def bands(order, width):
    """The wing bands, highest first; returns (svg parts, height)."""
    mods = dict(order)
    parts, y = [], 40
    for row in ROWS:
        bw = (width - 10 * (len(row) - 1)) // len(row)
        for i, wing in enumerate(row):
            x = 10 + i * (bw + 10)
            label = "top (core/)" if wing == "top" else "core/%s/" % wing
            parts.append(box(x, y, bw, 74, "#eaf1f8", "#5d7f9e", 8))
            parts.append(text(x + 10, y + 20, label, 14, "bold"))
            mx = x + 10
            for m in mods[wing]:
                mw = 12 + 7 * len(m)  # about 7 px a character at 12 px
                parts.append(box(mx, y + 32, mw, 30, "#ffffff", "#8aa6bf", 4))
                parts.append(text(mx + mw // 2, y + 52, m, 12, anchor="middle"))
                mx += mw + 6
        if y > 40:  # the wing above includes this one and those below
            parts.append('<path d="M%d %d v12" stroke="#5d7f9e" stroke-width="2" marker-end="url(#a)"/>'
                         % (10 + width // 2, y - 22))
        y += 74 + 24
    return parts, y


def matrix(order, rank, es, x0):
    """Module edges from each wing (rows) to each wing (columns), highest wing first; a count
    where layering.sh allows none (a wing above or a peer) is drawn red."""
    names = [w for w, _ in order][::-1]
    wing = lambda m: m.split("/")[0]
    count = {}
    for a, b in es:
        count[(wing(a), wing(b))] = count.get((wing(a), wing(b)), 0) + 1
    parts = [text(x0, 30, "includes between modules, from (row) to (column)", 13, "bold")]
    cw = 74
    for j, w in enumerate(names):
        parts.append(text(x0 + 84 + j * cw + cw // 2, 56, w, 12, "bold", "middle"))
    for i, a in enumerate(names):
        y = 66 + i * 34
        parts.append(text(x0 + 76, y + 22, a, 12, "bold", "end"))
        for j, b in enumerate(names):
            n = count.get((a, b), 0)
            allowed = a == b or rank[b] < rank[a]
            fill = "#ffffff" if not n else ("#cfe3f2" if allowed else "#f5b7b1")
            parts.append(box(x0 + 84 + j * cw, y, cw - 4, 30, fill if allowed or n else "#f4f6f7",
                             "#8aa6bf", 3))
            if n:
                parts.append(text(x0 + 84 + j * cw + cw // 2 - 2, y + 20, str(n), 12, anchor="middle"))
    y = 66 + len(names) * 34 + 22
    for k, line in enumerate(("%d modules, %d module edges (tools/core_graph.py --edges)."
                              % (sum(len(m) for _, m in order), len(es)),
                              "Blue: edges; grey: none allowed (a higher wing or a peer);",
                              "red: an edge layering.sh refuses.")):
        parts.append(text(x0, y + 18 * k, line, 12))
    return parts


def svg(root):
    order, rank = wings(root)
    es = edges(root)
    left, h = bands(order, 800)
    right = matrix(order, rank, es, 840)
    head = ('<svg xmlns="http://www.w3.org/2000/svg" width="1380" height="%d" '
            'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">' % h)
    defs = ('<defs><marker id="a" markerWidth="8" markerHeight="8" refX="4" refY="4" orient="auto">'
            '<path d="M0 0 L8 4 L0 8 z" fill="#5d7f9e"/></marker></defs>')
    title = text(10, 24, "core/: five wings and a top; each includes only its own and lower wings", 15, "bold")
    return "\n".join([head, '<rect width="100%" height="100%" fill="#ffffff"/>', defs, title]
                     + left + right + ["</svg>", ""])


def check(root, path):
    """0 if @p path is byte for byte what --svg draws now; else 1, with the first line that
    differs and the command that redraws it."""
    want = svg(root)
    try:
        have = open(path, encoding="utf-8").read()
    except OSError as e:
        print("%s: %s" % (path, e), file=sys.stderr)
        return 1
    if have == want:
        print("%s is the drawing of today's sources (%d lines)" % (path, want.count("\n")))
        return 0
    a, b = have.split("\n"), want.split("\n")
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print("%s is stale: line %d differs from what tools/core_graph.py draws now" % (path, k + 1), file=sys.stderr)
    print("  committed: %s" % (a[k] if k < len(a) else "(end of file)"), file=sys.stderr)
    print("  drawn now: %s" % (b[k] if k < len(b) else "(end of file)"), file=sys.stderr)
    label = re.compile(r">([^<]*)</text>")
    drawn, now = label.findall(have), label.findall(want)
    for what, names in (("drawn but gone", [t for t in drawn if t not in now]),
                        ("missing", [t for t in now if t not in drawn])):
        if names:
            print("  %s: %s" % (what, "; ".join(names)), file=sys.stderr)
    print("redraw it: python3 tools/core_graph.py --svg docs/core-wings.svg", file=sys.stderr)
    return 1


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if argv[:1] == ["--root"] and len(argv) > 2:
        root, argv = argv[1], argv[2:]
    if argv == ["--edges"]:
        for a, b in edges(root):
            print(a, b)
        return 0
    if len(argv) == 2 and argv[0] == "--svg":
        with open(argv[1], "w") as f:
            f.write(svg(root))
        return 0
    if len(argv) == 2 and argv[0] == "--check":
        return check(root, argv[1])
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
