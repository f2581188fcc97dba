#!/usr/bin/env python3
"""Every relative link in the repository's Markdown points to a file or folder that exists, and
every `FILE.md#anchor` or `#anchor` names a heading (or explicit anchor) of that file, so the
manual, the maintainer's map and the measurement record keep pointing at each other.

Anchors are GitHub's: a heading's rendered text, lowercased, spaces turned to '-', punctuation
other than '-' and '_' dropped; a repeated slug gets -1, -2, ... An explicit `{#id}` at a
heading's end (docs/benchmarks*.md) names that heading instead; `<a id=...>`/`<a name=...>`
add anchors too. Fenced code blocks and code spans hold neither links nor headings.

Usage: doc_links.py SOURCE_ROOT | doc_links.py --self-test
"""
import os
import re
import sys
import tempfile
import unicodedata
from urllib.parse import unquote

FENCE = re.compile(r'^ {0,3}(`{3,}|~{3,})')
ATX = re.compile(r'^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$')
SETEXT = re.compile(r'^ {0,3}(=+|-+)[ \t]*$')
EXPLICIT_ID = re.compile(r'[ \t]*\{#([^}\s]+)\}[ \t]*$')
HTML_ANCHOR = re.compile(r'<a\s[^>]*?\b(?:id|name)\s*=\s*["\']?([^"\'\s>]+)', re.I)
CODE_SPAN = re.compile(r'(`+)(.+?)\1')
INLINE_LINK = re.compile(r'!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+[^)]*)?\)')
REF_DEF = re.compile(r'^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$')
TAG = re.compile(r'<[^>]+>')
KEEP = {'Mn', 'Mc', 'Me', 'Nd', 'Nl', 'No', 'Pc'}


def prose_lines(text):
    """The lines of a Markdown file outside fenced code blocks, with their line numbers."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield n, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip()[len(m.group(1)):].strip():
            fence = None


def rendered(heading):
    """A heading's text as GitHub renders it: link text without its target, no code-span ticks,
    no HTML tags, no emphasis markers."""
    parts = []
    last = 0
    for m in CODE_SPAN.finditer(heading):
        parts.append(markup_stripped(heading[last:m.start()]))
        parts.append(m.group(2))
        last = m.end()
    parts.append(markup_stripped(heading[last:]))
    return ''.join(parts)


def markup_stripped(s):
    s = INLINE_LINK.sub(lambda m: m.group(1), s)
    s = TAG.sub('', s)
    s = re.sub(r'(?<!\w)_+|_+(?!\w)', '', s)
    return s.replace('*', '')


def slug(text):
    out = []
    for c in text.strip().lower():
        if c == ' ':
            out.append('-')
        elif c in '-_' or c.isalpha() or unicodedata.category(c) in KEEP:
            out.append(c)
    return ''.join(out)


def anchors(text):
    """The set of anchors a Markdown file defines."""
    found, seen = set(), {}
    lines = list(prose_lines(text))
    for i, (n, line) in enumerate(lines):
        for m in HTML_ANCHOR.finditer(line):
            found.add(m.group(1))
        m = ATX.match(line)
        heading = (m.group(2) or '') if m else None
        if heading is None and i + 1 < len(lines) and lines[i + 1][0] == n + 1 \
                and SETEXT.match(lines[i + 1][1]) and line.strip() \
                and not SETEXT.match(line) and not line.lstrip().startswith(('>', '-', '*', '|')):
            heading = line.strip()
        if heading is None:
            continue
        explicit = EXPLICIT_ID.search(heading)
        if explicit:
            found.add(explicit.group(1))
            continue
        base = slug(rendered(heading))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f'{base}-{count}')
    return found


def links(text):
    """(line number, target) of every inline link, image and reference definition in prose."""
    for n, line in prose_lines(text):
        m = REF_DEF.match(line)
        if m:
            yield n, m.group(1)
            continue
        for m in INLINE_LINK.finditer(CODE_SPAN.sub('', line)):
            yield n, m.group(2)


def markdown_files(root):
    """The Markdown files under root, less the build trees (build*), .git and fetched subprojects
    at the top."""
    for top, dirs, files in os.walk(root):
        if top == root:
            dirs[:] = [d for d in dirs
                       if not d.startswith('build') and d not in ('.git', 'subprojects')]
        dirs.sort()
        for f in sorted(files):
            if f.endswith('.md'):
                yield os.path.relpath(os.path.join(top, f), root)


def main(root):
    texts, cache = {}, {}

    def read(path):
        if path not in texts:
            with open(os.path.join(root, path), encoding='utf-8') as f:
                texts[path] = f.read()
        return texts[path]

    bad = 0
    for md in markdown_files(root):
        for n, target in links(read(md)):
            if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.I) or target == '':
                continue                      # http:, https:, mailto: ...
            path, _, fragment = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(md), unquote(path))) \
                if path else md
            if not os.path.exists(os.path.join(root, dest)):
                print(f'{md}:{n}: broken link: {path}')
                bad = 1
                continue
            if os.path.isdir(os.path.join(root, dest)):
                dest = os.path.join(dest, 'README.md')   # a folder shows its README
            if not fragment or not dest.endswith('.md') or dest.startswith('..') \
                    or not os.path.isfile(os.path.join(root, dest)):
                continue
            if dest not in cache:
                cache[dest] = anchors(read(dest))
            if unquote(fragment) not in cache[dest]:
                print(f'{md}:{n}: broken anchor: {target} ({dest} has no heading or anchor '
                      f'"{unquote(fragment)}")')
                bad = 1
    return bad


SAMPLE = """# Top
## Dup
## Dup
Setext title
------------
<a id="html-one"></a>
## Notes {#short}
## `code_name` and [link](a.md) \u2014 20 % *bold* _em_
```
# Inside fence
[in a fence](#nowhere)
```
[a](#dup) [b](#dup-1) [c](#setext-title) [d](#html-one) [e](#short) `[span](#nowhere)`
[f](#code_name-and-link--20--bold-em) [g](a.md#a-heading) [h](sub/#sub-readme)
[ref]: a.md#a-heading
"""
SAMPLE_BAD = ['#dup-2', '#inside-fence', '#notes', '#top-1', 'a.md#b', 'sub/#x',
              'missing.md#a-heading']


def self_test():
    """The check passes a sample of every anchor kind and fails each kind of broken link."""
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, 'sub'))
        for path, text in (('a.md', '# A heading\n'), ('sub/README.md', '# Sub README\n'),
                           ('README.md', SAMPLE)):
            with open(os.path.join(root, path), 'w', encoding='utf-8') as f:
                f.write(text)
        if main(root) != 0:
            print('self-test: the good sample fails')
            return 1
        for target in SAMPLE_BAD:
            with open(os.path.join(root, 'README.md'), 'w', encoding='utf-8') as f:
                f.write(SAMPLE + f'[bad]({target})\n')
            if main(root) == 0:
                print(f'self-test: a link to {target} passes')
                return 1
    print(f'self-test: the sample passes and its {len(SAMPLE_BAD)} broken links fail')
    return 0


if __name__ == '__main__':
    arg = sys.argv[1] if len(sys.argv) > 1 else '.'
    sys.exit(self_test() if arg == '--self-test' else main(arg))
