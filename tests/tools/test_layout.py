"""The package's folders name its layers, and dependencies point one way:
band <- ops <- functional <- integration <- recipe <- tools. The patch set imports only the one
stable path, `openrlhf_band.integration`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "openrlhf_band"
LAYERS = {"band": 0, "ops": 1, "functional": 2, "integration": 3, "recipe": 4, "tools": 5}


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if parts[0] == "openrlhf_band" and len(parts) > 1 else None


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("openrlhf_band")}


def test_every_module_lives_in_a_layer_folder():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "functional.py"], top  # the public API and the dispatching API
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(LAYERS) - {
        "functional"
    }


def test_dependencies_point_one_way():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        module = "openrlhf_band." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        own = layer_of(module)
        if own is None:  # openrlhf_band/__init__.py: the public API re-exports from every layer
            continue
        for target in imports(path):
            theirs = layer_of(target)
            if theirs is not None and theirs > own:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_the_patch_set_imports_only_the_integration_package():
    patches = (PACKAGE / "integration" / "patches").glob("openrlhf-*/*.patch")
    lines = [line for p in patches for line in p.read_text().splitlines()]
    added = [line for line in lines if line.startswith("+") and "openrlhf_band" in line]
    assert added, "the patch set imports nothing from openrlhf_band?"
    for line in added:
        assert re.search(r"from openrlhf_band\.integration import |import openrlhf_band\.integration as ", line), line
