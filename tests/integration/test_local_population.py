"""`spotray run SWEEP --local` with population-based training (issue 40): the worse trial goes on from the
better one's checkpoint with a perturbed learning rate, and the new rate is the one it trains with.

Two trials at once (this machine's 2 CPUs), compared every 20 of 60 paced steps, their learning rates
drawn from a log range (seed 1: about 2.7e-3 and 1.4e-4). At step 20 the worse one exploits the other:
it is stopped on a checkpoint, then started again with checkpoint.startFrom naming the donor's newest
compared checkpoint, which its job copies into its own prefix before it resumes, and with the donor's
rate times 0.8 or 1.2 (no resampling here). It goes on from the donor's step, at its new rate where
the schedule is: the Trainer alone would have restored the donor's rate from the checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import get_cosine_schedule_with_warmup

from spotray.contract.sweep import parse_sweep
from spotray.decisions.sweep_plan import decide
from spotray.train.records.event_log import read_events

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 60

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def sweep_document(tmp_path: Path) -> dict[str, Any]:
    document = yaml.safe_load((REPO / "jobs/gpt2/pbt.yaml").read_text())
    template = document["spec"]["template"]
    template["entrypoint"] = (
        f"python -m spotray.jobs.gpt2 --max-steps {MAX_STEPS} --batch-size 8 --n-layer 1 --n-embd 32 --dropout 0 "
        f"--min-step-seconds 0.3 --workdir {tmp_path / 'scratch'} --learning-rate ${{lr}}"
    )
    template["checkpoint"]["keep"] = 6  # the donor's compared checkpoint is still there when it is copied
    document["spec"]["search"] = {"algorithm": "random", "seed": 1}
    document["spec"]["populationBased"] = {"intervalSteps": 20, "quantile": 0.25, "resampleProbability": 0}
    return document


def schedule(rate: float, step: int) -> float:
    """The rate the gpt2 job's Trainer trains ``step`` with (and logs) for a peak ``rate``: its cosine
    schedule (a warm-up of max_steps // 20) after the step before."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=rate)
    scheduler = get_cosine_schedule_with_warmup(optimizer, max(1, MAX_STEPS // 20), MAX_STEPS)
    return rate * scheduler.lr_lambdas[0](step - 1)


# 4-7 minutes (two local trials at once, each a Ray cluster and a GPT-2 run): make test-campaign. In
# make test the decisions are held by tests/unit/test_population.py, the donor's checkpoint copied by
# tests/integration/test_start_from.py and the new rate by test_learning_rate_after_resume.py.
@pytest.mark.campaign
@pytest.mark.timeout(900)
def test_the_worse_trial_goes_on_from_the_better_ones_checkpoint_at_its_own_new_rate(tmp_path: Path) -> None:
    manifest = tmp_path / "pbt.yaml"
    manifest.write_text(yaml.safe_dump(sweep_document(tmp_path)))
    workdir = tmp_path / "sweep"
    command = [sys.executable, "-m", "spotray.cli", "run", str(manifest), "--local", "--workdir", str(workdir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=850, check=False, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "Failed" not in output
    assert "exploited: from trial" in output, "the summary shows the lineage"

    state = json.loads((workdir / "sweep-state.json").read_text())
    [(number, exploit)] = [
        (int(trial), exploit)
        for trial, exploits in state["lineage"].items()
        for exploit in exploits
        if exploit["step"] == 20
    ]
    donor = exploit["donor"]
    assert donor == 3 - number, "the other trial"
    assert f"trial {number} exploits trial {donor} at step 20" in output, output[-3000:]
    initial = dict(decide(parse_sweep(sweep_document(tmp_path)).spec, []).start)
    assert exploit["before"] == initial[number]
    donor_rate = initial[donor]["lr"]
    assert exploit["values"]["lr"] in (float(f"{donor_rate * 0.8:.6g}"), float(f"{donor_rate * 1.2:.6g}"))

    # Its job copied the donor's checkpoint, and its next attempt resumed from the donor's step.
    events = list(read_events(workdir / f"gpt2-pbt-t{number}" / "events.jsonl"))
    copies = [i for i, e in enumerate(events) if e.get("event") == "started_from"]
    begin = copies[0]
    assert events[begin]["uri"].endswith(f"/gpt2-pbt-t{donor}/checkpoint-{exploit['donorStep']}"), events[begin]
    [resumed] = [e for e in events[begin:] if e.get("event") == "start"][:1]
    assert resumed["resumed_from"] == exploit["donorStep"]

    # Until its next exploit (if any) it trains at its new rate where the schedule is, not the donor's.
    end = copies[1] if len(copies) > 1 else len(events)
    after = [e for e in events[begin:end] if e.get("event") == "step" and "lr" in e]
    assert after, "steps after the exploit"
    assert after[0]["step"] == exploit["donorStep"] + 1
    for event in after:
        assert event["lr"] == pytest.approx(schedule(exploit["values"]["lr"], event["step"]), rel=1e-6), event
    assert (workdir / "sweep.png").read_bytes().startswith(b"\x89PNG"), "every curve, the exploit marked"
