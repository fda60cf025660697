#!/usr/bin/env bash
# Checks, never rewrites, that the C++ files of the folders below follow
# .clang-format: `clang-format --dry-run -Werror` prints each file and line
# that would change and exits non-zero. A folder joins the list once it has
# been formatted in a commit of its own (clang-format -i), so the check
# never asks anyone to reformat code they did not touch. The reference is
# Debian 12's clang-format 14 (scripts/install-deps.sh test installs it);
# another version may wrap some lines differently.
#
#   scripts/format-check.sh            # scripts/test.sh runs it
#   CLANG_FORMAT=clang-format-14 scripts/format-check.sh
#   # to fix: clang-format -i $(git ls-files 'coordinator/*.cc' 'coordinator/*.h')  # (or any folder above)
set -euo pipefail
cd "$(dirname "$0")/.."

folders=(client common worker coordinator tests bench fuzz)

clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" >/dev/null; then
  echo "format-check: $clang_format not found: install it (apt-get install clang-format, or scripts/install-deps.sh test)" >&2
  exit 2
fi

files=()
for d in "${folders[@]}"; do
  while IFS= read -r f; do files+=("$f"); done < <(git ls-files -- "$d/*.cc" "$d/*.h")
done
if [ ${#files[@]} -eq 0 ]; then
  echo "format-check: no C++ files under ${folders[*]} (not a git checkout?)" >&2
  exit 2
fi
if ! "$clang_format" --dry-run -Werror "${files[@]}"; then
  echo "format-check: FAILED: run clang-format -i on the files above ($("$clang_format" --version))" >&2
  exit 1
fi
echo "format-check: ${#files[@]} files under ${folders[*]} follow .clang-format ($("$clang_format" --version | head -1))"
