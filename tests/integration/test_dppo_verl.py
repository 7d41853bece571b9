"""Our DPPO rule against verl's released DPPO losses (ground truth).

DPPO (arXiv 2602.04879) is merged in verl as `compute_policy_loss_dppo_tv` / `compute_policy_loss_dppo_kl`.
`verl_dppo` (tests/support) runs those functions, with verl's `agg_loss`, `masked_sum` and `masked_mean`,
from the installed verl 0.9.1 wheel (`.venv/ground-truth/verl-0.9.1`, made by `make venv`); nothing of
verl's code is copied here. Our DPPO is `BandPolicyLoss(divergence="tv" | "kl", delta=clip_ratio_high,
lower_delta=clip_ratio_low, upper_cap=None, ratio_truncation=clip_ratio_c)`.

On rollout-like float32 batches (old log-probs of tokens sampled from a softmax policy, new log-probs
from perturbed logits, padding, GRPO advantages of both signs and 0), for tv and kl, symmetric and
asymmetric radii, truncation c in {1e4, 3, 1.5} and both aggregations (verl's token-mean and
seq-mean-token-mean, with and without global counts), the tests compare

* the trust-region masks: verl's (read from its own gradient: verl's per-token gradient is
  -A min(r, c) valid / N, zero exactly where verl masks a token with A != 0) against our
  ~(clipped_upper | clipped_lower): no disagreement except at a token within float32 rounding of
  the radius (none on these batches on the machines we ran them on, but the batches themselves come
  from float32 log_softmax, whose rounding differs between CPUs);
* the gradients of the aggregated losses w.r.t. the new log-probs: equal within float32 rounding at
  every other position (the loss values differ by design: verl's surrogate is -A sg(min(r, c)) log pi);
* the metrics: band/clip_frac_upper + band/clip_frac_lower is actor/pg_clipfrac, band/truncated_frac
  is actor/pg_clipfrac_lower, the forward's ppo_kl is actor/ppo_kl.

Plus: negative controls (a cap, no truncation, a symmetric or swapped radius) that the comparison must
catch; tokens placed within 1e-9..1e-3 (relative) of the radius, where the two masks may disagree, but
only within float32 rounding of the divergence; and log-ratios beyond the [-20, 20] clamp, where
DPPO's gradient (unlike PolicyLoss's) does not stop.
"""

from __future__ import annotations

import math

import pytest
import torch
import verl_dppo
import verl_objectives

from openrlhf_band import band_token_loss
from openrlhf_band.integration.policy_loss import BandPolicyLoss

# (divergence, clip_ratio_low, clip_ratio_high): verl's example radii, then an asymmetric pair
RADII = [("tv", 0.15, 0.15), ("kl", 0.05, 0.05), ("tv", 0.1, 0.2), ("kl", 0.1, 0.2)]
# the DPPO authors' scripts (1e4), verl's ActorConfig default (3.0), one that binds on many tokens
TRUNCATIONS = [1e4, 3.0, 1.5]
MODES = {"token-mean": True, "seq-mean-token-mean": False}  # verl mode -> our token_level_loss

SEEDS = range(8)
VOCABS = (64, 1000, 256, 128, 512, 64, 1000, 256)  # one per seed
BATCH, LENGTH, GROUP = 64, 128, 8
# Per-token gradients: -A min(r, c) / N from a few correctly rounded float32 ops and one exp on each
# side, in different orders: a few ulps (u = 2^-24 ~ 6e-8) each, ~1e-6 relative in all; 1e-5 leaves
# 10x. atol 0: a zero must be a zero.
RTOL = 1e-5
# A token's q within this many float32 ulps of max(p, q) of the exact root may fall on either side of
# the radius in verl's probability-space test and in our ratio-space one (each rounds differently;
# measured up to 21.5 ulps in test_disagreements_near_the_radius_are_float32_rounding).
NEAR_RADIUS_ULPS = 32.0


@pytest.fixture(scope="module")
def verl():
    return verl_objectives.load_or_fail(verl_dppo.load)  # a test that cannot run must fail, not skip


def rollout_batch(seed: int, vocab: int, batch: int = BATCH, length: int = LENGTH, group: int = GROUP):
    """(log_probs, old_log_probs, advantages, mask), float32 (batch, length).

    Old policy: log_softmax of N(0, s^2) logits with a per-sequence temperature s log-uniform in
    [0.3, 12], and on 30% of the positions one token boosted by U(0, 25) (very confident tokens,
    1 - p down to float32's resolution). The sampled token is drawn from the old policy (2% uniformly:
    rare tokens, p down to ~1e-30). New policy: the logits plus sigma N(0, 1), sigma per sequence in
    {0.02, 0.1, 0.4, 1.2}, so that tokens cross the radii both ways. Right padding to a random length
    >= 1 (no empty sequence). GRPO advantages: groups of `group` sequences with Bernoulli rewards,
    (r - mean) / (std + 1e-6): both signs, and exactly 0 for a group with equal rewards.
    """
    gen = torch.Generator().manual_seed(seed)
    _, old_all, new_all, tokens = verl_objectives.draw_policies(
        gen, batch, length, vocab, max_temperature=12.0, max_boost=25, sigmas=(0.02, 0.1, 0.4, 1.2)
    )
    old = old_all.gather(-1, tokens[..., None])[..., 0]
    new = new_all.gather(-1, tokens[..., None])[..., 0]
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None] < lengths[:, None]).float()
    success = torch.rand(batch // group, 1, generator=gen).expand(-1, group)
    rewards = (torch.rand(batch // group, group, generator=gen) < success).float()
    adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    return new, old, adv.reshape(batch, 1).expand(batch, length).contiguous(), mask


@pytest.fixture(scope="module")
def rollout():
    parts = [rollout_batch(seed, vocab) for seed, vocab in zip(SEEDS, VOCABS)]
    new, old, adv, mask = (torch.cat(tensors) for tensors in zip(*parts))
    # the main batches stay inside the [-20, 20] log-ratio clamp (beyond it: test_beyond_log_ratio_clamp)
    assert float((new - old)[mask.bool()].abs().max()) < 20.0
    return new, old, adv, mask


def batch_counts(mask: torch.Tensor, dp_size: int):
    """Global counts as verl's trainer passes them (dp_size ranks holding the same batch)."""
    return float(mask.sum()) * dp_size, float((mask.sum(-1) > 0).sum()) * dp_size


def run_verl(verl, divergence, low, high, c, mode, new, old, adv, mask, dp_size=1):
    """verl's loss on (new, old, adv, mask): (gradient w.r.t. the new log-probs, metrics dict).
    dp_size 1: no global counts (agg_loss takes the micro-batch's); 2: verl's global_batch_info."""
    info = {"dp_size": dp_size}
    if dp_size > 1:
        info["batch_num_tokens"], info["global_batch_size"] = batch_counts(mask, dp_size)
    config = verl_dppo.DppoConfig(high, low, high, clip_ratio_c=c, global_batch_info=info)
    log_prob = new.clone().requires_grad_(True)
    loss, metrics = verl.dppo[divergence](old, log_prob, adv, mask, mode, config)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return grad, metrics


def run_ours(divergence, low, high, c, mode, new, old, adv, mask, dp_size=1, overrides=None):
    """Our DPPO (BandPolicyLoss) on the same inputs: (gradient, forward outputs, band_metrics, flags),
    flags being band_token_loss's output with the same options (clipped_upper / clipped_lower)."""
    options = dict(divergence=divergence, delta=high, lower_delta=low, upper_cap=None, ratio_truncation=c)
    options.update(overrides or {})
    loss_fn = BandPolicyLoss(token_level_loss=MODES[mode], backend="torch", **options)
    counts = {}
    if dp_size > 1:
        counts["batch_num_tokens"], counts["global_batch_size"] = batch_counts(mask, dp_size)
    log_probs = new.clone().requires_grad_(True)
    outputs = loss_fn(log_probs, old, adv, mask, dp_size=dp_size, **counts)
    (grad,) = torch.autograd.grad(outputs[0], log_probs)
    flags = band_token_loss(new, old, adv, mask, backend="torch", **options)
    return grad, outputs, loss_fn.band_metrics, flags


def divergence64(divergence: str, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """q - p (tv) or the binary KL(p || q) (kl), in float64 from the float32 log-probs, without
    cancellation (expm1 / log1p)."""
    lp, lq = old.double(), new.double()
    p, q = lp.exp(), lq.exp()
    if divergence == "tv":
        return q - p
    log_1mp, log_1mq = torch.log(-torch.expm1(lp)), torch.log(-torch.expm1(lq))
    return p * (lp - lq) + (1 - p) * (log_1mp - log_1mq)


def describe(divergence, old, new, adv, where, limit=10):
    """(p, q, A, divergence) of the first `limit` tokens of `where`, for failure messages."""
    d = divergence64(divergence, old, new)
    rows = [
        f"p={math.exp(float(old[i])):.9g} q={math.exp(float(new[i])):.9g} A={float(adv[i]):+.3g} D={float(d[i]):.10g}"
        for i in where.nonzero()[:limit, 0].tolist()
    ]
    return "; ".join(rows)


def grad_mismatch(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    return ~torch.isclose(ours, theirs, rtol=RTOL, atol=0.0)


def beyond_rounding(divergence, low, high, old, new, adv, where: torch.Tensor) -> torch.Tensor:
    """The tokens of `where` whose q lies more than NEAR_RADIUS_ULPS float32 ulps of max(p, q) from the
    exact root on its advantage's side (A > 0: the upper root at `high`, A < 0: the lower at `low`),
    or that have no such root: there a disagreement is a different rule, not float32 rounding."""
    out = torch.zeros_like(where)
    if not where.any():
        return out
    lp, lq, side = old[where].double(), new[where].double(), torch.sign(adv[where]).double()
    root = _boundary_log_q(divergence, lp, side, torch.where(side > 0, high, low).double())
    dist = root.exp() * torch.expm1(lq - root).abs() / (2.0**-24 * torch.maximum(lp.exp(), lq.exp()))
    out[where] = ~(dist <= NEAR_RADIUS_ULPS)  # nan (no root on that side): beyond
    return out


def test_installed_verl_is_0_9_1(verl):
    assert verl.version == verl_dppo.VERL_VERSION == "0.9.1"
    assert verl_dppo.installed_version() == "0.9.1"
    assert set(verl.dppo) == {"tv", "kl"}


def test_missing_or_wrong_verl_fails_with_make_venv(tmp_path):
    with pytest.raises(verl_dppo.VerlGroundTruthMissing, match="run `make venv`"):
        verl_dppo.load(tmp_path / "verl-0.9.1")
    # the right files, a different version in the dist-info
    for relative in (verl_dppo.CORE_ALGOS, verl_dppo.TORCH_FUNCTIONAL):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).symlink_to(verl_dppo.VERL_ROOT / relative)
    (tmp_path / "verl-0.9.0.dist-info").mkdir()
    (tmp_path / "verl-0.9.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.4\nName: verl\nVersion: 0.9.0\n")
    with pytest.raises(verl_dppo.VerlGroundTruthMissing, match="holds verl 0.9.0, not 0.9.1"):
        verl_dppo.load(tmp_path)


def test_rollout_batches_cover_the_cases(rollout):
    new, old, adv, mask = rollout
    m = mask.bool()
    p = old.exp()[m]
    assert m.sum() >= 30_000
    assert float(p.min()) < 1e-6 and int((p > 1 - 1e-6).sum()) >= 100  # rare and very confident tokens
    assert int((adv[m] > 0).sum()) >= 5_000 and int((adv[m] < 0).sum()) >= 5_000 and int((adv[m] == 0).sum()) > 0
    assert (mask.sum(-1) > 0).all() and (mask == 0).any()


@pytest.mark.parametrize("dp_size", [1, 2])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("c", TRUNCATIONS)
@pytest.mark.parametrize("divergence, low, high", RADII)
def test_dppo_matches_verl(verl, rollout, divergence, low, high, c, mode, dp_size):
    new, old, adv, mask = rollout
    grad_verl, _ = run_verl(verl, divergence, low, high, c, mode, new, old, adv, mask, dp_size)
    grad_ours, _, _, flags = run_ours(divergence, low, high, c, mode, new, old, adv, mask, dp_size)
    m = mask.bool()
    live = m & (adv != 0)

    # not vacuous: both sides clip, and the truncation acts exactly when c is small enough
    assert int(flags.clipped_upper.sum()) >= 20 and int(flags.clipped_lower.sum()) >= 20
    ratio = (new - old).exp()
    truncated = live & ~(flags.clipped_upper | flags.clipped_lower) & (ratio > c)
    assert (int(truncated.sum()) >= 50) if c < 10 else (int(truncated.sum()) == 0)

    # (a) the masks: verl's, read from its own gradient, against our clip flags; a disagreement only
    # within float32 rounding of the radius, and rare
    verl_valid = grad_verl != 0
    ours_valid = ~(flags.clipped_upper | flags.clipped_lower)
    disagree = live & (verl_valid != ours_valid)
    beyond = beyond_rounding(divergence, low, high, old, new, adv, disagree)
    assert int(beyond.sum()) == 0, f"{int(beyond.sum())} mask disagreements: " + describe(
        divergence, old, new, adv, beyond
    )
    assert int(disagree.sum()) <= 1e-3 * int(live.sum()), describe(divergence, old, new, adv, disagree)
    assert (grad_verl[~live] == 0).all() and (grad_ours[~live] == 0).all()

    # (b) the gradients of the aggregated losses, every position but those disagreements
    bad = grad_mismatch(grad_ours, grad_verl) & ~disagree
    rel = ((grad_ours - grad_verl).abs() / grad_verl.abs().clamp(min=1e-30))[live & verl_valid & ~disagree]
    assert int(bad.sum()) == 0, f"{int(bad.sum())} gradient mismatches (max rel {float(rel.max()):.3g}): " + describe(
        divergence, old, new, adv, bad
    )


@pytest.mark.parametrize("c", TRUNCATIONS)
@pytest.mark.parametrize("divergence, low, high", RADII)
def test_metrics_match_verl(verl, rollout, divergence, low, high, c):
    """band/clip_frac_upper + band/clip_frac_lower = actor/pg_clipfrac and band/truncated_frac =
    actor/pg_clipfrac_lower over the tokens with A != 0; over all tokens verl also counts the A = 0
    tokens that its negative-advantage mask drops (they have no gradient either way; our flags need
    A < 0 to clip below), and nothing else differs."""
    new, old, adv, mask = rollout
    live_mask = mask * (adv != 0)
    grad_verl, verl_live = run_verl(verl, divergence, low, high, c, "token-mean", new, old, adv, live_mask)
    _, outputs, ours_live, flags = run_ours(divergence, low, high, c, "token-mean", new, old, adv, live_mask)
    # verl's masked_mean divides by count + 1e-8, and returns .item(): 1e-6; plus one token's share per
    # mask disagreement within float32 rounding of the radius (test_dppo_matches_verl: none beyond it)
    disagree = live_mask.bool() & ((grad_verl != 0) == (flags.clipped_upper | flags.clipped_lower))
    assert not beyond_rounding(divergence, low, high, old, new, adv, disagree).any()
    tol = dict(rel=0, abs=1e-6 + int(disagree.sum()) / float(mask.sum()))
    clip_frac = float(ours_live["band/clip_frac_upper"] + ours_live["band/clip_frac_lower"])
    assert clip_frac == pytest.approx(verl_live["actor/pg_clipfrac"], **tol)
    assert float(outputs[1]) == pytest.approx(verl_live["actor/pg_clipfrac"], **tol)  # the forward's clip_ratio
    assert float(ours_live["band/truncated_frac"]) == pytest.approx(verl_live["actor/pg_clipfrac_lower"], **tol)
    assert float(outputs[2]) == pytest.approx(verl_live["actor/ppo_kl"], **tol)
    assert (verl_live["actor/pg_clipfrac_lower"] > 0) == (c < 10)

    # all tokens: verl's pg_clipfrac = ours + verl's own pg_clipfrac over the A = 0 tokens (as shares)
    zero_mask = mask * (adv == 0)
    _, verl_all = run_verl(verl, divergence, low, high, c, "token-mean", new, old, adv, mask)
    _, verl_zero = run_verl(verl, divergence, low, high, c, "token-mean", new, old, adv, zero_mask)
    _, _, ours_all, _ = run_ours(divergence, low, high, c, "token-mean", new, old, adv, mask)
    n_all, n_zero = float(mask.sum()), float(zero_mask.sum())
    ours_clip = float(ours_all["band/clip_frac_upper"] + ours_all["band/clip_frac_lower"])
    assert verl_all["actor/pg_clipfrac"] == pytest.approx(
        ours_clip + verl_zero["actor/pg_clipfrac"] * n_zero / n_all, **tol
    )
    assert float(ours_all["band/truncated_frac"]) == pytest.approx(verl_all["actor/pg_clipfrac_lower"], **tol)


NEGATIVE_CONTROLS = {
    # (verl's divergence, low, high, c) -> our deviating options
    "band's default cap 10": (("kl", 0.05, 0.05, 1e4), dict(upper_cap=10.0)),
    "no truncation where c binds": (("tv", 0.15, 0.15, 1.5), dict(ratio_truncation=None)),
    "symmetric radius for verl's asymmetric": (("tv", 0.1, 0.2, 1e4), dict(delta=0.2, lower_delta=None)),
    "radii swapped": (("kl", 0.1, 0.2, 3.0), dict(delta=0.1, lower_delta=0.2)),
    "tv radius in kl": (("kl", 0.05, 0.05, 3.0), dict(divergence="tv")),
}


@pytest.mark.parametrize("name", list(NEGATIVE_CONTROLS))
def test_comparison_catches_a_different_rule(verl, rollout, name):
    (divergence, low, high, c), overrides = NEGATIVE_CONTROLS[name]
    new, old, adv, mask = rollout
    grad_verl, _ = run_verl(verl, divergence, low, high, c, "token-mean", new, old, adv, mask)
    grad_ours, *_ = run_ours(divergence, low, high, c, "token-mean", new, old, adv, mask, overrides=overrides)
    assert int(grad_mismatch(grad_ours, grad_verl).sum()) > 0, name
    # and the faithful configuration passes on the same inputs (up to float32 rounding at the radius)
    grad_ours, *_ = run_ours(divergence, low, high, c, "token-mean", new, old, adv, mask)
    assert not beyond_rounding(divergence, low, high, old, new, adv, grad_mismatch(grad_ours, grad_verl)).any()


def _boundary_log_q(divergence, lp, side, target):
    """log q (float64) with divergence(p, q) = target on `side` (+1: q > p, -1: q < p), by bisection
    (kl: in log q below p, in log(1 - q) above p; no cancellation)."""
    p = lp.exp()
    if divergence == "tv":
        return torch.log(p + side * target)

    def kl(lq):
        return divergence64("kl", lp, lq)

    log_1mp = torch.log(-torch.expm1(lp))
    # lower: t = log q in (lp - 800, lp); upper: t = log(1 - q) in (-700, log(1 - p))
    lo = torch.where(side > 0, torch.full_like(lp, -700.0), lp - 800.0)
    hi = torch.where(side > 0, log_1mp, lp)
    for _ in range(80):
        mid = (lo + hi) / 2
        lq = torch.where(side > 0, torch.log1p(-mid.exp()), mid)
        above = kl(lq) > target  # upper: D falls as t grows; lower: D falls as t grows too
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    mid = (lo + hi) / 2
    return torch.where(side > 0, torch.log1p(-mid.exp()), mid)


@pytest.mark.parametrize("divergence, low, high", RADII)
def test_disagreements_near_the_radius_are_float32_rounding(verl, divergence, low, high):
    """Tokens whose exact divergence is radius * (1 +- u), u log-uniform in [1e-9, 1e-3] (p log-uniform
    in (1e-6, 1), 30% with 1 - p log-uniform in (1e-7, 0.5)): the masks may disagree here, but only
    within float32 rounding: the token's q must lie within ULPS float32 ulps of max(p, q) of the exact
    root q* (float64 bisection for the token's float32 p). verl decides in probability space (q - p,
    or a KL with 1 - q + 1e-8), we in ratio space (r > r_up(p)): each rounds differently. Where ours
    is the side that is wrong (against the exact divergence of the float32 inputs), it is within
    |log r| + 3 ulps (derived below). Measured maxima (ulps of max(p, q)): ours 8.3 (tv, |log r| ~ 10),
    verl 21.5 (kl, p ~ 1e-6, q ~ 0.05)."""
    ulps = NEAR_RADIUS_ULPS
    gen = torch.Generator().manual_seed(7)
    n = 40_000
    confident = torch.rand(n, generator=gen) < 0.3
    rare = -torch.empty(n).uniform_(math.log(1e-7), math.log(14.0), generator=gen).exp()  # p in (1e-6, 1)
    near_one = torch.log1p(-torch.empty(n).uniform_(math.log(1e-7), math.log(0.5), generator=gen).exp())
    lp = torch.where(confident, near_one.double(), rare.double()).float().double()  # p exactly a float32 log-prob
    side = torch.where(torch.rand(n, generator=gen) < 0.5, 1.0, -1.0).double()
    u = torch.empty(n).uniform_(math.log(1e-9), math.log(1e-3), generator=gen).exp().double()
    u = u * torch.where(torch.rand(n, generator=gen) < 0.5, 1.0, -1.0).double()
    radius = torch.where(side > 0, high, low).double()
    lq = _boundary_log_q(divergence, lp, side, radius * (1 + u))
    keep = torch.isfinite(lq) & (lq < 0) & ((lq - lp).abs() < 20)  # inside the log-ratio clamp
    old, new, adv = lp[keep].float()[None], lq[keep].float()[None], side[keep].float()[None]
    mask = torch.ones_like(old)
    grad_verl, _ = run_verl(verl, divergence, low, high, 1e4, "token-mean", new, old, adv, mask)
    grad_ours, _, _, flags = run_ours(divergence, low, high, 1e4, "token-mean", new, old, adv, mask)
    verl_valid, ours_valid = (grad_verl != 0)[0], (~(flags.clipped_upper | flags.clipped_lower))[0]
    disagree = verl_valid != ours_valid

    # distance of q from the exact root q*, in float32 ulps of max(p, q) (exp(lq*) |expm1(lq - lq*)|: no
    # cancellation near q = 1)
    lp32, lq32, a = old[0].double(), new[0].double(), adv[0].double()
    root = _boundary_log_q(divergence, lp32, a, torch.where(a > 0, high, low).double())
    dist = root.exp() * torch.expm1(lq32 - root).abs() / (2.0**-24 * torch.maximum(lp32.exp(), lq32.exp()))
    d = divergence64(divergence, lp32, lq32)
    # ours decides fl(exp(fl(log q - log p))) > fl(r_up): the float32 log-ratio is off by up to u |log r|
    # (u = 2^-24) absolute, exp by one ulp (<= 2u relative), the bound by half an ulp (u): so only
    # within (|log r| + 3) u relative of r_up, i.e. (|log r| + 3) ulps of max(p, q) in q, can ours be wrong
    ours_ulps = (lq32 - lp32).abs() + 3.0
    # DPPO's rule in exact arithmetic, on the float32 inputs
    if divergence == "tv":
        exact_valid = torch.where(a > 0, d <= high, d >= -low)
    else:
        exact_valid = torch.where(a > 0, (d <= high) | (lq32 <= lp32), (d <= low) | (lq32 >= lp32))
    ours_wrong = disagree & (ours_valid != exact_valid)

    assert int(keep.sum()) >= n // 2 and int((dist <= ulps).sum()) >= 1_000  # the points do sit on the radius
    assert int(disagree.sum()) > 0  # the probe reaches the rounding level
    beyond = disagree & (dist > ulps)
    assert int(beyond.sum()) == 0, f"{int(beyond.sum())} of {int(disagree.sum())} disagreements beyond rounding: " + (
        describe(divergence, old[0], new[0], adv[0], beyond)
    )
    assert int((ours_wrong & (dist > ours_ulps)).sum()) == 0, describe(
        divergence, old[0], new[0], adv[0], ours_wrong & (dist > ours_ulps)
    )
    # where the masks agree, so do the gradients (no tie-splitting departure at the radius)
    bad = grad_mismatch(grad_ours, grad_verl)[0]
    assert int((bad & ~disagree).sum()) == 0, describe(divergence, old[0], new[0], adv[0], bad & ~disagree)


@pytest.mark.parametrize("divergence", ["tv", "kl"])
def test_beyond_log_ratio_clamp(verl, divergence):
    """verl's DPPO surrogate is -A sg(min(r, c)) log pi: its gradient -A min(r, c) does not pass
    through the [-20, 20] clamp of the log-ratio (which only caps r at e^20 inside min). OpenRLHF's
    PolicyLoss differentiates exp(clamp(log r)), zero beyond the clamp; with a ratio truncation
    (DPPO) ours follows verl instead: a token inside the trust region with log r > 20 (e.g. A < 0
    and a rare token whose probability grew e^25-fold) gets -A c, one below -20 gets -A e^-20."""
    rows = [(-30.0, -5.0, -1.0), (-30.0, -5.0, 1.0), (-40.0, -19.0, -1.0), (-2.0, -25.0, 1.0), (-7.0, -28.0, -1.0)]
    old, new, adv = (torch.tensor([[row[k] for row in rows]]) for k in range(3))
    mask = torch.ones_like(old)
    grad_verl, _ = run_verl(verl, divergence, 0.15, 0.15, 3.0, "token-mean", new, old, adv, mask)
    grad_ours, *_ = run_ours(divergence, 0.15, 0.15, 3.0, "token-mean", new, old, adv, mask)
    assert int(grad_mismatch(grad_ours, grad_verl).sum()) == 0
