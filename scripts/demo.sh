#!/usr/bin/env bash
# demo.sh: set-up (scripts/setup.sh), then the main job on the built-in sample
# model: make resnet18 with Python, pack it, inspect and verify it, then run 8
# workers that map it zero-copy next to 8 that load it the usual way. Where
# the torch in .venv can, the archive also carries the model compiled by
# AOTInductor (no weights in it) and the tsar workers serve that, with no
# TorchScript (docs/programs.md); otherwise they bind TorchScript's architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
work=$(mktemp -d /tmp/tsar-demo-XXXXXX)
trap 'rm -rf "$work"' EXIT
PYTHONPATH=build/python .venv/bin/python samples/cpp-server/make_model.py "$work"
# The weights into the archive, the architecture without them for the workers.
build/cli/tsar pack "$work/resnet18_ts.pt" -o "$work/resnet18.tsar" --arch "$work/resnet18_arch_ts.pt"
if [ -e "$work/resnet18.aoti.pt2" ]; then
  # The compiled program joins the archive, checked against its weights.
  PYTHONPATH=build/python .venv/bin/python -c 'import sys, tsar
tsar.pack(sys.argv[1], sys.argv[1], programs={"model": sys.argv[2]})' \
    "$work/resnet18.tsar" "$work/resnet18.aoti.pt2"
fi
build/cli/tsar inspect "$work/resnet18.tsar" | sed -n 1,6p   # (sed, not head: no SIGPIPE under pipefail)
build/cli/tsar verify "$work/resnet18.tsar"
samples/cpp-server/run_workers.sh build "$work" "${TSAR_DEMO_WORKERS:-8}"
