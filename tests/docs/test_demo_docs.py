"""The demo's method lists, as the CLI help, docs/demo.md and the README state them, are the code's
(openrlhf_band.tools.demo: DEFAULT_METHODS, FULL, QUICK, DemoConfig), the committed summary's methods
are those of the command docs/demo.md gives for it, docs/demo.md's timings are one current statement with
its commit and a history table with a commit per row, and the README quotes only the current statement. Each
check is shown to fail on a mutated text."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from openrlhf_band.tools.demo import DEFAULT_METHODS, FULL, QUICK, DemoConfig

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "docs" / "demo.md"
README = ROOT / "README.md"


def flat(text: str) -> str:
    return " ".join(text.split())


def listed(methods: list[str]) -> str:
    """'a, b, c and d', as the pages write a list of methods."""
    return ", ".join(methods[:-1]) + " and " + methods[-1] if len(methods) > 1 else methods[0]


def demo_page_claims() -> list[str]:
    cfg = DemoConfig()
    return [
        f"make demo runs {listed(DEFAULT_METHODS)} over {cfg.seeds} seeds x {cfg.rollouts} rollouts",
        f"make demo # {', '.join(DEFAULT_METHODS)}; {cfg.seeds} seeds x {cfg.rollouts} rollouts",
        f"--full runs all {len(FULL['methods'])} methods of the demo",
        f"over {FULL['seeds']} seeds x {FULL['rollouts']} rollouts, {len(FULL['methods']) * FULL['seeds']} runs",
        f"# all {len(FULL['methods'])} methods, {FULL['seeds']} seeds x {FULL['rollouts']} rollouts",
        f"--quick runs {' and '.join(QUICK['methods'])} over {QUICK['seeds']} seed x {QUICK['rollouts']} rollouts",
    ]


def test_docs_demo_states_the_codes_method_lists():
    page = flat(DEMO.read_text().replace("`", ""))
    assert [c for c in demo_page_claims() if c not in page] == []
    # every "--full ... N methods" on the page and in the README is the code's N
    for text in (page, flat(README.read_text())):
        counts = {int(n) for n in re.findall(r"--full[^.]*?\ball (\d+) methods", text)}
        assert counts <= {len(FULL["methods"])}, counts


def test_the_cli_help_is_the_codes_method_lists():
    from openrlhf_band.tools.cli import build_parser, demo_help

    assert demo_help() in flat(build_parser().format_help())
    for method in DEFAULT_METHODS + QUICK["methods"]:
        assert method in demo_help()
    assert f"all {len(FULL['methods'])} methods" in demo_help()


def committed_run_command() -> list[str]:
    """The command docs/demo.md gives for the committed full run (the block under "The full run")."""
    section = DEMO.read_text().split("## The full run", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1).replace("\\\n", " ")
    return shlex.split(block)


def test_the_committed_runs_command_makes_the_committed_summary():
    words = committed_run_command()
    methods = words[words.index("--methods") + 1 :]
    methods = methods[: next((i for i, w in enumerate(methods) if w.startswith("-")), len(methods))]
    header = (ROOT / "docs" / "demo_summary.txt").read_text().splitlines()[0]
    seeds, rollouts, named = re.match(r"CPU GRPO demo: (\d+) seeds x (\d+) rollouts, methods (.*)$", header).groups()
    assert methods == named.split(", ")
    assert words[words.index("--seeds") + 1] == seeds and words[words.index("--rollouts") + 1] == rollouts
    assert set(methods) < set(FULL["methods"])  # every one of them still a demo method
    assert f"when it had these {len(methods)} methods" in flat(DEMO.read_text())


CURRENT = "**What is measured for today's methods.**"
TIME = r"\d+ min \d+ s|\d+(?:\.\d+)? s\b"


def demo_times(text: str) -> set[str]:
    return set(re.findall(TIME, text))


def current_statement(page: str) -> str:
    """docs/demo.md's one paragraph of what is measured for today's methods (the rest is history)."""
    return page[page.index(CURRENT) :].split("\n\n", 1)[0]


def readme_demo_times(readme: str) -> set[str]:
    """The times the README gives in sentences about the demo (not about `make test`)."""
    sentences = flat(readme).split(". ")
    return set().union(*(demo_times(s) for s in sentences if "demo" in s and "make test" not in s))


def demo_time_problems(page: str, readme: str) -> list[str]:
    current = current_statement(page)
    problems = [f"no commit named in {CURRENT}"] if not re.search(r"\bcommit [0-9a-f]{7}\b", current) else []
    history = page[page.index(CURRENT) + len(current) :].split("\n## ", 1)[0]
    rows = [line for line in history.splitlines() if line.startswith("| ") and "---" not in line][1:]
    problems += [f"history row without a commit: {r[:60]}" for r in rows if not re.search(r"\| [0-9a-f]{7} \|", r)]
    problems += [f"the README quotes {t}, not in the current statement" for t in
                 sorted(readme_demo_times(readme) - demo_times(current))]  # fmt: skip
    return problems


def test_the_demo_times_are_one_current_statement_and_dated_history():
    """demo.md gives one current statement (with its commit) and a history table (a commit per row), and the
    README quotes only the current statement's times (or none, and links it)."""
    assert demo_time_problems(DEMO.read_text(), README.read_text()) == []


def test_the_demo_checks_can_fail():
    page = flat(DEMO.read_text().replace("`", ""))
    old = page.replace(f"all {len(FULL['methods'])} methods", "all 15 methods")
    assert [c for c in demo_page_claims() if c not in old]
    claims = demo_page_claims()
    wrong_default = claims[0].replace(DEFAULT_METHODS[-1], "band-kl-entropy")
    assert wrong_default not in page
    demo_page = DEMO.read_text()
    assert demo_time_problems(demo_page, "`make demo`: the demo alone took 13 min 3 s.")  # history as current
    assert demo_time_problems(demo_page.replace(" 2890902 |", " |", 1), "")
    assert demo_time_problems(re.sub(r"commit [0-9a-f]{7}", "an earlier commit", demo_page), "")
    assert demo_time_problems(demo_page, "`make demo` takes 6 min 7 s. `make test` takes 37 min 20 s") == []
