#!/usr/bin/env bash
# Here, before a call to the lent GPU machine: the wheels of what commlab imports there that its
# image lacks (it has torch, numpy, psutil, pandas, scipy, tqdm, pytest and its plugins; nothing
# can be downloaded there), for its Python 3.12, into .whl/ (ignored by git).  The call carries
# .whl and runs benchmarks/gpu_check.sh, which installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
# tomli-w: the core's one pure-Python package beyond the image's (the run folder's config.toml).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --platform any -d .whl "tomli-w>=1.0"
ls -l .whl
