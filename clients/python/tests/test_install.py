"""The package installs as docs/python.md says: offline, into a virtual environment.

``pip install --no-index --no-build-isolation clients/python`` builds with the setuptools
backend, which (setuptools 65 and 66 here) needs the ``wheel`` package beside it: a venv made
with ``--system-site-packages`` sees Debian's ``python3-setuptools`` and ``python3-wheel``.
What it installs is the package, typed, under its version, removed whole by ``pip uninstall``;
``pip install -e`` points at the source tree.
"""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

import pytest

# Debian keeps ensurepip (which `python3 -m venv` needs for pip) in python3-venv, and the
# offline build needs setuptools and wheel from the system; .ci/run installs all three.
pytest.importorskip("ensurepip", reason="a venv with pip needs ensurepip: apt-get install python3-venv")
pytest.importorskip("wheel", reason="the offline build needs wheel: apt-get install python3-wheel")

PROJECT = Path(__file__).resolve().parent.parent


def _run(*args: str | Path) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _source(tmp_path: Path) -> Path:
    """A copy of the project: setuptools writes build/ and an .egg-info into the tree it builds."""
    copy = tmp_path / "python"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests", "examples"))
    return copy


def _venv(path: Path) -> Path:
    venv.create(path, with_pip=True, system_site_packages=True)
    return path / "bin" / "python"


def test_installs_offline_as_documented_and_uninstalls_whole(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv")
    _run(python, "-m", "pip", "install", "--no-index", "--no-build-isolation", _source(tmp_path))
    shown = _run(python, "-c", (
        "import importlib.metadata as m, importlib.resources as r, fencegate;"
        "print(fencegate.__file__); print(m.version('fencegate'));"
        "print(r.files('fencegate').joinpath('py.typed').is_file());"
        "print(hasattr(fencegate, 'FencegateClient'), hasattr(fencegate, 'AsyncFencegateClient'))"
    )).splitlines()
    assert Path(shown[0]).is_relative_to(tmp_path / "venv")
    assert shown[1:] == ["0.1.0", "True", "True True"]
    site = Path(shown[0]).parent.parent
    _run(python, "-m", "pip", "uninstall", "-y", "fencegate")
    assert [p.name for p in site.iterdir() if p.name.startswith("fencegate")] == []


def test_installs_editable_from_the_source_tree(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv")
    source = _source(tmp_path)
    _run(python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "-e", source)
    where = _run(python, "-c", "import fencegate; print(fencegate.__file__)").strip()
    assert Path(where) == source / "src" / "fencegate" / "__init__.py"
