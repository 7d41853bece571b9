"""What the docs say about the kernel's compile checks is what the code and the committed data say:
the GPU targets CI compiles (tests/bench/test_aot.py's CI_TARGETS), the register-ceiling figures and the
goals docs/kernel.md states of its tables (bench/results/aot_*; the tables themselves are rendered by
studies/docs_tables.py and held by tests/docs/test_docs_tables.py), and the GPU check's steps and their time
limits (bench/gpu_check.sh). Each check is shown to fail on a
mutated page or table."""

from __future__ import annotations

import ast
import json
import re
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


# --- the GPU check: bench/gpu_check.sh's steps and their limits ---


def gpu_check_script() -> str:
    return (ROOT / "bench" / "gpu_check.sh").read_text()


def script_steps(script: str) -> dict[str, int]:
    """`run_step NAME LIMIT` of the script, in order."""
    return {name: int(limit) for name, limit in re.findall(r"^run_step (\S+) (\d+) ", script, re.M)}


def page_steps(text: str) -> dict[str, int]:
    """The step table after the page's gpu-check-steps marker: | step | N s | ... |."""
    table = text[text.index("<!-- gpu-check-steps") :].split("\n\n")[0]
    return {name: int(limit) for name, limit in re.findall(r"^\| (\w+) \| (\d+) s \|", table, re.M)}


def gpu_check_problems(script: str, benchmarks: str, kernel: str) -> list[str]:
    steps, problems = script_steps(script), []
    if page_steps(benchmarks) != steps:
        problems.append(f"benchmarks.md's step table {page_steps(benchmarks)} is not the script's {steps}")
    total = sum(steps.values())
    flat = " ".join(benchmarks.split())
    if f"add up to {total} s ({total // 60} minutes)" not in flat:
        problems.append(f"benchmarks.md does not say the limits add up to {total} s")
    if f"within {total // 60} minutes by construction" not in " ".join(kernel.split()):
        problems.append(f"kernel.md does not say {total // 60} minutes")
    return problems


def test_the_gpu_check_steps_and_limits_are_what_the_script_does():
    assert gpu_check_problems(gpu_check_script(), BENCHMARKS.read_text(), KERNEL.read_text()) == []


def test_the_gpu_check_can_fail():
    script, benchmarks, kernel = gpu_check_script(), BENCHMARKS.read_text(), KERNEL.read_text()
    assert sum(script_steps(script).values()) == 540
    mutated = script.replace("run_step speed 130 ", "run_step speed 100 ")
    assert len(gpu_check_problems(mutated, benchmarks, kernel)) == 3
    assert gpu_check_problems(script, benchmarks.replace("| bounds | 25 s |", "| bounds | 35 s |"), kernel)
