#!/usr/bin/env bash
# Builds the container images the test bed's real Kubernetes nodes run, without Docker (podman
# and buildah on Debian's runc), and saves each as an OCI archive for containerd to import:
#   localhost/spotray/base:bookworm    debootstrap --variant=minbase bookworm (the others' base;
#                                      not saved: no pod runs it)
#   localhost/spotray/pause:3.10       FROM scratch: the static pause binary build.sh makes
#   localhost/spotray/spotray:testbed  the repository's Dockerfile on that base, PyPI's CUDA torch
#                                      with its CUDA wheels (docker/requirements-torch-pypi.lock)
#   localhost/spotray/controller:testbed  the Dockerfile's controller target on that base (no
#                                      torch, no Ray): the chart's controller.image
#   localhost/spotray/minio:testbed    the base with build.sh's minio and mc, as the chart's
#   localhost/spotray/mc:testbed       minio.image and minio.mcImage containers run them
# Every bit of podman/buildah state (configuration, storage, temporary files) lives under
# $TESTBED_CACHE/images (the runroot under /run); nothing global is read for storage or changed.
# Output: $TESTBED_CACHE/images/<name>.oci.tar and images.json, {"<name>": {"ref", "archive",
# "id"}} for pause, spotray, controller, minio and mc.
#
# An image is rebuilt when its inputs change (for spotray and controller: Dockerfile, .dockerignore,
# docker/*.lock, pyproject.toml, README.md, spotray/ train/ controller/ jobs/; for the others
# their binary and the base), and saved again only when the rebuilt image's id changed. podman's
# layer cache keeps the dependency venv (about 7 GB, the Dockerfile's deps stage) when only
# spotray's sources changed, so such a rebuild costs the small spotray layers and the save. A warm
# run reads a few stamps and hashes the sources: no podman call.
# Disk: the storage holds about 8 GB, the archives about 4 GB; a cold spotray build needs about
# 13 GB more while it commits the CUDA wheels' layer (buildah stages each layer twice under tmp/).
#
# Usage: testbed/images.sh            build what is missing or stale
#        testbed/images.sh --check    exit 1 if anything is missing or stale, build nothing
# Needs root, podman, debootstrap, the Debian mirror and PyPI; build.sh's minio, mc and kubenode.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"
TESTBED_CACHE="${TESTBED_CACHE:-$HOME/.cache/spotray/testbed}"
IMAGES="$TESTBED_CACHE/images"
STATE="$IMAGES/state"
CONF="$IMAGES/conf"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The host's CA bundle: HTTPS (PyPI) goes through a proxy with its own CA. Given to the spotray
# build as the secret build_ca, which the Dockerfile mounts into its pip steps only: it is never
# part of an image.
HOST_CA="${HOST_CA:-/etc/ssl/certs/ca-certificates.crt}"
# Builds run at the lowest priority: the machine is shared with training jobs and tests.
NICE=(nice -n 19)

BASE_REF=localhost/spotray/base:bookworm
declare -A REF=(
  [pause]=localhost/spotray/pause:3.10
  [spotray]=localhost/spotray/spotray:testbed
  [controller]=localhost/spotray/controller:testbed
  [minio]=localhost/spotray/minio:testbed
  [mc]=localhost/spotray/mc:testbed
)
NAMES=(pause spotray controller minio mc)
PAUSE_BIN="$TESTBED_CACHE/kubenode-$KUBERNETES_VERSION/bin/pause"
MINIO_BIN="$TESTBED_CACHE/minio-$MINIO_VERSION/bin/minio"
MC_BIN="$TESTBED_CACHE/mc-$MC_VERSION/bin/mc"
SPOTRAY_BUILD_ARGS=(
  --build-arg "BASE_IMAGE=$BASE_REF"
  --build-arg TORCH_INDEX=https://pypi.org/simple
  --build-arg TORCH_CUDA_LOCK=docker/requirements-torch-pypi.lock
)

log() { printf '[testbed images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# The Containerfiles of the small images (part of their inputs: editing one rebuilds it).
containerfile() {
  case "$1" in
    pause)
      cat <<'EOF'
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
EOF
      ;;
    minio)
      # The chart's StatefulSet gives only args (server /data ...), as for quay.io/minio/minio,
      # whose entrypoint runs minio; it runs as uid/gid 1000 with a read-only root filesystem.
      cat <<EOF
FROM $BASE_REF
COPY minio /usr/bin/minio
USER 1000:1000
EXPOSE 9000 9001
ENTRYPOINT ["/usr/bin/minio"]
EOF
      ;;
    mc)
      # The chart's minio-tenants Job runs `/bin/sh /scripts/minio-tenants.sh`, which calls mc
      # from PATH (cat, sed, grep, printf too: all in the base).
      cat <<EOF
FROM $BASE_REF
COPY mc /usr/bin/mc
USER 1000:1000
ENTRYPOINT ["/usr/bin/mc"]
EOF
      ;;
  esac
}

fingerprint() {  # a binary: path, size and mtime (hashing minio's 100+ MB on every run is slow)
  [[ -e "$1" ]] || { echo "missing:$1"; return; }
  stat -c '%n %s %Y' "$1"
}

base_id() { cat "$STATE/base.id" 2>/dev/null || echo none; }

# What each image is built from, hashed; a stamp holds the hash its current archive was built from.
inputs() {
  {
    case "$1" in
      pause)
        fingerprint "$PAUSE_BIN"
        containerfile pause
        ;;
      minio | mc)
        base_id
        if [[ "$1" == minio ]]; then fingerprint "$MINIO_BIN"; else fingerprint "$MC_BIN"; fi
        containerfile "$1"
        ;;
      spotray | controller)
        base_id
        [[ "$1" == spotray ]] && printf '%s\n' "${SPOTRAY_BUILD_ARGS[@]}"
        (
          cd "$ROOT"
          {
            printf '%s\n' Dockerfile .dockerignore pyproject.toml README.md LICENSE docker/*.lock
            find spotray train controller jobs -type f ! -name '*.pyc' ! -path '*/__pycache__/*'
          } | LC_ALL=C sort | xargs -d '\n' sha256sum
        )
        ;;
    esac
  } | sha256sum | cut -d' ' -f1
}

stamp_field() { # name, field (1: inputs, 2: id)
  local line
  line="$(cat "$STATE/$1.stamp" 2>/dev/null)" || return 0
  cut -d' ' -f"$2" <<<"$line"
}

manifest() {
  local name sep=""
  printf '{\n'
  for name in "${NAMES[@]}"; do
    printf '%s  "%s": {"ref": "%s", "archive": "%s", "id": "%s"}' "$sep" "$name" "${REF[$name]}" \
      "$IMAGES/$name.oci.tar" "$(stamp_field "$name" 2)"
    sep=$',\n'
  done
  printf '\n}\n'
}

declare -a STALE=()
check_all() {
  STALE=()
  local name
  for name in "${NAMES[@]}"; do
    if [[ ! -s "$IMAGES/$name.oci.tar" || "$(stamp_field "$name" 1)" != "$(inputs "$name")" ]]; then
      STALE+=("$name")
    fi
  done
}

manifest_current() { [[ -f "$IMAGES/images.json" && "$(manifest)" == "$(cat "$IMAGES/images.json")" ]]; }

check_all
if [[ "${1:-}" == "--check" ]]; then
  if ((${#STALE[@]})); then
    log "missing or stale: ${STALE[*]}"
    exit 1
  fi
  if ! manifest_current; then
    log "images.json is missing or stale"
    exit 1
  fi
  exit 0
fi
if ((${#STALE[@]} == 0)) && manifest_current; then
  exit 0
fi

for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { log "$tool is required (apt-get install podman debootstrap)"; exit 1; }
done
for bin in "$PAUSE_BIN" "$MINIO_BIN" "$MC_BIN"; do
  [[ -x "$bin" ]] || { log "$bin is missing: run testbed/build.sh first"; exit 1; }
done
[[ -r "$HOST_CA" ]] || { log "$HOST_CA: no CA bundle to give the pip steps"; exit 1; }

mkdir -p "$IMAGES" "$STATE" "$CONF" "$IMAGES/tmp" "$IMAGES/context"
# One build at a time: two concurrent runs must not race on the same storage or archives.
exec 9>"$IMAGES/.lock"
flock 9

# podman's runtime state (mounts, locks) belongs under /run; one directory per cache.
RUN_DIR="/run/spotray-images-$(printf '%s' "$TESTBED_CACHE" | sha256sum | cut -c1-12)"
mkdir -p "$RUN_DIR"
# Only runc works here (crun refuses the hybrid cgroups); without cgroupfs and these ulimits
# (the hard nofile limit is 20000 and cannot be raised) every RUN step fails. netns none: a
# container started with this configuration has no network unless a command asks for one.
cat >"$CONF/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
netns = "none"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
tmp_dir = "$RUN_DIR/libpod"
image_copy_tmp_dir = "$IMAGES/tmp"

[network]
network_config_dir = "$CONF/networks"
EOF
cat >"$CONF/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$IMAGES/storage"
runroot = "$RUN_DIR/storage"
EOF
# No registry is ever asked for anything: every image here is local.
cat >"$CONF/registries.conf" <<'EOF'
unqualified-search-registries = []
EOF
export CONTAINERS_CONF="$CONF/containers.conf"
export CONTAINERS_STORAGE_CONF="$CONF/storage.conf"
export CONTAINERS_REGISTRIES_CONF="$CONF/registries.conf"
export TMPDIR="$IMAGES/tmp"

image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

ROOTFS="$IMAGES/rootfs.tmp"
cleanup_rootfs() {
  local m
  for m in proc sys dev/pts dev; do
    mountpoint -q "$ROOTFS/$m" 2>/dev/null && umount -l "$ROOTFS/$m"
  done
  rm -rf "$ROOTFS"
}

ensure_base() {
  local id
  id="$(image_id "$BASE_REF")"
  if [[ -z "$id" ]]; then
    log "base $BASE_REF: debootstrap --variant=minbase bookworm $DEBIAN_MIRROR ..."
    START=$SECONDS
    trap cleanup_rootfs EXIT
    cleanup_rootfs
    "${NICE[@]}" debootstrap --variant=minbase bookworm "$ROOTFS" "$DEBIAN_MIRROR" >"$IMAGES/debootstrap.log" 2>&1 ||
      { log "debootstrap failed: see $IMAGES/debootstrap.log"; exit 1; }
    # The suites the python slim image uses (security updates included), in the same deb822 form.
    rm -f "$ROOTFS/etc/apt/sources.list"
    cat >"$ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $DEBIAN_MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${DEBIAN_MIRROR%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb
    tar -C "$ROOTFS" --numeric-owner -c . | podman import --quiet \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' - "$BASE_REF" >/dev/null
    cleanup_rootfs
    trap - EXIT
    id="$(image_id "$BASE_REF")"
    log "base $BASE_REF ready ($(( SECONDS - START ))s)"
  fi
  echo "$id" >"$STATE/base.id"
}

build_small() {  # pause, minio, mc: a context of one binary and a generated Containerfile
  local name="$1" bin ctx="$IMAGES/context/$1"
  case "$name" in
    pause) bin="$PAUSE_BIN" ;;
    minio) bin="$MINIO_BIN" ;;
    mc) bin="$MC_BIN" ;;
  esac
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp "$bin" "$ctx/"
  containerfile "$name" >"$ctx/Containerfile"
  "${NICE[@]}" podman build --quiet --network=host --layers --pull=never --format oci \
    -f "$ctx/Containerfile" -t "${REF[$name]}" "$ctx" >/dev/null
  rm -rf "$ctx"
}

build_from_dockerfile() {  # spotray (the last stage) or controller (its target)
  local name="$1" args=(--build-arg "BASE_IMAGE=$BASE_REF")
  if [[ "$name" == spotray ]]; then args=("${SPOTRAY_BUILD_ARGS[@]}"); else args+=(--target controller); fi
  "${NICE[@]}" podman build --network=host --layers --pull=never --format oci \
    --secret "id=build_ca,src=$HOST_CA" "${args[@]}" \
    -f "$ROOT/Dockerfile" -t "${REF[$name]}" "$ROOT" >"$IMAGES/$name-build.log" 2>&1 ||
    { tail -n 30 "$IMAGES/$name-build.log"; log "$name build failed: see $IMAGES/$name-build.log"; exit 1; }
}

ensure_base
check_all
declare -a REPLACED=()
log "building into $IMAGES: ${STALE[*]:-(manifest only)}"
for name in "${STALE[@]}"; do
  START=$SECONDS
  inputs_now="$(inputs "$name")"
  old_id="$(stamp_field "$name" 2)"
  log "building $name (${REF[$name]}) ..."
  case "$name" in
    spotray | controller) build_from_dockerfile "$name" ;;
    *) build_small "$name" ;;
  esac
  id="$(image_id "${REF[$name]}")"
  size="$(podman image inspect --format '{{.Size}}' "${REF[$name]}")"
  log "built $name: ${id:0:12}, $(( size / 1000000 )) MB ($(( SECONDS - START ))s)"
  archive="$IMAGES/$name.oci.tar"
  if [[ "$id" != "$old_id" || ! -s "$archive" ]]; then
    SAVE_START=$SECONDS
    rm -f "$archive.tmp"
    podman save --quiet --format oci-archive -o "$archive.tmp" "${REF[$name]}"
    mv "$archive.tmp" "$archive"
    log "saved $archive, $(( $(stat -c %s "$archive") / 1000000 )) MB ($(( SECONDS - SAVE_START ))s)"
    [[ -z "$old_id" || "$old_id" == "$id" ]] || REPLACED+=("$name")
  else
    log "$name unchanged (same image id): archive kept"
  fi
  echo "$inputs_now $id" >"$STATE/$name.stamp"
done
# The images rebuilt ones replaced, now untagged, and every layer only they used. The build cache
# survives: the spotray image's deps stage is its parent (so not dangling); only the small layers
# of its build stage (sources, wheel) go, and they rebuild in seconds.
if ((${#REPLACED[@]})); then
  START=$SECONDS
  podman image prune --force >/dev/null
  log "pruned what ${REPLACED[*]} replaced ($(( SECONDS - START ))s)"
fi
manifest >"$IMAGES/images.json.tmp"
mv "$IMAGES/images.json.tmp" "$IMAGES/images.json"
log "images ready: $IMAGES/images.json"
