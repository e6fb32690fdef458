#!/usr/bin/python3
"""check_samples.py [SAMPLES_DIR]: runs the reference decoder (tsar_ref.py, written
from spec/FORMAT.md alone) over every sample: valid ones must decode to their
expected.json, invalid ones must fail with the code, offset and message of
invalid/MANIFEST.tsv. For a valid sample it compares the storages, tensors, the number of
metadata records, the format version, for format 1.1 every value record and link of
the value tree (§4.10), and for a layer (format 1.2, §4.11) its layer record and base
storage table; it then opens the layer with its base (found next to it, B1-B6) and
verifies every storage (R76), base storages included. For a tensor-parallel archive
(format 1.4, §4.12) it compares tp_world and each tensor's shard_dim, and checks the
writer rule that the padding between a sharded tensor's slices is zero. It compares every
sparse record with the "sparse" array of expected.json, a tensor group's (format 1.5, §4.13)
outer dtype and strides included, and checks each group's description against the grammar
of §4.13.2 (group_description). The samples of
layers/MANIFEST.tsv are opened from inside layers/ (so that paths are as its messages give them), with no
search list, and must fail resolution with the code, offset and message listed (§8.4).
SAMPLES_DIR defaults to the repository's samples/. Exit 0 when the spec and the samples agree."""
import contextlib
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tsar_ref import (DTNAME, TsarError, attached_files, decode, full_bytes, group_description, hexb,  # noqa: E402
                      open_archive, shard_layout, storage_bytes, verify, xxh3)

ROLES = {"tensor": 0, "parameter": 1, "buffer": 2, "sparse_component": 3}
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
          "complex32", "complex64", "complex128", "float8_e5m2", "float8_e4m3fn", "uint16", "uint32", "uint64",
          "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"]


@contextlib.contextmanager
def working_directory(d):
    old = os.getcwd()
    os.chdir(d)
    try:
        yield
    finally:
        os.chdir(old)


def check_manifest(path, run, failures, missing, label):
    """Runs run(name) for each line of a MANIFEST.tsv, expecting TsarError with its
    code, offset (empty for an error without one) and message. Returns the line count.
    `label`: the manifest's directory, as failures name it."""
    lines = open(path).read().splitlines()
    for line in lines[1:]:
        name, code, off, msg = line.split("\t")[:4]
        if not os.path.exists(os.path.join(os.path.dirname(path), name)):
            missing.append(os.path.join(label, name))
            continue
        try:
            run(name)
            failures.append(f"{os.path.join(label, name)}: accepted, expected {code}")
        except TsarError as e:
            if (e.code, "" if e.off is None else str(e.off), str(e)) != (code, off, msg):
                failures.append(f"{os.path.join(label, name)}: got {e.code} {e.off} {e}\n  want {code} {off} {msg}")
    return len(lines) - 1


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "samples")
    failures, missing = [], []
    invalid = check_manifest(os.path.join(root, "invalid", "MANIFEST.tsv"),
                             lambda name: decode(open(os.path.join(root, "invalid", name), "rb").read(), name),
                             failures, missing, os.path.join(root, "invalid"))
    # §8.4: resolution failures, opened from inside layers/ with no search list.
    layers_dir = os.path.join(root, "layers")
    resolved = 0
    if os.path.exists(os.path.join(layers_dir, "MANIFEST.tsv")):
        with working_directory(layers_dir):
            resolved = check_manifest("MANIFEST.tsv", lambda name: open_archive(name, base_dirs=[], environ={}),
                                      failures, missing, layers_dir)
            # The other files there are the bases some of them name: valid archives.
            listed = {line.split("\t")[0] for line in open("MANIFEST.tsv").read().splitlines()[1:]}
            for name in sorted(set(glob.glob("*.tsar")) - listed):
                try:
                    decode(open(name, "rb").read(), name)
                except TsarError as e:
                    failures.append(f"{os.path.join(layers_dir, name)}: {e}")
    else:
        missing.append(os.path.join(layers_dir, "MANIFEST.tsv"))
    for path in sorted(glob.glob(os.path.join(root, "valid", "*.tsar"))):
        data = open(path, "rb").read()
        r = decode(data, os.path.basename(path))
        if not os.path.exists(path[:-5] + ".expected.json"):
            missing.append(path[:-5] + ".expected.json")
            continue
        want = json.load(open(path[:-5] + ".expected.json"))
        # Own storages have an offset; a layer's base storages (§4.11.1) a base_storage instead.
        own = [s for s in want["storages"] if "base_storage" not in s]
        based = [s for s in want["storages"] if "base_storage" in s]
        ok = want["file_size"] == len(data) and len(own) == len(r["storages"]) and len(based) == len(r["base_storages"])
        ok &= [s["id"] for s in want["storages"]] == list(range(len(want["storages"])))
        for s, (off, nbytes, h) in zip(own, r["storages"]):
            ok &= (s["offset"], s["nbytes"], s["xxh3"]) == (off, nbytes, f"{h:016x}") and xxh3(data[off:off + nbytes]) == h
        for s, (bs, nbytes, h) in zip(based, r["base_storages"]):
            ok &= (s["base_storage"], s["nbytes"], s["xxh3"]) == (bs, nbytes, f"{h:016x}")
        ok &= len(want["tensors"]) == len(r["tensors"])
        for t, rt in zip(want["tensors"], r["tensors"]):
            ok &= t["name"] == rt["name"].decode() and t["entry"] == r["entries"][rt["entry"]][0].decode()
            ok &= t.get("storage", rt["storage"]) == rt["storage"]
            ok &= t["dtype"] == DTYPES[rt["dtype"] - 1] and t["shape"] == rt["sizes"] and t["strides"] == rt["strides"]
            ok &= ROLES[t["role"]] == rt["role"] and t["requires_grad"] == rt["rg"] and t["storage_offset"] == rt["sof"]
            ok &= t.get("shard_dim") == rt.get("shard_dim")  # §4.12: only on sharded tensors
        ok &= len(want["metadata"]) == len(r["metadata"])
        # Sparse records (§4.6) and tensor groups (§4.13.1): every field expected.json lists;
        # a group has its outer dtype and strides too, and a description that the grammar
        # of §4.13.2 accepts.
        ok &= len(want.get("sparse", [])) == len(r["sparse"])
        for w, sp in zip(want.get("sparse", []), r["sparse"]):
            ok &= (w["entry"], w["name"], w["layout"], w["coalesced"], w["shape"], w["first_component"],
                   w["component_count"]) == (sp["entry"], sp["name"].decode(), sp["layout_name"], sp["coalesced"],
                                             sp["sizes"], sp["fc"], sp["cc"])
            ok &= w.get("dtype") == (DTNAME[sp["dtype"]] if sp["dtype"] is not None else None)
            ok &= w.get("strides") == sp.get("strides")
        for i, sp in enumerate(r["sparse"]):
            if sp["layout_name"] == "group":
                try:
                    group_description(r, i)
                except TsarError as e:
                    failures.append(f"{path}: {e}")
        # §4.7.1: the attached files, by the key grammar alone.
        ok &= want.get("files", {}) == {n.decode(): v.hex() for n, v in attached_files(r).items()}
        h = r["header"]
        ok &= want.get("format_version", "1.0") == f"{h['major']}.{h['minor']}"
        # The value tree (§4.10, format 1.1): every value record and link, as expected.json lists them.
        ok &= len(want.get("values", [])) == len(r["values"]) and want.get("links", []) == r["links"]
        for w, v in zip(want.get("values", []), r["values"]):
            ok &= (w["kind"], w["flags"], w["count"], w["first_link"]) == (v["kind"], v["flags"], v["count"], v["first_link"])
            if "bytes" in w:
                ok &= (w["bytes"], w["value_length"]) == (hexb(v["bytes"]), len(v["bytes"]))
            else:
                ok &= w["value"] == v["value"]
        # A layer (§4.11): its layer record, then the archive opened with its base (found
        # next to it, B1-B6), every storage verified where its bytes are (R76).
        layer = r["layer"]
        ok &= ("layer" in want) == (layer is not None)
        if layer is not None and "layer" in want:
            w = want["layer"]
            ok &= (w["base_path"], w["base_id"], w["depth"], w["base_storage_count"]) == (
                layer["base_path"].decode(), f"{layer['base_id_high']:016x}{layer['base_id_low']:016x}",
                layer["depth"], layer["base_storage_count"])
            ok &= w.get("base_file_size", layer["base_file_size"]) == layer["base_file_size"]
            try:
                verify(open_archive(path, base_dirs=[], environ={}))
            except TsarError as e:
                failures.append(f"{path}: {e}")
        # A tensor-parallel archive (§4.12): tp_world, and the writer rule that the bytes
        # between a sharded tensor's slices are zero (readers do not check it).
        ok &= want.get("tp_world") == r.get("tp_world")
        if "tp_world" in r:
            a = open_archive(path, base_dirs=[], environ={})
            for i, t in enumerate(r["tensors"]):
                if "shard_dim" not in t: continue
                L, b = shard_layout(r, i), storage_bytes(a, t["storage"])
                for q in range(L["world"] - 1):
                    gap = b[q * L["block_stride"] + L["slice_bytes"]: (q + 1) * L["block_stride"]]
                    if any(gap): failures.append(f"{path}: tensor #{i}: non-zero padding after slice {q}")
                # §4.12.3: slices back to back with one outer row are the C-order bytes.
                if L["outer"] <= 1 and L["block_stride"] == L["slice_bytes"]:
                    ok &= full_bytes(a, i) == b
        if not ok:
            failures.append(f"{path}: does not match its expected.json")
    if missing:
        print("missing (not checked): " + ", ".join(missing))
    if failures:
        print("\n".join(failures))
        return 1
    print(f"ok: {invalid} invalid, {resolved} layer resolution and {len(glob.glob(os.path.join(root, 'valid', '*.tsar')))} "
          "valid samples agree with the spec")
    return 0


if __name__ == "__main__":
    sys.exit(main())
