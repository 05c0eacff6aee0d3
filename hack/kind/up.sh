#!/usr/bin/env bash
# From zero to the GPT-2 TrainingRun on a local kind cluster (needs Docker, kind, kubectl, helm):
#   1. the cluster from kind-config.yaml (on-demand and tainted spot workers)
#   2. the spotray image, built from the Dockerfile and loaded into the kind nodes
#   3. the KubeRay operator, from its Helm chart (pinned, the test bed's version)
#   4. the S3 credentials Secret, then the spotray chart with its in-cluster MinIO
#   5. jobs/gpt2/trainingrun.yaml, pointed at MinIO
#
# Usage: hack/kind/up.sh [--dry-run]
#   --dry-run   print every command instead of running it (works without Docker)
# Environment: CLUSTER (spotray), IMAGE (spotray/spotray:0.1.0), RUN_NAMESPACE (default).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER="${CLUSTER:-spotray}"
IMAGE="${IMAGE:-spotray/spotray:0.1.0}"
RUN_NAMESPACE="${RUN_NAMESPACE:-default}"
SYSTEM_NAMESPACE="spotray-system"
KUBERAY_CHART_VERSION="1.6.1"
SECRET="s3-credentials"
BUCKET="spotray-demo"
DRY_RUN=false

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=true ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; usage >&2; exit 2 ;;
  esac
done

step() { printf '\n==> %s\n' "$*"; }
# Runs a command, or prints it under --dry-run.
run() {
  if $DRY_RUN; then
    printf '  %s\n' "$*"
  else
    "$@"
  fi
}

require_tools() {
  if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
    cat >&2 <<MSG
Docker is missing (or its daemon is not running) on this machine, and kind needs it.
Nothing was created. Without Docker, use the Docker-free test bed instead:
  make cluster-up        # a real control plane, KubeRay and Ray as local processes (docs/testbed.md)
To see what this script would do: $0 --dry-run
MSG
    exit 1
  fi
  local missing=()
  for tool in kind kubectl helm; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if ((${#missing[@]})); then
    echo "missing tools: ${missing[*]} (install them, then run $0 again)" >&2
    exit 1
  fi
}

# A random credential for the in-cluster MinIO (never written to a file).
random_key() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

main() {
  cd "$ROOT"
  if $DRY_RUN; then
    echo "dry run: the commands hack/kind/up.sh would run (nothing is executed)"
  else
    require_tools
  fi

  step "1. kind cluster '$CLUSTER' (kind-config.yaml)"
  if ! $DRY_RUN && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    echo "  cluster $CLUSTER exists: reusing it"
  else
    run kind create cluster --name "$CLUSTER" --config kind-config.yaml --wait 120s
  fi

  step "2. image $IMAGE (Dockerfile), loaded into the nodes"
  run docker build -t "$IMAGE" .
  run kind load docker-image "$IMAGE" --name "$CLUSTER"

  step "3. KubeRay operator (chart kuberay-operator $KUBERAY_CHART_VERSION)"
  run helm repo add kuberay https://ray-project.github.io/kuberay-helm/ --force-update
  run helm upgrade --install kuberay-operator kuberay/kuberay-operator --version "$KUBERAY_CHART_VERSION" \
    --namespace kuberay-system --create-namespace --wait

  step "4. S3 credentials (Secret $SECRET) and the spotray chart with MinIO"
  local access_key secret_key
  access_key="spotray-$(random_key | cut -c1-8)"
  secret_key="$(random_key)"
  for ns in "$SYSTEM_NAMESPACE" "$RUN_NAMESPACE"; do
    if $DRY_RUN; then
      printf '  %s\n' "kubectl create namespace $ns --dry-run=client -o yaml | kubectl apply -f -" \
        "kubectl -n $ns create secret generic $SECRET --from-literal=AWS_ACCESS_KEY_ID=<random> --from-literal=AWS_SECRET_ACCESS_KEY=<random>"
      continue
    fi
    kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    if ! kubectl -n "$ns" get secret "$SECRET" >/dev/null 2>&1; then
      kubectl -n "$ns" create secret generic "$SECRET" \
        --from-literal=AWS_ACCESS_KEY_ID="$access_key" --from-literal=AWS_SECRET_ACCESS_KEY="$secret_key"
    fi
  done
  run helm upgrade --install spotray charts/spotray --namespace "$SYSTEM_NAMESPACE" \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
    --set s3.existingSecret="$SECRET" --set minio.enabled=true --set "minio.buckets={$BUCKET}" \
    --set minio.persistence.size=5Gi --set controller.watchNamespaces="{$RUN_NAMESPACE}" --wait --timeout 10m

  step "5. the GPT-2 TrainingRun in namespace $RUN_NAMESPACE"
  run kubectl -n "$RUN_NAMESPACE" apply -f jobs/gpt2/trainingrun.yaml

  step "next"
  cat <<NEXT
  kubectl -n $RUN_NAMESPACE get trainingruns -w
  kubectl -n $RUN_NAMESPACE get rayclusters,pods -o wide
  kubectl -n $RUN_NAMESPACE port-forward svc/<raycluster>-head-svc 8265:8265   # Ray dashboard
  kubectl delete node <a spot worker>    # a spot preemption; the run resumes from S3
  kind delete cluster --name $CLUSTER     # everything goes
NEXT
}

main
