"""The kopf controller for TrainingRun resources: not written yet (issue #6).

It will watch TrainingRuns, create one KubeRay RayJob per attempt, and resume from the latest
complete checkpoint in S3 (see train/checkpoint.py) after a spot preemption.
"""
