#!/usr/bin/env bash
# ctest entry (readme_walk): walks README.md as a newcomer would, on a fresh clone of this checkout
# (its uncommitted changes to tracked files applied; a plain copy where the tree is not a git clone): every command of its ```sh blocks runs in order
# from the clone's root, stdin from /dev/null, and must exit 0 within 120 s. Lines marked
# "# needs: ..." (a build, a GPU, a download, a server of their own) are listed and skipped; the
# build is the binary under test, placed where the README's build puts it (build/roofline), and
# scripts/demo uses it through ROOFLINE_BIN instead of building again. ../shared is linked beside the
# clone when this checkout has one, as the README expects.
set -uo pipefail
bin="$(realpath "${1:?usage: readme_walk.sh ROOFLINE_BINARY}")"
src="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if git -C "$src" rev-parse --git-dir > /dev/null 2>&1; then
  git clone -q "$src" "$work/roofline" || { echo "readme_walk: cannot clone $src"; exit 1; }
  git -C "$src" diff HEAD --binary | git -C "$work/roofline" apply --allow-empty - || { echo "readme_walk: cannot apply local changes"; exit 1; }
else  # a source tree without git: a copy of it, build folders left out
  mkdir "$work/roofline" && tar -C "$src" --exclude='./build*' -cf - . | tar -C "$work/roofline" -xf -
fi
[ -d "$src/../shared" ] && ln -s "$(realpath "$src/../shared")" "$work/shared"
cd "$work/roofline"
mkdir -p build
ln -s "$bin" build/roofline
export ROOFLINE_BIN="$bin"

# The commands: lines inside ```sh fences.
mapfile -t commands < <(awk '/^```sh$/ {on=1; next} /^```/ {on=0} on && NF' README.md)
[ "${#commands[@]}" -gt 5 ] || { echo "readme_walk: found only ${#commands[@]} commands in README.md"; exit 1; }
ran=0 skipped=0 failed=0
for cmd in "${commands[@]}"; do
  if [[ "$cmd" == *"# needs:"* ]]; then
    echo "skip ($(sed 's/.*# needs: *//' <<< "$cmd")): ${cmd%%#*}"
    skipped=$((skipped + 1))
    continue
  fi
  echo "run: $cmd"
  if timeout 120 bash -c "$cmd" < /dev/null > "$work/out.txt" 2>&1; then
    ran=$((ran + 1))
  else
    echo "FAILED (exit $?): $cmd"
    sed 's/^/  | /' "$work/out.txt" | tail -20
    failed=$((failed + 1))
  fi
done
echo "readme_walk: $ran commands ran, $skipped skipped, $failed failed"
[ "$failed" -eq 0 ] && [ "$ran" -ge 8 ]
