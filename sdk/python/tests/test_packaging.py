"""What ``pip install ./sdk/python`` installed (scripts/test.sh installs it into the venv):
the typed package with every module of the tree, depending on ``httpx`` alone.

The tests import the tree's own copy (the Rust test puts ``sdk/python`` first on
``PYTHONPATH``, so an edit is tested without reinstalling); this checks the distribution."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ostiary"


def test_the_installed_distribution_is_typed_and_complete() -> None:
    try:
        dist = metadata.distribution("ostiary")
    except metadata.PackageNotFoundError:
        pytest.fail("ostiary is not installed: run scripts/test.sh --setup-only (pip install ./sdk/python)")
    installed = {Path(str(f)).as_posix() for f in dist.files or []}
    assert "ostiary/py.typed" in installed, "without py.typed mypy ignores the package's types"
    for module in sorted(PACKAGE.glob("*.py")):
        assert f"ostiary/{module.name}" in installed, f"{module.name} is not installed: reinstall"
    requires = [r for r in dist.requires or [] if "extra ==" not in r]
    assert [r.split(">")[0].split("<")[0].split("=")[0].strip() for r in requires] == ["httpx"]
    extras = set(dist.metadata.get_all("Provides-Extra") or [])
    assert extras == {"mcp", "requests"}
