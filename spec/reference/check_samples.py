#!/usr/bin/python3
"""check_samples.py SAMPLES_DIR: runs the reference decoder (tsar_ref.py, written
from spec/FORMAT.md alone) over every sample: valid ones must decode to their
expected.json, invalid ones must fail with the code, offset and message of
invalid/MANIFEST.tsv. For a valid sample it compares the storages, tensors, the number of
metadata records, the format version and, for format 1.1, every value record and link of
the value tree (§4.10). Exit 0 when the spec and the samples agree."""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tsar_ref import TsarError, decode, hexb, xxh3  # noqa: E402

ROLES = {"tensor": 0, "parameter": 1, "buffer": 2, "sparse_component": 3}
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
          "complex32", "complex64", "complex128", "float8_e5m2", "float8_e4m3fn", "uint16", "uint32", "uint64"]


def main():
    root = sys.argv[1]
    failures = []
    lines = open(os.path.join(root, "invalid", "MANIFEST.tsv")).read().splitlines()
    for line in lines[1:]:
        cols = line.split("\t")
        name, code, off, msg = cols[:4]
        data = open(os.path.join(root, "invalid", name), "rb").read()
        try:
            decode(data, name)
            failures.append(f"{name}: decoded, expected {code}")
        except TsarError as e:
            if (e.code, str(e.off), str(e)) != (code, off, msg):
                failures.append(f"{name}: got {e.code} {e.off} {e}\n  want {code} {off} {msg}")
    for path in sorted(glob.glob(os.path.join(root, "valid", "*.tsar"))):
        data = open(path, "rb").read()
        r = decode(data, os.path.basename(path))
        want = json.load(open(path[:-5] + ".expected.json"))
        ok = want["file_size"] == len(data) and len(want["storages"]) == len(r["storages"])
        for s, (off, nbytes, h) in zip(want["storages"], r["storages"]):
            ok &= (s["offset"], s["nbytes"], s["xxh3"]) == (off, nbytes, f"{h:016x}") and xxh3(data[off:off + nbytes]) == h
        ok &= len(want["tensors"]) == len(r["tensors"])
        for t, rt in zip(want["tensors"], r["tensors"]):
            ok &= t["name"] == rt["name"].decode() and t["entry"] == r["entries"][rt["entry"]][0].decode()
            ok &= t["dtype"] == DTYPES[rt["dtype"] - 1] and t["shape"] == rt["sizes"] and t["strides"] == rt["strides"]
            ok &= ROLES[t["role"]] == rt["role"] and t["requires_grad"] == rt["rg"] and t["storage_offset"] == rt["sof"]
        ok &= len(want["metadata"]) == len(r["metadata"])
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
        if not ok:
            failures.append(f"{path}: does not match its expected.json")
    if failures:
        print("\n".join(failures))
        return 1
    print(f"ok: {len(lines) - 1} invalid and {len(glob.glob(os.path.join(root, 'valid', '*.tsar')))} valid samples agree with the spec")
    return 0


if __name__ == "__main__":
    sys.exit(main())
