#!/usr/bin/env bash
# install-wheel-beside.sh PYTHON WHEEL DIR: a fresh virtual environment in DIR
# beside PYTHON's torch, with WHEEL installed (pip install --no-deps, as a
# user of another torch does). The packages of PYTHON's environment are linked
# into it, not reinstalled, so torch lies at DIR/lib/pythonX.Y/site-packages/torch
# as in a venv of its own (the wheel's run paths are relative to the venv).
set -euo pipefail
usage="usage: install-wheel-beside.sh PYTHON WHEEL DIR"
python=${1:?$usage}
wheel=${2:?$usage}
dir=${3:?$usage}
/usr/bin/python3 -m venv "$dir"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
fresh_site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for entry in "$site"/*; do
  name=$(basename "$entry")
  case $name in pip|pip-*|tsar|tsar-*|_distutils_hack|distutils-precedence.pth|setuptools|setuptools-*) continue ;; esac
  [ -e "$fresh_site/$name" ] || ln -s "$entry" "$fresh_site/$name"
done
"$dir/bin/python" -m pip install -q --no-deps --no-index "$wheel"
