"""The extras: each one the code names exists in pyproject.toml, and a missing package names its extra."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from spotray.contract.extras import EXTRAS, MissingExtraError, extra_required

pytestmark = [pytest.mark.unit, pytest.mark.core]

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_every_extra_the_code_names_is_declared_and_all_holds_them_all() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(declared)
    assert declared["all"] == [f"spotray[{','.join(EXTRAS)}]"]


def test_a_missing_module_becomes_an_error_that_names_the_extra() -> None:
    with pytest.raises(MissingExtraError) as caught, extra_required("ray"):
        import spotray_no_such_module  # noqa: F401, PLC0415

    assert isinstance(caught.value, ImportError)
    assert "'spotray_no_such_module' is not installed" in str(caught.value)
    assert "pip install 'spotray[ray]'" in str(caught.value)


def test_an_unknown_extra_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown extra"), extra_required("gpu"):
        pass
