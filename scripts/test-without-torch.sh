#!/usr/bin/env bash
# test-without-torch.sh [BUILD_DIR] [REFERENCE_TSAR]: builds tsar with
# -DTSAR_WITH_TORCH=OFF (format/, the reader, the packer, the lean CLI; no
# LibTorch headers or libraries) and checks that it packs torch.save,
# safetensors and HDF5 files, inspects, verifies and exports them, writing the
# same bytes as REFERENCE_TSAR (the LibTorch build's tsar), and that it says
# clearly what it cannot do (a TorchScript input, export to .pt). Fixtures
# are made with .venv/bin/python (torch, h5py).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-notorch}
reference=${2:-build/cli/tsar}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTSAR_WITH_TORCH=OFF \
  -DTSAR_BUILD_TESTS=OFF -DTSAR_BUILD_BENCH=OFF > /dev/null
cmake --build "$build" -j "$(nproc)"
t=$build/cli/tsar
if ldd "$t" | grep -E 'libtorch|libc10'; then echo "FAIL: $t links LibTorch"; exit 1; fi

d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"${TSAR_PYTHON:-.venv/bin/python}" - "$d" <<'PY'
import json, struct, sys
import h5py, numpy as np, torch
d = sys.argv[1]
torch.manual_seed(0)
w = torch.randn(16, 8)
torch.save({"a": w, "tied": w, "t": w.t(), "h": torch.randn(5).half(), "i": torch.arange(3)}, f"{d}/sd.pt")
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
m(torch.randn(3, 4)).sum().backward(); opt.step()
torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 1}, f"{d}/ckpt.pt")
hdr = {"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(f"{d}/m.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + np.arange(4, dtype="<f4").tobytes())
with h5py.File(f"{d}/m.h5", "w") as f:
    f["layer/weight"] = np.arange(6, dtype="f4").reshape(2, 3)
torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), f"{d}/ts.pt")
PY

for input in sd.pt ckpt.pt m.safetensors m.h5; do
  for dtype in "" float16; do
    "$t" pack -q ${dtype:+--dtype $dtype} "$d/$input" -o "$d/a.tsar"
    "$reference" pack -q ${dtype:+--dtype $dtype} "$d/$input" -o "$d/b.tsar"
    cmp "$d/a.tsar" "$d/b.tsar" || { echo "FAIL: $input ${dtype}: not the bytes of $reference"; exit 1; }
    "$t" verify "$d/a.tsar" > /dev/null
    "$t" inspect --json "$d/a.tsar" > /dev/null
    "$t" export -q --materialize-shared "$d/a.tsar" -o "$d/a.safetensors"
    "$t" export -q "$d/a.tsar" -o "$d/a.h5" 2> /dev/null || true  # h5 cannot hold every name
  done
done
expect_refusal() {  # expect_refusal NEEDLE COMMAND...: exit 3 and NEEDLE on stderr
  local needle=$1; shift
  if "$@" 2> "$d/err"; then echo "FAIL: $* succeeded"; exit 1; fi
  grep -qF "$needle" "$d/err" || { echo "FAIL: $*: expected '$needle', got: $(cat "$d/err")"; exit 1; }
}
expect_refusal "is a TorchScript archive: reading it needs LibTorch, and this tsar was built without it" \
  "$t" pack "$d/ts.pt" -o "$d/ts.tsar"
expect_refusal "writing a torch.save file needs LibTorch" "$t" export "$d/a.tsar" -o "$d/back.pt"
[ ! -e "$d/ts.tsar" ] && [ ! -e "$d/back.pt" ]
echo "test-without-torch: $t packs, reads and exports without LibTorch, with the bytes of $reference"
