"""What the docs say about the kernel's compile checks is what the code and the committed data say:
the GPU targets CI compiles (tests/bench/test_aot.py's CI_TARGETS), the register-ceiling figures and the
goals docs/kernel.md states of its tables (bench/results/aot_*; the tables themselves are rendered by
studies/docs_tables.py and held by tests/docs/test_docs_tables.py), and the GPU check's file names and
benchmark sizes (bench/gpu_check.sh and the benchmarks' defaults). Each check is shown to fail on a
mutated page or table."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
KERNEL = ROOT / "docs" / "kernel.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
PAGES = [p for p in sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")]) if p.exists()]
# the pages that state what CI compiles: each must say it (in a clause the check reads); README.md names the
# targets the kernel compiles for without naming CI, and the check of every page above holds it if it does
STATING_CI = ("CHANGELOG.md", "docs/kernel.md", "docs/operator.md", "docs/tests.md")


def ci_targets() -> set[str]:
    """CI_TARGETS of tests/bench/test_aot.py, read from its source (no triton import)."""
    tree = ast.parse((ROOT / "tests" / "bench" / "test_aot.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CI_TARGETS" for t in node.targets):
            return {str(t) for t in ast.literal_eval(node.value)}
    raise AssertionError("tests/bench/test_aot.py has no CI_TARGETS")


def clauses(text: str) -> list[str]:
    """The prose of a Markdown page as clauses (split at '. ' and '; '), one paragraph or list item
    joined onto one line; fenced code and table rows are left out (tables hold dated measurements)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("|")]
    text = re.sub(r"\n(?=\s*(?:[-*]|\d+\.)\s)", "\n\n", "\n".join(lines))  # a list item starts a paragraph
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        joined = " ".join(paragraph.split()).replace("`", "")
        out += [c for c in re.split(r"(?<=[.;])\s+", joined) if c]
    return out


CI_WORDS = re.compile(r"\bCI\b|make test|test_aot")
TARGET = re.compile(r"\bsm_(\d+)|\b(gfx\w+)")


def ci_statements(text: str) -> list[tuple[str, set[str]]]:
    """(clause, the targets it names) for each clause that names CI (or `make test`, or the AOT test)
    and GPU targets: such a clause states what CI compiles."""
    found = []
    for clause in clauses(text):
        targets = {a or b for a, b in TARGET.findall(clause)}
        if targets and CI_WORDS.search(clause):
            found.append((clause, targets))
    return found


def wrong_ci_statements(text: str, expected: set[str]) -> list[str]:
    return [f"{sorted(t)} in: {c}" for c, t in ci_statements(text) if t != expected]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_statement_of_the_ci_targets_names_exactly_those_test_aot_compiles(page):
    assert wrong_ci_statements(page.read_text(), ci_targets()) == []


def test_the_pages_that_state_the_ci_targets_still_state_them():
    missing = [name for name in STATING_CI if not ci_statements((ROOT / name).read_text())]
    assert missing == []


def test_the_ci_target_check_can_fail():
    expected = ci_targets()
    assert len(expected) >= 2  # read from the test module, not assumed
    bad = "The kernel is compiled for sm_80 and sm_90 in CI, with its registers."  # the claim of an earlier CI
    assert wrong_ci_statements(bad, expected)
    assert wrong_ci_statements("`make test` compiles it for sm_80-sm_120.", expected)
    listed = " and ".join(f"sm_{t}" for t in sorted(expected, key=int))
    good = f"CI (`make test`) compiles it for {listed}; runs by hand also cover sm_89 and gfx942."
    assert wrong_ci_statements(good, expected) == [] and ci_statements(good)


# --- docs/kernel.md against bench/results/aot_triton-* ---


def load_rows(name: str) -> list[dict]:
    return json.loads((RESULTS / f"aot_triton-{name}.json").read_text())["rows"]


def ceiling_claims(data: dict) -> list[str]:
    """The figures docs/kernel.md states about the register ceiling, computed from its committed table."""
    rows = data["rows"]
    spilled = [r for r in rows if r["spill_stores_B_ptxas"] or r["spill_loads_B_ptxas"]]
    others = [r for r in rows if "hellinger" not in r["variant"]]
    fewer = [r for r in others if r["blocks_per_sm_ceiling"] < r["blocks_per_sm_ptxas"]]
    two_to_one = sum(1 for r in fewer if (r["blocks_per_sm_ptxas"], r["blocks_per_sm_ceiling"]) == (2, 1))
    four_to_three = sum(1 for r in fewer if (r["blocks_per_sm_ptxas"], r["blocks_per_sm_ceiling"]) == (4, 3))
    fixed = {r["registers_ceiling"] for r in spilled}
    hellinger = [r for r in rows if "hellinger" in r["variant"]]
    plain = [r for r in hellinger if "per-token-all" not in r["variant"] and "per-seq-all" not in r["variant"]]
    twin = [r for r in hellinger if "per-seq-all" in r["variant"]]
    twin_cost = [r for r in twin if r["blocks_per_sm_ceiling"] < r["blocks_per_sm_ptxas"]]
    assert {r["blocks_per_sm_ptxas"] for r in plain} == {1}  # "at one program per SM, the occupancy ... has"
    twin_targets = ", sm_".join(sorted({r["target"] for r in twin_cost}, key=int))
    worst = next(r for r in others if r["variant"] == "fwd-reverse_kl-scalar-bare-fp32" and r["target"] == "100")
    return [
        f"squeezed it into {max(r['registers_ptxas'] for r in spilled)} (two programs per SM), and at "
        f"sm_{' and sm_'.join(sorted({r['target'] for r in spilled}, key=int))} the per-token radius spilled "
        f"{max(r['spill_stores_B_ptxas'] for r in spilled)} B a thread",
        f"it then takes {min(fixed)} registers there and spills nothing" if len(fixed) == 1 else "several counts",
        f"without those options has ({min(r['registers_ptxas'] for r in plain)}-"
        f"{max(r['registers_ptxas'] for r in plain)} registers)",
        f"{len({r['variant'] for r in rows})} forwards x {len(data['targets'])} targets",
        f"fit 64 registers without a spill at sm_{twin_targets}".replace(", sm_90", " and sm_90"),
        f"({len(twin_cost)} (variant, target) pairs)",
        f"removes those {len(spilled)} spills",
        f"occupancy in {len(fewer)} other (variant, target) pairs",
        f"down to 1 in {two_to_one}, 4 to 3 in {four_to_three}",
        f"{worst['registers_ptxas']} to {worst['registers_ceiling']} registers",
    ]


def test_the_register_ceiling_figures_are_the_committed_table():
    page = " ".join(KERNEL.read_text().split()).replace("`", "")
    data = json.loads((RESULTS / "aot_register_ceiling_triton-3.7.1.json").read_text())
    assert data["spilling_variants"]["ceiling"] == 0
    assert [c for c in ceiling_claims(data) if c not in page] == []
    # the mutation: one more pair losing occupancy, and the figure no longer matches the page
    row = next(r for r in data["rows"] if r["variant"].startswith("fwd-chi2") and r["blocks_per_sm_ptxas"] == 2)
    row["blocks_per_sm_ceiling"] = 1 if row["blocks_per_sm_ceiling"] == 2 else row["blocks_per_sm_ceiling"]
    assert [c for c in ceiling_claims(data) if c not in page]


def test_the_variant_counts_are_the_tools():
    from openrlhf_band.bench.aot import variants

    page = " ".join(KERNEL.read_text().split())
    full, ci = len(variants()), len(variants("ci"))
    assert f"({ci} variants each)" in page and f"every variant ({full})" in page
    assert f"`--set full`, the default, is {full} variants" in page and f"`--set ci` is {ci}:" in page
    assert f"{ci} each ({5 * ci})" in page and f"{full} each ({5 * full})" in page
    assert f"the {len([v for v in variants() if v.kernel == 'fwd'])} forwards" in page


def goal_problems(rows: list[dict]) -> list[str]:
    """What breaks the goals docs/kernel.md states of its committed tables: every variant compiled, with no
    spill, in under 10 CPU seconds (the tables themselves are rendered from these files by
    studies/docs_tables.py, whose check tests/docs/test_docs_tables.py runs)."""
    return [f"{r['variant']}@{r['target']}" for r in rows
            if not r["ok"] or r["spill_stores_B"] or r["spill_loads_B"] or r["compile_cpu_s"] >= 10]  # fmt: skip


def test_the_committed_tables_meet_the_goals_the_page_states():
    from openrlhf_band.bench.aot import DEFAULT_TARGETS, variants

    page = " ".join(KERNEL.read_text().split())
    assert "no spills in any variant on any target; every variant compiles in under 10 CPU seconds" in page
    for version in ("3.6.0", "3.7.1", "3.9.0"):
        rows = load_rows(version)
        assert len(rows) == len(DEFAULT_TARGETS) * len(variants()) and goal_problems(rows) == [], version
    rows = load_rows("3.7.1")
    rows[0] = {**rows[0], "compile_cpu_s": 10.5}  # the mutation: one slow compile
    assert goal_problems(rows) == [f"{rows[0]['variant']}@{rows[0]['target']}"]


# --- the GPU check: bench/gpu_check.sh's files and sizes ---


def gpu_check_script() -> str:
    return (ROOT / "bench" / "gpu_check.sh").read_text().replace("\\\n", " ")


def device_table_name(script: str) -> str:
    """aot_triton-<version><tag>.*, the tag as gpu_check.sh passes it, ${cap...} written <cap>."""
    tag = re.search(r'aot\b[^\n]*--tag "([^"]+)"', script).group(1)
    return "aot_triton-<version>" + re.sub(r"\$\{cap[^}]*\}", "<cap>", tag) + ".*"


def benchmark_tokens(script: str, what: str) -> list[int]:
    """The --tokens a `bench WHAT` line of the script passes, else the benchmark's default."""
    import argparse
    import importlib

    from openrlhf_band.tools.cli import BENCHMARKS

    line = next(line for line in script.splitlines() if re.search(rf"\bbench {what}\b", line))
    words = shlex.split(line[line.index(f"bench {what}") :])[2:]
    words = words[: next((i for i, w in enumerate(words) if w.startswith(("2>", "|", ">"))), len(words))]
    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(f"openrlhf_band.bench.{BENCHMARKS[what][0]}").add_arguments(parser)
    tokens = parser.parse_known_args(words)[0].tokens
    return tokens if isinstance(tokens, list) else [tokens]


def sizes(tokens: list[int]) -> str:
    return " and ".join(f"{t:,}" for t in tokens)


def gpu_check_phrase(script: str) -> str:
    return (f"the kernel benchmark at {sizes(benchmark_tokens(script, 'kernel'))} tokens (with achieved bandwidth) "
            f"and the bounds benchmark at {sizes(benchmark_tokens(script, 'bounds'))} tokens")  # fmt: skip


@pytest.mark.parametrize("page", [KERNEL, BENCHMARKS], ids=["kernel.md", "benchmarks.md"])
def test_the_gpu_check_files_and_sizes_are_what_the_script_does(page):
    script, text = gpu_check_script(), " ".join(page.read_text().split())
    named = set(re.findall(r"aot_triton-<version>[^`\s]*device[^`\s,]*", text))
    assert named == {device_table_name(script)}, named
    assert gpu_check_phrase(script) in text


def test_the_gpu_check_can_fail():
    script = gpu_check_script()
    assert device_table_name(script) == "aot_triton-<version>-sm<cap>-device.*"
    assert benchmark_tokens(script, "kernel") == [524_288, 4_194_304]
    assert benchmark_tokens(script, "bounds") == [524_288]  # the bounds benchmark's default
    mutated = script.replace('--tag "-sm${cap:-90}-device"', '--tag "-device"')
    assert device_table_name(mutated) == "aot_triton-<version>-device.*"
    mutated = script.replace("bench bounds --device cuda", "bench bounds --tokens 4194304 --device cuda")
    assert gpu_check_phrase(mutated) not in " ".join(BENCHMARKS.read_text().split())
