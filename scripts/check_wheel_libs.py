#!/usr/bin/env python3
"""check_wheel_libs.py WHEEL [--torch-lib DIR]: checks that every shared
library each ELF file of a tsar wheel needs (its DT_NEEDED entries) is

  - in the wheel itself (auditwheel's tsar.libs/, the wheel's own lib/),
  - glibc (libc, libm, libpthread, libdl, librt, ld-linux...),
  - the C++ runtime (libstdc++, libgcc_s), or
  - torch's (libtorch*, libc10*: the wheel requires torch, which brings them;
    with --torch-lib, each must also be a file there),

so that the wheel runs on a Linux machine that has none of the -dev packages
tsar is built with (issue 43, item 3). Prints each file with what it needs and
where that comes from, the wheel's size and its platform tag; exits 1 naming
every library that would have to come from anywhere else.
"""
import argparse
import hashlib
import os
import re
import sys
import tempfile
import zipfile

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

GLIBC = re.compile(r"^(libc|libm|libpthread|libdl|librt|libutil|libresolv|libanl|libmvec)\.so\.\d+$"
                   r"|^ld-linux(-x86-64|-aarch64)?\.so\.\d+$")
CXX_RUNTIME = {"libstdc++.so.6", "libgcc_s.so.1"}
TORCH = re.compile(r"^(libtorch[a-z_]*|libc10[a-z_]*|libshm)\.so(\.\d+)*$")


def needed(path):
    """(DT_NEEDED list, RUNPATH or RPATH) of an ELF file, or None if it is not one."""
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return None
        f.seek(0)
        elf = ELFFile(f)
        libs, runpath = [], ""
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        libs.append(tag.needed)
                    elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                        runpath = getattr(tag, "runpath", "") or getattr(tag, "rpath", "")
        return libs, runpath


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("--torch-lib", help="torch's lib/ folder: torch's libraries must be there")
    args = ap.parse_args()
    tag = os.path.basename(args.wheel)[:-len(".whl")].split("-")[-1]
    size = os.path.getsize(args.wheel)
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(args.wheel) as z:
            z.extractall(tmp)
        files = [os.path.join(d, n) for d, _, names in os.walk(tmp) for n in names]
        in_wheel = {os.path.basename(f) for f in files}
        elves = 0
        seen = {}  # an ELF file's bytes -> its path: a wheel holds no symbolic links
        for f in sorted(files):
            info = needed(f)
            if info is None:
                continue
            elves += 1
            with open(f, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            if digest in seen:
                bad.append(f"{os.path.relpath(f, tmp)} is {seen[digest]} again (a symbolic link "
                           "made a copy)")
            seen.setdefault(digest, os.path.relpath(f, tmp))
            libs, runpath = info
            where = []
            for lib in libs:
                if lib in in_wheel:
                    where.append(f"{lib} (wheel)")
                elif GLIBC.match(lib):
                    where.append(f"{lib} (glibc)")
                elif lib in CXX_RUNTIME:
                    where.append(f"{lib} (C++ runtime)")
                elif TORCH.match(lib) and (not args.torch_lib or os.path.exists(
                        os.path.join(args.torch_lib, lib))):
                    where.append(f"{lib} (torch)")
                else:
                    where.append(f"{lib} (ELSEWHERE)")
                    bad.append(f"{os.path.relpath(f, tmp)} needs {lib}")
            print(f"{os.path.relpath(f, tmp)}: {', '.join(where) or 'nothing'}"
                  + (f"; run path {runpath}" if runpath else ""))
    print(f"wheel: {os.path.basename(args.wheel)}, {size / 2**20:.1f} MiB, platform tag {tag}, "
          f"{elves} ELF files")
    if bad:
        print("FAIL: libraries from outside the wheel, glibc, the C++ runtime and torch, or "
              "one file twice:\n  " + "\n  ".join(bad))
        return 1
    if elves == 0:
        print("FAIL: no ELF file in the wheel")
        return 1
    print("check_wheel_libs: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
