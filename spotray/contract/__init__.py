"""The contract the job, the controller, local mode and the CLI share, declared once.

The TrainingRun spec and its codec (spec.py), the status it shows (status.py), storage URIs
(uris.py), the attempt's identity, record keys, exit codes and outcomes (attempts.py), every
Kubernetes name (names.py), errors that name their fix (errors.py) and which pip extra provides
what (extras.py). Standard library and
PyYAML only: the controller decides with it without importing boto3, torch or Ray, and
tests/unit/test_layering.py keeps it so.
"""
