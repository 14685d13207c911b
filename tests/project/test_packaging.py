"""The distribution ships every radixkv package, and policies only as radixkv.policies."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "radixkv").rglob("__init__.py")}
    found |= {"radixkv.policies"}
    assert found == listed
    assert config["package-dir"] == {"radixkv.policies": "policies"}
    assert "policies" not in listed


def test_policies_import_as_radixkv_policies():
    import radixkv.policies as policies

    assert Path(policies.__file__).resolve().parent == ROOT / "policies"
    assert "lru" in policies.available()


def test_python_dash_m_runs_the_cli():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "radixkv", "--help"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("Usage: radixkv ")
    assert "replay" in out.stdout


def test_license_and_typing_marker_ship():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert project["project"]["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text().splitlines()[0]
    assert (ROOT / "radixkv" / "py.typed").is_file()
    assert project["tool"]["setuptools"]["package-data"]["radixkv"] == ["py.typed"]


def test_every_runtime_dependency_is_imported():
    import re

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("-", "_") for d in deps]
    sources = "\n".join(p.read_text() for d in ("radixkv", "policies") for p in (ROOT / d).rglob("*.py"))
    for name in names:
        assert re.search(rf"^\s*(import|from) {name}\b", sources, re.M), f"{name} is declared but never imported"
