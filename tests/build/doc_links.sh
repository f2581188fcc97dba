#!/usr/bin/env bash
# Every relative link in the repository's Markdown points to a file or folder that exists, so the
# manual, the maintainer's map and the measurement record keep pointing at each other.
#   tests/build/doc_links.sh SOURCE_ROOT
set -euo pipefail
cd "${1:-.}"
bad=0
while IFS= read -r -d '' md; do
  dir=$(dirname "$md")
  # [text](target) and [text](target "title"); code spans and fenced blocks are not links
  while IFS= read -r target; do
    target=${target%% *}; target=${target%%#*}
    case $target in ''|http://*|https://*|mailto:*) continue ;; esac
    if [ ! -e "$dir/$target" ]; then
      echo "$md: broken link: $target" >&2; bad=1
    fi
  done < <(sed '/^```/,/^```/d; s/`[^`]*`//g' "$md" | grep -oE '\]\([^)]+\)' | sed 's/^](//; s/)$//')
done < <(find . -name '*.md' -not -path './build*' -not -path './.git/*' -not -path './subprojects/*' -print0)
exit $bad
