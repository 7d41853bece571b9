"""verl 0.9.1's aggregation modes that OpenRLHF 0.11.2 lacks, seq-mean-token-sum and seq-mean-token-sum-norm
(`--actor.loss_agg_mode`), for the band and every objective, against verl's own `agg_loss` and `compute_policy_loss_gpg`
run from the released wheel (tests/support/verl_objectives.py; nothing of verl's code is copied here).

Two checks, each on the same tensors:

* every loss of this package (the band, CISPO with the band's bounds, each token-level objective): its forward
  with the mode equals verl's `agg_loss` in that mode applied to the module's own per-token loss (`token_loss`),
  loss and gradient: the aggregation alone is compared;
* GPG end to end: `make_policy_loss("gpg", loss_agg_mode=...)` equals verl's `compute_policy_loss_gpg` with the
  same mode and `global_batch_info` (dp_size, global_batch_size, loss_scale_factor).

Tolerances, from the arithmetic (u the unit roundoff of the dtype): both sides sum the same values per sequence
and then over at most B sequences, each a float sum off by at most (n - 1) u sum |x| in any order, then divide and
multiply three times (a rounding each), so |ours - verl| <= 2 (T + B + 4) u S, S = the sum of |x| times the
aggregation's factor. The gradient of each token is one product of the same factors on each side: 8 u of it.
"""

from __future__ import annotations

import math

import pytest
import torch
import verl_objectives as VO

from openrlhf_band.integration.objective_loss import make_policy_loss
from openrlhf_band.integration.openrlhf_loss import LOSS_AGG_MODES, OpenRLHFPolicyLoss
from openrlhf_band.objectives import OBJECTIVES
from openrlhf_band.patching.check_args import validate_train_args

U = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
MODES = ("seq-mean-token-sum", "seq-mean-token-sum-norm")
HORIZON = 48.0  # the -norm's constant (the rollout's max new tokens), wider than any batch here
#: every loss of this package whose aggregation the mode decides (GMPO is per sequence: the mode does not apply)
LOSSES = {
    "band": dict(divergence="kl", delta=0.05),
    "band-cispo": dict(bounds="band", divergence="kl", delta=0.05),
    **{name: {} for name, o in OBJECTIVES.items() if not o.sequence_level},
}


@pytest.fixture(scope="module")
def verl():
    return VO.load_or_fail(VO.load)


def batch(dtype, seed=0, B=6, T=20):
    """Rollout-like (B, T) tensors: varied lengths, one empty sequence, GRPO-like advantages per sequence."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 0.01
    new = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.2
    lengths = torch.tensor([T, 1, T // 2, 0, 7, T - 3])[:B]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    return new.to(dtype), old.to(dtype), adv.to(dtype), mask


def module(name: str, mode: str) -> OpenRLHFPolicyLoss:
    options = dict(LOSSES[name])
    norm = {"loss_scale_factor": HORIZON} if mode.endswith("-norm") else {}
    loss = make_policy_loss("cispo" if name == "band-cispo" else name, loss_agg_mode=mode, **norm, **options)
    assert loss.loss_agg_mode == mode and not loss.token_level_loss
    return loss


def counts_for(mask, counts):
    if counts == "local":
        return {}
    return dict(dp_size=4, global_batch_size=float((mask.sum(-1) > 0).sum()) * 4 + 3)


def bound(per_token: torch.Tensor, mask, mode, info, u) -> float:
    """The module docstring's bound on |ours - verl| for the loss value."""
    sequences = info.get("global_batch_size", float((mask.sum(-1) > 0).sum()))
    factor = info.get("dp_size", 1) / sequences / (HORIZON if mode.endswith("-norm") else 1.0)
    B, T = mask.shape
    s = float((per_token.double().abs() * mask.double()).sum()) * factor
    return 2 * (T + B + 4) * u * s + 1e-300


@pytest.mark.parametrize("counts", ["local", "global"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_each_loss_aggregates_as_verls_agg_loss(verl, name, mode, dtype, counts):
    new, old, adv, mask = batch(dtype)
    loss_fn = module(name, mode)
    info = counts_for(mask, counts)
    rollout = old + 0.05  # the sampler's log-probs, which DRPO and IPO read (the rest ignore them)
    log_probs = new.clone().requires_grad_(True)
    torch.manual_seed(0)  # Clip-Cov's random choice: the same draw on both sides
    ours = loss_fn(log_probs, old, adv, mask, rollout_log_probs=rollout, **info)[0]
    (grad,) = torch.autograd.grad(ours, log_probs)

    same = new.clone().requires_grad_(True)
    torch.manual_seed(0)
    per_token = loss_fn.token_loss(same, old, adv, mask, rollout).loss
    per_token = torch.where(mask != 0, per_token, torch.zeros((), dtype=per_token.dtype))
    norm = {"loss_scale_factor": HORIZON} if mode.endswith("-norm") else {}
    theirs = verl.agg_loss(per_token, mask, mode, **info, **norm)
    (their_grad,) = torch.autograd.grad(theirs, same)

    u = U[dtype]
    assert abs(float(ours) - float(theirs)) <= bound(per_token.detach(), mask, mode, info, u), (
        float(ours),
        float(theirs),
    )
    assert ((grad - their_grad).abs() <= 8 * u * their_grad.abs() + 1e-300).all()
    assert (grad[mask == 0] == 0).all() and float(ours) != 0.0


@pytest.mark.parametrize("counts", ["local", "global"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", MODES)
def test_gpg_equals_verls_gpg_in_each_mode(verl, mode, dtype, counts):
    new, old, adv, mask = batch(dtype, seed=1)
    info = counts_for(mask, counts)
    norm = {"loss_scale_factor": HORIZON} if mode.endswith("-norm") else {}
    log_probs = new.clone().requires_grad_(True)
    ours = make_policy_loss("gpg", loss_agg_mode=mode, **norm)(log_probs, old, adv, mask, **info)[0]
    (grad,) = torch.autograd.grad(ours, log_probs)

    config = VO.verl_config(**info)
    config.global_batch_info.update(norm)
    log_prob = new.clone().requires_grad_(True)
    theirs, metrics = verl.losses["gpg"](old, log_prob, adv, mask, mode, config, None)
    (their_grad,) = torch.autograd.grad(theirs, log_prob)
    assert VO.RECORDER.last.mode == mode and metrics == {}

    u = U[dtype]
    per_token = (new * adv).detach()
    assert abs(float(ours) - float(theirs)) <= bound(per_token, mask, mode, info, u), (float(ours), float(theirs))
    assert ((grad - their_grad).abs() <= 8 * u * their_grad.abs() + 1e-300).all()


def test_the_norm_divides_by_the_constant_not_the_padded_width(verl):
    """-norm's normaliser is the constant given (the rollout's max new tokens), not the micro-batch's padded width
    (verl's fallback when loss_scale_factor is None): the same batch padded wider gives the same loss."""
    new, old, adv, mask = batch(torch.float64)
    loss_fn = module("gpg", "seq-mean-token-sum-norm")
    narrow = loss_fn(new, old, adv, mask)[0]
    pad = torch.zeros(new.shape[0], 11, dtype=new.dtype)
    wide = loss_fn(*(torch.cat([t, pad], dim=-1) for t in (new, old, adv, mask)))[0]
    assert float(narrow) == float(wide)
    fallback = verl.agg_loss(-new * adv * mask, mask, "seq-mean-token-sum-norm")  # verl: / T = 20, not 48
    assert float(fallback) == pytest.approx(float(narrow) * HORIZON / new.shape[1], rel=1e-12)


def test_masked_garbage_stays_out(verl):
    """nan / inf at masked positions never reach the loss or its gradient in the new modes (verl's seq modes
    multiply by the mask after the arithmetic: 0 * nan)."""
    new, old, adv, mask = batch(torch.float32)
    garbage = torch.tensor([math.nan, math.inf, -math.inf, 1e30])
    holes = mask == 0
    fill = garbage[torch.arange(int(holes.sum())) % 4]
    for mode in MODES:
        for name in ("band", "gpg", "cispo"):
            loss_fn = module(name, mode)
            torch.manual_seed(0)
            clean = loss_fn(new, old, adv, mask)[0]
            dirty = [t.clone() for t in (new, old, adv)]
            for t in dirty:
                t[holes] = fill
            log_probs = dirty[0].requires_grad_(True)
            torch.manual_seed(0)
            out = loss_fn(log_probs, dirty[1], dirty[2], mask)[0]
            (grad,) = torch.autograd.grad(out, log_probs)
            assert float(out) == float(clean) and torch.isfinite(grad).all(), (name, mode)


def test_the_modes_are_checked():
    assert LOSS_AGG_MODES[:2] == ("token-mean", "seq-mean-token-mean")
    with pytest.raises(ValueError, match="loss_scale_factor > 0"):
        make_policy_loss("gpg", loss_agg_mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="applies to seq-mean-token-sum-norm only"):
        make_policy_loss("band", loss_agg_mode="seq-mean-token-sum", loss_scale_factor=10)
    with pytest.raises(ValueError, match="loss_agg_mode must be one of"):
        make_policy_loss("sapo", loss_agg_mode="token-sum")
    # OpenRLHF's two modes: the mode and token_level_loss say the same
    assert make_policy_loss("band", loss_agg_mode="token-mean").token_level_loss
    assert make_policy_loss("band", token_level_loss=False).loss_agg_mode == "seq-mean-token-mean"


BASE = [
    "--actor.model_name_or_path", "some/model", "--algo.advantage.estimator", "group_norm",
    "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "reward.py", "--rollout.max_new_tokens", "96",
]  # fmt: skip


def test_the_flag_reaches_the_actors_loss():
    """train_ppo_ray's --actor.loss_agg_mode takes verl's two modes for this package's losses; -norm's constant is
    --rollout.max_new_tokens; OpenRLHF's own ppo / gspo refuse them in one line."""
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_band.integration.flags import resolved_loss_config
    from openrlhf_band.integration.hooks import loss_class_and_kwargs

    for loss in (("--loss", "band"), ("--loss", "gpg"), ("--loss", "cispo", "--actor.cispo.bounds", "band")):
        args = validate_train_args([*BASE, *loss, "--actor.loss_agg_mode", "seq-mean-token-sum-norm"])
        _, kwargs = loss_class_and_kwargs(args, PolicyLoss)
        assert kwargs["loss_agg_mode"] == "seq-mean-token-sum-norm" and kwargs["loss_scale_factor"] == 96, loss
        assert resolved_loss_config(args)["loss_scale_factor"] == 96
        args = validate_train_args([*BASE, *loss, "--actor.loss_agg_mode", "seq-mean-token-sum"])
        _, kwargs = loss_class_and_kwargs(args, PolicyLoss)
        assert kwargs["loss_agg_mode"] == "seq-mean-token-sum" and "loss_scale_factor" not in kwargs
        assert "loss_scale_factor" not in resolved_loss_config(args)
    args = validate_train_args([*BASE, "--loss", "band"])
    assert "loss_agg_mode" not in loss_class_and_kwargs(args, PolicyLoss)[1]  # OpenRLHF's modes: as before
    for loss in ("ppo", "gspo"):
        with pytest.raises(SystemExit):
            validate_train_args([*BASE, "--loss", loss, "--actor.loss_agg_mode", "seq-mean-token-sum"])
