#!/usr/bin/env bash
# run.sh: tsar archives shipped as OCI images through a real registry, and
# run in real containers, with Debian's podman, buildah, skopeo and
# docker-registry. In order:
#
#  1. build.sh makes the build context (the worker's root filesystem, the base
#     archive, the variant as a tsar layer over it); buildah builds the
#     runtime, model and variant images (Containerfile.*) into host 1's storage
#     with --timestamp 0;
#  2. the model image is built a second time from a second build.sh run (the
#     same checkpoint packed again): its layers must have the same digests;
#  3. a registry on 127.0.0.1 (registry.yml) receives the images;
#  4. host 2, an empty container storage of its own in a network namespace
#     of its own, pulls the model image, then the variant, across a veth pair
#     (from a second registry process serving the same blobs on the veth's
#     host end; over loopback where no namespace can be made): the bytes the
#     registry served for the variant must be at most 1.05x the variant's own
#     layer plus its manifest and config;
#  5. 2 base and 2 variant workers run on host 2 with read-only root file
#     systems, one request each (workers.py): every answer must equal the same
#     model's without containers, and their summed Pss of the archives at most
#     1.05x the base archive plus the variant's own layer.
#
#   samples/container/run.sh [--work DIR] [--keep]
#
# Environment: TSAR_CLI (default build/cli/tsar), TSAR_WORKER (default
# build/samples/cpp-server/tsar_worker_cpu), TSAR_PYTHON (default .venv/bin/python).
# Exit status: 0 when every check holds, 1 when one fails, 77 when containers
# cannot run here (the reason is printed: not root, podman missing, ...).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tsar=${TSAR_CLI:-$repo/build/cli/tsar}
worker=${TSAR_WORKER:-$repo/build/samples/cpp-server/tsar_worker_cpu}
export TSAR_PYTHON=${TSAR_PYTHON:-$repo/.venv/bin/python}
work=""
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
skip() { echo "run.sh: SKIP: $*"; exit 77; }
for tool in podman buildah skopeo docker-registry runc; do
  command -v $tool >/dev/null || skip "$tool is not installed (apt-get install podman buildah skopeo docker-registry runc)"
done
[ "$(id -u)" = 0 ] || skip "needs root: rootless podman needs subordinate uid ranges this machine does not set up"
for f in "$tsar" "$worker"; do [ -x "$f" ] || { echo "run.sh: $f is not built (ninja -C build)" >&2; exit 1; }; done

made_work=0
if [ -z "$work" ]; then
  work=$(mktemp -d /var/tmp/tsar-containers.XXXXXX)
  made_work=1
fi
mkdir -p "$work"
export CONTAINERS_CONF=$here/containers.conf
# Each "host": a container storage and libpod state of its own, nothing shared
# with this machine's own podman (its /var/lib/containers, /run/libpod).
store1="--root $work/host1/root --runroot $work/host1/run --storage-driver overlay"
store2="--root $work/host2/root --runroot $work/host2/run --storage-driver overlay"
host1="$store1 --tmpdir $work/host1/tmp --network-config-dir $work/host1/net"
host2="$store2 --tmpdir $work/host2/tmp --network-config-dir $work/host2/net"
registry_pid=""
netns=""
cleanup() {
  [ -z "$registry_pid" ] || kill $registry_pid 2>/dev/null || true
  [ -z "$netns" ] || ip netns del "$netns" 2>/dev/null || true
  ip link del "tsar-a$$" 2>/dev/null || true  # a veth pair left half set up
  if [ $keep = 0 ]; then
    # Containers first (they hold overlay mounts), then what this run made.
    for h in host1 host2; do
      [ -d "$work/$h" ] || continue
      podman --root "$work/$h/root" --runroot "$work/$h/run" --storage-driver overlay --tmpdir "$work/$h/tmp" \
        rm -af >/dev/null 2>&1 || true
      buildah --root "$work/$h/root" --runroot "$work/$h/run" --storage-driver overlay rm -a >/dev/null 2>&1 || true
      podman --root "$work/$h/root" --runroot "$work/$h/run" --storage-driver overlay --tmpdir "$work/$h/tmp" \
        rmi -af >/dev/null 2>&1 || true
    done
    if [ $made_work = 1 ]; then
      rm -rf "$work"
    else
      rm -rf "$work"/host1 "$work"/host2 "$work"/ctx "$work"/ctx-again "$work"/registry "$work"/registry*.log
    fi
  fi
}
trap cleanup EXIT
step() { echo "== run.sh: $* ($(date +%T))"; }
fail=0
check() {  # check OK|FAIL WHAT
  echo "check: $2: $1"
  [ "$1" = OK ] || fail=1
}

step "build contexts (build.sh, twice: the second for the rebuild check)"
"$here/build.sh" "$tsar" "$worker" "$work/ctx"
"$here/build.sh" "$tsar" "$worker" "$work/ctx-again" >/dev/null
for f in "$here"/Containerfile.*; do cp "$f" "$work/ctx/"; cp "$f" "$work/ctx-again/"; done

step "images on host 1 (buildah bud --timestamp 0)"
# --layers: a layer per instruction (buildah's default is one for the whole file).
bud() { buildah $store1 bud -q --layers --timestamp 0 "$@" >/dev/null; }
info=$(buildah $store1 info 2>&1) || skip "buildah cannot use a container storage here: $info"
bud -f "$work/ctx/Containerfile.runtime" -t tsar/runtime:1 "$work/ctx"
probe=$(podman $host1 run --rm --read-only --network none tsar/runtime:1 2>&1 || true)
echo "$probe" | grep -q "usage: tsar_worker" || skip "podman cannot run a container here: $probe"
echo "runtime image: $(podman $host1 image inspect --format '{{.Size}}' tsar/runtime:1) bytes"
bud --build-arg RUNTIME=tsar/runtime:1 -f "$work/ctx/Containerfile.model" -t tsar/resnet18:1 "$work/ctx"
bud --build-arg MODEL=tsar/resnet18:1 -f "$work/ctx/Containerfile.variant" -t tsar/resnet18-ft:1 "$work/ctx"
bud --no-cache --build-arg RUNTIME=tsar/runtime:1 -f "$work/ctx-again/Containerfile.model" \
  -t tsar/resnet18-again:1 "$work/ctx-again"
layers() { podman $host1 image inspect --format '{{json .RootFS.Layers}}' "$1"; }
echo "model image layers (diff IDs): $(layers tsar/resnet18:1)"
[ "$(layers tsar/resnet18:1)" = "$(layers tsar/resnet18-again:1)" ] &&
  check OK "the model image rebuilt from the same checkpoint has the same layer digests" ||
  check FAIL "the model image rebuilt from the same checkpoint has the same layer digests: $(layers tsar/resnet18-again:1)"

step "registry on 127.0.0.1"
port=$("$TSAR_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
reg=127.0.0.1:$port
REGISTRY_HTTP_ADDR=$reg REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY=$work/registry \
  docker-registry serve "$here/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do
  "$TSAR_PYTHON" -c "import urllib.request as u; u.urlopen('http://$reg/v2/')" 2>/dev/null && break
  sleep 0.2
done
# Host 2's network: a namespace joined to this one by a veth pair, and a
# second registry process on the veth's host end over the same blob folder.
pull_reg=$reg
pull_log=$work/registry.log
in_host2=()
if command -v ip >/dev/null && ip netns add "tsar-h2-$$" 2>/dev/null; then
  netns=tsar-h2-$$
  net=10.$((RANDOM % 200 + 20)).$((RANDOM % 250)).0
  if ip link add "tsar-a$$" type veth peer name "tsar-b$$" &&
     ip link set "tsar-b$$" netns "$netns" &&
     ip addr add "${net%.0}.1/30" dev "tsar-a$$" && ip link set "tsar-a$$" up &&
     ip netns exec "$netns" ip addr add "${net%.0}.2/30" dev "tsar-b$$" &&
     ip netns exec "$netns" ip link set "tsar-b$$" up && ip netns exec "$netns" ip link set lo up; then
    pull_reg=${net%.0}.1:$port
    export NO_PROXY="${NO_PROXY:+$NO_PROXY,}${net%.0}.1" no_proxy="${no_proxy:+$no_proxy,}${net%.0}.1"
    pull_log=$work/registry-veth.log
    REGISTRY_HTTP_ADDR=$pull_reg REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY=$work/registry \
      docker-registry serve "$here/registry.yml" >"$pull_log" 2>&1 &
    registry_pid="$registry_pid $!"
    in_host2=(ip netns exec "$netns")
    for _ in $(seq 50); do
      "${in_host2[@]}" "$TSAR_PYTHON" -c "import urllib.request as u; u.urlopen('http://$pull_reg/v2/')" 2>/dev/null && break
      sleep 0.2
    done
    echo "host 2: network namespace $netns, pulling from $pull_reg across a veth pair"
  else
    echo "host 2: could not set up a veth pair; pulling over loopback"
  fi
else
  echo "host 2: no network namespace can be made here; pulling over loopback"
fi
push() { podman $host1 push -q --tls-verify=false "$1" "docker://$reg/$2"; }
push tsar/resnet18:1 tsar/resnet18:1
push tsar/resnet18-ft:1 tsar/resnet18-ft:1
push tsar/resnet18-again:1 tsar/resnet18-again:1
manifest() { skopeo inspect --raw --tls-verify=false "docker://$reg/$1"; }
blobs() { manifest "$1" | "$TSAR_PYTHON" -c 'import json, sys; print(" ".join(l["digest"][7:19] for l in json.load(sys.stdin)["layers"]))'; }
echo "model image layers as pushed (compressed): $(blobs tsar/resnet18:1)"
[ "$(blobs tsar/resnet18:1)" = "$(blobs tsar/resnet18-again:1)" ] &&
  check OK "the rebuilt model image pushes the same blobs" ||
  check FAIL "the rebuilt model image pushes the same blobs: $(blobs tsar/resnet18-again:1)"

step "host 2: pull the model, then the variant (from $pull_reg)"
log_bytes() {  # bytes of GET responses in the pull registry's access log from line $1 on
  tail -n +"$1" "$pull_log" | awk '$6 == "\"GET" {s += $10} END {print s + 0}'
}
pull() { "${in_host2[@]}" podman $host2 pull -q --tls-verify=false "docker://$pull_reg/$1" >/dev/null; }
mark=$(($(wc -l <"$pull_log") + 1))
pull tsar/resnet18:1
model_pulled=$(log_bytes $mark)
mark=$(($(wc -l <"$pull_log") + 1))
pull tsar/resnet18-ft:1
variant_pulled=$(log_bytes $mark)
read -r own meta < <(manifest tsar/resnet18-ft:1 | "$TSAR_PYTHON" -c '
import json, sys
raw = sys.stdin.buffer.read(); m = json.loads(raw)
print(m["layers"][-1]["size"], len(raw) + m["config"]["size"])')
echo "host 2 pulled $model_pulled bytes for the model image, then $variant_pulled for the variant;"
echo "the variant's own layer is $own bytes (compressed), its manifest and config $meta"
"$TSAR_PYTHON" -c "import sys; sys.exit(0 if $variant_pulled <= 1.05 * $own + $meta else 1)" &&
  check OK "the variant pulled over the model: $variant_pulled <= 1.05 x $own + $meta bytes" ||
  check FAIL "the variant pulled over the model: $variant_pulled > 1.05 x $own + $meta bytes"

step "host 2: 2 base and 2 variant workers, read-only root file systems"
own_bytes=$(($(stat -c %s "$work/ctx/models/resnet18.tsar") + $(stat -c %s "$work/ctx/models/resnet18-ft.tsar")))
if "$TSAR_PYTHON" "$here/workers.py" --podman "podman $host2" --worker "$worker" --ref "$work/ctx/ref" \
     --base "$pull_reg/tsar/resnet18:1" 2 --variant "$pull_reg/tsar/resnet18-ft:1" 2 --own-bytes $own_bytes; then
  check OK "answers equal the models' without containers; one copy of the weights in RAM"
else
  check FAIL "answers equal the models' without containers; one copy of the weights in RAM"
fi
[ $fail = 0 ] && echo "run.sh: every check holds" || echo "run.sh: a check failed"
exit $fail
