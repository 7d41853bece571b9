"""The package's folders name its layers, and each imports only from the layers it builds on:

    band <- ops <- functional <- integration <- patching
    objectives                    the policy objectives beside the band (CISPO, SAPO, ...): on band, ops;
                                  integration wires them into OpenRLHF
    sandbox                       stands alone: runs a program against its tests, isolated
    tasks                         the tasks (one folder each) and what they share; the code task on sandbox;
                                  nothing of the loss
    launcher                      the launcher's support (results table, model preparation, Ray job): on tasks
    bench                         the benchmarks: on band, ops, functional (and tasks, sandbox for theirs)
    tools                         the CLI and its commands, on top of everything

integration is the runtime face (what the patched OpenRLHF calls); patching operates on an OpenRLHF
install (the patch tool, check-args, the patch set). The patch set imports only the one stable path,
`openrlhf_band.integration`. docs/architecture.md's map names every module."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from openrlhf_band.tasks import TASKS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "openrlhf_band"
BELOW_INTEGRATION = {"band", "ops", "functional", "objectives"}
ALLOWED = {
    "band": set(),
    "ops": {"band"},
    "objectives": {"band", "ops"},
    "functional": {"band", "ops"},
    "integration": BELOW_INTEGRATION,
    "patching": BELOW_INTEGRATION | {"integration"},
    "sandbox": set(),
    "tasks": {"sandbox"},
    "launcher": {"tasks"},
    "bench": {"band", "ops", "functional", "tasks", "sandbox"},
    "tools": BELOW_INTEGRATION | {"integration", "patching", "tasks", "launcher", "bench"},
}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "openrlhf_band" and len(parts) > 1 and parts[1] in ALLOWED else None


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
    # the public API, the lazy-import helper its packages share (it imports nothing of the package), the dispatch
    assert top == ["__init__.py", "_lazy.py", "functional.py"], top
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(ALLOWED) - {"functional"}


def test_each_layer_imports_only_what_it_builds_on():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        module = "openrlhf_band." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        own = layer_of(module)
        if own is None:  # openrlhf_band/__init__.py: the public API re-exports from every layer
            continue
        for target in imports(path):
            theirs = layer_of(target)
            if theirs is not None and theirs != own and theirs not in ALLOWED[own]:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_the_layering_is_the_real_one():
    """No allowed edge is unused: the table says what the code does, not more."""
    used = {layer: set() for layer in ALLOWED}
    for path in PACKAGE.rglob("*.py"):
        own = layer_of("openrlhf_band." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        if own is not None:
            used[own] |= {layer_of(t) for t in imports(path)} - {None, own}
    for layer, deps in ALLOWED.items():  # each edge not implied by a longer path is really imported
        direct = {d for d in deps if not any(d in ALLOWED[other] for other in deps - {d})}
        assert direct <= used[layer], (layer, direct - used[layer])


def test_each_task_folder_stands_alone():
    """One room per task: a task's folder imports no other task's, and what the tasks share (the reward I/O, the
    pool, the sources, the agents' turns, the text helpers) imports none of them; the sandbox knows no task.
    prepare.py, the prepare-data command over every task, reaches them through the registry."""
    tasks_dir = PACKAGE / "tasks"
    folders = {p.name for p in tasks_dir.iterdir() if (p / "__init__.py").exists()}
    assert folders == {task.folder for task in TASKS.values()}  # one folder per registered task, named after it
    wrong = []
    for path in [*tasks_dir.rglob("*.py"), *(PACKAGE / "sandbox").rglob("*.py")]:
        rel = path.relative_to(PACKAGE)
        own = rel.parts[1] if rel.parts[0] == "tasks" and len(rel.parts) > 2 else None
        if rel.as_posix() == "tasks/prepare.py":
            continue
        for target in imports(path):
            parts = target.split(".")
            theirs = parts[2] if len(parts) > 2 and parts[1] == "tasks" and parts[2] in folders else None
            if theirs is not None and theirs != own:
                wrong.append(f"{rel} imports {target}")
    assert wrong == []


def test_the_layout_map_in_docs_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## The rooms", 1)[1].split("```", 2)[1]
    missing = [str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py"))
               if p.name != "__init__.py" and not re.search(rf"\b{re.escape(p.name)}\b", block)]  # fmt: skip
    assert missing == []


def test_the_patch_set_imports_only_the_integration_package():
    patches = (PACKAGE / "patching" / "patches").glob("openrlhf-*/*.patch")
    lines = [line for p in patches for line in p.read_text().splitlines()]
    added = [line for line in lines if line.startswith("+") and "openrlhf_band" in line]
    assert added, "the patch set imports nothing from openrlhf_band?"
    for line in added:
        assert re.search(r"from openrlhf_band\.integration import |import openrlhf_band\.integration as ", line), line


def test_no_file_cites_a_path_outside_the_repository():
    """Sources and docs name files inside the repository only (a reader has nothing else)."""
    work = "/work" + "/"  # split, so that this file does not match itself
    outside = re.compile(rf"(?<![\w./])\.\./shared/|{work}shared/|{work}main/")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    kinds = (".py", ".md", ".sh", ".toml", ".txt")
    texts = [p for p in tracked if p.endswith(kinds) or p in ("Makefile", "Dockerfile")]
    hits = [p for p in texts if outside.search((ROOT / p).read_text(errors="replace"))]
    assert hits == [], hits
