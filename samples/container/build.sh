#!/usr/bin/env bash
# build.sh TSAR_CLI [OUTDIR]: makes the files the Dockerfile COPYs, in OUTDIR
# (default samples/container/build/, ignored by git):
#
#   OUTDIR/models/resnet18.tsar     the weights (the layer of their own)
#   OUTDIR/resnet18_arch_ts.pt      the architecture, without weights
#
# Run it before `docker build`. The outputs are deterministic: the same model
# gives the same bytes (tsar pack writes no timestamps), and each file gets
# mode 0444 and mtime SOURCE_DATE_EPOCH (default 0), the metadata that goes
# into the image layer's tar, so a rebuild produces the same layer digest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tsar=${1:?usage: build.sh TSAR_CLI [OUTDIR]}
out=${2:-$here/build}
epoch=${SOURCE_DATE_EPOCH:-0}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"${TSAR_PYTHON:-$here/../../.venv/bin/python}" "$here/make_model.py" "$work"   # torch: the project's .venv
mkdir -p "$out/models"
rm -f "$out/models/resnet18.tsar" "$out/resnet18_arch_ts.pt"
"$tsar" pack -q "$work/resnet18_ts.pt" -o "$out/models/resnet18.tsar" --arch "$out/resnet18_arch_ts.pt"
"$tsar" verify "$out/models/resnet18.tsar" > /dev/null
chmod 0444 "$out/models/resnet18.tsar" "$out/resnet18_arch_ts.pt"
touch -h -d "@$epoch" "$out/models/resnet18.tsar" "$out/resnet18_arch_ts.pt"
echo "build.sh: $(sha256sum "$out/models/resnet18.tsar" | cut -c1-16)...  $out/models/resnet18.tsar"
