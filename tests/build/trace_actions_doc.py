#!/usr/bin/env python3
"""docs/trace-format.md's table of actions names exactly the rows of tools/replay/actions.h.

Usage: trace_actions_doc.py ROOT
"""
import re
import sys


def main(root):
    with open(f'{root}/tools/replay/actions.h', encoding='utf-8') as f:
        table = set(re.findall(r'^\s*[XN]\((\w+),', f.read(), re.M))
    with open(f'{root}/docs/trace-format.md', encoding='utf-8') as f:
        doc = f.read()
    section = doc.split('\n## Actions\n', 1)[1].split('\n## ', 1)[0]
    documented = set()
    for line in section.splitlines():
        if line.startswith('| `'):
            first_cell = line.split('|')[1]
            documented.update(re.findall(r'`(\w+)', first_cell))
    bad = [f'action {a} (tools/replay/actions.h) is not in docs/trace-format.md\'s table'
           for a in sorted(table - documented)]
    bad += [f'docs/trace-format.md lists {a}, which tools/replay/actions.h has no row for'
            for a in sorted(documented - table)]
    for b in bad:
        print(b)
    if not table:
        print('no rows found in tools/replay/actions.h')
        return 1
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
