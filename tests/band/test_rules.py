"""The band's rules are declared once (openrlhf_band/band/rules.py) and every layer reads them: no layer compares a
rule's name, each rule's declaration is consistent with the flags and the spec, and what a rule declares it
refuses is refused at parse time, in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from openrlhf_band.band.rules import OWNED, RULES, flag_name
from openrlhf_band.band.spec import BandSpec
from openrlhf_band.integration.flags import BAND_DEFAULTS

PACKAGE = Path(__file__).resolve().parents[2] / "openrlhf_band"
NAMES = "|".join(RULES)
#: a comparison with a rule's name: `x.rule == "dcpo"`, `rule != 'dppo'`, `"dcpo" == x`, `x in ("band", "dcpo")`
COMPARISON = re.compile(
    rf"""(==|!=)\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=)|\bin\s*[\(\[{{][^)\]}}]*["']({NAMES})["']"""
)


def test_no_layer_compares_a_rules_name():
    """Issue 59's bound: at most 8 comparisons of a rule's name in the package (there were 26 in 8 files). The ones
    left compare the demo's method kinds, which share two rule names, and the AOT table's kernel variants."""
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARISON.search(line.split("#", 1)[0]):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert len(hits) <= 8, "\n".join(hits)
    assert not [h for h in hits if not h.startswith(("openrlhf_band/tools/demo/", "openrlhf_band/bench/"))], hits


def test_the_detector_sees_the_comparisons_it_is_meant_to():
    for line in ('if spec.rule == "dcpo":', "if band.rule != 'dppo':", 'if "trust_region" == rule:',
                 'if rule in ("dcpo", "dppo"):', 'if kind in ("band", "dppo", "dcpo"):'):  # fmt: skip
        assert COMPARISON.search(line), line
    assert not COMPARISON.search("rule = RULES[spec.rule]")
    assert not COMPARISON.search('RULES = {"dcpo": DCPO}')


@pytest.mark.parametrize("name", list(RULES))
def test_each_rule_declares_flags_that_exist(name):
    rule = RULES[name]
    assert rule.name == name and rule.summary
    assert set(rule.refuses) <= set(BAND_DEFAULTS) and set(rule.own) <= set(BAND_DEFAULTS)
    assert bool(rule.refuses) == bool(rule.refusal), "a rule that refuses options says why"
    assert rule.takes_dual_clip or rule.dual_clip_refusal
    assert not (set(rule.own) & set(rule.refuses))
    assert rule.adaptive_radius <= rule.has_radius  # an adaptive radius moves a radius
    for key in rule.own:
        assert OWNED[key] is rule and rule.label


#: a spec of each rule with every option it takes, and the bounds computed by the operator's own functions
SPECS = {
    "trust_region": dict(
        divergence="chi2", delta=0.1, upper_cap=5.0, relax=(0.1, 0.1), lower_floor=0.7, ratio_truncation=3.0
    ),
    "dppo": dict(divergence="tv", delta=0.2, lower_delta=0.1, ratio_truncation=3.0),
    "dcpo": dict(dcpo_eps=(0.16, 0.2), upper_cap=10.0, lower_floor=0.75),
}


def _direct_bounds(name: str, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from openrlhf_band import band_bounds
    from openrlhf_band.band.dcpo import dcpo_bounds

    o = SPECS[name]
    if name == "dcpo":
        lower, upper = dcpo_bounds(old, *o["dcpo_eps"], o["upper_cap"])
        return lower.clamp(min=o["lower_floor"]), upper
    keys = ("upper_cap", "relax", "lower_floor", "lower_delta")
    return band_bounds(old, o["divergence"], o["delta"], **{k: o[k] for k in keys if k in o})


def test_every_rule_has_a_spec_here():
    assert set(SPECS) == set(RULES), "add the new rule's spec with every option it takes to SPECS"


@pytest.mark.parametrize("name", list(RULES))
def test_each_rules_bounds_are_the_operators(name):
    """`rule.bounds` (what spec_bounds, the loss and the kernel's given bounds use) equals the operator's own
    functions (band_bounds, dcpo_bounds: each held to an outside ground truth in tests/band) on every option."""
    spec = BandSpec(rule=name, **SPECS[name])
    old = torch.log(torch.tensor([[1e-6, 1e-4, 0.01, 0.3, 0.9, 0.999, 1.0]]))
    lower, upper, at_edge = RULES[name].bounds(spec, old, None, True)
    assert lower.shape == upper.shape == at_edge.shape == old.shape and at_edge.dtype == torch.bool
    expected = _direct_bounds(name, old)
    assert torch.equal(lower, expected[0]) and torch.equal(upper, expected[1])


def _logged(name: str) -> set[str]:
    """The metrics a BandPolicyLoss of the rule logs, with every option it takes, with and without a call radius."""
    from openrlhf_band import BandPolicyLoss

    logged = set()
    for call in ({}, {"delta": 0.04}) if RULES[name].has_radius else ({},):
        loss = BandPolicyLoss(band=BandSpec(rule=name, **SPECS[name]), backend="torch")
        g = torch.Generator().manual_seed(0)
        old = torch.log(torch.rand(4, 16, generator=g) ** 4)
        loss(old + torch.randn(4, 16, generator=g), old, torch.randn(4, 1, generator=g), torch.ones(4, 16), **call)
        logged |= set(loss.band_metrics)
    return logged


def test_each_rule_logs_exactly_the_metrics_it_declares():
    """Beyond the metrics every rule logs, each rule's loss logs those it declares (band/rules.py `metrics`)."""
    logged = {name: _logged(name) for name in RULES}
    every = set.intersection(*logged.values())
    assert {"band/clip_frac_upper", "band/clip_frac_lower", "band/width_mean"} <= every
    for name, rule in RULES.items():
        assert logged[name] - every == set(rule.metrics), name


@pytest.mark.parametrize("name", [n for n in RULES if RULES[n].refuses])
def test_each_refused_flag_is_refused_in_one_line(name, capsys):
    from openrlhf_band.patching.check_args import validate_train_args

    base = ["--actor.model_name_or_path", "m", "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "r.py", "--loss", "band",
            "--actor.band.rule", name]  # fmt: skip
    values = {"divergence": ["kl"], "delta": ["0.1"], "upper_cap": ["5"], "relax": ["0.2", "0.2"],
              "lower_floor": ["0.8"], "adaptive": ["entropy"], "entropy_power": ["1"], "delta_range": ["0.01", "0.1"],
              "target_entropy": ["0.5"], "controller_rate": ["0.1"]}  # fmt: skip
    for key in RULES[name].refuses:
        with pytest.raises(SystemExit) as exit_:
            validate_train_args([*base, flag_name(key), *values[key]])
        err = capsys.readouterr().err
        assert exit_.value.code == 2
        assert f"{flag_name(key)} does not apply to --actor.band.rule {name} ({RULES[name].refusal})" in err, err
        assert "usage:" not in err and len(err.strip().splitlines()) <= 3, err
