#!/usr/bin/env python3
"""Function length check: no function under the given folders is longer than its limit.

Usage: function_length.py ROOT LIMIT FOLDER[:MAX]... [--report FOLDER...]

Each FOLDER is held to LIMIT lines, or to MAX where given (the library's folders are held to
their longest function when the cap was set, so that none grows past it). C files: a function is
a top-level brace block whose opening line is not a struct/union/enum/array initializer; its
length is the lines from the line with its name to its closing brace; comments, strings and
character literals are skipped so braces inside them do not count. Python files: every def
(nested ones too), from its def line to its last line. Folders after --report are listed (the
longest ten) but not enforced.
"""
import ast
import os
import re
import sys


def strip(text):
    """The text with comments, strings and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            out.append(c + ' ' * (j - i - 1) + (c if j < n else ''))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


CALL = re.compile(r'([A-Za-z_]\w*)\s*\(')
NOT_NAMES = {'__attribute__', 'if', 'for', 'while', 'switch', 'return', 'sizeof'}


def definition(head):
    """The function name in the text before a top-level '{' and its offset, or None."""
    if re.search(r'=\s*$', head) or not head.rstrip().endswith(')'):
        return None
    for m in CALL.finditer(head):
        if m.group(1) not in NOT_NAMES:
            return m.group(1), m.start()
    return None


def functions(path):
    """(name, first line, length) of each function defined in @path."""
    with open(path, encoding='utf-8', errors='replace') as f:
        text = strip(f.read())
    lines = text.split('\n')
    depth, start, head = 0, None, ''
    found = []
    for ln, line in enumerate(lines, 1):
        for ch in line:
            if ch == '{':
                if depth == 0:
                    d = definition(head)
                    start = (d[0], ln - head[d[1]:].count('\n')) if d else None
                depth += 1
            elif ch == '}':
                depth -= 1
                if depth == 0:
                    if start:
                        name, first = start
                        # the definition starts where its name is
                        found.append((name, first, ln - first + 1))
                    start, head = None, ''
            elif ch == ';' and depth == 0:
                head = ''
            elif depth == 0:
                head += ch
        if depth == 0:
            head += '\n'
            if not head.strip() or line.lstrip().startswith('#'):
                head = '' if line.lstrip().startswith('#') else head
    return found


def py_functions(path):
    """(name, first line, length) of each def in the Python file @path."""
    with open(path, encoding='utf-8', errors='replace') as f:
        tree = ast.parse(f.read(), path)
    return [(n.name, n.lineno, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def walk(root, folder):
    for d, _, files in os.walk(os.path.join(root, folder)):
        for fn in sorted(files):
            p = os.path.join(d, fn)
            found = functions(p) if fn.endswith('.c') else py_functions(p) if fn.endswith('.py') else []
            for name, first, length in found:
                yield length, os.path.relpath(p, root), first, name


def main(argv):
    root, limit = argv[1], int(argv[2])
    rest = argv[3:]
    report = rest[rest.index('--report') + 1:] if '--report' in rest else []
    enforce = rest[:rest.index('--report')] if '--report' in rest else rest
    bad = []
    for spec in enforce:
        folder, _, cap = spec.partition(':')
        most = int(cap) if cap else limit
        for length, path, first, name in walk(root, folder):
            if length > most:
                bad.append(f'{path}:{first}: {name} is {length} lines (limit {most} in {folder}/)')
    for folder in report:
        longest = sorted(walk(root, folder), reverse=True)[:10]
        print(f'longest functions in {folder}/ (reported, not enforced):')
        for length, path, first, name in longest:
            print(f'  {length:4d}  {path}:{first} {name}')
    for b in bad:
        print(b)
    if bad:
        print(f'{len(bad)} function(s) over their folder\'s limit ({", ".join(enforce)}): split them')
        return 1
    print(f'ok: every function within its limit ({", ".join(enforce)}; default {limit} lines)')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
