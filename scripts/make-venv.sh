#!/usr/bin/env bash
# make-venv.sh DIR: a virtual environment from Debian's python3 with the
# packages of scripts/requirements.txt, made once and remade only when that
# file changes (DIR/.tsar-requirements holds the copy it was made from).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
req=scripts/requirements.txt
if [ -x "$venv/bin/python" ] && cmp -s "$req" "$venv/.tsar-requirements"; then
  exit 0
fi
start=$(date +%s)
echo "setup: making $venv (torch and the test tools, scripts/requirements.txt; a few GB)"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -r "$req"
cp "$req" "$venv/.tsar-requirements"
echo "setup: $venv ready in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
