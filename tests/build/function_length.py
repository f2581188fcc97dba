#!/usr/bin/env python3
"""Function length check: no C function under the given folders is longer than a limit.

Usage: function_length.py ROOT LIMIT FOLDER... [--report FOLDER...]

A function is a top-level brace block whose opening line is not a struct/union/enum/array
initializer; its length is the lines from the line with its name to its closing brace. Folders
after --report are listed (the longest ten) but not enforced. Comments, strings and character
literals are skipped so braces inside them do not count.
"""
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


def walk(root, folder):
    for d, _, files in os.walk(os.path.join(root, folder)):
        for fn in sorted(files):
            if fn.endswith('.c'):
                p = os.path.join(d, fn)
                for name, first, length in functions(p):
                    yield length, os.path.relpath(p, root), first, name


def main(argv):
    root, limit = argv[1], int(argv[2])
    rest = argv[3:]
    report = rest[rest.index('--report') + 1:] if '--report' in rest else []
    enforce = rest[:rest.index('--report')] if '--report' in rest else rest
    bad = []
    for folder in enforce:
        for length, path, first, name in walk(root, folder):
            if length > limit:
                bad.append(f'{path}:{first}: {name} is {length} lines (limit {limit})')
    for folder in report:
        longest = sorted(walk(root, folder), reverse=True)[:10]
        print(f'longest functions in {folder}/ (reported, not enforced):')
        for length, path, first, name in longest:
            print(f'  {length:4d}  {path}:{first} {name}')
    for b in bad:
        print(b)
    if bad:
        print(f'{len(bad)} function(s) over {limit} lines in {", ".join(enforce)}: split them')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
