"""The kopf controller for TrainingRun resources (``python -m spotray.controller``).

It watches TrainingRuns and creates one KubeRay RayJob per attempt; when an attempt ends it reads
the attempt's records in the run's checkpoint store (keys in spotray/contract/attempts.py, read by
train/records/attempt_records.py), decides with the run's plan (spotray/decisions/) whether the run
succeeded, failed or starts another attempt that resumes from the latest complete checkpoint, and
reports progress and checkpoints in status. The modules (docs/controller.md has a line on each):

- __main__.py: ``python -m spotray.controller``; config.py: every setting, from the environment;
- handlers.py: the kopf handlers; work_queue.py: which run is reconciled next, on which thread;
- reconcile.py: observe -> decide (spotray/decisions/run_plan.py) -> act;
- kube.py: the Kubernetes calls; run_store.py: the S3 reads; s3_access.py: which Secrets and
  endpoints a run may use; rayjob.py: the RayJob of an attempt; crd.py: the CRD;
- network_policy.py: a run's NetworkPolicy; checkpoint_key_secret.py: the namespace's checkpoint key
  Secret; ownership.py: whose an object with a run's name is;
- disruptions.py: lost pods and nodes, as the pod watcher sees them and as read back; pod_waits.py:
  what a starting attempt's pods wait for (capacity, or an image or Secret that stops them);
- spare_placement.py: which idle spare pod to move; startup.py: where an attempt's start-up went;
- sweep_reconcile.py: one sweep's reconcile (its decisions: spotray/decisions/sweep_plan.py);
- kube_events.py: Kubernetes Events; metrics.py: Prometheus metrics; watch_health.py: is the watch
  still delivering.

It imports the contract, the decisions (which local mode shares) and the job side's storage,
records and checkpoints, never the code that trains (torch, Ray, transformers):
tests/unit/test_layering.py.
"""
