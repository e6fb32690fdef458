#!/usr/bin/env bash
# check_format_purity.sh SOURCE_DIR: format/ is pure C++ (STYLE.md §1): no
# LibTorch, no file or mapping I/O. Fails listing any offending include.
set -euo pipefail
bad=$(grep -nE '#include *[<"](torch/|ATen/|c10/|caffe2/|sys/mman\.h|fcntl\.h|unistd\.h|fstream)' \
  "$1"/format/*.h "$1"/format/*.cc || true)
if [ -n "$bad" ]; then
  echo "format/ must not include LibTorch or I/O headers:"
  echo "$bad"
  exit 1
fi
echo "format/ is pure: std and xxHash only"
