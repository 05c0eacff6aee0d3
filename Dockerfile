# syntax=docker/dockerfile:1
# The image that Ray heads, Ray workers and the spotray controller run: Python 3.11, Ray, PyTorch,
# and the spotray package with every extra (python -m spotray.controller, python -m spotray.jobs.gpt2).
#
#   docker build -t spotray/spotray:0.1.0 .                                 # CPU PyTorch (kind, CPU nodes)
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t spotray/spotray:0.1.0-cu128 .
#
# Reproducible: the base image is pinned by tag, every Python package but torch/torchvision is
# installed from docker/requirements.lock (versions and hashes, generated from uv.lock by
# docker/lock.sh), and torch/torchvision are pinned to uv.lock's versions (a unit test checks).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.2
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/requirements.lock /tmp/requirements.lock
# torch first, from the variant's index and without its CUDA-only dependencies; the rest from
# the lock with hashes; `pip check` proves the two halves agree.
RUN pip install --no-cache-dir --no-deps --index-url "${TORCH_INDEX}" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && pip install --no-cache-dir --no-deps --require-hashes -r /tmp/requirements.lock
# spotray itself, as the wheel a user would install (spotray/{train,controller,jobs} are symlinks
# to the top-level folders, so those are copied beside it).
COPY pyproject.toml README.md /src/
COPY spotray/ /src/spotray/
COPY train/ /src/train/
COPY controller/ /src/controller/
COPY jobs/ /src/jobs/
RUN pip install --no-cache-dir --no-deps /src && pip check

FROM ${PYTHON_IMAGE}
# KubeRay's readiness and liveness probes of Ray pods call wget; nothing else comes from apt.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget=1.21.3-1+deb12u1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 1000 ray \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/ray --shell /bin/bash ray
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/ray
# The working directory of Ray jobs; spotray comes from the venv, not from here.
WORKDIR /app
# uid/gid 1000: the chart's fsGroup and the shared volume's owner.
USER 1000:1000
CMD ["python", "-m", "spotray.controller"]
