#!/usr/bin/env bash
# Puts what bench/gpu/gpu_checkpoint.py and bench/gpu/gpu_resume.py need on a device machine, and that
# machine lacks, under .device/ (git-ignored), inside the device tool's 64 MiB:
# - site.tar.xz: packages for its Python 3.12, installed here with --target:
#   - boto3 (not there), with botocore's service models cut to S3 and STS (the wheel is 17 MB,
#     nearly all of it the models of ~400 other AWS services that botocore loads only by name);
#   - uv.lock's transformers, huggingface-hub and tokenizers: the machine has transformers 5.x,
#     and the benchmarks measure the versions the project ships.
# - weed.xz: SeaweedFS's `weed` binary from this venv, xz-compressed (153 MB plain).
# torch, safetensors, accelerate and pyyaml are there already (/work/.library/device/KINDS.md).
# On the machine: mkdir -p /tmp/site && tar -xJf .device/site.tar.xz -C /tmp/site (see the benches' docstrings).
set -euo pipefail
cd "$(dirname "$0")/.."
locked() { awk -v n="$1" '$0 == "name = \"" n "\"" {getline; gsub(/[^0-9.]/, ""); print; exit}' uv.lock; }
rm -rf .device && mkdir -p .device/site
python3 -m pip install --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --target .device/site \
  boto3 botocore s3transfer jmespath \
  "transformers==$(locked transformers)" "huggingface-hub==$(locked huggingface-hub)" "tokenizers==$(locked tokenizers)"
find .device/site/botocore/data -mindepth 1 -maxdepth 1 -type d ! -name s3 ! -name sts -exec rm -rf {} +
find .device/site -name __pycache__ -type d -exec rm -rf {} +
tar -C .device/site -cJf .device/site.tar.xz . && rm -rf .device/site
xz -9 -T2 --stdout .venv/bin/weed > .device/weed.xz
du -sh .device
