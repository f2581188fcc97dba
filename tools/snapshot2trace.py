#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot into an xseg-replay trace.

    tools/snapshot2trace.py SNAPSHOT.pickle [--device N] > TRACE
    tools/snapshot2trace.py --out-dir DIR SNAPSHOT.pickle      (DIR/deviceN.trace per device)

SNAPSHOT is what torch.cuda.memory._dump_snapshot() writes (a pickle; loading it needs no torch).
The snapshot's `device_traces` is a window: allocations made before recording began appear only
as frees without an alloc, or as live blocks in `segments`. Those are seeded as allocations at
the start of the trace (in address order), so the replay starts from the live memory the
original program had. `alloc` and `free_completed` events become `alloc` and `free` lines (a
free becomes final only at free_completed: with record_stream the memory is reused only then);
streams other than 0 become declared streams; `oom` events become marks; allocations in a
segment of a private pool (segment_pool_id not (0, 0): a CUDA graph, a MemPool) go to that pool;
two or more segment frees in a row become one `empty_cache`. PyTorch 2.0's layout (blocks
without `address`, their request in `history`) reads like today's.

The header carries what PyTorch's own allocator did in the window, from the segment events:
peak allocated, peak reserved (counting what was reserved before the window), utilization, as
`# pytorch:` comment lines that tools can read back.

Safe on files from anyone: the pickle is read by a small reader of our own that builds plain
data (dicts, lists, strings, numbers) and refuses every opcode that would import or call code,
with bounds on the memory a crafted file can make it use and on how deep its data nests
(MAX_DEPTH, 1000 containers). Anything malformed ends with a one-line message and exit status 1. When the reader of the output goes away (`| head`), it stops
quietly with exit status 141, as a program killed by SIGPIPE would.

Python standard library only.
"""
import argparse
import bisect
import os
import sys


class SnapshotError(ValueError):
    """A snapshot that cannot be read or converted; the message is one line for the user."""


# ---- a pickle reader that builds data and nothing else ---------------------------------------
#
# pickle.Unpickler can call any importable function a crafted file names (find_class gates it,
# but the REDUCE, BUILD, NEWOBJ and INST opcodes then call what it returns). A PyTorch snapshot is
# plain data: dicts, lists, tuples, strings, numbers, booleans, None. So this reader implements
# only the opcodes that build those, and refuses every opcode that names or calls a global
# (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, EXT*, PERSID): nothing in a file can
# make it import or run anything. It also bounds what a small file can make it allocate (an
# estimate of the memory built, the stack, integer sizes), so a crafted file fails with a message
# instead of exhausting the host.

_MAX_INT_BYTES = 16          # snapshots hold 64-bit addresses, sizes, stream ids, times
_MAX_INT_DIGITS = 40
_MAX_STACK = 1 << 20         # items on the stack at once (PyTorch's pickles batch by 1000)
_COST_CONTAINER = 64         # rough bytes per container / item / scalar, for the memory budget
_COST_ITEM = 8
_COST_SCALAR = 32
MAX_DEPTH = 1000             # containers nested deeper are refused: hash() and == of a tuple
                             # recurse in C, and a million-deep key would overflow the C stack


class _Reader:
    def __init__(self, data, max_memory):
        self.data = data
        self.pos = 0
        self.stack = []
        self.marks = []      # stack lengths at each MARK
        self.memo = {}
        self.budget = max_memory
        # Nesting depth of each tuple and frozenset deeper than 1, fixed when it is built (they
        # are immutable), so a key's depth is known before hash() recurses into it. The object is
        # kept beside its depth so its id() cannot be reused by another.
        self.depths = {}

    def fail(self, msg):
        raise SnapshotError("byte %d: %s" % (self.pos, msg))

    def spend(self, cost):
        self.budget -= cost
        if self.budget < 0:
            self.fail("the snapshot would need more than the memory limit to load "
                      "(raise it with --max-memory-mib if the file is genuine)")

    def take(self, n):
        if n < 0 or self.pos + n > len(self.data):
            self.fail("truncated (wanted %d bytes, %d left)" % (n, len(self.data) - self.pos))
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def uint(self, n):
        return int.from_bytes(self.take(n), "little")

    def line(self):
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            self.fail("truncated (a text argument without its newline)")
        b = self.data[self.pos:end]
        self.pos = end + 1
        return b

    def push(self, v):
        if len(self.stack) >= _MAX_STACK:
            self.fail("more than %d items on the pickle stack" % _MAX_STACK)
        self.stack.append(v)

    def pop(self):
        if not self.stack or (self.marks and len(self.stack) == self.marks[-1]):
            self.fail("stack underflow")
        return self.stack.pop()

    def top(self):
        if not self.stack or (self.marks and len(self.stack) == self.marks[-1]):
            self.fail("stack underflow")
        return self.stack[-1]

    def pop_mark(self):
        if not self.marks:
            self.fail("no mark on the stack")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def text_int(self, b):
        s = b.strip().rstrip(b"L")
        if len(s) > _MAX_INT_DIGITS:
            self.fail("integer literal longer than %d digits" % _MAX_INT_DIGITS)
        try:
            return int(s, 10)
        except ValueError:
            self.fail("bad integer literal %r" % b[:20])

    def bin_long(self, n):
        if n > _MAX_INT_BYTES:
            self.fail("integer of %d bytes (more than %d)" % (n, _MAX_INT_BYTES))
        self.spend(_COST_SCALAR)
        return int.from_bytes(self.take(n), "little", signed=True)

    def string(self, b, what):
        self.spend(_COST_SCALAR + len(b))
        try:
            return b.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            self.fail("%s is not valid UTF-8" % what)

    def hashable(self, k):
        if not isinstance(k, (str, int, float, bool, bytes, type(None), tuple, frozenset)):
            self.fail("a %s used as a dict key or set item" % type(k).__name__)
        if isinstance(k, tuple):
            try:
                hash(k)
            except TypeError:
                self.fail("an unhashable tuple used as a dict key or set item")
        return k

    def depth_of(self, v):
        """Nesting depth of a tuple or frozenset (1 for anything else: only these are hashed)."""
        if isinstance(v, (tuple, frozenset)):
            got = self.depths.get(id(v))
            return got[1] if got else 1
        return 1

    def immutable(self, kind, items):
        """A tuple or frozenset of @items, refused when it would nest deeper than MAX_DEPTH."""
        v = kind(items)
        depth = 1 + max((self.depth_of(i) for i in items if isinstance(i, (tuple, frozenset))), default=0)
        if depth > MAX_DEPTH:
            self.fail("containers nested more than %d deep" % MAX_DEPTH)
        if depth > 1:
            self.depths[id(v)] = (v, depth)
        return v

    def set_items(self, d, items):
        if len(items) % 2:
            self.fail("an odd number of items for a dict")
        self.spend(_COST_ITEM * len(items))
        for i in range(0, len(items), 2):
            d[self.hashable(items[i])] = items[i + 1]

    def load(self):
        ops = _OPS
        data = self.data
        while True:
            if self.pos >= len(data):
                self.fail("truncated (no STOP opcode)")
            op = data[self.pos]
            self.pos += 1
            handler = ops.get(op)
            if handler is None:
                name = _REFUSED.get(op)
                self.pos -= 1
                if name:
                    self.fail("refused: opcode %s would import or call code (a snapshot holds "
                              "plain data only; is this a PyTorch memory snapshot?)" % name)
                self.fail("unknown pickle opcode 0x%02x" % op)
            if handler is _stop:
                if len(self.stack) != 1 or self.marks:
                    self.fail("STOP with %d items on the stack" % len(self.stack))
                return self.stack[0]
            handler(self)


def _stop(r):
    pass


def _proto(r):
    v = r.uint(1)
    if v > 5:
        r.fail("pickle protocol %d is newer than this reader (0-5)" % v)


def _frame(r):
    r.uint(8)  # frames only batch reads; the data follows inline


def _mark(r):
    if len(r.marks) >= _MAX_STACK:
        r.fail("more than %d nested marks" % _MAX_STACK)
    r.marks.append(len(r.stack))  # marks are kept aside, not on the value stack


def _memo_put(r, idx):
    r.spend(_COST_ITEM * 4)
    r.memo[idx] = r.top()


def _memo_get(r, idx):
    if idx not in r.memo:
        r.fail("memo entry %d used before it was stored" % idx)
    r.spend(_COST_ITEM)
    r.push(r.memo[idx])


def _append(r):
    v = r.pop()
    lst = r.top()
    if not isinstance(lst, list):
        r.fail("APPEND to a %s" % type(lst).__name__)
    r.spend(_COST_ITEM)
    lst.append(v)


def _appends(r):
    items = r.pop_mark()
    lst = r.top()
    if not isinstance(lst, list):
        r.fail("APPENDS to a %s" % type(lst).__name__)
    r.spend(_COST_ITEM * len(items))
    lst.extend(items)


def _setitem(r):
    v = r.pop()
    k = r.pop()
    d = r.top()
    if not isinstance(d, dict):
        r.fail("SETITEM on a %s" % type(d).__name__)
    r.set_items(d, [k, v])


def _setitems(r):
    items = r.pop_mark()
    d = r.top()
    if not isinstance(d, dict):
        r.fail("SETITEMS on a %s" % type(d).__name__)
    r.set_items(d, items)


def _additems(r):
    items = r.pop_mark()
    s = r.top()
    if not isinstance(s, set):
        r.fail("ADDITEMS on a %s" % type(s).__name__)
    r.spend(_COST_ITEM * len(items))
    for it in items:
        s.add(r.hashable(it))


def _dict_from_mark(r):
    items = r.pop_mark()
    r.spend(_COST_CONTAINER)
    d = {}
    r.set_items(d, items)
    r.push(d)


def _container(kind):
    def h(r):
        r.spend(_COST_CONTAINER)
        r.push(kind())
    return h


def _from_mark(kind):
    def h(r):
        items = r.pop_mark()
        r.spend(_COST_CONTAINER + _COST_ITEM * len(items))
        if kind is frozenset:
            items = [r.hashable(i) for i in items]
        r.push(r.immutable(kind, items) if kind in (tuple, frozenset) else kind(items))
    return h


def _tuple_n(n):
    def h(r):
        items = [r.pop() for _ in range(n)][::-1]
        r.spend(_COST_CONTAINER)
        r.push(r.immutable(tuple, items))
    return h


def _bytes_op(lenbytes, kind):
    def h(r):
        n = r.uint(lenbytes)
        b = r.take(n)
        r.spend(_COST_SCALAR + n)
        r.push(kind(b))
    return h


def _unicode_op(lenbytes):
    def h(r):
        n = r.uint(lenbytes)
        r.push(r.string(r.take(n), "a string"))
    return h


def _py2_string(r, b):
    # Protocol 0-2 STRING / BINSTRING (Python 2 str): taken as text, like pickle's default.
    r.spend(_COST_SCALAR + len(b))
    try:
        return b.decode("ascii")
    except UnicodeDecodeError:
        r.fail("a Python 2 string that is not ASCII")


def _string(r):
    b = r.line().rstrip(b"\r")
    if len(b) < 2 or b[0] != b[-1] or b[:1] not in (b"'", b'"'):
        r.fail("STRING argument is not quoted")
    try:
        raw = b[1:-1].decode("ascii").encode("latin-1").decode("unicode_escape").encode("latin-1")
    except (UnicodeError, ValueError):
        r.fail("bad STRING escape")
    r.push(_py2_string(r, raw))


def _unicode_line(r):
    b = r.line()
    try:
        s = b.decode("raw_unicode_escape")
    except UnicodeDecodeError:
        r.fail("bad UNICODE argument")
    r.push(r.string(s.encode("utf-8", "surrogatepass"), "a string"))


def _int_line(r):
    b = r.line()
    if b == b"00":
        r.push(False)
    elif b == b"01":
        r.push(True)
    else:
        r.spend(_COST_SCALAR)
        r.push(r.text_int(b))


def _long_line(r):
    r.spend(_COST_SCALAR)
    r.push(r.text_int(r.line()))


def _float_line(r):
    b = r.line()
    if len(b) > 64:
        r.fail("float literal too long")
    try:
        r.push(float(b))
    except ValueError:
        r.fail("bad float literal")
    r.spend(_COST_SCALAR)


def _binfloat(r):
    import struct
    r.spend(_COST_SCALAR)
    r.push(struct.unpack(">d", r.take(8))[0])


def _pop(r):
    if r.marks and len(r.stack) == r.marks[-1]:
        r.pop_mark()  # POP of a bare mark discards it (as pickle does)
    else:
        r.pop()


def _dup(r):
    r.push(r.top())


_OPS = {
    ord("."): _stop,
    0x80: _proto,
    0x95: _frame,
    ord("("): _mark,
    ord("0"): _pop,
    ord("1"): lambda r: r.pop_mark(),
    ord("2"): _dup,
    ord("N"): lambda r: r.push(None),
    0x88: lambda r: r.push(True),
    0x89: lambda r: r.push(False),
    ord("I"): _int_line,
    ord("L"): _long_line,
    ord("J"): lambda r: (r.spend(_COST_SCALAR), r.push(int.from_bytes(r.take(4), "little", signed=True))),
    ord("K"): lambda r: r.push(r.uint(1)),
    ord("M"): lambda r: (r.spend(_COST_SCALAR), r.push(r.uint(2))),
    0x8a: lambda r: r.push(r.bin_long(r.uint(1))),
    0x8b: lambda r: r.push(r.bin_long(r.uint(4))),
    ord("F"): _float_line,
    ord("G"): _binfloat,
    ord("S"): _string,
    ord("T"): lambda r: r.push(_py2_string(r, r.take(r.uint(4)))),
    ord("U"): lambda r: r.push(_py2_string(r, r.take(r.uint(1)))),
    ord("V"): _unicode_line,
    ord("X"): _unicode_op(4),
    0x8c: _unicode_op(1),
    0x8d: _unicode_op(8),
    ord("B"): _bytes_op(4, bytes),
    ord("C"): _bytes_op(1, bytes),
    0x8e: _bytes_op(8, bytes),
    0x96: _bytes_op(8, bytearray),
    ord("]"): _container(list),
    ord("}"): _container(dict),
    0x8f: _container(set),
    ord(")"): lambda r: r.push(()),
    ord("l"): _from_mark(list),
    ord("t"): _from_mark(tuple),
    ord("d"): _dict_from_mark,
    0x91: _from_mark(frozenset),
    0x85: _tuple_n(1),
    0x86: _tuple_n(2),
    0x87: _tuple_n(3),
    ord("a"): _append,
    ord("e"): _appends,
    ord("s"): _setitem,
    ord("u"): _setitems,
    0x90: _additems,
    ord("p"): lambda r: _memo_put(r, r.text_int(r.line())),
    ord("q"): lambda r: _memo_put(r, r.uint(1)),
    ord("r"): lambda r: _memo_put(r, r.uint(4)),
    0x94: lambda r: _memo_put(r, len(r.memo)),
    ord("g"): lambda r: _memo_get(r, r.text_int(r.line())),
    ord("h"): lambda r: _memo_get(r, r.uint(1)),
    ord("j"): lambda r: _memo_get(r, r.uint(4)),
}

_REFUSED = {
    ord("c"): "GLOBAL", 0x93: "STACK_GLOBAL", ord("R"): "REDUCE", ord("b"): "BUILD",
    ord("i"): "INST", ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1",
    0x83: "EXT2", 0x84: "EXT4", ord("P"): "PERSID", ord("Q"): "BINPERSID",
    0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}


_CONTAINERS = (list, tuple, dict, set, frozenset)


_CONTAINER_TYPES = frozenset(_CONTAINERS)  # exact types: the reader builds no subclasses


def _kids(v):
    """The containers directly inside @p v. A dict's keys are left out: they are tuples and
    frozensets at most, whose depth the reader bounded when it built them."""
    t = _CONTAINER_TYPES
    return [c for c in (v.values() if type(v) is dict else v) if type(c) in t]


def _check_nesting(root):
    """Refuse data nested more than MAX_DEPTH containers deep, or a container holding itself.
    Iterative (a depth-first walk with its own stack) and linear: each container is walked once
    and remembers its height, so data shared through the memo costs nothing more."""
    if type(root) not in _CONTAINER_TYPES:
        return
    height = {id(root): 0}  # id -> height of a walked container; 0 while it is being walked
    stack = [[root, iter(_kids(root)), 1]]  # container, its containers left, its height so far
    while stack:
        top = stack[-1]
        for c in top[1]:
            h = height.get(id(c))
            if h is None:
                kids = _kids(c)
                if kids:  # walk it first (leaves, most containers, have height 1 and no entry)
                    if len(stack) >= MAX_DEPTH:
                        raise SnapshotError("containers nested more than %d deep" % MAX_DEPTH)
                    height[id(c)] = 0
                    stack.append([c, iter(kids), 1])
                    break
                h = 1
            elif h == 0:
                raise SnapshotError("a container that contains itself (a snapshot holds no cycles)")
            if len(stack) + h > MAX_DEPTH:
                raise SnapshotError("containers nested more than %d deep" % MAX_DEPTH)
            if h >= top[2]:
                top[2] = h + 1
        else:
            stack.pop()
            height[id(top[0])] = top[2]
            if stack and top[2] >= stack[-1][2]:
                stack[-1][2] = top[2] + 1


def load_snapshot(data, max_memory=4 << 30):
    """Read a pickle of plain data (bytes) without importing or calling anything.
    Raises SnapshotError with a one-line message for anything else, including data nested more
    than MAX_DEPTH containers deep (checked without recursion; nothing here or in convert()
    recurses over the data, and Python's own hash() and == of tuples are only ever given keys
    the reader has bounded)."""
    v = _Reader(data, max_memory).load()
    _check_nesting(v)
    return v


def round_block(size):
    """PyTorch's rounding of a request to a block size (512-byte multiples, at least 512)."""
    return max(512, (size + 511) // 512 * 512)


def _where(path):
    return "".join("[%r]" % p if isinstance(p, str) else "[%d]" % p for p in path)


def _dict(v, path):
    if not isinstance(v, dict):
        raise SnapshotError("%s: expected a dict, found %s" % (_where(path) or "the top level",
                                                               type(v).__name__))
    return v


def _list(v, path):
    if not isinstance(v, (list, tuple)):
        raise SnapshotError("%s: expected a list, found %s" % (_where(path), type(v).__name__))
    return v


def _uint(d, key, path, default=None):
    """d[key] as an integer in [0, 2^64), or default when absent (None: required)."""
    if key not in d:
        if default is None:
            raise SnapshotError("%s: missing '%s'" % (_where(path), key))
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
        raise SnapshotError("%s['%s']: expected an integer in [0, 2^64), found %s"
                            % (_where(path), key, repr(v)[:40] if isinstance(v, (int, float, str))
                               else type(v).__name__))
    return v


def _short(v):
    """A setting for a comment line: repr of a scalar (one line, at most 200 characters)."""
    if not isinstance(v, (str, int, float, bool, type(None))):
        return "(%s)" % type(v).__name__
    r = repr(v)
    return r if len(r) <= 200 else r[:197] + "..."


class _Work:
    """Bounds the items convert() visits by the file size: a pickle can reference one list from
    many places (memo), so a small file could otherwise name billions of events."""

    def __init__(self, limit):
        self.left = limit

    def __call__(self, n=1):
        self.left -= n
        if self.left < 0:
            raise SnapshotError("the snapshot references the same data over and over (more items "
                                "than the file could hold); refusing to expand it")


def _char_bytes(c):
    """The bytes of one character: a surrogate that stands for a byte of a non-UTF-8 file name
    (os.fsdecode's U+DC80..U+DCFF) is that byte, any other lone surrogate its UTF-8 form."""
    try:
        return c.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return c.encode("utf-8", "surrogatepass")


def _frame_file(s):
    """A frame's filename as one token of the trace language: %XX for blanks, '#', '%' and every
    character that is not printable (control characters, NUL, line breaks, surrogates), which
    xseg-replay decodes back to the bytes."""
    if not s:
        return "-"
    if s == "-":
        return "%2d"
    return "".join(c if (c.isprintable() and c not in " \t#%") else
                   "".join("%%%02x" % b for b in _char_bytes(c)) for c in s)


def _frame_name(s):
    """A function name as the rest of a `frame` line, which xseg-replay takes as it is: every
    character that is not printable (NUL, tab, line breaks, surrogates of non-UTF-8 bytes) becomes
    a blank, blanks at either end go, and a '#' at the start or after a blank (a comment in the
    trace language) becomes '?'."""
    s = "".join(c if c.isprintable() else " " for c in s).strip()
    s = s.replace(" #", " ?")
    if s.startswith("#"):
        s = "?" + s[1:]
    return s or "??"


def _top(snapshot, source):
    """The snapshot's device_traces list, after checking the top level is a snapshot at all."""
    if isinstance(snapshot, list):
        raise SnapshotError("%s holds only segments (a bare list): record it with "
                            "torch.cuda.memory._record_memory_history() to get device_traces" % source)
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise SnapshotError("%s is not a PyTorch memory snapshot (no 'device_traces' key)" % source)
    return _list(snapshot["device_traces"], ["device_traces"])


MAX_DEVICES = 256  # more devices with data than any machine has: a crafted file, refused


def devices(snapshot, source="snapshot"):
    """The devices of @p snapshot that hold data (events in device_traces, or segments), in
    order. A file whose data is on device 1 must not look empty because device 0 is."""
    traces = _top(snapshot, source)
    found = set()
    for i, t in enumerate(traces):
        if _list(t, ["device_traces", i]):
            found.add(i)
    for i, s in enumerate(_list(snapshot.get("segments", []), ["segments"])):
        found.add(_uint(_dict(s, ["segments", i]), "device", ["segments", i], 0))
        if len(found) > MAX_DEVICES:
            break
    if len(found) > MAX_DEVICES:
        raise SnapshotError("%s has data on more than %d devices" % (source, MAX_DEVICES))
    return sorted(found)


def _pool_of_segment(s, path):
    """The private pool a segment belongs to, as a trace pool name ("g1_2" for segment_pool_id
    (1, 2): a CUDA graph's or a MemPool's), or None for the default pools ((0, 0), or no id:
    PyTorch 2.0 records none)."""
    pid = s.get("segment_pool_id")
    if pid is None:
        return None
    if (not isinstance(pid, (tuple, list)) or len(pid) != 2 or
            not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 64 for x in pid)):
        raise SnapshotError("%s['segment_pool_id']: expected a pair of integers, found %s"
                            % (_where(path), _short(pid) if not isinstance(pid, (tuple, list)) else
                               "(%s)" % ", ".join(_short(x) for x in pid[:3])))
    if pid[0] == 0 and pid[1] == 0:
        return None
    return "g%d_%d" % (pid[0], pid[1])


def _blocks(s, si, work):
    """(address, size, requested size, state, frames) of segment @p si's blocks, in both layouts:
    since PyTorch 2.1 each block has its address; 2.0 gives none (the blocks tile the segment in
    order, so a block starts where the one before it ended) and keeps each allocation's request
    and frames in the block's `history`."""
    blocks = _list(s.get("blocks", []), ["segments", si, "blocks"])
    work(len(blocks))
    at = None
    for bi, b in enumerate(blocks):
        path = ["segments", si, "blocks", bi]
        b = _dict(b, path)
        size = _uint(b, "size", path)
        if "address" in b:
            addr = _uint(b, "address", path)
        else:
            if at is None:
                if "address" not in s:
                    raise SnapshotError("%s: a block without 'address' in a segment without one "
                                        "(an unknown snapshot layout)" % _where(path))
                at = _uint(s, "address", ["segments", si])
            addr = at
        at = addr + size
        req = _uint(b, "requested_size", path, 0)
        frames = b.get("frames")
        hist = b.get("history")
        if isinstance(hist, list) and hist and isinstance(hist[-1], dict):
            # PyTorch 2.0: the block's latest allocation, {addr, real_size, frames}.
            if not req:
                req = _uint(hist[-1], "real_size", path + ["history", len(hist) - 1], 0)
            if frames is None:
                frames = hist[-1].get("frames")
        yield addr, size, req, b.get("state"), frames, path


def _gib(n):
    return "%.2f GiB" % (n / 2**30) if n >= 2**30 else "%.1f MiB" % (n / 2**20)


EMPTY_CACHE_BURST = 2  # this many segment frees in a row, with nothing between, were an empty_cache


def _device_data(snapshot, device, source, work):
    """(segments as (index, segment) on @p device, its trace events), checked."""
    traces = _top(snapshot, source)
    segments = []
    for i, s in enumerate(_list(snapshot.get("segments", []), ["segments"])):
        work()
        s = _dict(s, ["segments", i])
        if _uint(s, "device", ["segments", i], 0) == device:
            segments.append((i, s))
    if device < 0 or (device >= len(traces) and not segments):
        raise SnapshotError("%s has traces for %d device(s); device %d is out of range"
                            % (source, len(traces), device))
    events = _list(traces[device], ["device_traces", device]) if device < len(traces) else []
    work(len(events))
    return segments, events


class _PoolMap:
    """Private pools (CUDA graphs, MemPool): the address ranges of the segments that belong to
    one. An allocation inside one goes to that pool (pool_begin/pool_end around it)."""

    def __init__(self, segments):
        self.ranges = []
        for si, s in segments:
            pool = _pool_of_segment(s, ["segments", si])
            if pool:
                start = _uint(s, "address", ["segments", si])
                self.ranges.append((start, start + _uint(s, "total_size", ["segments", si]), pool))
        self.ranges.sort()
        self.starts = [r[0] for r in self.ranges]

    def at(self, addr):
        if not self.ranges:
            return None
        k = bisect.bisect_right(self.starts, addr) - 1
        return self.ranges[k][2] if k >= 0 and addr < self.ranges[k][1] else None


class _Names:
    """Streams and stacks as the trace names them. Each distinct stack becomes `frame kN ...`
    lines and allocations refer to it with `^kN`, so xseg-replay --history --snapshot shows the
    program's own stacks."""

    def __init__(self, frames, work):
        self.frames, self.work = frames, work
        self.streams = {}      # stream id -> name
        self.stack_names = {}  # tuple of (filename, name, line) -> "kN"
        self.stack_lines = []
        self.by_id = {}        # id(frames list) -> " ^kN" or "": lists a pickle shares are read once

    def stream_ref(self, sid):
        if not sid:
            return ""
        if sid not in self.streams:
            self.streams[sid] = "s%x" % sid
        return " @" + self.streams[sid]

    def stack_ref(self, frames_list, path):
        if not self.frames or not isinstance(frames_list, list) or not frames_list:
            return ""
        key = id(frames_list)
        if key in self.by_id:
            return self.by_id[key][0]
        self.work(len(frames_list))
        fr = []
        for f in frames_list:
            if not isinstance(f, dict):
                continue
            fname, func, line = f.get("filename", ""), f.get("name", ""), f.get("line", 0)
            if not isinstance(fname, str) or not isinstance(func, str):
                continue
            if not isinstance(line, int) or isinstance(line, bool) or not 0 <= line < 2**31:
                line = 0
            fr.append((fname, func, line))
        ref = ""
        if fr:
            t = tuple(fr)
            if t not in self.stack_names:
                self.stack_names[t] = "k%d" % len(self.stack_names)
                for fname, func, line in t:
                    self.stack_lines.append("frame %s %d %s %s" % (self.stack_names[t], line, _frame_file(fname),
                                                                  _frame_name(func)))
            ref = " ^" + self.stack_names[t]
        self.by_id[key] = (ref, frames_list)  # keep the list alive: its id stays its own
        return ref


class _Window:
    """The first pass: the window's events as entries, ("alloc", name, size, stream ref, stack
    ref, pool), ("free", name, note), ("seg", delta), ("empty_cache", count, bytes), ("oom", size,
    device free, stream ref); and the seeds, blocks alive before the window: (addr, name, size, stream, block
    size, stack ref, pool)."""

    def __init__(self, names, pools):
        self.names, self.pools = names, pools
        self.live = {}       # addr -> name
        self.seeds = []
        self.body = []
        self.counter = 0
        self.seg_delta = 0   # reserved bytes added during the window
        self.burst, self.burst_bytes = 0, 0

    def _name(self, prefix):
        name = "%s%d" % (prefix, self.counter)
        self.counter += 1
        return name

    def _burst(self, action, size):
        """A run of segment frees with nothing between them was an empty_cache."""
        if action in ("segment_free", "segment_unmap"):
            self.burst += 1
            self.burst_bytes += size
        elif self.burst:
            if self.burst >= EMPTY_CACHE_BURST:
                self.body.append(("empty_cache", self.burst, self.burst_bytes))
            self.burst, self.burst_bytes = 0, 0

    def event(self, e, path):
        action = e.get("action")
        addr = size = sid = 0
        if action in ("alloc", "free_completed", "segment_alloc", "segment_map", "segment_free",
                      "segment_unmap"):
            addr = _uint(e, "addr", path)
            size = _uint(e, "size", path)
            sid = _uint(e, "stream", path, 0)
        self._burst(action, size)
        names, body = self.names, self.body
        if action == "alloc":
            if addr in self.live:
                # The window lost this block's free (a ring buffer can): free it here.
                body.append(("free", self.live.pop(addr), "  # its free_completed is missing from the window"))
            name = self._name("a")
            self.live[addr] = name
            body.append(("alloc", name, size, names.stream_ref(sid), names.stack_ref(e.get("frames"), path),
                         self.pools.at(addr)))
        elif action == "free_completed":
            if addr in self.live:
                body.append(("free", self.live.pop(addr), ""))
            else:
                name = self._name("pre")
                self.seeds.append((addr, name, size, sid, round_block(size),
                                   names.stack_ref(e.get("frames"), path), self.pools.at(addr)))
                body.append(("free", name, ""))
        elif action in ("segment_alloc", "segment_map"):
            self.seg_delta += size
            body.append(("seg", size))
        elif action in ("segment_free", "segment_unmap"):
            self.seg_delta -= size
            body.append(("seg", -size))
        elif action == "oom":
            body.append(("oom", _uint(e, "size", path, 0), _uint(e, "device_free", path, -1),
                         names.stream_ref(_uint(e, "stream", path, 0))))
        # free_requested, snapshot, user annotations: nothing to replay

    def finish(self, segments, work):
        """After the last event: a pending burst, then the blocks alive when the snapshot was
        written that the window never allocated (live all along) as seeds."""
        if self.burst >= EMPTY_CACHE_BURST:
            self.body.append(("empty_cache", self.burst, self.burst_bytes))
        live_addrs = set(self.live)
        for si, s in segments:
            sstream = _uint(s, "stream", ["segments", si], 0)
            for baddr, bsize, req, state, bframes, path in _blocks(s, si, work):
                if state in ("active_allocated", "active_pending_free") and baddr not in live_addrs:
                    # The program asked for requested_size; PyTorch counted the whole block.
                    self.seeds.append((baddr, self._name("pre"), req or bsize, sstream, bsize,
                                       self.names.stack_ref(bframes, path), self.pools.at(baddr)))
        self.seeds.sort()


class _Router:
    """The private pool allocations go to now: pool_end / pool_begin lines where it changes."""

    def __init__(self):
        self.pool = None

    def route(self, to, out_lines):
        if to != self.pool:
            if self.pool:
                out_lines.append("pool_end %s" % self.pool)
            if to:
                out_lines.append("pool_begin %s" % to)
            self.pool = to


def _replay(win, reserved):
    """The second pass: the seeds' and the window's trace lines, following PyTorch's allocated
    and reserved bytes from the window's start (@p reserved). @return (seed lines, lines,
    figures without events and pools)."""
    allocated = sum(seed[4] for seed in win.seeds)  # rounded as PyTorch rounds blocks
    peak_res, peak_alloc = reserved, allocated
    sizes = {seed[1]: seed[4] for seed in win.seeds}
    router = _Router()
    seed_lines, lines = [], []
    for _, name, sz, sid, _, ref, p in win.seeds:
        router.route(p, seed_lines)
        seed_lines.append("alloc %s %d%s%s" % (name, sz, win.names.stream_ref(sid), ref))
    router.route(None, seed_lines)
    ooms = empties = 0
    oom_device = oom_parts = None
    for entry in win.body:
        kind = entry[0]
        if kind == "seg":
            reserved += entry[1]
            peak_res = max(peak_res, reserved)
        elif kind == "alloc":
            _, name, sz, sref, kref, p = entry
            sizes[name] = round_block(sz)
            allocated += sizes[name]
            peak_alloc = max(peak_alloc, allocated)
            router.route(p, lines)
            lines.append("alloc %s %d%s%s" % (name, sz, sref, kref))
        elif kind == "free":
            allocated -= sizes.pop(entry[1])
            lines.append("free %s%s" % (entry[1], entry[2]))
        elif kind == "empty_cache":
            router.route(None, lines)
            empties += 1
            lines.append("empty_cache  # PyTorch released %d segments (%s) here in a row"
                         % (entry[1], _gib(entry[2])))
        elif kind == "oom":
            ooms += 1
            free_txt = "%s free" % _gib(entry[2]) if entry[2] >= 0 else "free unknown"
            if oom_device is None:
                # What PyTorch could have used: what it held plus what the device still had
                # (0: the snapshot does not say).
                oom_device = reserved + entry[2] if entry[2] >= 0 else 0
                oom_parts = (reserved, entry[2])
            # A mark: each mode's figures at the point where PyTorch failed, beside PyTorch's.
            lines.append("mark PyTorch OOM: %s request, %s; PyTorch had %s allocated, %s reserved"
                         % (_gib(entry[1]), free_txt, _gib(allocated), _gib(reserved)))
            if entry[1] > 0:
                # The request that failed, so a replay asks for it too ("would xseg have served
                # it?"); freed at once, as the program got no memory to keep.
                lines.append("alloc oom%d %d%s  # the request PyTorch could not serve" % (ooms, entry[1], entry[3]))
                lines.append("free oom%d" % ooms)
    router.route(None, lines)
    figures = {
        "peak_allocated_bytes": peak_alloc,
        "peak_reserved_bytes": peak_res,
        "utilization": peak_alloc / peak_res if peak_res else 0.0,
        "ooms": ooms,
        "empty_caches": empties,
        "oom_device_bytes": oom_device,
        "oom_parts": oom_parts,
    }
    return seed_lines, lines, figures


def _write(out, source, device, snapshot, figures, names, seed_lines, lines, nseeds, has_pools):
    settings = snapshot.get("allocator_settings") or {}
    if not isinstance(settings, dict):
        settings = {}
    w = out.write
    w("# xseg-replay trace converted from the PyTorch snapshot %s (device %d) by tools/snapshot2trace.py\n"
      % ("".join(c if c.isprintable() else "?" for c in source), device))
    w("# %d events; %d allocations seeded from before the window\n" % (figures["events"], nseeds))
    if figures["ooms"] or figures["empty_caches"] or has_pools:
        w("# %d OOM(s) PyTorch recorded (marks), %d empty_cache inferred from bursts of segment frees, "
          "%d private pool(s) (CUDA graphs, MemPool)\n" % (figures["ooms"], figures["empty_caches"], figures["pools"]))
    if settings:
        # repr, bounded: a crafted value must not add lines (actions) to the trace.
        w("# recorded with expandable_segments=%s PYTORCH_CUDA_ALLOC_CONF=%s\n"
          % (_short(settings.get("expandable_segments")), _short(settings.get("PYTORCH_CUDA_ALLOC_CONF", ""))))
    for k in ("peak_allocated_bytes", "peak_reserved_bytes"):
        w("# pytorch: %s=%d (%.2f GiB)\n" % (k, figures[k], figures[k] / 2**30))
    w("# pytorch: utilization=%.4f\n" % figures["utilization"])
    if figures.get("expandable") is not None:
        # xseg-replay compares the recording with the mode that matches it (--report).
        w("# pytorch: expandable_segments=%d\n" % figures["expandable"])
    if figures["oom_device_bytes"] is not None:
        # The device an OOM is replayed on: PyTorch's reserved plus free bytes at the first OOM
        # (0: unknown); xseg-replay answers "would xseg have avoided it?" there.
        w("# pytorch: oom_device_bytes=%d\n" % figures["oom_device_bytes"])
        if figures.get("oom_parts") and figures["oom_parts"][1] >= 0:
            # Its two parts, so that a device larger than the card is explained, not just shown.
            w("# pytorch: oom_reserved_bytes=%d\n# pytorch: oom_free_bytes=%d\n" % figures["oom_parts"])
    # The device it came from: a replay runs on device 0, and says which GPU it stands for.
    w("# pytorch: device=%d\n" % device)
    # 0: a snapshot of segments only (no _record_memory_history): the replay has no history.
    w("# pytorch: history_events=%d\n" % figures.get("history_events", 0))
    if names.stack_lines:
        w("# the allocations' frames (xseg-replay --history --snapshot FILE shows them)\n")
    for line in names.stack_lines:
        w(line + "\n")
    for sid, name in sorted(names.streams.items()):
        w("stream %s\n" % name)
    for line in seed_lines:
        w(line + "\n")
    w("mark window start (seeded)\n")
    for line in lines:
        w(line + "\n")
    w("mark end of window\n")


def _recorded_expandable(snapshot, segments, events):
    """Whether PyTorch ran with expandable segments: its settings say so, else a segment of the
    device is expandable or the window maps pages (segment_map). None: the file does not tell."""
    settings = snapshot.get("allocator_settings")
    if isinstance(settings, dict) and isinstance(settings.get("expandable_segments"), bool):
        return settings["expandable_segments"]
    if any(s.get("is_expandable") is True for _, s in segments):
        return True
    if any(isinstance(e, dict) and e.get("action") in ("segment_map", "segment_unmap") for e in events):
        return True
    if any(isinstance(s.get("is_expandable"), bool) for _, s in segments):
        return False
    return None


def convert(snapshot, device, out, source="snapshot", work_limit=None, frames=True, work=None):
    """Write the trace for `device` of the loaded `snapshot` to `out`. Returns a dict of figures.
    Raises SnapshotError (a ValueError) with a one-line message when the snapshot is malformed.
    @p work (a _Work) bounds the items visited across several calls on one file."""
    if work is None:
        work = _Work(work_limit if work_limit is not None else float("inf"))
    segments, events = _device_data(snapshot, device, source, work)
    pools = _PoolMap(segments)
    names = _Names(frames, work)
    win = _Window(names, pools)
    for i, e in enumerate(events):
        path = ["device_traces", device, i]
        win.event(_dict(e, path), path)
    win.finish(segments, work)
    # PyTorch's reserved bytes at the window's start: what the segments hold now minus what the
    # window added.
    reserved = sum(_uint(s, "total_size", ["segments", si]) for si, s in segments) - win.seg_delta
    seed_lines, lines, replayed = _replay(win, reserved)
    figures = {"events": len(events),
               "history_events": sum(1 for e in events if not (isinstance(e, dict) and e.get("action") == "snapshot"))}
    figures.update(replayed)
    figures["pools"] = len({r[2] for r in pools.ranges})
    figures["expandable"] = _recorded_expandable(snapshot, segments, events)
    _write(out, source, device, snapshot, figures, names, seed_lines, lines, len(win.seeds), bool(pools.ranges))
    return figures


def _pick_device(snap, source, prog):
    """--device omitted: the only device with data, or the first of several (saying so)."""
    devs = devices(snap, source)
    if not devs:
        raise SnapshotError("%s holds no events and no segments on any device" % source)
    if len(devs) > 1:
        print("%s: %s holds data on devices %s: converting device %d (--device N for another; "
              "xseg-replay reads the snapshot itself and replays every device)"
              % (prog, source, ", ".join(map(str, devs)), devs[0]), file=sys.stderr)
    return devs[0]


def _check_device(snap, source, device):
    """--device N given: refuse a device without data rather than write an empty trace."""
    devs = devices(snap, source)
    if device not in devs:
        traces = _top(snap, source)
        if 0 <= device < len(traces):
            raise SnapshotError("%s: device %d holds no events and no segments (devices with data: %s)"
                                % (source, device, ", ".join(map(str, devs)) or "none"))
    return device


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Writes the trace on standard output (with --out-dir, one file per device).")
    ap.add_argument("snapshot", help="a pickle written by torch.cuda.memory._dump_snapshot")
    ap.add_argument("--device", type=int, default=None,
                    help="which device's trace (default: the first device that holds data)")
    ap.add_argument("--out-dir", metavar="DIR",
                    help="write DIR/deviceN.trace for every device that holds data (or for --device N "
                         "only) and list them on standard output, one 'N<tab>PATH<tab>EVENTS' line each")
    ap.add_argument("--no-frames", action="store_true",
                    help="leave out the allocations' frames (`frame` lines and ^STACK references)")
    ap.add_argument("--max-memory-mib", type=int, default=4096, metavar="MIB",
                    help="refuse snapshots that would need more host memory than this to load "
                         "(an estimate; default 4096)")
    ap.add_argument("--prog", default="snapshot2trace", help=argparse.SUPPRESS)  # name in messages
    args = ap.parse_args(argv)
    name = args.snapshot
    prog = args.prog
    if hasattr(sys.stdout, "reconfigure"):
        # The trace is UTF-8 whatever the locale: a frame name in any script must not end the
        # conversion with an encoding error (what cannot be encoded is escaped already).
        sys.stdout.reconfigure(encoding="utf-8", errors="strict")
    try:
        with open(args.snapshot, "rb") as f:
            data = f.read()
    except OSError as e:
        print("%s: %s: %s" % (prog, name, e.strerror or e), file=sys.stderr)
        return 1
    source = name.rsplit("/", 1)[-1]
    try:
        snap = load_snapshot(data, max_memory=args.max_memory_mib << 20)
        # Every item visited costs at least one byte of the file unless the pickle shares it;
        # each device visits the segment list once more.
        work = _Work(2 * len(data) + 1024)
        if args.out_dir is not None:
            devs = [_check_device(snap, source, args.device)] if args.device is not None else devices(snap, source)
            if not devs:
                raise SnapshotError("%s holds no events and no segments on any device" % source)
            for dev in devs:
                path = os.path.join(args.out_dir, "device%d.trace" % dev)
                try:
                    with open(path, "w", encoding="utf-8") as f:
                        fig = convert(snap, dev, f, source=source, frames=not args.no_frames, work=work)
                except OSError as e:
                    raise SnapshotError("cannot write %s: %s" % (path, e.strerror or e))
                sys.stdout.write("%d\t%s\t%d\n" % (dev, path, fig["events"]))
        else:
            dev = (_check_device(snap, source, args.device) if args.device is not None
                   else _pick_device(snap, source, prog))
            convert(snap, dev, sys.stdout, source=source, frames=not args.no_frames, work=work)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        # The reader has what it wanted (`| head`). Point stdout at /dev/null so the flush at
        # exit cannot fail again, and end as a program killed by SIGPIPE does: 128 + 13.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except SnapshotError as e:
        print("%s: %s: %s" % (prog, name, e), file=sys.stderr)
        return 1
    except (RecursionError, MemoryError) as e:
        print("%s: %s: too large or too deeply nested to convert (%s)"
              % (prog, name, type(e).__name__), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130  # Ctrl-C: stop quietly, as a program killed by SIGINT would (no traceback)
    return 0


if __name__ == "__main__":
    sys.exit(main())
