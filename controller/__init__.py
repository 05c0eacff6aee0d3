"""The kopf controller for TrainingRun resources (``python -m spotray.controller``).

It watches TrainingRuns and creates one KubeRay RayJob per attempt; when an attempt ends it reads
the attempt's records in the run's checkpoint store (spotray/contract/attempts.py), decides with the pure
lifecycle (lifecycle.py) whether the run succeeded, failed or starts another attempt that resumes
from the latest complete checkpoint, and reports progress and checkpoints in status. Wiring:
handlers.py (kopf), reconcile.py (observe -> decide -> act), kube.py and run_store.py (the reads
and writes), rayjob.py (the RayJob), crd.py (the CRD), s3_access.py (which Secrets and endpoints a
run may use).
"""
