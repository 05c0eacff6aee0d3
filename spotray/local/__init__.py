"""Local mode: the same TrainingRun or TrainingSweep on one machine (``spotray run FILE --local``).

- local_run.py: a run's attempts, each a local Ray cluster and the job's driver, ended and budgeted
  with the controller's own decisions (spotray.decisions), resumed from the latest complete checkpoint;
- local_ray.py: a Ray cluster on loopback (its head and worker nodes);
- local_sweep.py: a sweep's trials, each a local run, decided as the controller decides them;
- node_faults.py: worker nodes lost and back, on a schedule (``--lose-node``);
- reaper.py: a watchdog process that stops what a run started if the command dies;
- progress.py: the terminal progress view.

It may import everything below it but the controller, and only the command line imports it
(tests/unit/test_layering.py).
"""
