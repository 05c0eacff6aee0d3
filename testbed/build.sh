#!/usr/bin/env bash
# Builds the Docker-free Kubernetes test bed from the Go module proxy:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok,
#   the KubeRay operator (plus its CRDs), the Kueue manager (plus its CRDs), helm, and MinIO with its client mc;
#   for real nodes: kubelet, kube-proxy, containerd (with its runc shim and ctr), CoreDNS, and a
#   pause binary from Kubernetes' own pause.c, and kube-network-policies (the NetworkPolicy agent).
#   Images (base, pause, spotray) come from images.sh.
# Each component lands in $TESTBED_CACHE/<component>-<version>/ and is skipped when present,
# so a warm run takes well under a second. A cold run took 17 minutes on 2 busy cores.
#
# Usage: testbed/build.sh             build what is missing
#        testbed/build.sh --check     exit 1 if anything is missing, build nothing
#        testbed/build.sh prometheus  build Prometheus if missing (make test-campaign; not in the above)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"
TESTBED_CACHE="${TESTBED_CACHE:-$HOME/.cache/spotray/testbed}"
# Builds run at the lowest priority: the machine is shared with training jobs and tests.
NICE=(nice -n 19)
# Git stamps are not available for module-proxy sources.
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0

K8S_STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"

log() { printf '[testbed build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# component name, version, and the files that must exist for it to count as built
declare -a MISSING=()
need() {
  local dir="$TESTBED_CACHE/$1-$2"
  shift 2
  for f in "$@"; do
    [[ -e "$dir/$f" ]] || return 0
  done
  return 1
}

# Debian packages of the real nodes and the image builds (docs/testbed.md, "Real pods"):
# containerd is built below, but runc, the CNI plugins, podman/buildah and debootstrap come from
# the distribution.
DEBS=(runc containernetworking-plugins podman buildah debootstrap iptables iproute2 openssl)
missing_debs() {
  local pkg
  for pkg in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || echo "$pkg"
  done
}

check_all() {
  MISSING=()
  [[ -z "$(missing_debs)" ]] || MISSING+=(debs)
  need etcd "$ETCD_VERSION" bin/etcd && MISSING+=(etcd)
  need kubernetes "$KUBERNETES_VERSION" bin/kube-apiserver bin/kube-controller-manager \
    bin/kube-scheduler bin/kubectl && MISSING+=(kubernetes)
  need kwok "$KWOK_VERSION" bin/kwok && MISSING+=(kwok)
  need kuberay "$KUBERAY_VERSION" bin/ray-operator crds/ray.io_rayclusters.yaml && MISSING+=(kuberay)
  need kueue "$KUEUE_VERSION" bin/kueue crds/kueue.x-k8s.io_workloads.yaml && MISSING+=(kueue)
  need helm "$HELM_VERSION" bin/helm && MISSING+=(helm)
  need minio "$MINIO_VERSION" bin/minio && MISSING+=(minio)
  need mc "$MC_VERSION" bin/mc && MISSING+=(mc)
  need kubenode "$KUBERNETES_VERSION" bin/kubelet bin/kube-proxy bin/pause && MISSING+=(kubenode)
  need containerd "$CONTAINERD_VERSION" bin/containerd bin/containerd-shim-runc-v2 bin/ctr \
    && MISSING+=(containerd)
  need coredns "$COREDNS_VERSION" bin/coredns && MISSING+=(coredns)
  need netpol "$KUBE_NETWORK_POLICIES_VERSION" bin/kube-network-policies && MISSING+=(netpol)
  return 0
}

# Builds into a temporary directory and renames it into place at the end, so an interrupted
# build never leaves a half-filled cache entry that would count as built.
staging_dir() {
  local final="$TESTBED_CACHE/$1-$2"
  rm -rf "$final.tmp"
  mkdir -p "$final.tmp/bin"
  echo "$final.tmp"
}
publish() {
  local final="$TESTBED_CACHE/$1-$2"
  rm -rf "$final"
  mv "$final.tmp" "$final"
  log "$1 $2 ready in $final ($(( SECONDS - START ))s)"
}

build_debs() {
  local debs
  mapfile -t debs < <(missing_debs)
  ((${#debs[@]})) || return 0
  [[ $EUID -eq 0 ]] || { log "installing ${debs[*]} needs root: sudo apt-get install ${debs[*]}"; return 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${debs[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${debs[@]}" >/dev/null; }
  log "installed ${debs[*]} ($(( SECONDS - START ))s)"
}

build_etcd() {
  local out src
  out="$(staging_dir etcd "$ETCD_VERSION")"
  src="$out/src"
  mkdir -p "$src"
  # etcd's own top-level module uses local replace directives, so `go install` refuses it;
  # a two-line consumer of the server module builds the same binary.
  cat >"$src/go.mod" <<MOD
module spotray.local.local_run/testbed/etcd

go 1.26

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
  cat >"$src/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$src" && go mod tidy && "${NICE[@]}" go build -o "$out/bin/etcd" .)
  rm -rf "$src"
  publish etcd "$ETCD_VERSION"
}

# Builds commands of k8s.io/kubernetes into $out/bin: component, then the cmd/ names. The module
# points every k8s.io/<staging> module at ./staging/src; a consumer module must replace each of them
# with the published v0.x tag of the same release (the list comes from the release's own go.mod).
build_from_kubernetes() {
  local out="$1" src="$1/src" gomod cmd
  shift
  mkdir -p "$src"
  gomod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  {
    printf 'module spotray.local.local_run/testbed/kubernetes\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n\n' \
      "$KUBERNETES_VERSION"
    grep -E '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" |
      awk -v v="$K8S_STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
  } >"$src/go.mod"
  {
    printf '//go:build tools\n\n// Package tools only pins the commands built from k8s.io/kubernetes.\npackage tools\n\nimport (\n'
    for cmd in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
    printf ')\n'
  } >"$src/tools.go"
  local v="$KUBERNETES_VERSION" minor="${KUBERNETES_VERSION#v1.}"
  minor="${minor%%.*}"
  # The version the binaries report (kubectl version, /version); upstream sets it the same way.
  local ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean"
  done
  (cd "$src" && go mod tidy &&
    "${NICE[@]}" go build -ldflags "$ldflags" -o "$out/bin/" "${@/#/k8s.io/kubernetes/cmd/}")
  rm -rf "$src"
}

build_kubernetes() {
  local out
  out="$(staging_dir kubernetes "$KUBERNETES_VERSION")"
  build_from_kubernetes "$out" kube-apiserver kube-controller-manager kube-scheduler kubectl
  publish kubernetes "$KUBERNETES_VERSION"
}

build_kwok() {
  local out
  out="$(staging_dir kwok "$KWOK_VERSION")"
  GOBIN="$out/bin" "${NICE[@]}" go install \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  publish kwok "$KWOK_VERSION"
}

build_kuberay() {
  local out mod
  out="$(staging_dir kuberay "$KUBERAY_VERSION")"
  # Not `go install module@version`: that also asks the proxy for the module's version list (to
  # report deprecations), which the proxy refuses (403) for ray-operator. Download the one
  # version instead and build it in place with its own go.mod and go.sum, which is what
  # `go install` builds too (the module has no replace directives).
  mod="$(go mod download -json "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -n "$mod" && -f "$mod/go.mod" ]] || { log "go mod download gave no ray-operator source"; return 1; }
  (cd "$mod" && "${NICE[@]}" go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out/bin/ray-operator" .)
  # The CRDs ship inside the same module; copy them so the cache entry is self-contained.
  mkdir -p "$out/crds"
  cp "$mod"/config/crd/bases/*.yaml "$out/crds/"
  chmod u+w "$out"/crds/*.yaml
  publish kuberay "$KUBERAY_VERSION"
}

# Kueue's manager, built like KubeRay's operator (in place, from its own go.mod and go.sum; it
# has no replace directives), right after it so the Go cache it warmed (client-go,
# controller-runtime, KubeRay's API) is reused. The CRDs are the module's bases; testbed/kueue.py
# adds the conversion stanza a real install's kustomize patches add.
build_kueue() {
  local out mod
  out="$(staging_dir kueue "$KUEUE_VERSION")"
  mod="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -n "$mod" && -f "$mod/go.mod" ]] || { log "go mod download gave no kueue source"; return 1; }
  (cd "$mod" && "${NICE[@]}" go build -mod=readonly -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    -o "$out/bin/kueue" ./cmd/kueue)
  mkdir -p "$out/crds"
  cp "$mod"/config/components/crd/bases/*.yaml "$out/crds/"
  chmod u+w "$out"/crds/*.yaml
  publish kueue "$KUEUE_VERSION"
}

build_helm() {
  local out
  out="$(staging_dir helm "$HELM_VERSION")"
  GOBIN="$out/bin" "${NICE[@]}" go install \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  publish helm "$HELM_VERSION"
}

build_minio() {
  local out
  out="$(staging_dir minio "$MINIO_VERSION")"
  GOBIN="$out/bin" "${NICE[@]}" go install -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION"
  publish minio "$MINIO_VERSION"
}

build_mc() {
  local out
  out="$(staging_dir mc "$MC_VERSION")"
  GOBIN="$out/bin" "${NICE[@]}" go install -ldflags "-s -w" "github.com/minio/mc@$MC_VERSION"
  publish mc "$MC_VERSION"
}

# kubelet and kube-proxy for real nodes, from the same k8s.io/kubernetes module as the control
# plane (the Go cache it warmed makes this about half a minute), and the pause binary: Kubernetes'
# own build/pause/linux/pause.c, static, for the pause image (testbed/images.sh).
build_kubenode() {
  local out dir
  out="$(staging_dir kubenode "$KUBERNETES_VERSION")"
  build_from_kubernetes "$out" kubelet kube-proxy
  dir="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  gcc -Os -static -o "$out/bin/pause" "$dir/build/pause/linux/pause.c"
  publish kubenode "$KUBERNETES_VERSION"
}

# containerd 2.x, its runc shim and ctr (Debian's runc runs the containers). Storage drivers this
# test bed does not use are left out; overlayfs is built in.
build_containerd() {
  local out mod
  out="$(staging_dir containerd "$CONTAINERD_VERSION")"
  mod="$(go mod download -json "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -n "$mod" && -f "$mod/go.mod" ]] || { log "go mod download gave no containerd source"; return 1; }
  (cd "$mod" && "${NICE[@]}" go build -mod=readonly -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    -o "$out/bin/" ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr)
  publish containerd "$CONTAINERD_VERSION"
}

# CoreDNS with only the kubernetes plugin (and bind/errors/log): it answers cluster names and has no
# forward plugin to send anything further. Plugins register themselves when imported, so a
# small main that imports just these builds the same server as CoreDNS's own, minus the rest.
build_coredns() {
  local out src
  out="$(staging_dir coredns "$COREDNS_VERSION")"
  src="$out/src"
  mkdir -p "$src"
  cat >"$src/go.mod" <<MOD
module spotray.local.local_run/testbed/coredns

go 1.26

require github.com/coredns/coredns $COREDNS_VERSION
MOD
  cat >"$src/main.go" <<'GO'
package main

import (
	_ "github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func main() { coremain.Run() }
GO
  (cd "$src" && go mod tidy && "${NICE[@]}" go build -ldflags "-s -w" -o "$out/bin/coredns" .)
  rm -rf "$src"
  publish coredns "$COREDNS_VERSION"
}

# kube-network-policies, the NetworkPolicy agent of real nodes (testbed/nodes.py runs it).
build_netpol() {
  local out
  out="$(staging_dir netpol "$KUBE_NETWORK_POLICIES_VERSION")"
  GOBIN="$out/bin" "${NICE[@]}" go install -ldflags "-s -w" \
    "sigs.k8s.io/kube-network-policies/cmd@$KUBE_NETWORK_POLICIES_VERSION"
  mv "$out/bin/cmd" "$out/bin/kube-network-policies"
  publish netpol "$KUBE_NETWORK_POLICIES_VERSION"
}

# Prometheus, for the campaign that scrapes the controller (tests/e2e/test_controller.py): not part
# of make test, so a cold CI run does not build it. Static targets only: the remove_all_sd tag
# leaves out every cloud's service discovery and its SDK (Prometheus 3.10+).
build_prometheus() {
  local out mod
  out="$(staging_dir prometheus "$PROMETHEUS_VERSION")"
  mod="$(go mod download -json "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -n "$mod" && -f "$mod/go.mod" ]] || { log "go mod download gave no prometheus source"; return 1; }
  # GOWORK=off: the module zip keeps a go.work that names nested modules the zip leaves out.
  (cd "$mod" && GOWORK=off "${NICE[@]}" go build -mod=readonly -trimpath -tags remove_all_sd -ldflags "-s -w" \
    -o "$out/bin/prometheus" ./cmd/prometheus)
  publish prometheus "$PROMETHEUS_VERSION"
}

if [[ "${1:-}" == "prometheus" ]]; then  # testbed/build.sh prometheus: that one, if missing
  need prometheus "$PROMETHEUS_VERSION" bin/prometheus || exit 0
  command -v go >/dev/null || { log "go is required (1.26+) to build Prometheus"; exit 1; }
  mkdir -p "$TESTBED_CACHE"
  exec 9>"$TESTBED_CACHE/.build.lock"
  flock 9
  export GOCACHE="$TESTBED_CACHE/.go-build"
  START=$SECONDS
  log "building prometheus $PROMETHEUS_VERSION ..."
  build_prometheus
  rm -rf "$GOCACHE"
  exit 0
fi

check_all
if [[ "${1:-}" == "--check" ]]; then
  if ((${#MISSING[@]})); then
    log "missing: ${MISSING[*]}"
    exit 1
  fi
  exit 0
fi
if ((${#MISSING[@]} == 0)); then
  exit 0
fi

command -v go >/dev/null || { log "go is required (1.26+) to build the test bed"; exit 1; }
mkdir -p "$TESTBED_CACHE"
# One build at a time: two concurrent `make test` runs must not race on the same cache entry.
exec 9>"$TESTBED_CACHE/.build.lock"
flock 9
check_all
log "building into $TESTBED_CACHE: ${MISSING[*]} (cold: about 20 minutes on 2 cores)"
# Go's build cache of these builds (about 7 GB of object files) is worth nothing once the binaries
# are cached by version, and the disk it would keep is what the tests need (a cold CI run filled it):
# a private one, deleted once every component is built (kept after a failure, for the retry).
export GOCACHE="$TESTBED_CACHE/.go-build"
for component in "${MISSING[@]}"; do
  START=$SECONDS
  log "building $component ..."
  "build_$component"
done
rm -rf "$GOCACHE"
log "all components built"
