"""The test bed: a real Kubernetes control plane, real kubelets running real containers (crun, no
Docker), the real KubeRay operator and the real Kueue manager, on one machine's loopback (docs/testbed.md).

- build.sh, images.sh: build every part from its Go module or package, and the images, into
  ~/.cache/spotray/ (``make testbed``);
- cluster.py: ``Testbed``, the cluster the e2e tests and benches start and stop
  (``python -m testbed.cluster up|down``: ``make cluster-up``, ``make cluster-down``);
- kueue.py: ``Kueue``, the Kueue manager started on a running test bed, and the queues tests make;
- nodes.py: one real node (a kubelet, containerd and its runtime), run as a process of its own;
- cluster_demo.py: the chart installed on it and the GPT-2 TrainingRun followed to its end
  (``make cluster-demo``).

Imported by tests/ and bench/ (never by spotray/): tests/unit/test_layering.py.
"""
