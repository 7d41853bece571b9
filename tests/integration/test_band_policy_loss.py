"""BandPolicyLoss against OpenRLHF 0.11.2's own PolicyLoss, and its band/* metrics.

With the band replaced by the constant interval [0.8, 1.2], BandPolicyLoss must reproduce
PolicyLoss(0.2, 0.2) exactly: loss, gradient and every metric, for every option combination.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from openrlhf.models.loss import PolicyLoss

from openrlhf_band import band_bounds
from openrlhf_band.integration.policy_loss import BandPolicyLoss

IS_OPTIONS = [
    ("off", "mask", "ratio", (0.5, 5.0)),
    ("token", "mask", "ratio", (0.5, 5.0)),
    ("token", "clip", "ratio", (0.5, 5.0)),
    ("seq", "mask", "ratio", (0.5, 5.0)),
    ("token", "mask", "binary_kl", (0.0, 0.05)),
    ("seq", "mask", "tv", (0.0, 0.1)),
]


def make_batch(seed: int, batch: int = 6, length: int = 37):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 4
    log_probs = (old + 0.3 * torch.randn(batch, length, generator=gen)).requires_grad_(True)
    rollout = old + 0.05 * torch.randn(batch, length, generator=gen)
    advantages = torch.randn(batch, length, generator=gen)
    mask = (torch.rand(batch, length, generator=gen) > 0.25).float()
    mask[0] = 0.0  # a fully masked sequence
    return log_probs, old, rollout, advantages, mask


@pytest.mark.parametrize(
    "dual_clip, token_level, is_option, global_counts",
    list(itertools.product([None, 3.0], [True, False], IS_OPTIONS, [False, True])),
)
def test_constant_band_equals_openrlhf_ppo_clip(dual_clip, token_level, is_option, global_counts):
    level, mode, gating, threshold = is_option
    common = dict(
        dual_clip=dual_clip, token_level_loss=token_level, is_correction_level=level,
        is_correction_mode=mode, is_correction_gating=gating, is_correction_threshold=threshold,
    )  # fmt: skip
    ours = BandPolicyLoss(0.2, 0.2, backend="torch", bounds_fn=lambda old: (0.8, 1.2), **common)
    theirs = PolicyLoss(0.2, 0.2, policy_loss_type="ppo", **common)
    log_probs, old, rollout, adv, mask = make_batch(seed=IS_OPTIONS.index(is_option))
    kwargs = dict(action_mask=mask, rollout_log_probs=rollout)
    if global_counts:
        kwargs.update(dp_size=2, batch_num_tokens=float(mask.sum()) * 2, global_batch_size=12.0)
    a = ours(log_probs, old, adv, **kwargs)
    b = theirs(log_probs, old, adv, **kwargs)
    for name, x, y in zip(("loss", "clip_ratio", "ppo_kl", "vllm_kl", "is_filter_ratio"), a, b):
        if y is None:
            assert x is None, name
        else:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7, msg=name)
    (ga,) = torch.autograd.grad(a[0], log_probs)
    (gb,) = torch.autograd.grad(b[0], log_probs)
    torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-8)


def test_band_changes_the_clipping_where_it_should():
    # a rare token (p = 0.05) that doubled its probability with A > 0: clip 0.2 stops it, kl band does not
    old = torch.log(torch.tensor([[0.05, 0.9]]))
    log_probs = (old + math.log(2.0)).requires_grad_(True)
    adv, mask = torch.ones(1, 2), torch.ones(1, 2)
    band = BandPolicyLoss(backend="torch")
    ppo = PolicyLoss(0.2, 0.2)
    (g_band,) = torch.autograd.grad(band(log_probs, old, adv, action_mask=mask)[0], log_probs)
    (g_ppo,) = torch.autograd.grad(ppo(log_probs, old, adv, action_mask=mask)[0], log_probs)
    assert g_ppo[0, 0] == 0 and g_band[0, 0] < 0  # band keeps pushing the rare token up
    assert g_band[0, 1] == 0 and g_ppo[0, 1] == 0  # r = 2 exceeds both bounds for p = 0.9


def test_metrics_match_a_hand_computation():
    log_probs, old, _, adv, mask = make_batch(seed=3)
    loss_fn = BandPolicyLoss(backend="torch", divergence="chi2", delta=0.05, upper_cap=10.0)
    loss_fn(log_probs, old, adv, action_mask=mask)
    m = loss_fn.band_metrics
    bins = ("p<0.01", "p0.01-0.1", "p0.1-0.5", "p>=0.5")
    assert set(m) == {
        "band/clip_frac_upper", "band/clip_frac_lower", "band/lower_mean", "band/upper_mean", "band/width_mean",
        *(f"band/tokens_{b}" for b in bins), *(f"band/clipped_{b}" for b in bins),
        "band/delta_mean", "band/delta_sq_mean",
    }  # fmt: skip
    # a float32 mean of n copies of float32(0.05) (or its square): n - 1 additions in any order, the
    # division, 0.05's own rounding and the square's: within gamma_(n+2) < (n + 3) u relative, u = 2^-24
    rel = (int(mask.sum()) + 3) * 2.0**-24
    assert m["band/delta_mean"].item() == pytest.approx(0.05, rel=rel)
    assert m["band/delta_sq_mean"].item() == pytest.approx(0.0025, rel=rel)
    assert all(v.dim() == 0 and v.dtype == torch.float32 for v in m.values())
    keep = mask.bool()
    n = keep.sum()
    lower, upper = band_bounds(old, "chi2", 0.05, upper_cap=10.0)
    ratio = torch.exp(log_probs.detach() - old)
    up = (adv > 0) & (ratio > upper) & keep
    low = (adv < 0) & (ratio < lower) & keep
    torch.testing.assert_close(m["band/clip_frac_upper"], up.sum() / n)
    torch.testing.assert_close(m["band/clip_frac_lower"], low.sum() / n)
    torch.testing.assert_close(m["band/upper_mean"], upper[keep].mean())
    torch.testing.assert_close(m["band/width_mean"], (upper - lower)[keep].mean())
    p = old.exp()
    in_bin = keep & (p >= 0.1) & (p < 0.5)
    torch.testing.assert_close(m["band/tokens_p0.1-0.5"], in_bin.sum() / n)
    torch.testing.assert_close(m["band/clipped_p0.1-0.5"], ((up | low) & in_bin).sum() / n)
    assert sum(m[f"band/tokens_{b}"] for b in bins).item() == pytest.approx(1.0)


def test_metrics_reduce_exactly_under_token_weighted_averaging():
    # OpenRLHF averages 0-d metrics over micro-batches weighted by their token counts: the result
    # must equal the metric over the concatenated batch
    a, b = make_batch(seed=5, batch=3), make_batch(seed=6, batch=5)
    loss_fn = BandPolicyLoss(backend="torch", divergence="kl")
    parts = []
    for log_probs, old, rollout, adv, mask in (a, b):
        loss_fn(log_probs, old, adv, action_mask=mask, rollout_log_probs=rollout)
        parts.append((loss_fn.band_metrics, mask.sum()))
    whole = [torch.cat([x[i].detach() for x in (a, b)]) for i in range(5)]
    loss_fn(whole[0], whole[1], whole[3], action_mask=whole[4], rollout_log_probs=whole[2])
    assert "band/behaviour_outside_frac" in loss_fn.band_metrics
    for key, value in loss_fn.band_metrics.items():
        reduced = sum(m[key] * w for m, w in parts) / sum(w for _, w in parts)
        torch.testing.assert_close(reduced, value, msg=key)


def test_the_training_pages_metrics_table_lists_exactly_the_emitted_keys():
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    section = page[page.index("\n## Metrics") :].split("\n## ", 2)[1]
    table = [line for line in section.splitlines() if line.startswith("| `band/")]
    documented = {key for line in table for key in re.findall(r"`(band/[^`]+)`", line.split(" | ")[0])}
    log_probs, old, rollout, adv, mask = make_batch(seed=3)
    loss_fn = BandPolicyLoss(  # every key it can emit
        backend="torch", adaptive="entropy", target_entropy=1.0, lower_floor=0.8, ratio_truncation=3.0,
        anchor="rollout",
    )
    loss_fn(log_probs, old, adv, action_mask=mask, entropy=torch.rand_like(old), rollout_log_probs=rollout)
    assert documented == set(loss_fn.band_metrics)


@pytest.mark.parametrize("policy_loss_type", ["band", "cispo"])
def test_behaviour_metrics_measure_the_sampler_against_the_bands_centre(policy_loss_type):
    """band/behaviour_*: the sampler's ratio mu / pi_old against the bounds the loss used (pi_old's), and
    the mean |log mu - log pi_old|; masked positions (an agent's environment tokens) never reach them."""
    log_probs, old, _, adv, mask = make_batch(seed=11)
    gen = torch.Generator().manual_seed(12)
    rollout = old + 0.4 * torch.randn(old.shape, generator=gen)  # a sampler some steps behind
    loss_fn = BandPolicyLoss(backend="torch", divergence="kl", delta=0.05, lower_floor=0.9,
                             policy_loss_type=policy_loss_type)  # fmt: skip
    loss_fn(log_probs, old, adv, action_mask=mask, rollout_log_probs=rollout)
    m = loss_fn.band_metrics
    keep = mask.bool()
    n = keep.sum()
    lower, upper = band_bounds(old, "kl", 0.05, upper_cap=10.0)
    lower = lower.clamp(min=0.9)  # the floor is part of the bounds the loss used
    mu_ratio = torch.exp(rollout - old)
    outside = ((mu_ratio < lower) | (mu_ratio > upper)) & keep
    assert 0 < outside.sum() < n  # both kinds of token occur
    torch.testing.assert_close(m["band/behaviour_outside_frac"], outside.sum() / n)
    torch.testing.assert_close(m["band/behaviour_abs_log_ratio"], (rollout - old).abs()[keep].mean())
    # what masked positions hold does not matter: the dummy 0.0 of an agent's environment tokens, or worse
    for junk in (0.0, math.inf, -math.inf, math.nan):
        loss_fn(log_probs, old, adv, action_mask=mask, rollout_log_probs=torch.where(keep, rollout, junk))
        for key in ("band/behaviour_outside_frac", "band/behaviour_abs_log_ratio"):
            torch.testing.assert_close(loss_fn.band_metrics[key], m[key], msg=f"{key} with {junk} at masked positions")
    # without the sampler's log-probs (IS correction off) there is nothing to compare: no key
    loss_fn(log_probs, old, adv, action_mask=mask)
    assert not any(key.startswith("band/behaviour_") for key in loss_fn.band_metrics)


def test_behaviour_metrics_at_the_simplex_edges():
    """A lower bound of 0 (kl at p = 1e-9) and sampler ratios whose exp under- or overflows float32 are
    read exactly (in log space), never as NaN."""
    old = torch.log(torch.tensor([[1e-9, 1e-9, 0.5, 1.0 - 1e-7]]))
    gap = torch.tensor([[-200.0, 200.0, -5.0, -0.01]])
    loss_fn = BandPolicyLoss(backend="torch", divergence="kl", delta=0.05, upper_cap=None)
    loss_fn(old.clone().requires_grad_(True), old, torch.ones_like(old), action_mask=torch.ones_like(old),
            rollout_log_probs=old + gap)  # fmt: skip
    lower, upper = loss_fn.last_bounds
    assert lower[0, 0] == 0 and upper[0, 1] < 1e9 and lower[0, 3] < math.exp(-0.01) < upper[0, 3]  # as assumed below
    # inside: e^-200 above a lower bound of 0, and e^-0.01 near p = 1; outside: e^200 and e^-5 at p = 0.5
    m = loss_fn.band_metrics
    assert m["band/behaviour_outside_frac"].item() == 0.5
    assert m["band/behaviour_abs_log_ratio"].item() == pytest.approx((200 + 200 + 5 + 0.01) / 4, rel=1e-6)


def test_rejects_bad_options():
    with pytest.raises(ValueError, match="unknown divergence"):
        BandPolicyLoss(divergence="js")
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        BandPolicyLoss(dual_clip=0.5)
    with pytest.raises(ValueError, match="is_correction_level"):
        BandPolicyLoss(is_correction_level="sometimes")


@pytest.mark.parametrize("divergence", ["kl", "reverse_kl", "chi2"])
def test_per_token_delta_passes_through_and_a_constant_tensor_equals_the_scalar(divergence):
    log_probs, old, _, adv, mask = make_batch(seed=9)
    loss_fn = BandPolicyLoss(backend="torch", divergence=divergence, delta=0.05, upper_cap=10.0)
    scalar = loss_fn(log_probs, old, adv, action_mask=mask)
    scalar_metrics = dict(loss_fn.band_metrics)
    (scalar_grad,) = torch.autograd.grad(scalar[0], log_probs)
    tensor = loss_fn(log_probs, old, adv, action_mask=mask, delta=torch.full_like(old, 0.05))
    (tensor_grad,) = torch.autograd.grad(tensor[0], log_probs)
    # kl / reverse_kl: table (scalar) vs solver (tensor), each rounded once to float32: the bounds, and so
    # the loss (bound * A where clipped), a float32 ulp or two apart (~1.2e-7 each). A random ratio lies
    # within that of a bound (a clip decision the two could make differently) with chance ~1e-5 here.
    torch.testing.assert_close(tensor[0], scalar[0], rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(tensor_grad, scalar_grad, rtol=2e-6, atol=1e-7)
    for key, value in loss_fn.band_metrics.items():
        torch.testing.assert_close(value, scalar_metrics[key], rtol=2e-6, atol=1e-7, msg=key)
    # a per-sequence radius is a real per-row change: the bounds follow it row by row
    per_row = torch.linspace(0.01, 0.5, old.shape[0])[:, None]
    loss_fn(log_probs, old, adv, action_mask=mask, delta=per_row)
    lower, upper = band_bounds(old, divergence, per_row, upper_cap=10.0)
    keep = mask.bool()
    torch.testing.assert_close(loss_fn.band_metrics["band/upper_mean"], upper[keep].mean())


def _entropy_like(old, seed=3):
    return torch.rand(old.shape, generator=torch.Generator().manual_seed(seed)) * 2.0


def test_entropy_rule_with_power_zero_is_exactly_the_constant_radius():
    log_probs, old, _, adv, mask = make_batch(seed=11)
    constant = BandPolicyLoss(backend="torch", divergence="kl", delta=0.05)
    adaptive = BandPolicyLoss(backend="torch", divergence="kl", delta=0.05, adaptive="entropy", entropy_power=0.0)
    a = constant(log_probs, old, adv, action_mask=mask)
    b = adaptive(log_probs, old, adv, action_mask=mask, entropy=_entropy_like(old))
    # exact on every CPU: with power 0 BandPolicyLoss takes the constant radius's own code path
    assert torch.equal(a[0], b[0])
    for key, value in constant.band_metrics.items():
        assert torch.equal(value, adaptive.band_metrics[key]), key


def test_entropy_rule_gives_each_token_its_radius():
    log_probs, old, _, adv, mask = make_batch(seed=12)
    entropy = _entropy_like(old)
    loss_fn = BandPolicyLoss(backend="torch", divergence="chi2", delta=0.05, adaptive="entropy", entropy_power=1.0,
                             delta_range=(0.01, 0.2), upper_cap=None)  # fmt: skip
    loss_fn(log_probs, old, adv, action_mask=mask, entropy=entropy)
    keep = mask.bool()
    h_mean = entropy[keep].mean()  # before any optimizer step: this micro-batch's own mean
    want = (0.05 * entropy / h_mean).clamp(0.01, 0.2)
    lower, upper = band_bounds(old, "chi2", want)
    torch.testing.assert_close(loss_fn.band_metrics["band/upper_mean"], upper[keep].mean())
    torch.testing.assert_close(loss_fn.band_metrics["band/delta_mean"], want[keep].mean())
    torch.testing.assert_close(loss_fn.band_metrics["band/delta_sq_mean"], (want[keep] ** 2).mean())
    torch.testing.assert_close(loss_fn.band_metrics["band/entropy_mean"], h_mean)
    # after an optimizer step, the normaliser is that step's mean over all its tokens
    second = _entropy_like(old, seed=4)
    loss_fn(log_probs, old, adv, action_mask=mask, entropy=second)
    loss_fn.after_optimizer_step()
    step_mean = (entropy[keep].sum() + second[keep].sum()) / (2 * keep.sum())
    assert loss_fn.previous_entropy_mean == pytest.approx(float(step_mean), rel=1e-6)
    loss_fn(log_probs, old, adv, action_mask=mask, entropy=entropy)
    torch.testing.assert_close(
        loss_fn.band_metrics["band/delta_mean"], (0.05 * entropy / step_mean).clamp(0.01, 0.2)[keep].mean()
    )


def test_controller_moves_delta_after_each_optimizer_step_and_checkpoints_it():
    log_probs, old, _, adv, mask = make_batch(seed=13)
    low_entropy = torch.full_like(old, 0.1)
    loss_fn = BandPolicyLoss(backend="torch", delta=0.05, target_entropy=1.0, controller_rate=0.5,
                             delta_range=(0.01, 0.2))  # fmt: skip
    deltas = []
    for _ in range(3):
        loss_fn(log_probs, old, adv, action_mask=mask, entropy=low_entropy)
        deltas.append(loss_fn.band_metrics["band/controller_delta"].item())
        # the float32 mean of n copies of float32(delta): within (n + 3) u relative (see above)
        rel = (int(mask.sum()) + 3) * 2.0**-24
        assert loss_fn.band_metrics["band/delta_mean"].item() == pytest.approx(deltas[-1], rel=rel)
        loss_fn.after_optimizer_step()
    # entropy below the target: the radius shrinks by exp(0.5 * -0.2) per optimizer step
    assert deltas == pytest.approx([0.05, 0.05 * math.exp(-0.1), 0.05 * math.exp(-0.2)], rel=1e-6)
    state = loss_fn.band_state()
    fresh = BandPolicyLoss(backend="torch", delta=0.05, target_entropy=1.0, controller_rate=0.5,
                           delta_range=(0.01, 0.2))  # fmt: skip
    fresh.load_band_state(state)
    assert fresh.controller.delta == loss_fn.controller.delta and fresh.controller.steps == 3
    assert fresh.previous_entropy_mean == pytest.approx(0.1)


def test_adaptive_rules_need_the_entropy_and_refuse_bounds_fn():
    log_probs, old, _, adv, mask = make_batch(seed=14)
    with pytest.raises(ValueError, match="entropy"):
        BandPolicyLoss(backend="torch", adaptive="entropy")(log_probs, old, adv, action_mask=mask)
    with pytest.raises(ValueError, match="bounds_fn"):
        BandPolicyLoss(backend="torch", adaptive="entropy", bounds_fn=lambda o: (o * 0 + 0.8, o * 0 + 1.2))


def _two_rank_step(rank: int, init_file: str, results) -> None:
    """One optimizer step of the entropy rule and the controller on rank `rank` of a 2-process gloo
    group: rank 0 has 3 tokens of entropy 1.0, rank 1 has 1 token of entropy 3.0 (others masked)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        entropy = torch.tensor([[1.0, 1.0, 1.0, float("nan")]]) if rank == 0 else torch.tensor([[3.0, 9.0, 9.0, 9.0]])
        mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]]) if rank == 0 else torch.tensor([[1.0, 0.0, 0.0, 0.0]])
        old = torch.full((1, 4), -1.0)
        loss_fn = BandPolicyLoss(backend="torch", divergence="chi2", delta=0.05, adaptive="entropy",
                                 target_entropy=1.0, controller_rate=0.5, delta_range=(0.01, 0.2))  # fmt: skip
        loss_fn(old.clone().requires_grad_(True), old, torch.ones(1, 4), action_mask=mask, entropy=entropy)
        loss_fn.after_optimizer_step()
        results[rank] = (loss_fn.previous_entropy_mean, loss_fn.controller.delta)
    finally:
        dist.destroy_process_group()


def test_the_step_mean_entropy_is_token_weighted_over_all_ranks(tmp_path):
    # (3 x 1.0 + 1 x 3.0) / 4 = 1.5 on both ranks, not the mean of the rank means (2.0); the
    # controller then sees 1.5 / 1.0 - 1 = +0.5, clipped to +0.2: delta 0.05 e^(0.5 x 0.2) on both
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # the worker is this module's function: no re-import
    with ctx.Manager() as manager:
        results = manager.dict()
        ranks = [ctx.Process(target=_two_rank_step, args=(r, str(tmp_path / "init"), results)) for r in (0, 1)]
        for proc in ranks:
            proc.start()
        for proc in ranks:
            proc.join(timeout=120)
        assert [proc.exitcode for proc in ranks] == [0, 0]
        results = dict(results)
    assert results[0] == results[1]
    assert results[0][0] == pytest.approx(1.5, rel=1e-12)
    assert results[0][1] == pytest.approx(0.05 * math.exp(0.1), rel=1e-12)


def test_floor_and_truncation_metrics_match_a_hand_computation():
    log_probs, old, _, adv, mask = make_batch(seed=4)
    loss_fn = BandPolicyLoss(backend="torch", divergence="kl", delta=0.05, lower_floor=0.8, ratio_truncation=1.2)
    loss_fn(log_probs, old, adv, action_mask=mask)
    m = loss_fn.band_metrics
    keep = mask.bool()
    n = keep.sum()
    band_lower, upper = band_bounds(old, "kl", 0.05, upper_cap=10.0)
    lower = band_lower.clamp(min=0.8)
    torch.testing.assert_close(loss_fn.last_bounds[0][keep], lower[keep])
    ratio = torch.exp(log_probs.detach() - old)
    low = (adv < 0) & (ratio < lower) & keep
    up = (adv > 0) & (ratio > upper) & keep
    by_floor = low & (ratio >= band_lower)
    assert by_floor.sum() > 0 and (low & ~by_floor).sum() > 0  # both kinds of lower clip occur
    torch.testing.assert_close(m["band/clip_frac_lower"], low.sum() / n)
    torch.testing.assert_close(m["band/clip_frac_floor"], by_floor.sum() / n)
    truncated = keep & ~(low | up) & (ratio > 1.2)
    assert truncated.sum() > 0
    torch.testing.assert_close(m["band/truncated_frac"], truncated.sum() / n)
    assert m["band/lower_mean"] >= 0.8


def test_floor_composes_with_dcpo_and_the_adaptive_radius():
    from openrlhf_band.band.adaptive import entropy_adaptive_delta
    from openrlhf_band.band.dcpo import dcpo_bounds

    log_probs, old, _, adv, mask = make_batch(seed=7)
    keep = mask.bool()
    dcpo = BandPolicyLoss(backend="torch", bounds_fn=dcpo_bounds, lower_floor=0.7)
    dcpo(log_probs, old, adv, action_mask=mask)
    dcpo_lower, dcpo_upper = dcpo_bounds(old)
    torch.testing.assert_close(dcpo.last_bounds[0][keep], dcpo_lower.clamp(min=0.7)[keep])
    torch.testing.assert_close(dcpo.last_bounds[1][keep], dcpo_upper[keep])
    entropy = _entropy_like(old)
    adaptive = BandPolicyLoss(backend="torch", adaptive="entropy", lower_floor=0.75)
    adaptive(log_probs, old, adv, action_mask=mask, entropy=entropy)
    h = torch.where(keep, entropy, 0.0)
    mean = h.sum() / keep.sum()
    deltas = entropy_adaptive_delta(0.05, h, mean, adaptive.entropy_power, adaptive.delta_range)
    lower, _ = band_bounds(old, "kl", deltas, upper_cap=10.0, lower_floor=0.75)
    torch.testing.assert_close(adaptive.last_bounds[0][keep], lower[keep])
    assert (adaptive.last_bounds[0][keep] >= 0.75).all()


def test_dppo_options_are_checked():
    with pytest.raises(ValueError, match="ratio_truncation must be a positive finite number"):
        BandPolicyLoss(ratio_truncation=0.0)
    with pytest.raises(ValueError, match="adaptive radii are symmetric"):
        BandPolicyLoss(lower_delta=0.02, adaptive="entropy")
    with pytest.raises(ValueError, match="lower_floor must be a number strictly between 0 and 1"):
        BandPolicyLoss(lower_floor=1.5)
