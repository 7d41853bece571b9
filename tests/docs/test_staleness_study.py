"""The staleness study (studies/staleness, docs/staleness.md): its committed rows cover every arm, lag and seed to
the last rollout; with no lag the band centred on mu is the band centred on pi_old bit for bit (the control that the
two arms differ only by the centre); summary.json is what study.py computes from the rows; a paired interval by
hand; the lag the recomputed arms measured; and the page's tables are rendered blocks, not hand-typed."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "studies" / "staleness"
_spec = importlib.util.spec_from_file_location("staleness_study_for_tests", HERE / "study.py")
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)

ROWS = study.read()


def test_every_arm_lag_and_seed_ran_to_the_last_rollout():
    last = max(r["step"] for r in ROWS)
    assert last == 80  # the demo's rollouts
    done = {(r["method"], r["lag"], r["seed"]) for r in ROWS if r["step"] == last}
    assert done == {(m, lag, s) for m in study.ARMS for lag in study.LAGS for s in range(study.SEEDS)}
    assert {r["step"] for r in ROWS} == {0, *range(5, 81, 5)}


def test_with_no_lag_the_rollout_anchor_is_the_recomputed_one_bit_for_bit():
    lag0 = {(r["method"], r["seed"], r["step"]): r for r in ROWS if r["lag"] == 0}
    pairs = [(r, lag0[("band-kl", s, t)]) for (m, s, t), r in lag0.items() if m == "band-kl-rollout"]
    assert len(pairs) == study.SEEDS * 17
    for a, b in pairs:
        assert all(study._same(a[k], b[k]) for k in a if k != "method"), (a["seed"], a["step"])
    # the control: at a lag they differ
    lag1 = {(r["method"], r["seed"], r["step"]): r["mean@32"] for r in ROWS if r["lag"] == 1 and r["step"] == 80}
    assert any(lag1[("band-kl-rollout", s, 80)] != lag1[("band-kl", s, 80)] for s in range(study.SEEDS))


def test_with_no_lag_the_arms_are_the_committed_band_family_runs():
    """The demo is deterministic on one machine: at lag 0 clip, band-kl and DPPO-TV are the band family's committed
    runs of the same seeds, on every column the two files share (the lag machinery changed nothing without a lag)."""
    family = {(r["method"], r["seed"], r["step"]): r
              for r in study.read_demo_csv(ROOT / "studies" / "band_family" / "results" / "metrics.csv")}  # fmt: skip
    ours = [r for r in ROWS if r["lag"] == 0 and r["method"] in ("clip", "band-kl", "dppo-tv")]
    assert len(ours) == 3 * study.SEEDS * 17
    for r in ours:
        theirs = family[(r["method"], r["seed"], r["step"])]
        common = set(r) & set(theirs) - {"method", "seed", "step"}
        assert len(common) > 20 and all(study._same(r[k], theirs[k]) for k in common), (r["method"], r["seed"])


def test_the_summary_is_what_the_study_computes_from_the_rows():
    committed = json.loads((HERE / "results" / "summary.json").read_text())
    assert committed == json.loads(json.dumps(study.summary(ROWS), sort_keys=True))


def test_a_paired_interval_by_hand():
    steps = (70, 75, 80)
    with (HERE / "results" / "metrics.csv").open() as fh:
        raw = list(csv.DictReader(fh))

    def final(method: str, lag: int, seed: int) -> float:
        key = (method, lag, seed)
        values = [float(r["mean@32"]) for r in raw
                  if (r["method"], int(r["lag"]), int(r["seed"])) == key and int(r["step"]) in steps]  # fmt: skip
        assert len(values) == 3
        return sum(values) / 3

    diffs = [final("band-kl-rollout", 2, s) - final("band-kl", 2, s) for s in range(3)]
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    half = 4.303 * sd / math.sqrt(3)  # t(0.975, 2 df)
    got = study.paired(ROWS, ("band-kl-rollout", 2), ("band-kl", 2), "mean@32")
    assert got["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-15)
    assert got["ci95"] == pytest.approx([mean - half, mean + half], rel=1e-12, abs=1e-15)


def test_the_recomputed_arms_measured_the_lag_and_the_anchored_arm_did_not():
    for lag in study.LAGS:
        recomputed = study.sampler_kl(ROWS, "band-kl", lag)
        assert study.sampler_kl(ROWS, "band-kl-rollout", lag) is None  # no pi_old pass to measure against
        if lag == 0:
            assert recomputed is None  # mu is pi_old
        else:
            assert recomputed > 0.0, lag
    # the further behind the sampler, the larger the KL to it
    kls = [study.sampler_kl(ROWS, "clip", lag) for lag in study.LAGS[1:]]
    assert kls == sorted(kls), kls


def test_the_page_tables_are_rendered_blocks():
    page = (ROOT / "docs" / "staleness.md").read_text()
    for name in ("staleness-mean32", "staleness-entropy", "staleness-anchor", "staleness-to-clip",
                 "staleness-lag-cost"):  # fmt: skip
        assert f"<!-- table {name}: " in page and f"<!-- /table {name} -->" in page, name
    rest = re.sub(r"^<!-- table ([\w.-]+): .*?^<!-- /table \1 -->$", "", page, flags=re.M | re.S)
    assert [line for line in rest.splitlines() if line.startswith("|")] == []


def test_a_lag_is_complete_only_with_every_arm_and_seed_at_the_last_rollout(tmp_path):
    cfg = study.demo_config(1, tmp_path, seeds=2)
    assert not study._complete(cfg)
    Path(cfg.out).mkdir(parents=True)
    rows = [{"method": m, "seed": s, "step": cfg.rollouts} for m in study.ARMS for s in range(2)]
    with (Path(cfg.out) / "metrics.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["method", "seed", "step"])
        writer.writeheader()
        writer.writerows(rows[:-1])
    assert not study._complete(cfg)  # drpo seed 1 missing
    with (Path(cfg.out) / "metrics.csv").open("a", newline="") as fh:
        csv.DictWriter(fh, fieldnames=["method", "seed", "step"]).writerow(rows[-1])
    assert study._complete(cfg)


def test_the_figures_the_pages_quote_are_the_committed_results():
    """The answer's figures in docs/staleness.md and docs/training.md, recomputed from the committed rows."""
    s = study.summary(ROWS)
    staleness, training = ((ROOT / "docs" / name).read_text() for name in ("staleness.md", "training.md"))

    def interval(d: dict) -> str:  # as the prose writes it: '+0.009 [-0.022, +0.040]'
        return study._ci(d).removesuffix(" *")

    for lag in (1, 2, 4):
        quoted = interval(s["anchor"][str(lag)]["mean@32"])
        assert quoted in staleness and quoted in training, (lag, quoted)
        kl = f"{s['final'][f'band-kl@{lag}']['sampler_kl']:.3f}"
        assert kl in staleness, (lag, kl)
    for arm in study.ARMS:
        assert interval(s["to_lag0"][f"{arm}@4"]["mean@32"]) in staleness.replace("\n  ", " "), arm
    entropy = [abs(s["anchor"][str(lag)]["entropy"]["mean"]) for lag in (1, 2, 4)]
    assert max(entropy) <= 0.003 and "within 0.003 nats" in staleness and "within 0.003 nats" in training
