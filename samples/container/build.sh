#!/usr/bin/env bash
# build.sh TSAR_CLI WORKER [OUTDIR]: makes the build context of the
# Containerfiles in OUTDIR (default samples/container/build/, ignored by git):
#
#   OUTDIR/rootfs/                     the runtime image's files: the worker at
#                                      /opt/tsar/bin/tsar_worker, every library it
#                                      loads in /opt/tsar/lib, the ELF loader
#   OUTDIR/models/resnet18.tsar        the base model's weights
#   OUTDIR/models/resnet18-ft.tsar     the fine-tuned variant: a tsar layer over
#                                      resnet18.tsar holding only its new head
#   OUTDIR/models/resnet18_arch_ts.pt  the architecture, without weights
#   OUTDIR/ref/resnet18_ts.pt, resnet18_ft_ts.pt  the two models with their
#                                      weights, as torch.jit.save wrote them
#                                      (run.sh's answers without containers)
#
# WORKER is tsar_worker_cpu (samples/cpp-server: the sample worker linked
# against LibTorch's CPU libraries only), so the closure is about 0.45 GB.
# Outputs are deterministic: the same model gives the same bytes (tsar pack
# writes no timestamps), and every file gets mode 0444 (0555 for programs) and
# mtime SOURCE_DATE_EPOCH (default 0), so a rebuild gives the same layers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tsar=${1:?usage: build.sh TSAR_CLI WORKER [OUTDIR]}
worker=${2:?usage: build.sh TSAR_CLI WORKER [OUTDIR]}
out=${3:-$here/build}
epoch=${SOURCE_DATE_EPOCH:-0}
py=${TSAR_PYTHON:-$here/../../.venv/bin/python}   # torch: the project's .venv

rm -rf "$out/rootfs" "$out/models" "$out/ref"
mkdir -p "$out/rootfs/opt/tsar/bin" "$out/rootfs/opt/tsar/lib" "$out/rootfs/lib64" "$out/models" "$out/ref"
# TorchScript writes a module's constants in Python's set order: a fixed hash
# seed makes the same model the same .pt (and tsar pack --arch of it the same).
PYTHONHASHSEED=0 "$py" "$here/make_model.py" "$out/ref" 2> >(grep -v -i warn >&2)
"$tsar" pack -q "$out/ref/resnet18_ts.pt" -o "$out/models/resnet18.tsar" --arch "$out/models/resnet18_arch_ts.pt"
"$tsar" pack -q "$out/ref/resnet18_ft_ts.pt" --base "$out/models/resnet18.tsar" -o "$out/models/resnet18-ft.tsar"
"$tsar" verify "$out/models/resnet18.tsar" > /dev/null
"$tsar" verify "$out/models/resnet18-ft.tsar" > /dev/null

# The runtime: the worker and what the dynamic loader resolves for it here.
cp "$worker" "$out/rootfs/opt/tsar/bin/tsar_worker"
ldd "$worker" | awk '/=> \// {print $3}' | while read -r lib; do cp -L "$lib" "$out/rootfs/opt/tsar/lib/"; done
if ldd "$worker" | grep -q "not found"; then
  echo "build.sh: $worker needs libraries that are not found here:" >&2
  ldd "$worker" | grep "not found" >&2
  exit 1
fi
cp -L /lib64/ld-linux-x86-64.so.2 "$out/rootfs/lib64/"

find "$out/rootfs" "$out/models" "$out/ref" -type f -exec chmod 0444 {} +
chmod 0555 "$out/rootfs/opt/tsar/bin/tsar_worker" "$out/rootfs/lib64/ld-linux-x86-64.so.2"
find "$out/rootfs" "$out/models" "$out/ref" -exec touch -h -d "@$epoch" {} +
echo "build.sh: $out: runtime $(du -sh "$out/rootfs" | cut -f1), base $(stat -c %s "$out/models/resnet18.tsar") bytes, variant $(stat -c %s "$out/models/resnet18-ft.tsar") bytes"
