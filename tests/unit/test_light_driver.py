"""The GPT-2 job's driver imports neither transformers nor the model's code (issue 39, item 3).

A driver starts on every attempt before any worker can, and its imports were its largest phase on
real pods (17 s of 51 s from RayJob to first step, docs/goodput.md); transformers was half of its
CPU time (farm-bench, A vs B). Ray ships the workers' loop by reference, so the driver's
``train_loop`` must stay a light function whose module a worker imports, and that imports the heavy
one itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

HEAVY = ("transformers", "spotray.jobs.gpt2.train", "spotray.train.hf.data")


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_what_python_m_spotray_jobs_gpt2_imports_leaves_out_transformers() -> None:
    loaded = (
        run_python(
            """
        import sys
        import spotray.jobs.gpt2.__main__  # what `python -m spotray.jobs.gpt2` runs, but main()
        print(",".join(sorted(sys.modules)))
        """
        )
        .strip()
        .split(",")
    )
    assert "spotray.jobs.gpt2.driver" in loaded
    assert not [module for module in HEAVY if module in loaded]


def test_the_workers_loop_travels_by_reference_and_imports_the_worker_side_only_where_it_runs() -> None:
    pickled = run_python(
        """
        import sys
        import ray.cloudpickle as cloudpickle
        from spotray.jobs.gpt2.driver import train_loop
        data = cloudpickle.dumps(train_loop)
        assert "transformers" not in sys.modules
        print(data.hex())
        """
    ).strip()
    assert len(pickled) < 2000, "by reference: a module and a name, not the function's code"
    unpickled = run_python(
        f"""
        import pickle
        loop = pickle.loads(bytes.fromhex("{pickled}"))
        print(loop.__module__, loop.__name__)
        """
    )
    assert unpickled.split() == ["spotray.jobs.gpt2.driver", "train_loop"]
