"""The nemesis campaign's history checker (bench/campaigns/nemesis.py) and its fault proxy
(bench/campaigns/fault_proxy.py).

The checker must fail the histories a broken controller would write (an outcome that changes, a
budget that goes down, a preemption counted for a fault that should cost nothing) and pass the
ones a correct controller writes; the proxy must fail traffic in each of its modes and pass it again.
"""

from __future__ import annotations

import http.server
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.campaigns.fault_proxy import FaultProxy, fault
from bench.campaigns.nemesis import (
    CAMPAIGN_PACE,
    KINDS,
    Fault,
    Landing,
    TrialLog,
    TrialResult,
    checkpoints_vanished,
    commit_window,
    draw_faults,
    is_job_driver,
    judged_once,
    latest_runs,
    once_per_object,
    outcomes_allowed,
    pull_found_nothing,
    summary,
    unexplained_interruptions,
)
from spotray.train.checkpoints.checkpoint import MANIFEST_NAME

pytestmark = pytest.mark.unit


def attempt(number: int, outcome: str, reason: str) -> dict[str, object]:
    return {"attempt": number, "outcome": outcome, "reason": reason, "message": "m"}


def landing(kind: str, attempts: list[int], *, missed: bool = False) -> Landing:
    return Landing(kind, "step", attempts, 12, "between checkpoints", 30.0, missed=missed)


def test_an_outcome_that_changes_or_a_budget_that_goes_down_is_caught() -> None:
    history = [
        (1.0, {"attempts": [attempt(1, "Running", "")]}),
        (2.0, {"preemptions": 1, "attempts": [attempt(1, "Preempted", "NodeLost")]}),
        (3.0, {"preemptions": 0, "failures": 1, "attempts": [attempt(1, "Failed", "TrainingFailed")]}),
    ]
    problems = judged_once(history)
    assert any("judged ('Preempted', 'NodeLost'), then ('Failed', 'TrainingFailed')" in p for p in problems)
    assert any("budgets spent went from (1, 0) to (0, 1)" in p for p in problems)
    assert judged_once(history[:2]) == []


PACE = CAMPAIGN_PACE
LAST = PACE.steps


def test_a_run_fault_allows_only_its_own_outcome_on_the_attempt_it_hit() -> None:
    hit = [landing("node-lost", [1])]
    good = [attempt(1, "Preempted", "NodeLost"), attempt(2, "Succeeded", "TrainingFinished")]
    assert outcomes_allowed(good, hit, PACE) == []
    counted_as_failure = [attempt(1, "Failed", "TrainingFailed"), attempt(2, "Succeeded", "TrainingFinished")]
    assert "attempt 1 judged Failed/TrainingFailed" in outcomes_allowed(counted_as_failure, hit, PACE)[0]


def test_a_fault_that_reached_a_finished_job_may_leave_the_attempt_succeeded() -> None:
    finished = [attempt(1, "Succeeded", "TrainingFinished")]
    late_kill = Landing("driver-killed", "step", [1], LAST, "between checkpoints", 30.0)
    assert outcomes_allowed(finished, [late_kill], PACE) == []
    early_kill = Landing("driver-killed", "step", [1], LAST - 5, "between checkpoints", 30.0)
    assert outcomes_allowed(finished, [early_kill], PACE), "a driver killed mid-training must count a failure"
    late_notice = Landing("spot-notice", "step", [1], LAST - 5, "between checkpoints", 30.0)
    assert outcomes_allowed(finished, [late_notice], PACE) == [], "the last interval may finish before the drain"


def test_an_attempt_no_run_fault_hit_may_only_finish_or_be_interrupted_by_a_cluster_fault() -> None:
    preempted = [attempt(1, "Preempted", "NodeLost"), attempt(2, "Succeeded", "TrainingFinished")]
    assert outcomes_allowed(preempted, [landing("s3-silent", [1])], PACE), "an S3 outage is never a preemption"
    interrupted = [attempt(1, "Interrupted", "InfrastructureFault"), attempt(2, "Succeeded", "TrainingFinished")]
    assert outcomes_allowed(interrupted, [landing("s3-silent", [1])], PACE) == []
    assert outcomes_allowed(interrupted, [], PACE), "interrupted with no fault at all"
    # A fault that missed (the job had ended) excuses nothing.
    assert outcomes_allowed(preempted, [landing("node-lost", [1], missed=True)], PACE)


def test_faults_are_drawn_where_they_can_land() -> None:
    rng = random.Random(3)
    pairs = second_starts = 0
    for number in range(300):
        lead = list(KINDS)[number % len(KINDS)]
        faults = draw_faults(rng, PACE, lead)
        assert 1 <= len(faults) <= 2
        assert lead in [drawn.kind for drawn in faults]
        for order, drawn in enumerate(faults):
            assert drawn.kind in KINDS
            if KINDS[drawn.kind].scope == "run":
                assert drawn.trigger in ("step", "upload"), "a run fault acts on a running job"
            if drawn.trigger == "step":
                assert drawn.value in PACE.steps_for(order, len(faults))
                assert 2 <= drawn.value < LAST - 2
            if drawn.trigger == "upload":
                assert drawn.value in PACE.saves_for(order, len(faults))
            if drawn.trigger == "start" and order == 1:
                # It waits for an attempt begun after the first fault: only a run fault that ends its
                # attempt surely makes one (a user's edit or pull does not).
                assert KINDS[faults[0].kind].scope == "run"
                assert KINDS[faults[0].kind].ends_attempt
                second_starts += 1
        if len(faults) == 2:
            pairs += 1
            first, second = faults
            if "start" not in (first.trigger, second.trigger):
                assert first.value < second.value, "the second fault lands later in the run"
    assert pairs > 50, "a third of the trials have two faults"
    assert second_starts > 0, "a cluster fault in the start-up of the attempt a run fault made"


def test_a_checkpoint_reported_complete_may_vanish_only_by_the_runs_own_keep() -> None:
    # keep 3, checkpoints 10..60 reported: pruning leaves 40, 50, 60, and every older one has 3 newer.
    assert checkpoints_vanished({10, 20, 30, 40, 50, 60}, {40, 50, 60}, keep=3) == []
    # An emergency checkpoint (57) pruned with the others is as fine.
    assert checkpoints_vanished({10, 20, 30, 40, 50, 57, 60}, {50, 57, 60}, keep=3) == []
    # A run created again that started fresh and pruned the first run's: 40 and 50 gone with one newer.
    lost = checkpoints_vanished({10, 20, 30, 40, 50}, {10, 60}, keep=3)
    assert [problem.split(" was ")[0] for problem in lost] == ["checkpoint-20", "checkpoint-30", "checkpoint-40",
                                                               "checkpoint-50"]  # fmt: skip
    # A startFrom that deleted the run's own before its copy was safe: nothing newer at all.
    assert checkpoints_vanished({10, 20}, set(), keep=3) != []


def test_a_run_created_again_may_create_its_rayjob_names_again_once() -> None:
    uids = {"t1-a1 of run A": {"j1"}, "t1-a2 of run A": {"j2"}, "t1-a1 of run B": {"j3"}}
    assert once_per_object(Counter({"t1-a1": 2, "t1-a2": 1}), uids) == Counter({"t1-a1": 1, "t1-a2": 1})
    # The same object creating a name twice is still seen.
    assert once_per_object(Counter({"t1-a1": 3, "t1-a2": 2}), uids) == Counter({"t1-a1": 2, "t1-a2": 2})


def test_a_first_fault_held_longest_is_over_while_the_job_still_has_a_save_to_come() -> None:
    """The flaw of the campaign's first part: 30 steps of 0.3 s were over inside a first fault held
    20-45 s, and every second fault was "never due"."""
    longest = max(kind.held_s[1] for kind in KINDS.values())
    assert longest == 45, "the controller's pause"
    coming_back = 10  # a stopped part answering again
    first_fault_over = max(PACE.steps_for(0, 2)) * PACE.step_seconds + longest + coming_back
    assert first_fault_over < max(PACE.saves_for(1, 2)) * PACE.step_seconds


def test_the_commit_window_opens_at_the_save_not_when_the_first_file_is_listed() -> None:
    """Seen in the first part with the 100 kB/s link: every fault fired right after a save was put
    "between checkpoints", because the files went up side by side and none was listed yet."""
    committed = ["checkpoint-10/model.safetensors", f"checkpoint-10/{MANIFEST_NAME}"]
    assert commit_window(committed, saved=[]) == "between checkpoints"
    assert commit_window(committed, saved=[10]) == "between checkpoints", "its manifest is in"
    assert commit_window(committed, saved=[10, 20]) == "being written: checkpoint-20 (0 files, no manifest)"
    uploading = [*committed, "checkpoint-20/optimizer.pt"]
    assert commit_window(uploading, saved=[20]) == "being written: checkpoint-20 (1 files, no manifest)"
    two = [*uploading, "checkpoint-100/optimizer.pt"]
    assert commit_window(two, saved=[]) == (
        "being written: checkpoint-20 (1 files, no manifest), checkpoint-100 (1 files, no manifest)"
    ), "in step order"
    pruned = ["checkpoint-40/model.safetensors", f"checkpoint-40/{MANIFEST_NAME}", "checkpoint-10/optimizer.pt"]
    assert commit_window(pruned, saved=[10, 20]) == "between checkpoints", "10 and 20 pruned since: 40 is complete"


def test_a_campaign_in_parts_is_summarized_from_its_trial_log_with_the_commit_of_each(tmp_path: Path) -> None:
    log_path = tmp_path / "trials.jsonl"
    failed_landing = Landing("s3-silent", "upload", [1], 20, "being written: checkpoint-20 (3 files, no manifest)", 9.0)
    passed = TrialResult(1, 101, [Fault("node-lost", "step", 12)], [landing("node-lost", [1])], [], 150.0, ["1 x"])
    failed = TrialResult(2, 102, [Fault("s3-silent", "upload", 20)], [failed_landing], ["lost a step"], 90.0)
    TrialLog(log_path, campaign_seed=1, parallel=3).append(passed)
    TrialLog(log_path, campaign_seed=1, parallel=1).append(failed)  # a second part, later

    results, stamps = TrialLog.read(log_path)
    assert results == [passed, failed]
    assert [stamp["parallel"] for stamp in stamps] == [3, 1]
    assert all(stamp["commit"] for stamp in stamps)
    totals = summary(results)
    assert (totals["trials"], totals["passes"]) == (2, 1)
    assert totals["windows"] == {"between checkpoints": 1, "checkpoint being written": 1}
    assert totals["failures"][0]["problems"] == ["lost a step"]

    rerun = TrialResult(2, 102, [Fault("s3-silent", "upload", 20)], [failed_landing], [], 95.0)
    TrialLog(log_path, campaign_seed=1, parallel=1).append(rerun)  # after the campaign's own fault was fixed
    latest, earlier = latest_runs(*TrialLog.read(log_path))
    assert latest == [passed, rerun], "a trial is its latest run"
    assert [(run["number"], run["problems"]) for run in earlier] == [(2, ["lost a step"])], "never dropped"


class _Ok(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection carries several requests
    BIG = b"x" * 1_000_000

    def do_GET(self) -> None:  # /big answers a megabyte, anything else "ok"
        body = self.BIG if self.path == "/big" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:  # an upload: its body read whole, then "ok"
        self.rfile.read(int(self.headers["Content-Length"]))
        self.do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with FaultProxy(server.server_address[1]) as started:
        yield started
    server.shutdown()


def get(proxy: FaultProxy, timeout: float = 2) -> int:
    with urllib.request.urlopen(f"{proxy.endpoint_url}/x", timeout=timeout) as response:
        return int(response.status)


def test_the_proxy_passes_then_fails_in_each_mode_then_passes_again(proxy: FaultProxy) -> None:
    assert get(proxy) == 200
    with fault(proxy, "error500"), pytest.raises(urllib.error.HTTPError) as answered:
        get(proxy)
    assert answered.value.code == 500
    with fault(proxy, "refuse"), pytest.raises(urllib.error.URLError) as refused:
        get(proxy)
    assert isinstance(refused.value.reason, ConnectionRefusedError)
    with fault(proxy, "silent"):
        started = time.monotonic()
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            get(proxy, timeout=0.5)
        assert time.monotonic() - started < 2
    assert get(proxy) == 200


def test_an_upload_link_slows_uploads_shared_by_every_connection_and_not_downloads() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def put(url: str, size: int) -> None:
        request = urllib.request.Request(url, data=b"y" * size, method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.read() == b"ok"

    with FaultProxy(server.server_address[1], upload_bytes_per_s=2_000_000) as slow:
        started = time.monotonic()
        with urllib.request.urlopen(f"{slow.endpoint_url}/big", timeout=10) as download:
            assert len(download.read()) == 1_000_000
        assert time.monotonic() - started < 0.4, "a download is not slowed"
        started = time.monotonic()
        two = [threading.Thread(target=put, args=(slow.endpoint_url, 500_000)) for _ in range(2)]
        for upload in two:
            upload.start()
        for upload in two:
            upload.join()
        assert 0.45 <= time.monotonic() - started < 3, "two half-megabyte uploads share a 2 MB/s link"
    server.shutdown()
    with pytest.raises(ValueError, match="a speed above 0"):
        FaultProxy(1, upload_bytes_per_s=0)


def response(connection: socket.socket) -> bytes:
    """One whole response of the test server (its body is ``ok``), however the bytes arrive."""
    received = b""
    while not received.endswith(b"ok"):
        chunk = connection.recv(1000)
        if not chunk:
            break
        received += chunk
    return received


def test_a_silence_stalls_an_open_connection_that_then_flows_again(proxy: FaultProxy) -> None:
    request = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
    connection = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    connection.sendall(request)
    assert response(connection).startswith(b"HTTP/1.1 200"), "relayed in pass mode first"
    proxy.set_mode("silent")
    connection.sendall(request)
    connection.settimeout(0.6)
    with pytest.raises(TimeoutError):
        connection.recv(1000)
    proxy.set_mode("pass")
    connection.settimeout(5)
    assert response(connection).startswith(b"HTTP/1.1 200")
    connection.close()


def test_a_spot_notice_goes_to_the_python_driver_not_the_shell_that_names_it() -> None:
    """Ray's job supervisor runs the entrypoint through a shell: SIGTERM to that shell ended it (exit
    -15, judged a training failure) and left the driver training on (trial 13 of campaign seed 1)."""
    shell = subprocess.Popen(["sh", "-c", f"sleep 30; {sys.executable} -m spotray.jobs.gpt2"])
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m", "spotray.jobs.gpt2"])
    try:
        for process in (shell, driver):  # until each has exec'd its program (a forked child shows its parent's)
            deadline = time.monotonic() + 10
            cmdline = Path(f"/proc/{process.pid}/cmdline")
            while b"spotray.jobs.gpt2" not in cmdline.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)
        assert not is_job_driver(shell.pid)
        assert is_job_driver(driver.pid)
        assert not is_job_driver(2**22 + 7)  # no such process
    finally:
        for process in (shell, driver):
            process.kill()
            process.wait()


def test_an_interruption_no_fault_explains_keeps_the_trials_logs() -> None:
    attempts = ["1 Interrupted/InfrastructureFault", "2 Succeeded/TrainingFinished"]
    assert unexplained_interruptions(attempts, [landing("s3-refuse", [2])]) == [1], "trial 96: S3 failed later"
    assert unexplained_interruptions(attempts, [landing("s3-refuse", [1])]) == []
    later = ["1 Preempted/NodeLost", "2 Interrupted/InfrastructureFault", "3 Succeeded/TrainingFinished"]
    assert unexplained_interruptions(later, [landing("s3-silent", [1])]) == [], "an outage reaching attempt 2"
    assert unexplained_interruptions(attempts, [landing("s3-silent", [])]) == [], "a fault between attempts"
    assert unexplained_interruptions(attempts, [landing("s3-refuse", [1], missed=True)]) == [1]
    assert unexplained_interruptions(["1 Succeeded/TrainingFinished"], []) == []


def test_a_pull_before_the_first_checkpoint_keeps_its_promise_by_saying_so() -> None:
    """Trial 41 pulled at step 3, before the run's first checkpoint: `spotray pull` said "no checkpoints"
    with exit 3 (not found), as docs/cli.md promises. Only that answer, and only with none there."""
    said = "error: there are no checkpoints under s3://nemesis/nemesis/runs/t41 |   fix: check RUN"
    assert pull_found_nothing(3, said, set())
    assert not pull_found_nothing(3, said, {10})  # one was there: the pull must have found it
    assert not pull_found_nothing(3, said, None)  # the listing did not answer: nothing is proved
    assert not pull_found_nothing(1, said, set())  # another failure is a failure


def test_a_pull_while_the_first_checkpoint_uploads_keeps_its_promise_by_saying_it_is_incomplete() -> None:
    """Trial 89 pulled at step 9, as checkpoint-10 (the run's first) was being uploaded: `spotray pull`
    refused with exit 1, "there is no complete checkpoint ... the newest, checkpoint-10, is incomplete",
    as docs/cli.md promises for an incomplete checkpoint. Only with no complete one there."""
    said = (
        "error: there is no complete checkpoint under s3://nemesis/nemesis/runs/t89: the newest, checkpoint-10, "
        "is incomplete (no manifest (upload unfinished or interrupted)) |   fix: wait for its upload to finish"
    )
    assert pull_found_nothing(1, said, set())
    assert not pull_found_nothing(1, said, {10})  # a complete one was there: the pull must have taken it
    assert not pull_found_nothing(1, said, None)
    assert not pull_found_nothing(3, said, set())  # that answer is a refusal (1), not a "not found"
    assert not pull_found_nothing(1, "error: s3://x/checkpoint-20 is corrupt", set())
