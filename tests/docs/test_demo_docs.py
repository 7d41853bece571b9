"""The demo's method lists, as the CLI help, docs/demo.md and the README state them, are the code's
(openrlhf_band.tools.demo: DEFAULT_METHODS, FULL, QUICK, DemoConfig), the committed summary's methods
are those of the command docs/demo.md gives for it, and the README's demo times are docs/demo.md's
measurements. Each check is shown to fail on a mutated text."""

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


def demo_minutes(text: str) -> set[str]:
    return set(re.findall(r"\d+ min \d+ s", text))


def readme_demo_times() -> set[str]:
    """The times the README gives for the demo alone, i.e. the sentence about "the demo alone"."""
    readme = flat(README.read_text())
    sentence = readme[readme.index("the demo alone") :].split(". ")[0]
    return demo_minutes(sentence)


def measured_demo_times() -> set[str]:
    table = [line for line in DEMO.read_text().splitlines() if line.startswith("| the demo alone")]
    return demo_minutes("\n".join(table))


def test_the_readmes_demo_times_are_the_measured_ones():
    times = readme_demo_times()
    assert times and times <= measured_demo_times(), times - measured_demo_times()


def test_the_demo_checks_can_fail():
    page = flat(DEMO.read_text().replace("`", ""))
    old = page.replace(f"all {len(FULL['methods'])} methods", "all 15 methods")
    assert [c for c in demo_page_claims() if c not in old]
    claims = demo_page_claims()
    wrong_default = claims[0].replace(DEFAULT_METHODS[-1], "band-kl-entropy")
    assert wrong_default not in page
    assert not demo_minutes("the demo alone takes about 5 min") and "4 min 7 s" not in measured_demo_times()
