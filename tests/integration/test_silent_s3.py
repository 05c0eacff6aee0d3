"""Every S3 call of the controller and the CLI is bounded, against a server that accepts the
connection and never answers (a hung or paused S3 server, a half-open link), the kind of silence a
stopped server never gives: a closed port answers at once with a reset.

The peer is a real TCP listener on loopback that accepts and never sends a byte (tests/conftest.py);
the clients are the real ones: the controller's reads of a run's records and progress
(controller/run_store.py, through controller/reconcile.py's readers) and the CLI's store
(spotray/cli/target.py), over boto3.

The bound each must hold: its retry deadline plus one request's read timeout. Before, botocore
retried each request twice more inside every try of ours, so a controller read of a silent store
took 30 s (three tries of its 10 s read timeout) against a 5 s deadline, and a CLI read 180 s
against 20 s.
"""

from __future__ import annotations

import time

import pytest

from spotray.cli.target import CLI_RETRY, RunLocation
from spotray.cli.target import open_run_store as cli_open_run_store
from spotray.contract.attempts import AttemptId
from spotray.contract.errors import SpotrayError
from spotray.controller import reconcile
from spotray.controller.config import ControllerConfig
from spotray.controller.run_store import CONTROLLER_RETRY, open_run_store, store_config
from tests.unit.test_file_roots import NoSecrets, run

pytestmark = pytest.mark.integration


def test_the_controllers_reads_of_a_silent_store_end_within_their_deadline(silent_peer: int) -> None:
    endpoint = f"http://127.0.0.1:{silent_peer}"
    training_run, config = run("s3://bucket/runs/r"), ControllerConfig(s3_endpoint=endpoint)
    reach = store_config(training_run, NoSecrets(), config)  # type: ignore[arg-type]
    bound = CONTROLLER_RETRY.deadline_s + reach.connect_timeout_s + reach.read_timeout_s + 1.0

    def store() -> object:
        return open_run_store(training_run, NoSecrets(), config)  # type: ignore[arg-type]

    started = time.monotonic()
    records, why, _ = reconcile._records(store, training_run, AttemptId("uid-1", 1))  # type: ignore[arg-type]
    took = time.monotonic() - started
    assert records is None, "unknown, not empty: nothing is decided from a store that did not answer"
    assert took < bound, f"the records read took {took:.1f} s, past its bound of {bound:.1f} s"
    assert "timeout" in why.lower() or "timed out" in why.lower(), why
    assert endpoint in why, why


def test_the_clis_reads_of_a_silent_store_end_within_their_deadline_with_the_fix(
    silent_peer: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{silent_peer}"
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }.items():
        monkeypatch.setenv(name, value)
    store = cli_open_run_store(RunLocation("r", "s3://bucket/runs/r", "URI"))
    reach = store.config  # type: ignore[attr-defined]
    bound = CLI_RETRY.deadline_s + reach.connect_timeout_s + reach.read_timeout_s + 1.0
    started = time.monotonic()
    with pytest.raises(SpotrayError) as raised:
        store.list("")
    took = time.monotonic() - started
    assert took < bound, f"the CLI's list took {took:.1f} s, past its bound of {bound:.1f} s"
    assert endpoint in str(raised.value)
    assert raised.value.fix, "the error says what to check"
