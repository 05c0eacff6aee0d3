"""The layers of docs/architecture.md ("Module map and layers"), checked on every module under spotray/.

Imports go down, never up. The job side, lowest first (a module may import its own package and
any layer before its own; two packages that share a line are siblings and import neither other):

    spotray.contract            the shared contract: spec, URIs, attempts, names, errors, extras
    spotray.train.processes     ranks, child processes
    spotray.train.storage       object stores, hashed downloads, the embedded S3 server
    spotray.train.records       attempt records, progress, goodput, events, the plot
    spotray.train.checkpoints   the checkpoint format, its upload, resume
    spotray.train.launch | spotray.train.hf    Ray and torchrun glue | the Hugging Face side
    spotray.jobs                the example jobs

The run's decisions (spotray.decisions: the run's plan, its budgets, the sweep's choices, cost
and goodput arithmetic, the vocabulary of Events and refusals) stand on the contract alone: pure
functions of facts, shared by the controller and local mode, importing no other spotray layer and
imported by no job-side module. The controller stands beside the job side, not above it: it reads
what attempts leave in the store, so it may import the contract, the decisions, storage, records
and checkpoints, and nothing that trains (processes, launch, hf), no job and no CLI module. Local
mode (spotray.local: a TrainingRun or a sweep on one machine) may import everything below it but
the controller: it shares the decisions, not the controller's internals. The command line
(spotray.cli) is the top: it may import anything, and nothing imports it. Nothing else stands at
the package's top level (a module there is in no layer). spotray/__init__.py and
train/__init__.py are imported by every import below them, so they import no spotray module.

The tools beside the package import it, never the other way: the test bed (testbed/) may import
spotray and itself; the benchmarks (bench/) spotray, the test bed and themselves; nothing under
spotray/ imports testbed, bench or tests. Every one of them is imported as the package it is, from the
repository's root: no file changes ``sys.path``.

Imports inside ``if TYPE_CHECKING:`` never run and are exempt. Every other import counts, at
module level or inside a function. Third-party packages: the contract is standard library and
PyYAML only; the decisions add only Optuna (the sweep's sampler); the controller
imports neither torch, Ray nor the Hugging Face stack, and nothing
below launch/hf imports Ray (``pip install spotray`` has no Ray). Two subprocesses check the same
at run time: importing the contract or the decisions loads none of them (nor boto3).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.core]

ROOT = Path(__file__).resolve().parents[2]

# The job side, lowest first. Packages on one line are siblings: neither may import the other.
JOB_SIDE: list[tuple[str, ...]] = [
    ("spotray.contract",),
    ("spotray.train.processes",),
    ("spotray.train.storage",),
    ("spotray.train.records",),
    ("spotray.train.checkpoints",),
    ("spotray.train.launch", "spotray.train.hf"),
    ("spotray.jobs",),
]
DECISIONS = "spotray.decisions"
CONTROLLER = "spotray.controller"
# What the controller may import besides itself: the decisions, what attempts leave in the store, and how to read it.
CONTROLLER_MAY_IMPORT = (
    "spotray.contract",
    DECISIONS,
    "spotray.train.storage",
    "spotray.train.records",
    "spotray.train.checkpoints",
)
CLI = "spotray.cli"
# Local mode: it runs a TrainingRun on one machine with the decisions the controller makes.
LOCAL_MODE = "spotray.local"
# Package roots: imported whenever anything under them is, so they must import no spotray module,
# but the top one may import the contract (the bottom layer: nothing of spotray's under it, so no
# cycle) to name the extra a public name needs; those names themselves load lazily (spotray/__init__.py).
ROOTS = ("spotray", "spotray.train")
ROOT_MAY_IMPORT = {"spotray": "spotray.contract"}

# Third-party packages, by the layer that must not import them (standard library aside).
CONTRACT_MAY_IMPORT = ("yaml",)  # and the standard library, and itself
NOT_IN_CONTROLLER = ("torch", "ray", "transformers", "accelerate", "safetensors", "streaming")
DECISIONS_MAY_IMPORT = ("yaml", "optuna")  # and the standard library
SWEEP_SAMPLER = "spotray.decisions.sweep_plan"  # the one decisions module that needs Optuna (the [sweep] extra)
RAY_ONLY_FROM = ("spotray.train.launch", "spotray.train.hf", "spotray.jobs", LOCAL_MODE, CLI)
# Not to be in sys.modules after the import, checked in a fresh interpreter.
NOT_LOADED_BY_CONTRACT = ("torch", "ray", "transformers", "boto3", "botocore", "streaming", "kubernetes", "kopf")
NOT_LOADED_BY_CONTROLLER = ("torch", "ray", "transformers")
NOT_LOADED_BY_DECISIONS = NOT_LOADED_BY_CONTRACT


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository root, as the file really is (train/..., not spotray/train/...)
    line: int
    importer: str  # the importing module, e.g. spotray.train.records.goodput
    target: str  # the imported module, e.g. spotray.train.storage.store, or torch.distributed


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under spotray/, by dotted name; the symlinked folders are followed once."""
    found: dict[str, Path] = {}

    def walk(folder: Path, prefix: list[str]) -> None:
        for dirpath, dirnames, filenames in os.walk(folder):  # does not descend into symlinked folders
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = Path(dirpath).relative_to(folder).parts
            for name in sorted(f for f in filenames if f.endswith(".py")):
                parts = [*prefix, *rel] + ([] if name == "__init__.py" else [name[: -len(".py")]])
                found[".".join(parts)] = Path(dirpath) / name

    package = root / "spotray"
    walk(package, ["spotray"])
    for link in sorted(p for p in package.iterdir() if p.is_symlink() and p.is_dir()):
        walk(link.resolve(), ["spotray", link.name])
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) bodies."""
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}:
            exempt |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return exempt


def _import_statements(path: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a file that runs, at module level or in a function (``if TYPE_CHECKING:``
    bodies aside)."""
    tree = ast.parse(path.read_text(), str(path))
    exempt = _type_checking_only(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in exempt:
            yield node


def imports(root: Path = ROOT) -> list[Import]:
    """Every import statement that runs, at module level or in a function, resolved to a module name."""
    known = modules(root)
    found = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        file = str(path.resolve().relative_to(root.resolve()))
        for node in _import_statements(path):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from its package, one level up per extra dot
                    package = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                # `from spotray.train import hf` imports the subpackage, not just spotray.train
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            found += [Import(file, node.lineno, module, target) for target in dict.fromkeys(targets)]
    return found


def unit_of(module: str) -> str:
    """The layer, controller, CLI or package root that a spotray module belongs to."""
    if module in ROOTS:
        return module
    for layer in JOB_SIDE:
        for package in layer:
            if module == package or module.startswith(package + "."):
                return package
    for unit in (DECISIONS, CONTROLLER, LOCAL_MODE, CLI):
        if module == unit or module.startswith(unit + "."):
            return unit
    if module.startswith("spotray.train."):
        return "unlayered " + ".".join(module.split(".")[:3])
    return "unlayered " + ".".join(module.split(".")[:2])


def rank(unit: str) -> int | None:
    return next((i for i, layer in enumerate(JOB_SIDE) if unit in layer), None)


def layering_violations(root: Path = ROOT) -> list[str]:
    problems = []
    for imp in imports(root):
        if imp.target != "spotray" and not imp.target.startswith("spotray."):
            continue
        importer, imported = unit_of(imp.importer), unit_of(imp.target)
        where = f"{imp.file}:{imp.line} ({imp.importer}) imports {imp.target}"
        if importer.startswith("unlayered") or imported.startswith("unlayered"):
            problems.append(f"{where}: {importer if importer.startswith('unlayered') else imported} is in no layer")
        elif importer in ROOTS and imported != ROOT_MAY_IMPORT.get(importer):
            problems.append(f"{where}: {importer} is imported with everything under it, so it imports nothing")
        elif importer in ROOTS or importer == imported or imported in ROOTS:
            continue
        elif imported == CLI:
            problems.append(f"{where}: nothing imports the command line (spotray.cli)")
        elif importer == CLI:
            continue
        elif importer == LOCAL_MODE:
            if imported == CONTROLLER:
                problems.append(f"{where}: local mode shares {DECISIONS} with the controller, not its modules")
        elif imported == LOCAL_MODE:
            problems.append(f"{where}: only the command line imports local mode (spotray.local)")
        elif importer == DECISIONS:
            if imported != "spotray.contract":
                problems.append(f"{where}: the decisions stand on spotray.contract alone")
        elif importer == CONTROLLER:
            if imported not in CONTROLLER_MAY_IMPORT:
                problems.append(f"{where}: the controller may import only {', '.join(CONTROLLER_MAY_IMPORT)}")
        elif imported == CONTROLLER:
            problems.append(f"{where}: the job side never imports the controller")
        elif imported == DECISIONS:
            problems.append(f"{where}: the job side never imports the decisions")
        else:
            low, high = rank(importer), rank(imported)
            assert low is not None
            assert high is not None
            if high >= low:
                relation = "a sibling of" if high == low else "below"
                problems.append(f"{where}: {importer} is {relation} {imported}")
    return problems


def third_party_violations(root: Path = ROOT) -> list[str]:
    problems = []
    for imp in imports(root):
        top = imp.target.split(".")[0]
        if top == "spotray" or top in sys.stdlib_module_names:
            continue
        unit = unit_of(imp.importer)
        where = f"{imp.file}:{imp.line} ({imp.importer}) imports {imp.target}"
        if unit == "spotray.contract" and top not in CONTRACT_MAY_IMPORT:
            problems.append(f"{where}: the contract is the standard library and {', '.join(CONTRACT_MAY_IMPORT)}")
        if unit == DECISIONS and top not in DECISIONS_MAY_IMPORT:
            problems.append(f"{where}: the decisions are the standard library and {', '.join(DECISIONS_MAY_IMPORT)}")
        if unit == CONTROLLER and top in NOT_IN_CONTROLLER:
            problems.append(f"{where}: the controller decides without {', '.join(NOT_IN_CONTROLLER)}")
        if top == "ray" and unit not in RAY_ONLY_FROM:
            problems.append(f"{where}: only {', '.join(RAY_ONLY_FROM)} import Ray")
    return problems


# The repository's own top-level packages, and which of them each may import (itself included).
OWN_PACKAGES = ("spotray", "testbed", "bench", "tests", "hack")
MAY_IMPORT_OWN = {"spotray": ("spotray",), "testbed": ("spotray", "testbed"), "bench": ("spotray", "testbed", "bench")}
# Where Python files live that are run or imported (the symlinked folders are found through spotray/).
PYTHON_FOLDERS = ("spotray", "testbed", "bench", "tests", "hack", "plugins")


def _python_files(root: Path, folder: str) -> list[Path]:
    if folder == "spotray":
        return sorted(set(modules(root).values()))
    return sorted(p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _running_imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every absolute import that runs (``_import_statements``)."""
    found = []
    for node in _import_statements(path):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif not node.level:
            found.append((node.lineno, node.module or ""))
    return found


def tool_violations(root: Path = ROOT) -> list[str]:
    """Imports of the repository's own packages that go against ``MAY_IMPORT_OWN``."""
    problems = []
    for folder, may in MAY_IMPORT_OWN.items():
        for path in _python_files(root, folder):
            for line, target in _running_imports(path):
                top = target.split(".")[0]
                if top in OWN_PACKAGES and top not in may:
                    where = f"{path.resolve().relative_to(root.resolve())}:{line}"
                    problems.append(f"{where} imports {target}: {folder}/ may import only {', '.join(may)}")
    return problems


def path_changes(root: Path = ROOT) -> list[str]:
    """Every call that changes ``sys.path`` (insert, append, extend, assignment) in the repository's Python files."""
    found = []
    for folder in PYTHON_FOLDERS:
        for path in _python_files(root, folder):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                target = node.func if isinstance(node, ast.Call) else None
                text = ast.unparse(target) if target is not None else ""
                assigned = isinstance(node, ast.Assign) and any(ast.unparse(t) == "sys.path" for t in node.targets)
                if assigned or text.startswith("sys.path."):
                    found.append(f"{path.resolve().relative_to(root.resolve())}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_tools_import_the_package_and_never_the_other_way() -> None:
    problems = tool_violations()
    assert not problems, "\n".join(problems)


def test_the_hydra_launcher_shares_the_decisions_not_the_controller() -> None:
    """The plugin (plugins/hydra-spotray-launcher) runs where the user's Hydra app does: it reads a sweep's
    trials with spotray.decisions, as local mode does, and imports no controller module."""
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in _python_files(ROOT, "plugins")
        for line, target in _running_imports(path)
        if target == CONTROLLER or target.startswith(CONTROLLER + ".")
    ]
    assert found == []
    assert any(
        target.startswith(DECISIONS) for path in _python_files(ROOT, "plugins") for _, target in _running_imports(path)
    )


def test_nothing_changes_sys_path() -> None:
    """The test bed, the benchmarks and the tests are packages imported from the repository's root."""
    assert path_changes() == []


def test_the_tool_checks_find_a_wrong_import_and_a_path_change(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "spotray/__init__.py": "",
            "spotray/cli/main.py": "import testbed.cluster\n",
            "testbed/__init__.py": "",
            "testbed/cluster.py": "from bench.common import write_result\nimport spotray.cli.main\n",
            "bench/__init__.py": "",
            "bench/common.py": "import sys\nsys.path.insert(0, 'hack')\nfrom tests.minio import x\n",
        },
    )
    assert sorted(tool_violations(tmp_path)) == [
        "bench/common.py:3 imports tests.minio: bench/ may import only spotray, testbed, bench",
        "spotray/cli/main.py:1 imports testbed.cluster: spotray/ may import only spotray",
        "testbed/cluster.py:1 imports bench.common: testbed/ may import only spotray, testbed",
    ]
    assert path_changes(tmp_path) == ["bench/common.py:2: sys.path.insert(0, 'hack')"]


def test_every_module_is_found_through_the_symlinks() -> None:
    found = modules()
    for module in (
        "spotray.cli.main",
        "spotray.contract.spec",
        "spotray.train.processes.ranks",
        "spotray.train.launch.launcher",
        "spotray.train.hf.notice",
        "spotray.decisions.run_plan",
        "spotray.jobs.gpt2.train",
    ):
        assert module in found, f"{module} not found: the walk of spotray/ is broken"
    assert all(path.resolve().is_relative_to(ROOT) for path in found.values())


def test_imports_only_go_down_the_layers() -> None:
    problems = layering_violations()
    assert not problems, "imports against the layers (tests/unit/test_layering.py, docs/architecture.md):\n" + (
        "\n".join(problems)
    )


def test_third_party_imports_stay_in_their_layers() -> None:
    problems = third_party_violations()
    assert not problems, "\n".join(problems)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_checks_name_the_file_and_line_of_an_upward_import(tmp_path: Path) -> None:
    """The checker itself, on a small tree laid out like this one, with one violation of each kind."""
    _write(
        tmp_path,
        {
            "spotray/__init__.py": "",
            "spotray/cli/main.py": "import spotray.controller.handlers\nfrom spotray.train import hf\n",
            "spotray/contract/__init__.py": "",
            "spotray/contract/spec.py": "import yaml\nimport boto3\n",
            "train/__init__.py": "",
            "train/processes/__init__.py": "",
            "train/processes/ranks.py": "def f():\n    from spotray.train.hf import worker\n",
            "train/storage/__init__.py": "",
            "train/storage/store.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from spotray.train.hf import worker\n"
            ),
            "train/launch/__init__.py": "",
            "train/launch/launcher.py": "import ray\nfrom spotray.train.hf.worker import x\n",
            "train/hf/__init__.py": "",
            "train/hf/worker.py": "from spotray.contract import spec\nfrom spotray.decisions import run_plan\n",
            "spotray/decisions/__init__.py": "",
            "spotray/decisions/run_plan.py": (
                "from spotray.contract import spec\nfrom spotray.train.storage import store\n"
            ),
            "spotray/local/local_run.py": (
                "from spotray.decisions import run_plan\nfrom spotray.controller import reconcile\n"
            ),
            "spotray/helpers.py": "from spotray.contract import spec\n",
            "train/records/__init__.py": "import ray\n",
            "controller/__init__.py": "",
            "controller/lifecycle.py": (
                "import torch\nfrom spotray.train.processes.ranks import f\nimport spotray.cli.main\n"
            ),
        },
    )
    for folder in ("train", "controller"):
        (tmp_path / "spotray" / folder).symlink_to(Path("..") / folder)
    assert sorted(layering_violations(tmp_path)) == sorted(
        [
            "train/processes/ranks.py:2 (spotray.train.processes.ranks) imports spotray.train.hf.worker: "
            "spotray.train.processes is below spotray.train.hf",
            "train/launch/launcher.py:2 (spotray.train.launch.launcher) imports spotray.train.hf.worker: "
            "spotray.train.launch is a sibling of spotray.train.hf",
            "controller/lifecycle.py:2 (spotray.controller.lifecycle) imports spotray.train.processes.ranks: "
            "the controller may import only " + ", ".join(CONTROLLER_MAY_IMPORT),
            "controller/lifecycle.py:3 (spotray.controller.lifecycle) imports spotray.cli.main: "
            "nothing imports the command line (spotray.cli)",
            "train/hf/worker.py:2 (spotray.train.hf.worker) imports spotray.decisions.run_plan: "
            "the job side never imports the decisions",
            "spotray/decisions/run_plan.py:2 (spotray.decisions.run_plan) imports spotray.train.storage.store: "
            "the decisions stand on spotray.contract alone",
            "spotray/local/local_run.py:2 (spotray.local.local_run) imports spotray.controller: "
            "local mode shares spotray.decisions with the controller, not its modules",
            "spotray/helpers.py:1 (spotray.helpers) imports spotray.contract.spec: "
            "unlayered spotray.helpers is in no layer",
        ]
    )
    assert sorted(third_party_violations(tmp_path)) == sorted(
        [
            "spotray/contract/spec.py:2 (spotray.contract.spec) imports boto3: "
            "the contract is the standard library and yaml",
            "controller/lifecycle.py:1 (spotray.controller.lifecycle) imports torch: "
            "the controller decides without " + ", ".join(NOT_IN_CONTROLLER),
            "train/records/__init__.py:1 (spotray.train.records) imports ray: only "
            + ", ".join(RAY_ONLY_FROM)
            + " import Ray",
        ]
    )


def _loaded_after_importing(names: list[str], watched: tuple[str, ...]) -> dict[str, list[str]]:
    """In a fresh interpreter, import each module in turn: which watched packages each one loaded."""
    code = (
        "import importlib, json, sys\n"
        f"watched, loaded = {list(watched)!r}, {{}}\n"
        f"for name in {names!r}:\n"
        "    before = {w for w in watched if w in sys.modules}\n"
        "    importlib.import_module(name)\n"
        "    loaded[name] = sorted(w for w in watched if w in sys.modules and w not in before)\n"
        "print(json.dumps(loaded))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRAY_")}  # the controller's defaults
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_contract_loads_no_heavy_dependency() -> None:
    contract = sorted(m for m in modules() if unit_of(m) == "spotray.contract")
    loaded = _loaded_after_importing(contract, NOT_LOADED_BY_CONTRACT)
    assert not {name: packages for name, packages in loaded.items() if packages}


def test_the_decisions_load_no_heavy_dependency() -> None:
    """The run's plan decides from facts read elsewhere (controller/run_store.py reads S3): no boto3,
    no Kubernetes client."""
    decisions = sorted(m for m in modules() if unit_of(m) == DECISIONS)
    assert "spotray.decisions.run_plan" in decisions
    if importlib.util.find_spec("optuna") is None:  # the [sweep] extra: `pip install spotray` has no sampler
        decisions.remove(SWEEP_SAMPLER)
    loaded = _loaded_after_importing(decisions, NOT_LOADED_BY_DECISIONS)
    assert not {name: packages for name, packages in loaded.items() if packages}


def test_no_controller_module_loads_torch_ray_or_transformers() -> None:
    """Every module, kopf handlers included (the [controller] extra; no cluster needed to import them)."""
    for package in ("kopf", "kubernetes", "prometheus_client"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (the [controller] extra)")
    controller = sorted(m for m in modules() if unit_of(m) == CONTROLLER)
    loaded = _loaded_after_importing(controller, NOT_LOADED_BY_CONTROLLER)
    assert "spotray.controller.handlers" in loaded
    assert not {name: packages for name, packages in loaded.items() if packages}
