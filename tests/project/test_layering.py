"""docs/architecture.md's "Layering", checked against the code: every module of radixkv/ and policies/ is
named there, and each imports (outside ``TYPE_CHECKING``) only modules of its own layer or of
the layers before it. A new module or an upward import fails here until docs/architecture.md says where
it belongs."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first: a module may import from its own layer and the ones above it in this list.
LAYERS = [
    {"errors", "keys", "extents"},
    {"tree", "page_keys", "token_buffer", "costs"},
    {"pool", "victims", "capacity", "tenancy", "copies"},
    {"policies"},
    {"events"},
    {"router"},
    {"store"},
    {"lower"},
    {"cache"},
    {"tiers"},
    {"adapters"},
    {"workload"},
    {"analysis"},
    {"cluster", "global_index", "fleet"},
    {"api", "cli", "__main__", "__init__"},
    {"testing"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> Iterator[Tuple[str, Path]]:
    """``(dotted name, path)`` of every module, ``policies/`` as ``radixkv.policies``."""
    for base, prefix in ((ROOT / "radixkv", "radixkv"), (ROOT / "policies", "radixkv.policies")):
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            yield ".".join([prefix] + parts), path


def component(dotted: str) -> str:
    """The layer name of ``radixkv.x.y``: ``x`` (``__init__`` for the package itself)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def runtime_imports(dotted: str, path: Path) -> Set[str]:
    """The radixkv modules ``path`` imports when it runs (imports under ``if TYPE_CHECKING`` left out)."""
    tree = ast.parse(path.read_text())
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    package = dotted if path.name == "__init__.py" else dotted.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target + "." + a.name for a in node.names] if node.module is None else [target]
            else:
                names = [node.module or ""]
            out.update(n for n in names if n.startswith("radixkv"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("radixkv"))
    return out


def test_every_module_has_a_layer():
    missing = sorted({component(d) for d, _ in modules()} - set(LAYER_OF))
    assert not missing, f"modules of no layer (add them to LAYERS and docs/architecture.md): {missing}"


@pytest.mark.parametrize("dotted,path", list(modules()), ids=lambda v: str(v) if isinstance(v, str) else "")
def test_imports_go_down_the_layers(dotted, path):
    own = component(dotted)
    if own not in LAYER_OF:
        pytest.fail(f"{dotted} has no layer")
    upward = sorted(t for t in runtime_imports(dotted, path)
                    if component(t) in LAYER_OF and LAYER_OF[component(t)] > LAYER_OF[own])
    assert not upward, f"{dotted} (layer {own}) imports later layers: {upward}"


def readme_entries() -> Dict[str, Set[str]]:
    """The Layering block's entries: each name before the description (``tiers/``, ``api, cli``)
    -> the words of its description, continuation lines included."""
    readme = (ROOT / "docs" / "architecture.md").read_text()
    block = readme.split("## Layering", 1)[1].split("```", 2)[1]
    entries: Dict[str, Set[str]] = {}
    words: Set[str] = set()
    for line in block.splitlines():
        if line and not line[0].isspace():
            head, _, text = line.partition("  ")
            words = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))
            for name in head.split(","):
                entries[name.strip().rstrip("/")] = words
        elif line.strip():
            words.update(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", line))
    return entries


def test_the_readme_names_every_module_and_folder():
    """A top-level module or package has an entry of its own; a module inside a package is named
    in its package's entry (``tiers/  ... stack ...``)."""
    entries = readme_entries()
    missing = []
    for dotted, path in modules():
        parts = [p for p in dotted.split(".")[1:] if p != "__init__"]
        if not parts:  # radixkv/__init__.py: the package itself
            continue
        top = parts[0]
        if top not in entries and not (top == "__main__" and "__main__" in entries.get("cli", ())):
            missing.append(top)
        elif len(parts) > 1 and parts[-1] not in entries[top]:
            missing.append(".".join(parts))
    assert not missing, f"docs/architecture.md's Layering does not name: {sorted(set(missing))}"
