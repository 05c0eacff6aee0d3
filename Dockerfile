# syntax=docker/dockerfile:1
# The image that Ray heads and workers run (and the controller, unless given its own): Python 3.11,
# Ray, PyTorch, and the spotray package with every extra (python -m spotray.jobs.gpt2,
# python -m spotray.controller). The controller target below is the controller's small image.
#
#   docker build -t spotray/spotray:0.1.0 .                                 # CPU PyTorch (kind, CPU nodes)
#   docker build --build-arg TORCH_INDEX=https://pypi.org/simple \
#       --build-arg TORCH_CUDA_LOCK=docker/requirements-torch-pypi.lock \
#       -t spotray/spotray:0.1.0-cuda .                                      # CUDA PyTorch (GPU nodes)
#
# PyPI's Linux torch is the CUDA build; it needs the CUDA runtime wheels (nvidia-*, cuda-*,
# triton) that TORCH_CUDA_LOCK installs, hashed, at uv.lock's versions. A CUDA index of PyTorch's
# own (download.pytorch.org/whl/cuXXX) needs the nvidia-* wheels of that CUDA release instead,
# which no lock here lists: use PyPI's.
#
# Build args:
#   BASE_IMAGE       a Debian 12 (bookworm) image: the python slim image (its Python is used), or
#                    a bare Debian with no Python, e.g. `debootstrap --variant=minbase bookworm`
#                    (then Debian's python3, also 3.11, comes from apt). testbed/images.sh
#                    builds on such a base, without Docker.
#   TORCH_INDEX      where torch/torchvision come from (default: PyTorch's CPU index)
#   TORCH_CUDA_LOCK  "" or docker/requirements-torch-pypi.lock (see above)
#   PIP_INDEX_URL    where everything else comes from (default: PyPI)
# Behind a TLS-intercepting proxy, give the pip steps its CA bundle as a build secret; it is
# mounted into those steps only and never lands in the image:
#   docker build --secret id=build_ca,src=/etc/ssl/certs/ca-certificates.crt ...
#
# Reproducible: the base image is pinned by tag, every Python package but torch/torchvision is
# installed from docker/requirements.lock (versions and hashes, generated from uv.lock by
# docker/lock.sh), and torch/torchvision are pinned to uv.lock's versions (a unit test checks).
#
# Layers: the dependency venv (with CUDA about 7 GB, in three layers: torch, its CUDA wheels, the
# lock) is built in the deps stage, which no source of spotray's reaches; the image is that stage
# plus small layers (wget, the ray user, spotray's wheel), so a source change rebuilds and ships
# only the last of them, and the venv is stored once, not copied into a second stage.

ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS deps
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.2
ARG TORCH_CUDA_LOCK=""
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# The python slim image has Python 3.11 in /usr/local; a bare Debian 12 gets Debian's (3.11 too).
RUN if ! command -v python3.11 >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The locks stay in the image (/opt/spotray/docker/): what the venv was installed from.
COPY docker/requirements-torch-pypi.lock /opt/spotray/docker/
# torch from the variant's index, without its dependencies; for PyPI's CUDA torch, its CUDA
# runtime wheels, hashed; then the rest, hashed. `pip check` (in the last stage) proves the parts
# agree.
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca SSL_CERT_FILE=/run/secrets/build_ca; fi \
    && pip install --no-cache-dir --no-deps --index-url "${TORCH_INDEX}" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca SSL_CERT_FILE=/run/secrets/build_ca; fi \
    && if [ -n "${TORCH_CUDA_LOCK}" ]; then \
        pip install --no-cache-dir --no-deps --require-hashes -r "/opt/spotray/${TORCH_CUDA_LOCK}"; \
    fi
COPY docker/requirements.lock /opt/spotray/docker/
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca SSL_CERT_FILE=/run/secrets/build_ca; fi \
    && pip install --no-cache-dir --no-deps --require-hashes -r /opt/spotray/docker/requirements.lock

# spotray itself, built as the wheel a user would install (spotray/{train,controller,jobs} are
# symlinks to the top-level folders, so those are copied beside it). Only the wheel leaves this stage.
FROM deps AS build
# ARGs do not carry over from deps: pip's build isolation fetches setuptools from here.
ARG PIP_INDEX_URL=https://pypi.org/simple
COPY pyproject.toml README.md LICENSE /src/
COPY spotray/ /src/spotray/
COPY train/ /src/train/
COPY controller/ /src/controller/
COPY jobs/ /src/jobs/
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca SSL_CERT_FILE=/run/secrets/build_ca; fi \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src

# The controller's own image (`--target controller`): the core and the controller and sweep extras,
# no torch and no Ray, about a tenth of the training image. It builds nothing of the deps stage, so
# it is quick to build alone:
#   docker build --target controller -t REGISTRY/spotray-controller:0.1.0 .
FROM ${BASE_IMAGE} AS controller
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN if ! command -v python3.11 >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3.11 -m venv /opt/venv \
    && groupadd --gid 1000 spotray \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin spotray
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY docker/requirements-controller.lock /opt/spotray/docker/
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca SSL_CERT_FILE=/run/secrets/build_ca; fi \
    && pip install --no-cache-dir --no-deps --require-hashes -r /opt/spotray/docker/requirements-controller.lock
COPY pyproject.toml README.md LICENSE /src/
COPY spotray/ /src/spotray/
COPY train/ /src/train/
COPY controller/ /src/controller/
COPY jobs/ /src/jobs/
# The wheel a user would install, built and installed here (pip's build isolation fetches
# setuptools), then the sources go; `pip check` proves the lock satisfies the wheel's requirements.
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca SSL_CERT_FILE=/run/secrets/build_ca; fi \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheels /src \
    && pip install --no-cache-dir --no-index --no-deps /tmp/wheels/spotray-*.whl \
    && rm -rf /tmp/wheels /src \
    && pip check \
    && python -c "import spotray.controller, kopf, optuna"
USER 1000:1000
CMD ["python", "-m", "spotray.controller"]

FROM deps
# KubeRay's readiness and liveness probes of Ray pods call wget. KubeRay starts Ray with
# `bash -lc`, and Debian's /etc/profile resets PATH: profile.d puts the venv back in front.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget=1.21.3-1+deb12u1 \
    && rm -rf /var/lib/apt/lists/* \
    && echo "export PATH=\"/opt/venv/bin:\$PATH\"" >/etc/profile.d/spotray-venv.sh \
    && groupadd --gid 1000 ray \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/ray --shell /bin/bash ray
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/ray
COPY --from=build /wheels/ /tmp/wheels/
RUN pip install --no-cache-dir --no-index --no-deps /tmp/wheels/spotray-*.whl \
    && rm -rf /tmp/wheels \
    && pip check
# The working directory of Ray jobs; spotray comes from the venv, not from here.
WORKDIR /app
# uid/gid 1000: the chart's fsGroup and the shared volume's owner.
USER 1000:1000
CMD ["python", "-m", "spotray.controller"]
