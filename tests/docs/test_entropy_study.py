"""The entropy study's arithmetic and rules (studies/realmodel/entropy_study.py), without the model: the paired t
test's p-value against the standard t quantiles, Holm's step-down, the stopping rule, the validity halts and the
pairing check on fake ledgers, and the study's refusal to run before its protocol is committed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies"))
sys.path.insert(0, str(ROOT / "studies" / "realmodel"))
import entropy_study as es  # noqa: E402
from paired_runs import T95  # noqa: E402  (two-sided 95% t quantiles, to 3 decimals, from the standard tables)


@pytest.mark.parametrize("df", sorted(T95))
def test_the_t_test_gives_p_005_at_the_tabled_quantile(df):
    """n = df + 1 values whose t statistic is the tabled 97.5% quantile: p = 0.05, to within what the table's 3
    decimals allow (a t off by 0.0005 moves p by at most 2 x 0.0005 x the t density there, < 1e-3)."""
    n = df + 1
    t = T95[df]
    # values with mean m and sd 1 (a centred +-1 pattern scaled to sd 1): t = m * sqrt(n)
    base = [(-1) ** i for i in range(n)]
    mean0 = sum(base) / n
    centred = [b - mean0 for b in base]
    sd0 = (sum(c * c for c in centred) / (n - 1)) ** 0.5
    m = t / n**0.5
    values = [m + c / sd0 for c in centred]
    assert es.t_test_p(values) == pytest.approx(0.05, abs=1e-3)
    assert es.t_test_p([-v for v in values]) == pytest.approx(0.05, abs=1e-3)


def test_holm_steps_down_and_stays_monotone():
    adjusted = es.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "e": None})
    assert adjusted == pytest.approx({"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06, "e": None})


def _outcomes(n: int, ci: tuple[float, float] | None) -> dict:
    return {"primary": {"n": n, "ci95": list(ci) if ci else None}}


def test_the_stopping_rule():
    assert es.stopping_rule(_outcomes(3, (0.1, 0.2))) is None  # never before 4 blocks
    assert "excludes 0" in es.stopping_rule(_outcomes(4, (0.01, 0.3)))
    assert "excludes 0" in es.stopping_rule(_outcomes(4, (-0.3, -0.01)))
    assert es.HALF_WIDTH == 0.02  # protocol.md's precision
    assert "half-width" in es.stopping_rule(_outcomes(4, (-0.019, 0.019)))  # half-width 0.019 < 0.02
    assert es.stopping_rule(_outcomes(5, (-0.021, 0.021))) is None  # 0.021: go on
    assert es.stopping_rule(_outcomes(5, (-0.04, 0.05))) is None  # the drafted 0.05 would have stopped here
    assert es.stopping_rule(_outcomes(8, (-1.0, 1.0))) == "8 blocks"


def _run(arm: str, seed: int, entropies: list[float], sha: str = "same", reward: float = 0.5, groups: float = 0.6):
    return {
        "method": arm,
        "seed": seed,
        "settings": es.settings(),
        "steps": [
            {"step": s, "replies_sha": sha if s == 1 else str(s), "informative_groups": groups} for s in range(1, 25)
        ],  # fmt: skip
        "exact": [{"step": 6 * i, "entropy": e, "mean_p_correct": 0.3} for i, e in enumerate(entropies)],
        "sampled": {"mean_reward": reward},
        "seconds": 1200.0,
    }


def _write(ledger: Path, run: dict) -> None:
    ledger.mkdir(parents=True, exist_ok=True)
    (ledger / f"{run['method']}-seed{run['seed']}.json").write_text(json.dumps(run))


def test_outcomes_halts_and_pairing_on_a_fake_ledger(tmp_path, monkeypatch):
    monkeypatch.setattr(es, "LEDGER", tmp_path / "runs")
    for seed, gap in enumerate([-0.05, -0.04, -0.06, -0.05]):
        _write(es.LEDGER, _run("clip", seed, [0.26, 0.2, 0.15, 0.12, 0.1]))
        _write(es.LEDGER, _run("band-kl", seed, [0.26, *[x + gap for x in (0.2, 0.15, 0.12, 0.1)]]))
        _write(es.LEDGER, _run("band-kl-floor", seed, [0.26, 0.21, 0.16, 0.13, 0.11]))
    result = es.outcomes()
    primary = es.primary(result)
    assert primary["n"] == 4 and primary["mean"] == pytest.approx(-0.05)
    assert primary["ci95"][1] < 0 and "excludes 0" in es.stopping_rule(result)
    floor = result["secondary: band-kl-floor - clip, mean exact entropy steps 6-24 (nats)"]
    assert floor["mean"] == pytest.approx(0.01)
    assert es.pairing_check() == [] and es.validity_halt() is None
    # a block whose arms sampled different step-1 replies is named
    _write(es.LEDGER, _run("band-kl", 0, [0.26, 0.2, 0.15, 0.12, 0.1], sha="other"))
    assert es.pairing_check() and "seed 0" in es.pairing_check()[0]
    assert "differ across arms" in es.validity_halt()  # the study stops to find out why
    assert es.primary(es.outcomes())["seeds"] == [1, 2, 3]  # and the block is left out
    _write(es.LEDGER, _run("band-kl", 0, [0.26, *[x - 0.05 for x in (0.2, 0.15, 0.12, 0.1)]]))
    nan = _run("band-kl-floor", 3, [0.26, float("nan"), 0.16, 0.13, 0.11])
    _write(es.LEDGER, nan)
    assert "not finite" in es.validity_halt()
    _write(es.LEDGER, _run("band-kl-floor", 3, [0.26, 0.21, 0.16, 0.13, 0.11]))
    # clip ending at a trivial policy's score (the audit's 0.004: within 10%) halts; so do dead groups
    _write(es.LEDGER, _run("clip", 1, [0.26, 0.2, 0.15, 0.12, 0.1], reward=0.0040))
    assert "within 10%" in es.validity_halt()
    _write(es.LEDGER, _run("clip", 1, [0.26, 0.2, 0.15, 0.12, 0.1], groups=0.2))
    assert "carry a gradient" in es.validity_halt()
    # the report renders from the ledger
    assert any("primary" in line for line in es.report_lines())


def test_the_study_refuses_to_run_before_its_protocol_is_committed(tmp_path, monkeypatch):
    monkeypatch.setattr(es, "ROOT", tmp_path)
    monkeypatch.setattr(es, "PROTOCOL", tmp_path / "protocol.md")
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "protocol.md").write_text("draft\n")
    with pytest.raises(SystemExit, match="commit the protocol"):
        es.protocol_commit()
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "protocol.md"], check=True)
    subprocess.run([*git, "commit", "-qm", "protocol"], check=True)
    assert len(es.protocol_commit()) == 40
    (tmp_path / "protocol.md").write_text("draft, amended without a commit\n")
    with pytest.raises(SystemExit, match="commit the protocol"):
        es.protocol_commit()


def test_run_resumes_from_the_ledger_block_by_block_and_stops_at_a_stop_file(tmp_path, monkeypatch):
    """`entropy_study.py run` as a later sitting (the model's runs faked): finished runs are skipped, a block runs
    every arm before the next seed, a STOP file stops it before the next run and stays, and the rule stops it."""
    monkeypatch.setattr(es, "LEDGER", tmp_path / "runs")
    monkeypatch.setattr(es, "RESULTS", tmp_path)
    monkeypatch.setattr(es, "WORK", tmp_path / "work")
    monkeypatch.setattr(es, "protocol_commit", lambda: "0" * 40)
    monkeypatch.setattr(es, "task", lambda: (None, []))
    ran: list[tuple[str, int]] = []

    def run_one(method: str, seed: int, cfg=None, save_mid=None) -> dict:
        ran.append((method, seed))
        gap = -0.05 if method == "band-kl" else 0.0
        return _run(method, seed, [0.26, *[x + gap for x in (0.2, 0.15, 0.12, 0.1)]])

    monkeypatch.setattr(es, "run_one", run_one)
    _write(es.LEDGER, _run("clip", 0, [0.26, 0.2, 0.15, 0.12, 0.1]))  # an earlier sitting's run
    with pytest.raises(SystemExit, match="probe is not complete"):  # an arm it joins runs from the first block
        es.run_main(8)
    (tmp_path / "probe_summary.json").write_text(json.dumps({"joins": ["band-chi2"], "complete": False}))
    with pytest.raises(SystemExit, match="probe is not complete"):
        es.run_main(8)
    assert es.study_arms() == es.ARMS  # an incomplete probe joins nothing
    (tmp_path / "probe_summary.json").write_text(json.dumps({"joins": [], "complete": True}))
    assert ran == []
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "STOP").touch()
    assert es.run_main(8) == 0 and ran == []  # stopped before anything
    (tmp_path / "work" / "STOP").unlink()
    assert es.run_main(2) == 0
    assert ran == [("band-kl", 0), ("band-kl-floor", 0), ("clip", 1), ("band-kl", 1), ("band-kl-floor", 1)]
    assert all(json.loads(p.read_text())["protocol_commit"] == "0" * 40 for p in es.LEDGER.glob("*-seed1.json"))
    ran.clear()
    assert es.run_main(8) == 0  # blocks 2 and 3, then the rule: 4 blocks whose primary excludes 0
    assert [seed for _, seed in ran] == [2, 2, 2, 3, 3, 3]
    assert "excludes 0" in es.stopping_rule(es.outcomes())


def _probe_batch(seed: int, higher_neg: float, source: str = "start") -> dict:
    def tokens(pos: float, neg: float) -> dict:
        return {f"{b}/{s}": {"tokens": 10, "mean_dlogp": v} for b in ("p<0.01", "p0.01-0.1") for s, v in
                (("pos", pos), ("neg", neg))}  # fmt: skip

    methods = {
        "band-kl": tokens(0.3, -2.0),
        "clip-higher": tokens(0.3 - 0.01 * (seed % 8), -2.0 + higher_neg),
        "band-chi2": tokens(0.3 + (0.001 if seed % 2 else -0.001), -2.0),
        "clip": tokens(0.2, -1.0),
    }
    return {"source": source, "seed": seed, "reward": 0.3, "methods": {m: {"tokens": t} for m, t in methods.items()}}


def test_the_probe_rule_joins_an_arm_only_when_all_batches_separate_it():
    batches = [_probe_batch(s, 0.5, src) for src in ("start", "mid-clip") for s in es.PROBE_SEEDS]
    done = {"batches": batches}
    lines, summary = es.probe_tables(done)
    assert summary["joins"] == ["clip-higher"]  # 8 of 8 above band-kl on rare negatives, by 0.5 nats
    assert summary["verdicts"]["clip-higher/neg"]["held"]  # predicted +
    assert not summary["verdicts"]["band-chi2/pos"]["separated"]  # 4 of 8 each way
    assert not summary["verdicts"]["clip-higher/pos"]["separated"]  # 0.00-0.03 nats below, ties dropped
    _, partial = es.probe_tables({"batches": batches[:6]})
    assert partial["joins"] == []  # 6 of 6 would pass the sign test; the rule waits for all 8
    assert any("Pending: 6 of 8" in line for line in es.probe_tables({"batches": batches[:6]})[0])
    # a batch without rare negative tokens (NaN) is not agreeing: 7 of 8 does not join
    empty = _probe_batch(1003, 0.5, "mid-clip")
    for m in empty["methods"].values():
        for b in ("p<0.01", "p0.01-0.1"):
            m["tokens"][f"{b}/neg"] = {"tokens": 0, "mean_dlogp": float("nan")}
    _, seven = es.probe_tables({"batches": [*batches[:7], empty]})
    assert seven["joins"] == []
