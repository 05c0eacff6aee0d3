"""Which cluster and namespace a command talks to: the kubectl-style flags, kept apart from the
kubernetes client so that commands which may never need a cluster do not load it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class KubeOptions:
    """None means the kube config's default (KUBECONFIG or ~/.kube/config, its current context)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KubeOptions:
        return cls(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster (as kubectl chooses it)")
    group.add_argument("-n", "--namespace", help="namespace (default: the context's namespace, else default)")
    group.add_argument("--kubeconfig", metavar="FILE", help="kube config file (default: $KUBECONFIG, ~/.kube/config)")
    group.add_argument("--context", help="kube config context (default: the current context)")
