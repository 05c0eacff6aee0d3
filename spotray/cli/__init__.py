"""The ``spotray`` command (docs/cli.md): one module per command and the helpers they share.

- main.py: the argument parser and the dispatch (``spotray = spotray.cli.main:main``); __main__.py:
  ``python -m spotray.cli``;
- submit.py, watch.py, logs.py, run_status.py, loss_plot.py, checkpoint_commands.py: the commands;
  run_actions.py: validate, delete, suspend and resume; completion.py: the shell completion script;
- target.py: which cluster or store a command speaks to; cluster_client.py: the few Kubernetes calls
  the commands make; cluster_options.py: the flags that name a cluster; output.py: tables and JSON;
  exit_codes.py: the exit codes the command promises, and which error gives which.

The top of the package: it may import anything, and nothing imports it (tests/unit/test_layering.py).
"""
