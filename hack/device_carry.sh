#!/usr/bin/env bash
# Puts what bench/gpu_checkpoint.py needs on a device machine and that machine lacks under .device/
# (git-ignored): boto3's wheels for its Python 3.12, and SeaweedFS's `weed` binary from this venv,
# xz-compressed (153 MB plain; the device tool carries 64 MiB at most).
# torch, transformers, safetensors and pyyaml are there already (/work/.library/device/KINDS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .device && mkdir -p .device/whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .device/whl \
  boto3 botocore s3transfer jmespath
xz -9 -T2 --stdout .venv/bin/weed > .device/weed.xz
du -sh .device
