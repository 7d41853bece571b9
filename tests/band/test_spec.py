"""`BandSpec`: the band's options validated once, when the spec is built, and never again below it.

What is checked: every bad option is refused when the spec is built, with the message the keyword
APIs give; the rules' own constraints (dppo, dcpo); one canonical, hashable value per option; the
layers below (bounds, both loss backends, BandPolicyLoss.forward) run no validation; the spec and
the keyword APIs compute the same thing; `spec_bounds` gives any objective the bounds of every rule.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import openrlhf_band.band.spec as spec_module
from openrlhf_band import BandPolicyLoss, BandSpec, band_bounds, band_token_loss
from openrlhf_band.band.bounds import spec_bounds
from openrlhf_band.band.dcpo import dcpo_bounds
from openrlhf_band.functional import band_token_loss_from_spec


def _batch(seed: int = 0, shape=(4, 33)):
    gen = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(shape, generator=gen, dtype=torch.float64).clamp(min=1e-6)).float()
    new = (old + 0.3 * torch.randn(shape, generator=gen)).clamp(max=0.0).requires_grad_(True)
    adv = torch.randn(shape, generator=gen)
    mask = torch.rand(shape, generator=gen) > 0.2
    return new, old, adv, mask


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(divergence="js"), "unknown divergence"),
        (dict(delta=0.0), "delta must be a positive finite number"),
        (dict(delta=float("nan")), "delta must be a positive finite number"),
        (dict(delta="0.05"), "delta must be a positive finite number"),
        (dict(upper_cap=0.5), "upper_cap must be >= 1"),
        (dict(relax=(1.5, 0.2)), "relax must be a pair"),
        (dict(lower_floor=1.0), "strictly between 0 and 1"),
        (dict(lower_delta=-1.0), "lower_delta must be a positive finite number"),
        (dict(ratio_truncation=0.0), "ratio_truncation must be a positive finite number"),
        (dict(rule="ppo"), "rule must be one of"),
        (dict(rule="dppo", divergence="chi2"), "takes divergence tv or kl"),
        (dict(rule="dppo", upper_cap=10.0), "the dppo rule has no upper_cap"),
        (dict(rule="dppo", lower_floor=0.8), "the dppo rule has no lower_floor"),
        (dict(rule="dcpo"), "needs dcpo_eps"),
        (dict(rule="dcpo", dcpo_eps=(0.16, -0.2)), "DCPO eps_high must be a positive finite number"),
        (dict(rule="dcpo", dcpo_eps=(0.16, 0.2), ratio_truncation=3.0), "the dcpo rule takes neither"),
        (dict(dcpo_eps=(0.16, 0.2)), "dcpo_eps is the dcpo rule's"),
    ],
)
def test_a_bad_option_is_refused_when_the_spec_is_built(options, message):
    with pytest.raises(ValueError, match=message):
        BandSpec(**options)


def test_the_keyword_apis_refuse_with_the_specs_messages():
    new, old, adv, mask = _batch()
    for call in (
        lambda: band_bounds(old, "kl", delta=-1.0),
        lambda: band_token_loss(new, old, adv, mask, delta=-1.0, backend="torch"),
        lambda: BandPolicyLoss(delta=-1.0),
    ):
        with pytest.raises(ValueError, match="delta must be a positive finite number"):
            call()
    with pytest.raises(ValueError, match="lower_delta takes a number delta"):
        band_token_loss(new, old, adv, mask, delta=torch.full((4, 1), 0.05), lower_delta=0.02, backend="torch")


def test_one_canonical_hashable_value_per_option():
    a = BandSpec("kl", 1, 10, [0, 0], lower_floor=0.5)
    b = BandSpec("kl", 1.0, 10.0, (0.0, 0.0), lower_floor=0.5)
    assert a == b and hash(a) == hash(b) and type(a.delta) is float and a.relax == (0.0, 0.0)
    assert BandSpec("chi2") != BandSpec("tv")  # negative control: a different rule is a different spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.delta = 0.1


def test_nothing_below_the_spec_validates_again(monkeypatch):
    """Count the validator's calls: building the spec is the one; the bounds, both backends and
    BandPolicyLoss.forward add none (the control: building a spec does count)."""
    calls = []
    real = spec_module.validate_band
    monkeypatch.setattr(spec_module, "validate_band", lambda *a, **k: calls.append(a) or real(*a, **k))
    spec = BandSpec("kl", 0.05, 10.0, lower_floor=0.7)
    assert len(calls) == 1
    new, old, adv, mask = _batch()
    loss_fn = BandPolicyLoss(band=spec, backend="torch")
    calls.clear()
    spec_bounds(spec, old)
    out = band_token_loss_from_spec(new, old, adv, mask, spec, backend="torch", return_bounds=True)
    out.loss.sum().backward()
    for _ in range(3):
        loss_fn(new, old, adv, mask)[0].backward()
    assert calls == []
    BandSpec("tv")
    assert len(calls) == 1


def test_the_spec_and_the_keyword_apis_compute_the_same():
    new, old, adv, mask = _batch(1)
    options = dict(divergence="kl", delta=0.07, upper_cap=5.0, relax=(0.1, 0.1), lower_floor=0.6)
    spec = BandSpec(**options)
    by_keywords = band_token_loss(new, old, adv, mask, dual_clip=3.0, backend="torch", return_bounds=True, **options)
    by_spec = band_token_loss_from_spec(new, old, adv, mask, spec, dual_clip=3.0, backend="torch", return_bounds=True)
    for a, b in zip(by_keywords, by_spec):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(band_bounds(old, **options), spec_bounds(spec, old)))
    other = band_token_loss_from_spec(new, old, adv, mask, dataclasses.replace(spec, delta=0.2), backend="torch")
    assert not torch.equal(other.loss, by_spec.loss)  # the control: the radius matters
    by_module = BandPolicyLoss(band=spec, backend="torch", dual_clip=3.0, token_level_loss=True)(new, old, adv, mask)
    by_options = BandPolicyLoss(backend="torch", dual_clip=3.0, token_level_loss=True, **options)(new, old, adv, mask)
    assert torch.equal(by_module[0], by_options[0])
    with pytest.raises(ValueError, match="give the band once"):
        BandPolicyLoss(band=spec, delta=0.1)


def test_spec_bounds_serve_every_rule():
    _, old, _, _ = _batch(2)
    dcpo = BandSpec(upper_cap=10.0, lower_floor=0.7, rule="dcpo", dcpo_eps=(0.16, 0.2))
    lower, upper = dcpo_bounds(old, 0.16, 0.2, upper_cap=10.0)
    got = spec_bounds(dcpo, old)
    assert torch.equal(got[0], lower.clamp(min=0.7)) and torch.equal(got[1], upper)
    dppo = BandSpec("tv", 0.2, lower_delta=0.1, ratio_truncation=1e4, rule="dppo")
    expected = band_bounds(old, "tv", 0.2, lower_delta=0.1)
    assert all(torch.equal(a, b) for a, b in zip(spec_bounds(dppo, old), expected))
    per_sequence = torch.tensor([0.01, 0.05, 0.1, 0.2])
    assert all(
        torch.equal(a, b)
        for a, b in zip(spec_bounds(BandSpec("chi2"), old, per_sequence), band_bounds(old, "chi2", per_sequence))
    )
    with pytest.raises(ValueError, match="takes no radius"):
        spec_bounds(dcpo, old, per_sequence)


def test_a_dcpo_spec_in_the_loss_is_dcpos_bounds_given_to_the_loss():
    """The dcpo rule through BandPolicyLoss(band=...) is the loss with DCPO's bounds as given bounds
    (bounds_fn, the form the demo uses), the floor applied by the loss (so it flags floor_clipped)."""
    new, old, adv, mask = _batch(3)
    spec = BandSpec(upper_cap=10.0, lower_floor=0.7, rule="dcpo", dcpo_eps=(0.16, 0.2))
    by_rule = BandPolicyLoss(band=spec, backend="torch")
    by_fn = BandPolicyLoss(backend="torch", upper_cap=10.0, lower_floor=0.7,
                           bounds_fn=lambda o: dcpo_bounds(o, 0.16, 0.2, upper_cap=10.0))  # fmt: skip
    a, b = by_rule(new, old, adv, mask), by_fn(new, old, adv, mask)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert by_rule.band_metrics.keys() == by_fn.band_metrics.keys()
    assert all(torch.equal(by_rule.band_metrics[k], by_fn.band_metrics[k]) for k in by_rule.band_metrics)
    with pytest.raises(ValueError, match="do not apply to bounds_fn rules"):
        BandPolicyLoss(band=spec, adaptive="entropy")
