"""DRPO and IPO, reached through `make_policy_loss(...)`, against their authors' own code run on the same tensors:
UniRL's `_drpo_loss` (1a7b501e, unirl/algorithms/drpo.py:97-159) and prime-rl's `ipo_loss_fn` (559b4477,
src/prime_rl/trainer/rl/loss.py:164-196), copied verbatim into tests/support/authors_losses.py (neither is in verl
0.9.1 or on PyPI).

The mapping held here (openrlhf_band/objectives/sampler.py states it):
* mu is OpenRLHF's `rollout_log_probs` (vLLM's log-probs of the sampled tokens): UniRL's `old_logp` with its default
  old_logp_source="rollout", prime-rl's `inference_logprobs`; with old_logp_source="replay" DRPO's mu is the loss's
  `old_log_probs` (OpenRLHF's recomputed pi_old), as UniRL's replay mode puts a train-side pi_old there.
* aggregation: UniRL packs a micro-batch's reply tokens (no padding) and takes `loss_per_elem.mean()` (token-mean) or,
  in its recipe's seq-mean-token-sum-norm, the mean over sequences of each one's token sum divided by `horizon`:
  OpenRLHF's token-mean over the unmasked tokens, and our seq-mean-token-sum-norm with loss_scale_factor = horizon.
  prime-rl sums each sample's per-token losses and divides by the step's number of loss tokens: token-mean.
* metrics: UniRL's drpo_penalty_mean, clipfrac_upper, clipfrac_lower (means over the packed tokens) are drpo/
  penalty_mean, beyond_upper, beyond_lower; prime-rl's is_masked is ipo/masked_frac and forward's clip ratio; its
  masked_ and unmasked_mismatch_kl, weighted by their token counts, are ipo/mismatch_kl.
* the log-ratio clamp: ours clamps log r to [-20, 20] before exp for IPO too (prime-rl does not); the batches here
  stay inside it.

Tolerances (u the unit roundoff, 2^-24 or 2^-53; our metrics are float32 sums whatever the inputs, held to U32):
per token both sides evaluate the same expression, a chain of at
most ~10 correctly rounded operations and two exp (torch's CPU exp is within a few ulps, and a vectorised and a
scalar tail may differ), amplified by exp's condition number |log r| for the rounding of log pi - log mu: so
C_TOKEN = 64 u (1 + |log r|) times the magnitude of the terms (`scale`). A mean of n terms is off by at most
(n - 1) u times the mean of their magnitudes, whatever the summation order. Negative controls (a wrong eps or
threshold, a token dropped on our side) must fail the same comparisons.
"""

from __future__ import annotations

import math

import authors_losses as authors  # tests/support
import pytest
import torch

from openrlhf_band.integration.objective_loss import make_policy_loss
from openrlhf_band.patching.check_args import validate_train_args

HORIZON = 48.0  # UniRL's `horizon`, our --rollout.max_new_tokens for seq-mean-token-sum-norm
# our metrics are float32 whatever the inputs (what OpenRLHF logs): the per-token values cast to float32 and summed in
# float32 (metrics.token_mean), so a metric's error is float32's summation bound; a share's count is exact
U32 = 2.0**-24


def unit(dtype) -> float:
    return 2.0**-24 if dtype == torch.float32 else 2.0**-53


def batch(dtype, seed=0, B=5, T=16, spread=0.6):
    """mu near pi_old, pi moved from it by up to `spread` nats: rare and common tokens, both signs of A, one
    sequence with padding; masked positions of our inputs hold nan / inf (never the authors' inputs)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 11:] = False
    mask[3, 4:] = False
    mu = torch.log(torch.rand(B, T, generator=g, dtype=torch.float64).clamp(min=1e-4))
    old = mu + 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64)
    new = (old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=0.0)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).contiguous()
    return {k: v.to(dtype) for k, v in dict(new=new, old=old, mu=mu, adv=adv).items()}, mask


def garbage(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bad = torch.tensor([math.nan, math.inf, -math.inf], dtype=x.dtype).repeat(x.numel())[: x.numel()].view_as(x)
    return torch.where(mask, x, bad)


def ours(name: str, b: dict, mask, mode="token-mean", drop=None, **options):
    """Our loss value, gradient w.r.t. log pi (B, T) and metrics; `drop` masks one more token on our side only."""
    mask = mask.clone()
    if drop is not None:
        mask[drop] = False
    norm = {"loss_scale_factor": HORIZON} if mode.endswith("-norm") else {}
    loss_fn = make_policy_loss(name, loss_agg_mode=mode, **norm, **options)
    new = garbage(b["new"], mask).requires_grad_()
    loss, clip_ratio, *_ = loss_fn(new, garbage(b["old"], mask), garbage(b["adv"], mask), action_mask=mask,
                                   rollout_log_probs=garbage(b["mu"], mask))  # fmt: skip
    loss.backward()
    return loss.detach(), new.grad, {k.split("/", 1)[1]: float(v) for k, v in loss_fn.loss_metrics.items()}, clip_ratio


def packed(x: torch.Tensor, mask) -> torch.Tensor:
    return x[mask]


def unirl(b: dict, mask, mode="token-mean", epsilon=12.5, source="rollout"):
    """UniRL's DRPO on the packed reply tokens: its loss as drpo.py's caller reduces it (lines 318-330), the
    gradient w.r.t. the (B, T) log pi, its metrics and its per-token loss."""
    new = b["new"].clone().requires_grad_()
    mu = b["mu"] if source == "rollout" else b["old"]
    per_token, metrics = authors._drpo_loss(new_logp=packed(new, mask), old_logp=packed(mu, mask),
                                            advantages=packed(b["adv"], mask), epsilon=epsilon)  # fmt: skip
    if mode == "seq-mean-token-sum-norm":
        parts = torch.split(per_token, mask.sum(-1).tolist())
        loss = torch.stack([p.sum() for p in parts]).mean() / HORIZON
    else:
        loss = per_token.mean()
    loss.backward()
    return loss.detach(), new.grad, {k: float(v) for k, v in metrics.items()}, per_token.detach()


def scale(b: dict, mask, mu_key: str, epsilon: float) -> torch.Tensor:
    """Per token: the magnitude of DRPO's terms and of its gradient, widened by exp's condition number."""
    log_r = (b["new"] - b[mu_key]).double()
    r, mu, a = log_r.exp(), b[mu_key].double().exp(), b["adv"].double().abs()
    return torch.where(mask, a * r * (1 + mu * (r + 1) ** 2 / epsilon) * (1 + log_r.abs()) + a, 0.0)


def near(values: torch.Tensor, edge: torch.Tensor, tol: torch.Tensor, mask) -> int:
    """How many unmasked tokens lie within `tol` of a comparison's edge: a share of tokens on one side of it may
    differ between the two sides' roundings by at most that many tokens."""
    return int((((values.double() - edge.double()).abs() <= tol) & mask).sum())


def check_close(mine, theirs, tol) -> bool:
    return bool((mine.double() - theirs.double()).abs().le(tol).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("source", ["rollout", "replay"])
@pytest.mark.parametrize("epsilon", [12.5, 0.05])  # the authors' eps (a weight within [0.92, 1.08]) and a tight one
def test_drpo_equals_unirls_drpo_loss(dtype, mode, source, epsilon):
    b, mask = batch(dtype)
    u, n = unit(dtype), int(mask.sum())
    loss, grad, metrics, clip_ratio = ours("drpo", b, mask, mode, epsilon=epsilon, old_logp_source=source)
    their_loss, their_grad, their_metrics, per_token = unirl(b, mask, mode, epsilon, source)
    s = scale(b, mask, "mu" if source == "rollout" else "old", epsilon)
    per_token_tol = 64 * u * s
    # the gradient, token by token (a masked token gets exactly none): each token's own, over the mode's divisor
    divisor = n if mode == "token-mean" else float((mask.sum(-1) > 0).sum()) * HORIZON
    assert check_close(grad[mask], their_grad[mask], per_token_tol[mask] / divisor)
    assert torch.all(grad[~mask] == 0) and torch.isfinite(grad).all()
    # the loss value: the same per-token terms, reduced in another order
    value_tol = float(((n + 8) * u * s.sum() + per_token_tol.sum()) / divisor)
    assert abs(float(loss) - float(their_loss)) <= value_tol, (float(loss), float(their_loss), value_tol)
    # the metrics: means over the reply tokens (a token at a boundary, to rounding, may fall either side)
    mu = (b["mu"] if source == "rollout" else b["old"]).double().exp()
    r = (b["new"] - (b["mu"] if source == "rollout" else b["old"])).double().exp()
    edge_tol = 64 * u * (r + epsilon / mu) * (1 + r.log().abs())
    for side, edge in (("upper", 1 + epsilon / mu), ("lower", 1 - epsilon / mu)):
        slack = (near(r, edge, edge_tol, mask) + 2 * n * u) / n + U32
        assert abs(metrics[f"beyond_{side}"] - their_metrics[f"clipfrac_{side}"]) <= slack, side
    slack = (near(r, 1 + epsilon / mu, edge_tol, mask) + near(r, 1 - epsilon / mu, edge_tol, mask) + 4 * n * u) / n
    assert abs(float(clip_ratio) - their_metrics["clipfrac_upper"] - their_metrics["clipfrac_lower"]) <= slack + U32
    penalty_tol = float((n + 8) * max(u, U32) * s.sum() / n)
    assert abs(metrics["penalty_mean"] - their_metrics["drpo_penalty_mean"]) <= penalty_tol
    if epsilon == 0.05:  # the boundary binds somewhere, so the metrics above are tested, not vacuous
        assert their_metrics["clipfrac_upper"] + their_metrics["clipfrac_lower"] > 0


@pytest.mark.parametrize("control", ["epsilon", "drop", "source"])
def test_the_drpo_comparison_fails_on_a_wrong_loss(control):
    b, mask = batch(torch.float64)
    u, n = unit(torch.float64), int(mask.sum())
    their_loss, their_grad, *_ = unirl(b, mask)
    options = dict(epsilon=12.5, old_logp_source="rollout")
    if control == "epsilon":
        options["epsilon"] = 12.5 * 1.01
    elif control == "source":
        options["old_logp_source"] = "replay"  # pi_old is 0.05 nats from mu here
    loss, grad, *_ = ours("drpo", b, mask, drop=(0, 5) if control == "drop" else None, **options)
    tol = 64 * u * scale(b, mask, "mu", 12.5)
    assert not check_close(grad[mask], their_grad[mask], tol[mask] / n)


def prime_rl(b: dict, mask, threshold=0.1, adv_tau=1.0, kl_tau=1e-3):
    """prime-rl's IPO, one call per sample (as its compute_loss), the step's loss = the sum of the samples' losses
    over the number of loss tokens; the gradient w.r.t. the (B, T) log pi; its metrics over the whole batch."""
    config = authors.IPOLossConfig(ipo_threshold=threshold, adv_tau=adv_tau, kl_tau=kl_tau)
    new = b["new"].clone().requires_grad_()
    total = sum(
        authors.ipo_loss_fn(authors.LossInputs(new[i], b["mu"][i], None, b["adv"][i], mask[i]), config).loss
        for i in range(len(mask))
    )
    loss = total / mask.sum()
    loss.backward()
    flat = authors.LossInputs(b["new"].flatten(), b["mu"].flatten(), None, b["adv"].flatten(), mask.flatten())
    metrics = authors.ipo_loss_fn(flat, config).metrics
    return loss.detach(), new.grad, {k: float(v) for k, v in metrics.items()}


def ipo_scale(b: dict, mask, adv_tau=1.0, kl_tau=1e-3) -> torch.Tensor:
    log_r = (b["new"] - b["mu"]).double()
    return torch.where(mask, (adv_tau * b["adv"].double().abs() * log_r.exp() + 2 * kl_tau * (log_r.abs() + log_r**2))
                       * (1 + log_r.abs()), 0.0)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threshold, adv_tau, kl_tau", [(0.1, 1.0, 1e-3), (0.2, 1.0, 1e-3), (0.1, 0.5, 0.2)])
def test_ipo_equals_prime_rls_ipo_loss_fn(dtype, threshold, adv_tau, kl_tau):
    b, mask = batch(dtype)
    u, n = unit(dtype), int(mask.sum())
    loss, grad, metrics, clip_ratio = ours("ipo", b, mask, ipo_threshold=threshold, adv_tau=adv_tau, kl_tau=kl_tau)
    their_loss, their_grad, their_metrics = prime_rl(b, mask, threshold, adv_tau, kl_tau)
    s = ipo_scale(b, mask, adv_tau, kl_tau)
    assert check_close(grad[mask], their_grad[mask], 64 * u * s[mask] / n)
    assert torch.all(grad[~mask] == 0)
    assert abs(float(loss) - float(their_loss)) <= float(((n + 8) * u * s.sum() + 64 * u * s.sum()) / n)
    masked_frac = their_metrics["is_masked"]
    assert 0 < masked_frac < 1  # the mask binds on some tokens, not all: the comparison sees both branches
    pi, mu = b["new"].double().exp(), b["mu"].double().exp()
    edge = torch.full_like(pi, threshold)
    slack = (near((pi - mu).abs(), edge, 8 * u * (pi + mu), mask) + 2 * n * u) / n + U32  # |pi - mu| rounds either way
    assert abs(metrics["masked_frac"] - masked_frac) <= slack
    assert abs(float(clip_ratio) - masked_frac) <= slack
    mismatch = masked_frac * their_metrics["masked_mismatch_kl"] + (1 - masked_frac) * their_metrics[
        "unmasked_mismatch_kl"
    ]
    log_r = (b["new"] - b["mu"]).double()
    term = torch.where(mask, (log_r.exp() + log_r.abs() + 1) * (1 + log_r.abs()), 0.0)  # r - log r - 1's magnitudes
    assert abs(metrics["mismatch_kl"] - mismatch) <= float((n + 72) * max(u, U32) * term.sum() / n)


@pytest.mark.parametrize("control", ["threshold", "kl_tau", "drop"])
def test_the_ipo_comparison_fails_on_a_wrong_loss(control):
    b, mask = batch(torch.float64)
    u, n = unit(torch.float64), int(mask.sum())
    _, their_grad, their_metrics = prime_rl(b, mask)
    options = dict(ipo_threshold=0.1, adv_tau=1.0, kl_tau=1e-3)
    if control == "threshold":
        options["ipo_threshold"] = 0.15
    elif control == "kl_tau":
        options["kl_tau"] = 2e-3
    _, grad, *_ = ours("ipo", b, mask, drop=(0, 5) if control == "drop" else None, **options)
    assert not check_close(grad[mask], their_grad[mask], 64 * u * ipo_scale(b, mask)[mask] / n)


def test_the_sampler_objectives_refuse_what_would_correct_twice_and_need_mu():
    b, mask = batch(torch.float32)
    for name, options in (("ipo", {}), ("drpo", {}), ("drpo", {"old_logp_source": "rollout"})):
        with pytest.raises(ValueError, match="would weigh its tokens by pi_old / mu a second time"):
            make_policy_loss(name, is_correction_level="token", **options)
        loss_fn = make_policy_loss(name, **options)
        with pytest.raises(ValueError, match=f"{name} needs the rollout engine's log-probs"):
            loss_fn(b["new"], b["old"], b["adv"], action_mask=mask)
    # with replay DRPO's ratio is against pi_old, and the IS correction weighs pi_old / mu as for any loss
    replay = make_policy_loss("drpo", old_logp_source="replay", is_correction_level="token")
    loss, *_ = replay(b["new"], b["old"], b["adv"], action_mask=mask, rollout_log_probs=b["mu"])
    assert torch.isfinite(loss)
    bad = b["mu"].clone()
    bad[0, 3] = math.nan  # inside the mask
    with pytest.raises(ValueError, match="non-finite value inside the action mask"):
        make_policy_loss("ipo")(b["new"], b["old"], b["adv"], action_mask=mask, rollout_log_probs=bad)
    with pytest.raises(ValueError, match="old_logp_source must be one of rollout, replay"):
        make_policy_loss("drpo", old_logp_source="sampler")


BASE = [
    "--actor.model_name_or_path", "m", "--algo.advantage.estimator", "group_norm",
    "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "r.py",
]  # fmt: skip


@pytest.mark.parametrize(
    "flags, reads",
    [(("--loss", "drpo"), True), (("--loss", "drpo", "--actor.drpo.old_logp_source", "replay"), False),
     (("--loss", "ipo"), True), (("--loss", "gpg"), False)],
)  # fmt: skip
def test_the_flags_ask_vllm_for_mu_where_the_loss_reads_it(flags, reads):
    from openrlhf_band.integration.flags import resolved_loss_config
    from openrlhf_band.integration.hooks import requests_rollout_log_probs

    args = validate_train_args([*BASE, *flags])
    assert requests_rollout_log_probs(args) is reads
    objective = resolved_loss_config(args)["objective"]
    assert ("ratio_against" in objective) is reads
    if flags[1] != "gpg":
        assert "verl_name" not in objective and objective["code"].split()[0] in ("UniRL", "prime-rl")


@pytest.mark.parametrize(
    "flags, message",
    [(("--loss", "ipo", "--algo.advantage.is_correction_level", "token"),
      "--algo.advantage.is_correction_level token does not apply to --loss ipo"),
     (("--loss", "drpo", "--algo.advantage.is_correction_level", "seq"),
      "--algo.advantage.is_correction_level seq does not apply to --loss drpo"),
     (("--loss", "drpo", "--actor.drpo.epsilon", "0"), "epsilon must be a finite number > 0"),
     (("--loss", "ipo", "--actor.drpo.epsilon", "1"), "--actor.drpo.epsilon needs --loss drpo"),
     (("--loss", "ipo", "--actor.ipo.ipo_threshold=-0.1"), "ipo_threshold must be a finite number >= 0"),
     (("--loss", "drpo", "--rollout.top_p", "0.9"), "--loss drpo needs --rollout.top_p 1 (got 0.9)"),
     (("--loss", "ipo", "--rollout.top_p", "0.9"), "--loss ipo needs --rollout.top_p 1 (got 0.9)")],
)  # fmt: skip
def test_bad_sampler_objective_flags_fail_at_parse_time(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        validate_train_args([*BASE, *flags])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    # (replay takes the IS correction: its ratio is against pi_old)
    validate_train_args([*BASE, "--loss", "drpo", "--actor.drpo.old_logp_source", "replay",
                         "--algo.advantage.is_correction_level", "token"])  # fmt: skip
