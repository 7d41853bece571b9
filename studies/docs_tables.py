"""Every results table in README.md and docs/ that comes from committed data, rendered by one command.

    .venv/bin/python studies/docs_tables.py            # rewrite every table block from its data
    .venv/bin/python studies/docs_tables.py --check    # exit 1 and name each block that differs

A page holds a rendered table between two marker lines (the name says which renderer writes it):

    <!-- table NAME: rendered by `python studies/docs_tables.py` from DATA; edit the data, not this -->
    | ... |
    <!-- /table NAME -->

The renderers live beside their data: each file named doc_tables.py under studies/ or bench/ defines
`TABLES: dict[str, Callable[[], tuple[str, str]]]`, NAME -> a function returning (the markdown, the
data files it read, as one short string for the marker). A block whose NAME no module defines, or a
name no page uses, is an error: a table cannot be left behind by a renamed renderer, nor a renderer by
a deleted table. tests/docs/test_docs_tables.py runs the check.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# the modules that define TABLES: every doc_tables.py under studies/ and bench/, beside the data it reads
# (loaded by path: studies/ is not a package)
RENDERER_MODULES = sorted(
    str(p.relative_to(ROOT)) for d in ("studies", "bench") for p in (ROOT / d).glob("**/doc_tables.py")
)
COMMAND = "python studies/docs_tables.py"
BLOCK = re.compile(r"^<!-- table (?P<name>[\w.-]+): [^\n]* -->\n(?P<body>.*?)^<!-- /table (?P=name) -->$", re.M | re.S)
OPEN = re.compile(r"^<!-- table ([\w.-]+):", re.M)

Renderer = Callable[[], tuple[str, str]]


def load_module(relative: str):
    """The module at ROOT/relative, loaded once (a renderer may use another's module through this)."""
    path = ROOT / relative
    name = "docs_tables_" + relative.replace("/", "_").removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a module up by name
    spec.loader.exec_module(module)
    return module


def renderers(modules: list[str] = RENDERER_MODULES) -> dict[str, Renderer]:
    tables: dict[str, Renderer] = {}
    for relative in modules:
        for name, render in load_module(relative).TABLES.items():
            if name in tables:
                raise ValueError(f"table {name!r} is defined twice (second time in {relative})")
            tables[name] = render
    return tables


def shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def block(name: str, markdown: str, sources: str) -> str:
    return (f"<!-- table {name}: rendered by `{COMMAND}` from {sources}; edit the data, not this -->\n"
            f"{markdown.strip()}\n<!-- /table {name} -->")  # fmt: skip


def render_page(text: str, tables: dict[str, Renderer], cache: dict[str, str]) -> tuple[str, list[str]]:
    """The page with every block re-rendered, and the problems found (unknown or unclosed blocks)."""
    problems = []
    opened = OPEN.findall(text)
    closed = [m.group("name") for m in BLOCK.finditer(text)]
    if sorted(opened) != sorted(closed):
        problems.append(f"unclosed table block(s): {sorted(set(opened) - set(closed)) or opened}")

    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in tables:
            problems.append(f"no renderer defines table {name!r}")
            return match.group(0)
        if name not in cache:
            markdown, sources = tables[name]()
            cache[name] = block(name, markdown, sources)
        return cache[name]

    return BLOCK.sub(replace, text), problems


def run(check: bool, pages: list[Path] = PAGES, modules: list[str] = RENDERER_MODULES) -> list[str]:
    """Render (or, with check, compare) every page; returns the problems, empty when all is well."""
    tables, cache, problems, used = renderers(modules), {}, [], set()
    for page in pages:
        text = page.read_text()
        used.update(m.group("name") for m in BLOCK.finditer(text))
        new, page_problems = render_page(text, tables, cache)
        problems += [f"{shown(page)}: {p}" for p in page_problems]
        if new != text:
            if check:
                differ = [m.group("name") for m, n in zip(BLOCK.finditer(text), BLOCK.finditer(new))
                          if m.group(0) != n.group(0)]  # fmt: skip
                problems.append(f"{shown(page)}: differs from `{COMMAND}` in {differ}")
            else:
                page.write_text(new)
    problems += [f"table {name!r} is rendered but no page shows it" for name in sorted(set(tables) - used)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    args = parser.parse_args(argv)
    problems = run(args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
