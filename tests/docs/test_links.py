"""The user-facing Markdown is true to the tree: every relative link in README.md, CHANGELOG.md and
docs/ resolves (a #anchor to a heading of its target), and every command in a fenced shell block of
the README names something real: a Makefile target, an `openrlhf-band` subcommand (and `bench`
benchmark), a script or module of this repository, or one of a few outside tools."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
PAGES = [p for p in PAGES if p.exists()]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
# outside tools a README command may start with (their arguments that name repo paths are checked)
OUTSIDE_TOOLS = {"pip", "docker", "git", "cd", "export", "tensorboard", "ray", "uv", "python3", "nvidia-smi"}
REPO_PATH = re.compile(r"^(examples|tests|bench|studies|requirements|docs|openrlhf_band|\.ci)/")


def _anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _strip_code(page.read_text())
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M)}


def _strip_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def links(page: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", _strip_code(page.read_text()))
    return [a or b for a, b in LINK.findall(text)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            name = dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest.name
            broken.append(f"{target}: no heading #{anchor} in {name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*):(?!=)", (ROOT / "Makefile").read_text(), flags=re.M))


def cli_commands() -> dict[str, set[str]]:
    from openrlhf_band.tools.cli import build_parser

    def choices(parser: argparse.ArgumentParser) -> dict:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices
        return {}

    top = choices(build_parser())
    return {name: set(choices(sub)) for name, sub in top.items()}


def shell_commands(page: Path) -> list[str]:
    """Each command of the page's ```bash / ```sh / ```shell blocks (continuations joined, comments and
    prompts dropped; `a && b` and `a | b` are two commands)."""
    commands = []
    for block in re.findall(r"^```(?:bash|sh|shell|console)\n(.*?)^```", page.read_text(), flags=re.M | re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = re.sub(r"^\s*\$\s+", "", line)
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
                if part:
                    commands.append(part)
    return commands


def problems(command: str, targets: set[str], cli: dict[str, set[str]]) -> list[str]:
    words = [w for w in shlex.split(command)]
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value prefixes
        words.pop(0)
    if not words:
        return []
    tool, args = words[0], words[1:]
    out = [f"{command!r}: {w} does not exist" for w in args if REPO_PATH.match(w) and "*" not in w
           and not (ROOT / w.split("=")[-1]).exists() and not w.startswith("out/")]  # fmt: skip
    if tool == "make":
        out += [f"{command!r}: no Makefile target {w}" for w in args
                if not w.startswith("-") and "=" not in w and w not in targets]  # fmt: skip
    elif tool == "openrlhf-band":
        sub = next((w for w in args if not w.startswith("-")), None)
        if sub not in cli:
            out.append(f"{command!r}: no openrlhf-band subcommand {sub}")
        elif cli[sub] and sub == "bench":
            what = next((w for w in args[args.index(sub) + 1 :] if not w.startswith("-")), None)
            if what not in cli[sub]:
                out.append(f"{command!r}: no openrlhf-band bench {what}")
    elif tool in ("bash", "sh") or tool.startswith("./"):
        script = args[0] if tool in ("bash", "sh") else tool
        if not (ROOT / script).exists():
            out.append(f"{command!r}: no script {script}")
    elif tool in ("python", "python3", ".venv/bin/python") and args[:1] == ["-m"]:
        module = args[1]
        if importlib.util.find_spec(module.split(".")[0]) is None:
            out.append(f"{command!r}: no module {module}")
    elif tool in ("python", "python3") and args and args[0].endswith(".py"):
        if not (ROOT / args[0]).exists():
            out.append(f"{command!r}: no file {args[0]}")
    elif tool not in OUTSIDE_TOOLS and not (ROOT / tool).exists():
        out.append(f"{command!r}: {tool} is not a Makefile target, CLI, script or known tool")
    return out


def test_every_readme_command_names_something_real():
    targets, cli = makefile_targets(), cli_commands()
    commands = shell_commands(ROOT / "README.md")
    assert commands, "no shell block in the README"
    assert [p for c in commands for p in problems(c, targets, cli)] == []


def runs_a_test_file(command: str) -> bool:
    """Whether a command runs a script or module under tests/ other than through pytest (the
    test runner is the one thing meant to run them)."""
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    if not words or words[0].endswith("pytest") or words[1:2] == ["-m"] and words[2:3] == ["pytest"]:
        return False
    return any(w.startswith("tests/") or w.startswith("tests.") for w in words)


def test_no_user_command_runs_a_file_under_tests():
    """Studies, benchmarks and tools live outside tests/: README and docs/ never tell a user to run
    a file under tests/ (only pytest runs them)."""
    commands = [c for page in PAGES if page.name != "CHANGELOG.md" for c in shell_commands(page)]
    assert [c for c in commands if runs_a_test_file(c)] == []
    assert runs_a_test_file("bash tests/e2e/learn.sh out/l")  # the control: what the docs said before
    assert not runs_a_test_file("OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/band -q")


def test_the_checks_can_fail(tmp_path):
    targets, cli = makefile_targets(), cli_commands()
    assert {"demo", "test"} <= targets and "bench" in cli and "demo" in cli
    for bad in ("make demoo", "openrlhf-band benchh", "openrlhf-band bench nothing", "bash tests/e2e/nope.sh",
                "frobnicate --all", "docker run -v x examples/scripts/nope.sh"):
        assert problems(bad, targets, cli), bad
    good_commands = ("make demo", "OMP_NUM_THREADS=1 openrlhf-band bench logprobs --tokens 1",
                     "bash studies/learn/learn.sh out/l")
    for good in good_commands:
        assert problems(good, targets, cli) == [], good
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [gone](missing.md) [anchor](#nowhere) `[code](skipped.md)`\n")
    assert broken_links(page) == ["missing.md: no such file", "#nowhere: no heading #nowhere in page.md"]
