"""Test fixtures live in radixkv.testing, and the library proper imports none of them.

The LRU replay oracle (``reference``), the transfer worker threads (``workers``)
and the throwaway Redis servers (``localredis``) serve tests, benchmarks and
demos; they import without hypothesis, and every runtime dependency is one that
code outside radixkv.testing imports.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ("reference", "workers", "localredis")


def library_files():
    for folder in ("radixkv", "policies"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "testing" not in path.relative_to(ROOT).parts:
                yield path


def imported_modules(path: Path):
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1]).replace("policies", "radixkv.policies", 1)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = node.module if not node.level else ".".join(filter(None, (base, node.module)))
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def test_the_library_imports_no_fixture():
    fixtures = {f"radixkv.testing.{name}" for name in FIXTURES} | {"radixkv.testing"}
    for path in library_files():
        used = set(imported_modules(path)) & fixtures
        assert not used, f"{path.relative_to(ROOT)} imports {sorted(used)}"


def test_fixtures_import_without_hypothesis():
    code = ("import sys; sys.modules['hypothesis'] = None\n"
            + "".join(f"import radixkv.testing.{name}\n" for name in FIXTURES)
            + "from radixkv.testing import RadixKVTarget\n"
            "print('radixkv.testing.machine' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_kit_still_loads_its_machine_and_strategies_on_use():
    import radixkv.testing as kit
    from radixkv.testing import machine, strategies

    assert kit.run_conformance is machine.run_conformance and kit.strategies is strategies
    assert set(kit.__all__) <= set(dir(kit))


def test_every_runtime_dependency_is_imported_outside_the_fixtures():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("-", "_") for d in deps]
    used = {module.split(".")[0] for path in library_files() for module in imported_modules(path)}
    for name in names:
        assert name in used, f"{name} is declared but only fixtures (or nothing) import it"
