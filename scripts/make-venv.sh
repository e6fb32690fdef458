#!/usr/bin/env bash
# make-venv.sh DIR [REQUIREMENTS...]: a virtual environment from Debian's
# python3 with the packages of the requirements files, by default
# scripts/requirements.txt (torch, the test tools, the peers the benchmark
# compares with) and scripts/requirements-peers.txt (the streaming peers of
# bench/peers); made once and remade only when a file changes
# (DIR/.tsar-requirements holds the copy it was made from). A file whose
# first line is "# make-venv: --no-deps" is a complete pinned set: the whole
# install then runs with pip's --no-deps, which resolves nothing
# (scripts/requirements-vllm.txt: vLLM's CPU build pins a torch PyPI lacks).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
shift || true
reqs=("$@")
[ ${#reqs[@]} -gt 0 ] || reqs=(scripts/requirements.txt scripts/requirements-peers.txt)
if [ -x "$venv/bin/python" ] && cat "${reqs[@]}" | cmp -s - "$venv/.tsar-requirements"; then
  exit 0
fi
no_deps=()
for req in "${reqs[@]}"; do
  [ "$(head -n 1 "$req")" != "# make-venv: --no-deps" ] || no_deps=(--no-deps)
done
start=$(date +%s)
echo "setup: making $venv (torch and the test tools of ${reqs[*]}; a few GB)"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "${no_deps[@]}" $(printf -- '-r %s ' "${reqs[@]}")
cat "${reqs[@]}" > "$venv/.tsar-requirements"
echo "setup: $venv ready in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
