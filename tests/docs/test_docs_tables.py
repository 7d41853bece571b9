"""Every results table in README.md and docs/ between `<!-- table NAME: ... -->` markers is what
`python studies/docs_tables.py` renders from the committed data; the check fails on a changed figure,
an unknown or unclosed block, and a renderer no page uses."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "studies" / "docs_tables.py")
docs_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_tables)


@pytest.fixture(scope="module")
def tables():
    return docs_tables.renderers()


def test_every_page_is_what_the_command_renders():
    assert docs_tables.run(check=True) == []


def test_every_renderer_module_defines_tables_that_render(tables):
    for name, render in tables.items():
        markdown, sources = render()
        assert markdown.strip().count("\n") >= 1 and "|" in markdown, name
        assert sources and "-->" not in sources, name


def _page_with(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_the_check_fails_on_a_changed_figure(tmp_path, tables):
    name = next(iter(tables))
    markdown, sources = tables[name]()
    good = "intro\n\n" + docs_tables.block(name, markdown, sources) + "\n\nafter\n"
    digit = next(i for i, c in enumerate(good) if c.isdigit() and i > good.index("-->"))
    bad = good[:digit] + str((int(good[digit]) + 1) % 10) + good[digit + 1 :]
    modules = docs_tables.RENDERER_MODULES
    assert [p for p in docs_tables.run(True, [_page_with(tmp_path, good)], modules) if "no page shows" not in p] == []
    problems = docs_tables.run(True, [_page_with(tmp_path, bad)], modules)
    assert any("differs" in p and name in p for p in problems)
    docs_tables.run(False, [_page_with(tmp_path, bad)], modules)  # rendering repairs it
    assert (tmp_path / "page.md").read_text() == good


def test_the_check_fails_on_unknown_unclosed_and_unused_tables(tmp_path):
    modules = docs_tables.RENDERER_MODULES
    unknown = _page_with(tmp_path, "<!-- table no-such-table: x -->\n| a |\n<!-- /table no-such-table -->\n")
    problems = docs_tables.run(True, [unknown], modules)
    assert any("no renderer defines table 'no-such-table'" in p for p in problems)
    assert any("no page shows it" in p for p in problems)  # none of the real tables is on this page
    unclosed = _page_with(tmp_path, "<!-- table realmodel-pairs: x -->\n| a |\n")
    assert any("unclosed" in p for p in docs_tables.run(True, [unclosed], modules))
