"""The registered objectives (CISPO with fixed bounds, SAPO, GMPO, Clip-Cov, KL-Cov, GPG), reached through
`make_policy_loss(...)`, against verl 0.9.1's own functions run from the installed wheel
(`tests/support/verl_objectives.py`; nothing of verl's code is copied here).

The mapping the tests hold (ObjectivePolicyLoss's module docstring states it):

* arguments: OpenRLHF's clip_eps_low / clip_eps_high are verl's clip_ratio_low / clip_ratio_high;
  tau_pos / tau_neg are verl's `actor.tau_pos` / `tau_neg`; clip_cov_ratio / clip_cov_lb /
  clip_cov_ub / kl_cov_ratio / ppo_kl_coef are verl's `actor.policy_loss.<key>`; forward's
  (dp_size, batch_num_tokens, global_batch_size) are verl's `config.global_batch_info`;
  OpenRLHF's train/rollout IS coefficient (`is_correction_level="token"`, mask or clip mode) is
  verl's `rollout_is_weights`.
* sign and aggregation: both return a loss to minimise; token_level_loss=True is verl's
  "token-mean", False verl's "seq-mean-token-mean".
* SAPO: verl fixes seq-mean-token-mean whatever loss_agg_mode it is given; ours takes the flag.
  token_level_loss=False is verl's loss; token_level_loss=True is verl's own per-token matrix
  aggregated by verl's own agg_loss in "token-mean" (test_sapo_aggregation_mapping).
* GMPO (verl's geo_mean): per sequence; verl ignores loss_agg_mode and global_batch_info and takes
  torch.mean over the micro-batch's sequences (an empty one included, as a 0); ours averages over
  OpenRLHF's global sample count (dp_size / global_batch_size), whatever token_level_loss. Equal when
  no sequence is empty and global_batch_size = dp_size x the micro-batch's sequences
  (test_gmpo_aggregation_mapping holds the general relation). IS: the per-sequence geometric mean of
  the token coefficients, as verl's. The same denominators n_b + 1e-8 as verl's, so float64 agrees to
  rounding too (test_gmpo_float64_equals_verl).
* metrics: verl's actor/pg_clipfrac is cispo/clip_frac (= forward's clip_ratio), gmpo/clip_frac_upper
  and clip_cov/selected_frac; actor/pg_clipfrac_lower is gmpo/clip_frac_lower (CISPO and SAPO log 0
  there, and SAPO 0 for pg_clipfrac too); actor/ppo_kl is forward's ppo_kl for every objective but
  KL-Cov, where it is kl_cov/abs_kl (the mean |log r|).
* GPG: -A log pi per token, no ratio and no clip; verl's gpg returns no metrics (no actor/ppo_kl): ours logs
  OpenRLHF's clip ratio 0 and its ppo_kl.
* the log-ratio clamp: ours clamps log r to [-20, 20] for every objective; verl's cispo and sapo do
  too, its geo_mean, clip_cov and kl_cov do not (test_log_ratio_clamp_difference). Inside the clamp
  (every rollout batch here) nothing differs.

Tolerances come from float32 (or float64) arithmetic, with u the unit roundoff (2^-24, 2^-53):
per token, each side's gradient is a chain of at most ~12 correctly rounded operations and two
transcendental functions (exp, sigmoid; torch's CPU kernels are within a few ulps), <= ~20 u of the
magnitudes involved per side, hence C_TOKEN = 64 u times a per-objective magnitude (`token_scales`:
the product of the factors, widened by (1 + |log r|) for the rounding of log pi - log pi_old that
exp amplifies, and for SAPO by the cancellation in 1 - sigmoid). A sum of n terms is off by at
most (n - 1) u times the sum of their magnitudes (the worst-case bound for any summation order),
which is what the loss values, GMPO's per-sequence means and the metrics' means get. The float64
runs use the same formulas with u = 2^-53. That worst-case bound makes the float32 loss-value check
loose (up to ~1e-3 of the sum of |per-token loss|): in float32 the agreement is held per token
(gradients, and verl's recorded per-token loss matrix against our registered function's), and the
loss values agree tightly in the float64 runs (the same bound is ~1e-12 there).

Negative controls (a wrong tau, clip value, kl_cov_ratio or ppo_kl_coef, one token masked in ours
only) must fail the same comparison.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest
import torch
import verl_objectives as VO
from openrlhf.models.loss import PolicyLoss

from openrlhf_band.integration.objective_loss import ObjectivePolicyLoss, make_policy_loss
from openrlhf_band.objectives import get_objective

U = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
C_TOKEN = 64  # ulps of the per-token magnitude (module docstring)
IS_THRESHOLD = (0.5, 5.0)  # OpenRLHF's default is_correction_threshold
DP_SIZE = 4
GARBAGE = (math.nan, math.inf, -math.inf, 1e30, -1e30)


@dataclass(frozen=True)
class Case:
    """One objective configuration: our name, OpenRLHF's clip eps, the objective's options."""

    name: str
    low: float = 0.2
    high: float = 0.2
    options: tuple = ()

    @property
    def opts(self) -> dict:
        return dict(self.options)

    def arguments(self, **changes) -> dict:
        """Keyword arguments for both sides (make_policy_loss and run_verl), with `changes`."""
        out = dict(clip_eps_low=self.low, clip_eps_high=self.high, **self.opts)
        out.update(changes)
        return out


CASES = {
    "cispo": Case("cispo", 0.2, 0.28),
    "cispo-10/0.2": Case("cispo", 10.0, 0.2),  # verl's CISPO example: no lower clip, 1 + 0.2 above
    "sapo": Case("sapo", options=(("tau_pos", 1.0), ("tau_neg", 1.05))),
    "gmpo": Case("gmpo", 0.2, 0.28),
    "clip_cov": Case("clip_cov", 0.2, 0.28, (("clip_cov_ratio", 0.02), ("clip_cov_lb", 1.0), ("clip_cov_ub", 5.0))),
    "kl_cov": Case("kl_cov", options=(("kl_cov_ratio", 0.02), ("ppo_kl_coef", 0.1))),
    "gpg": Case("gpg"),
}
SEED = 1234  # torch.manual_seed before each call (Clip-Cov's randperm)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for these element-wise ops on ~50k values: thread hand-offs cost far more
    than they save at this size (and much more on a loaded machine); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def verl():
    return VO.load_or_fail(VO.load)  # a test that cannot run must fail, not skip


@dataclass
class Batch:
    new: torch.Tensor
    old: torch.Tensor
    rollout: torch.Tensor
    adv: torch.Tensor  # (B, T)
    mask: torch.Tensor

    def to(self, dtype) -> Batch:
        return Batch(*(t.to(dtype) for t in (self.new, self.old, self.rollout, self.adv, self.mask)))


def make_batch(kind: str, dtype=torch.float32) -> Batch:
    """The rollout batch of `kind`: "grpo", per-sequence GRPO advantages (zeros included); "token", N(0, 1)
    per token."""
    new, old, rollout, adv, mask = VO.rollout_batch(0 if kind == "grpo" else 1, per_token_advantages=kind == "token")
    return Batch(new, old, rollout, adv.expand(new.shape).contiguous(), mask).to(dtype)


def with_garbage(x: torch.Tensor, mask: torch.Tensor, shift: int) -> torch.Tensor:
    """x with every masked position holding nan, inf, -inf, 1e30 or -1e30 (cycling)."""
    fill = torch.tensor(GARBAGE, dtype=x.dtype)[(torch.arange(x.numel()) + shift) % len(GARBAGE)].view(x.shape)
    return torch.where(mask != 0, x, fill)


def is_weights(old, rollout, mode):
    """OpenRLHF's token-level IS coefficient (PolicyLoss "ppo" branch, gating "ratio"): w = pi_old /
    pi_rollout; mask mode keeps w inside the threshold and zeroes the rest, clip mode clamps it."""
    low, high = IS_THRESHOLD
    w = (old - rollout).exp()
    return w.clamp(low, high) if mode == "clip" else torch.where((w >= low) & (w <= high), w, 0.0)


# ------------------------------------------------------------------------------------------- runs
@dataclass
class Ours:
    loss: torch.Tensor
    grad: torch.Tensor
    outputs: tuple
    metrics: dict


def run_ours(case: Case, b: Batch, *, token_level_loss=True, is_mode=None, counts=None, garbage=False, seed=SEED,
             mask=None, per_sequence=False, **changes) -> Ours:  # fmt: skip
    """Ours through make_policy_loss; `garbage`: masked positions of every input hold garbage;
    `mask`: a different mask for ours alone (negative controls); `per_sequence`: the advantages
    passed as (B, 1) (GRPO's, as OpenRLHF may hand them over; verl gets them broadcast to (B, T))."""
    mask = b.mask if mask is None else mask
    new, old, adv, rollout = b.new, b.old, b.adv, b.rollout
    if per_sequence:
        assert (adv == adv[:, :1]).all()
        adv = adv[:, :1]
    if garbage:
        new, old, adv, rollout = (with_garbage(t, mask, k) for k, t in enumerate((new, old, adv, rollout)))
    extra = {}
    if is_mode is not None:
        extra = dict(is_correction_level="token", is_correction_mode=is_mode, is_correction_threshold=IS_THRESHOLD)
    loss_fn = make_policy_loss(case.name, token_level_loss=token_level_loss, **extra, **case.arguments(**changes))
    assert isinstance(loss_fn, ObjectivePolicyLoss)
    log_probs = new.clone().requires_grad_(True)
    torch.manual_seed(seed)
    outputs = loss_fn(log_probs, old, adv, mask, rollout_log_probs=rollout if is_mode else None, **(counts or {}))
    (grad,) = torch.autograd.grad(outputs[0], log_probs)
    return Ours(outputs[0].detach(), grad, outputs, dict(loss_fn.loss_metrics))


def run_theirs(verl, case: Case, b: Batch, *, token_level_loss=True, is_mode=None, counts=None, seed=SEED):
    """verl's function on the clean batch, the same arguments mapped (module docstring)."""
    weights = None if is_mode is None else is_weights(b.old, b.rollout, is_mode)
    return VO.run_verl(verl, case.name, b.new, b.old, b.adv, b.mask, token_level_loss=token_level_loss,
                       rollout_is_weights=weights, seed=seed, **case.arguments(), **(counts or {}))  # fmt: skip


def global_counts(mask: torch.Tensor) -> dict:
    """dp_size ranks; the other ranks hold a different number of tokens (batch_num_tokens is not
    dp_size x ours), the same number of sequences (GMPO's verl mean needs that: module docstring)."""
    return dict(
        dp_size=DP_SIZE,
        batch_num_tokens=float(mask.sum()) * DP_SIZE + 1234.0,
        global_batch_size=float((mask.sum(-1) > 0).sum()) * DP_SIZE,
    )


# ------------------------------------------------------------------------------------- tolerances
def aggregation_weights(mask, token_level_loss, counts, sequence_level=False, verl_gmpo=False):
    """d loss / d (per-token or per-sequence loss), float64: token-mean dp / tokens, seq-mean-token-mean
    dp / (n_b sequences); a sequence-level objective dp / sequences (verl's geo_mean: 1 / B)."""
    m = mask.double()
    counts = counts or {}
    dp = counts.get("dp_size", 1)
    n_b = m.sum(-1, keepdim=True)
    sequences = counts.get("global_batch_size", float((n_b > 0).sum()))
    if sequence_level:
        return (torch.full_like(n_b, 1.0 / mask.shape[0]) if verl_gmpo else dp / sequences * (n_b > 0)).squeeze(-1)
    if token_level_loss:
        return m * dp / counts.get("batch_num_tokens", float(m.sum()))
    return m * dp / (n_b.clamp(min=1) * sequences)


def token_scales(case: Case, b: Batch, weights=None, **changes):
    """Per token, float64 (B, T), before the aggregation weight: (gradient error scale, loss error
    scale, |loss|). u times an error scale bounds the rounding that each side's per-token gradient /
    loss carries, up to the C_TOKEN factor (module docstring): the product of the factors, widened by
    (1 + |log r|) for the float rounding of log pi - log pi_old (u |log r| absolute) that exp turns
    into a relative error of r. `weights`: the IS coefficient (multiplies all three)."""
    o = {**case.arguments(), **changes}
    lr = (b.new.double() - b.old.double()).clamp(-20, 20)
    r, a, widen = lr.exp(), b.adv.double().abs(), 1.0 + lr.abs()
    if case.name == "cispo":  # -sg(w) A log pi: gradient -w A, w = clip(r)
        w = r.clamp(1 - o["clip_eps_low"], 1 + o["clip_eps_high"])
        grad, loss = w * a * widen, w * a * b.new.double().abs() * widen
        size = w * a * b.new.double().abs()
    elif case.name == "sapo":  # -(4 / tau) s A, s = sigmoid(tau (r - 1)); gradient -4 A s (1 - s) r
        tau = torch.where(b.adv > 0, o["tau_pos"], o["tau_neg"]).double()
        # an error e in s moves s (1 - s) by <= e (no relative bound: 1 - s cancels), and
        # e <= u + tau |error of r - 1| / 4 <= u + tau r (2 + |log r|) u / 4
        grad = a * r * (tau * r * (2 + lr.abs()) + 8)
        loss = a * (r * (2 + lr.abs()) + 8 / tau)
        size = 4 / tau * a
    elif case.name == "clip_cov":  # max(-A r, -A clip(r)) or 0; gradient -A r or 0
        grad = a * r * widen
        loss = a * (r * widen + 1 + o["clip_eps_high"])
        size = a * torch.maximum(r, torch.as_tensor(1 + o["clip_eps_high"], dtype=torch.float64))
    elif case.name == "kl_cov":  # -A r (+ coef |log r|); gradient -A r (+ coef sign(log r))
        grad = a * r * widen + o["ppo_kl_coef"]
        loss = a * r * widen + o["ppo_kl_coef"] * lr.abs()
        size = a * r + o["ppo_kl_coef"] * lr.abs()
    elif case.name == "gpg":  # -A log pi; gradient -A (exact: a product with the aggregation weight)
        log_pi = b.new.double().abs()
        grad, loss, size = a, a * log_pi, a * log_pi
    else:
        raise ValueError(case.name)
    if weights is not None:
        w = weights.double()
        grad, loss, size = grad * w, loss * w, size * w
    return grad, loss, size


# verl's denominators n + 1e-8: ours are the same for GMPO (a float count n_b + 1e-8 per sequence, and the
# per-sequence losses summed over the sequences with a token, not through aggregate_loss's count 1 + 1e-8),
# so no extra term in either dtype (test_gmpo_float64_equals_verl holds it in float64, where it would show).
DENOMINATOR_EPS = {torch.float32: 0.0, torch.float64: 0.0}


def gmpo_scales(case: Case, b: Batch, weights=None, **changes):
    """GMPO per sequence b, float64 (B,): (e_b, |L_b|, float64 extra) where u e_b bounds the rounding
    of the per-sequence loss L_b = -A_b R_b W_b on each side: R_b = exp(S_b / n_b) with S_b a sum of
    n_b terms, off by <= n_b u sum |log r| (worst-case summation bound, |kept| <= |log r|, plus each
    term's own rounding), so R_b is off by <= u (sum |log r| + 3) relative; the mean advantage by
    <= u sum |A| absolute (its sum's bound / n_b); W_b, the IS weights' geometric mean, like R_b.
    The extra: DENOMINATOR_EPS's relative factor."""
    o = {**case.arguments(), **changes}
    m = b.mask.double()
    n = m.sum(-1).clamp(min=1)
    lr = (b.new.double() - b.old.double()).clamp(-20, 20) * m
    sign = torch.sign(b.adv.double())
    clamped = lr.clamp(-o["clip_eps_low"], o["clip_eps_high"])
    kept = sign * torch.minimum(sign * lr, sign * clamped)
    mean_kept = (kept * m).sum(-1) / n
    a = b.adv.double() * m
    mean_adv = a.sum(-1) / n
    if weights is None:
        mean_log_w, log_w = torch.zeros_like(n), torch.zeros_like(n)
    else:
        logs = torch.log(weights.double() + 1e-10) * m
        mean_log_w, log_w = logs.sum(-1) / n, logs.abs().sum(-1)
    ratio = (mean_kept + mean_log_w).exp()
    e = ratio * (a.abs().sum(-1) + mean_adv.abs() * (lr.abs().sum(-1) + log_w + 8))
    size = (mean_adv * ratio).abs()
    extra = 2 * (1 + (1 + mean_kept.abs() + mean_log_w.abs()) / n)
    return e, size, extra


@dataclass
class Tolerances:
    grad: torch.Tensor  # (B, T)
    loss: float


def tolerances(case: Case, b: Batch, *, token_level_loss=True, is_mode=None, counts=None, verl_gmpo=True):
    """Per-token gradient tolerances and the loss value's: C_TOKEN u times the error scales, and for
    the loss, both sides' sums: (k - 1) u sum |x| each for k nonzero terms (a masked position adds an
    exact 0): k = the unmasked tokens (token-mean), the longest sequence + the sequences (seq-mean),
    the sequences (GMPO)."""
    u, eps = U[b.new.dtype], DENOMINATOR_EPS[b.new.dtype]
    weights = None if is_mode is None else is_weights(b.old, b.rollout, is_mode)
    m = b.mask.double()
    if case.name == "gmpo":
        e, size, extra = gmpo_scales(case, b, weights)
        d = aggregation_weights(b.mask, token_level_loss, counts, sequence_level=True, verl_gmpo=verl_gmpo)
        n = m.sum(-1).clamp(min=1)
        per_seq = C_TOKEN * u * e + eps * extra * size
        grad = (per_seq * d / n)[:, None] * m
        loss = float((per_seq * d).sum()) + 2 * b.mask.shape[0] * u * float((size * d).sum())
        return Tolerances(grad, loss)
    grad_scale, loss_scale, size = token_scales(case, b, weights)
    d = aggregation_weights(b.mask, token_level_loss, counts)
    terms = float(m.sum()) if token_level_loss else float(m.sum(-1).max()) + b.mask.shape[0]
    loss = C_TOKEN * u * float((loss_scale * d).sum()) + 2 * terms * u * float((size * d).sum())
    return Tolerances(C_TOKEN * u * grad_scale * d, loss)


def mismatches(ours: Ours, theirs, tol: Tolerances) -> dict:
    """What differs beyond tolerance: {"loss": (ours, theirs, tol), "grad": (count, worst ratio)}."""
    out = {}
    loss_err = abs(float(ours.loss) - float(theirs.loss))
    if not loss_err <= tol.loss:  # nan fails
        out["loss"] = (float(ours.loss), float(theirs.loss), tol.loss)
    err = (ours.grad.double() - theirs.grad.double()).abs()
    bad = ~(err <= tol.grad)
    if bad.any():
        ratio = err / tol.grad.clamp(min=1e-300)
        out["grad"] = (int(bad.sum()), float(ratio[bad].max()))
    return out


def share_tol(value: float, u: float, n: float) -> float:
    """Two token shares (count / n, verl's count / (n + 1e-8)): a rounding each, plus verl's 1e-8."""
    return 4 * u * abs(value) + abs(value) * 1e-8 / n + 1e-300


def mean_tol(values: torch.Tensor, mask: torch.Tensor, u: float) -> float:
    """Two float sums of the n masked values, each over n: (n - 1) u sum |x| / n each, + the division."""
    n = float(mask.sum())
    s = float((values.double().abs() * mask.double()).sum())
    return 2 * n * u * s / n + 4 * u * s / n + s / n * 1e-8 / n


def ppo_kl_and_metrics_match(case: Case, b: Batch, ours: Ours, theirs) -> list[str]:
    """The metric mapping (module docstring), each within share_tol / mean_tol. Our shares are float32
    whatever the dtype (loss_metrics and OpenRLHF's clip_ratio are float32), so they get float32's u."""
    u, n = U[torch.float32], float(b.mask.sum())
    lr = b.new - b.old
    fails = []

    def check(label, mine, verl_value, tol):
        if not abs(float(mine) - float(verl_value)) <= tol:
            fails.append(f"{label}: ours {float(mine)!r} verl {float(verl_value)!r} (tol {tol:.3g})")

    vm, m = theirs.metrics, ours.metrics
    if case.name == "gpg":  # verl's gpg returns no metrics; ours: nothing clipped
        assert vm == {} and m == {} and float(ours.outputs[1]) == 0.0, (vm, m)
        return fails
    if case.name == "kl_cov":
        check("kl_cov/abs_kl = actor/ppo_kl", m["kl_cov/abs_kl"], vm["actor/ppo_kl"], mean_tol(lr.abs(), b.mask, u))
    else:
        check("ppo_kl = actor/ppo_kl", ours.outputs[2], vm["actor/ppo_kl"], mean_tol(lr, b.mask, U[b.new.dtype]))
    if case.name == "cispo":
        share = vm["actor/pg_clipfrac"]
        check("cispo/clip_frac = actor/pg_clipfrac", m["cispo/clip_frac"], share, share_tol(share, u, n))
        check("clip_ratio = actor/pg_clipfrac", ours.outputs[1], share, share_tol(share, u, n))
        assert vm["actor/pg_clipfrac_lower"] == 0.0
    elif case.name == "sapo":
        assert vm["actor/pg_clipfrac"] == 0.0 and vm["actor/pg_clipfrac_lower"] == 0.0  # verl logs none for SAPO
    elif case.name == "gmpo":
        up, lo = vm["actor/pg_clipfrac"], vm["actor/pg_clipfrac_lower"]
        check("gmpo/clip_frac_upper = actor/pg_clipfrac", m["gmpo/clip_frac_upper"], up, share_tol(up, u, n))
        check("gmpo/clip_frac_lower = actor/pg_clipfrac_lower", m["gmpo/clip_frac_lower"], lo, share_tol(lo, u, n))
    elif case.name == "clip_cov":
        share = vm["actor/pg_clipfrac"]
        check("clip_cov/selected_frac = actor/pg_clipfrac", m["clip_cov/selected_frac"], share, share_tol(share, u, n))
    return fails


# ------------------------------------------------------------------------------------------ tests
def test_installed_verl_is_0_9_1(verl):
    assert verl.version == VO.VERL_VERSION == "0.9.1"
    assert set(verl.losses) == {"cispo", "sapo", "gmpo", "clip_cov", "kl_cov", "gpg"}
    for name, loss in verl.losses.items():
        assert get_objective(name).verl_name == loss.__name__.removeprefix("compute_policy_loss_")


def test_missing_verl_fails_with_make_venv(tmp_path):
    with pytest.raises(VO.VerlGroundTruthMissing, match="run `make venv`"):
        VO.load(tmp_path / "verl-0.9.1")


def test_option_defaults_are_verls_config_defaults(verl):
    """Our option defaults are verl 0.9.1's actor config defaults (trainer/config/actor/actor.yaml):
    note verl's kl_cov falls back to ppo_kl_coef 1.0 only when its config has no value."""
    text = (verl.root / "verl" / "trainer" / "config" / "actor" / "actor.yaml").read_text()

    def yaml_value(key):
        (value,) = re.findall(rf"^\s*{key}:\s*([0-9.eE+-]+)\s*$", text, re.MULTILINE)
        return float(value)

    for objective, option in [("sapo", "tau_pos"), ("sapo", "tau_neg"), ("clip_cov", "clip_cov_ratio"),
                              ("clip_cov", "clip_cov_lb"), ("clip_cov", "clip_cov_ub"), ("kl_cov", "kl_cov_ratio"),
                              ("kl_cov", "ppo_kl_coef")]:  # fmt: skip
        assert get_objective(objective).option(option).default == yaml_value(option), (objective, option)


def test_rollout_batches_cover_the_cases():
    for kind in ("grpo", "token"):
        b = make_batch(kind)
        m = b.mask.bool()
        lr, a = (b.new - b.old)[m], b.adv[m]
        assert int(m.sum()) >= 30_000
        assert float(lr.abs().max()) < 20.0  # inside the clamp: verl's geo_mean / clip_cov / kl_cov agree there
        r = lr.exp()
        # every clip value binds on many tokens, both ways, for both signs of A
        for side in (r > 1.28, r < 0.8):
            assert int((side & (a > 0)).sum()) >= 500 and int((side & (a < 0)).sum()) >= 500
        assert int(((r > 1.2) & (r <= 1.28)).sum()) >= 200  # where eps_high 0.2 and 0.28 differ
        w = (b.old - b.rollout)[m].exp()
        assert int(((w < IS_THRESHOLD[0]) | (w > IS_THRESHOLD[1])).sum()) >= 100  # the IS filter acts
        assert (b.mask.sum(-1) > 0).all() and int((b.mask.sum(-1) <= 8).sum()) >= 4 and (b.mask == 0).any()
        if kind == "grpo":
            assert int((a == 0).sum()) > 0 and int((a > 0).sum()) >= 5_000 and int((a < 0).sum()) >= 5_000
        else:
            assert not (a == 0).any()


# SAPO with token_level_loss=True has no verl counterpart of its own (test_sapo_aggregation_mapping)
MODES = [(key, mode) for key in CASES for mode in (True, False) if not (key == "sapo" and mode)]
MAIN = [(key, mode, kind, dtype) for key, mode in MODES for kind in ("grpo", "token")
        for dtype in (torch.float32, torch.float64)]  # fmt: skip


@pytest.mark.parametrize("key, token_level_loss, kind, dtype", MAIN)
def test_objective_matches_verl(verl, key, token_level_loss, kind, dtype):
    """Loss, gradient w.r.t. the new log-probs, and the mapped metrics, on >= 30k rollout-like tokens,
    for each aggregation (SAPO: its verl mapping), both advantage kinds, float32 and float64."""
    case, b = CASES[key], make_batch(kind, dtype)
    ours = run_ours(case, b, token_level_loss=token_level_loss, per_sequence=kind == "grpo")
    theirs = run_theirs(verl, case, b, token_level_loss=token_level_loss)
    tol = tolerances(case, b, token_level_loss=token_level_loss)
    assert mismatches(ours, theirs, tol) == {}
    assert not (ours.grad == 0).all() and torch.isfinite(ours.grad).all()
    assert ppo_kl_and_metrics_match(case, b, ours, theirs) == []
    if case.name != "gmpo":  # per token, the loss values themselves: ours (the registered function) and verl's matrix
        _, loss_scale, _ = token_scales(case, b)
        mine = registered_token_loss(case, b)
        m = b.mask.bool()
        assert (((mine - theirs.loss_mat).abs() <= C_TOKEN * U[dtype] * loss_scale) | ~m).all()


def registered_token_loss(case: Case, b: Batch, seed=SEED, **changes) -> torch.Tensor:
    """The per-token loss of our registered function (what ObjectivePolicyLoss aggregates), on the
    clean batch; torch.manual_seed(seed) first (Clip-Cov)."""
    return registered(case, b, seed, **changes).loss.detach()


def registered(case: Case, b: Batch, seed=SEED, **changes):
    """Our registered function's ObjectiveLoss (options resolved, defaults filled in, as
    ObjectivePolicyLoss does) on the clean batch, after torch.manual_seed(seed)."""
    objective = get_objective(case.name)
    o = {**case.arguments(), **changes}
    low, high = o.pop("clip_eps_low"), o.pop("clip_eps_high")
    torch.manual_seed(seed)
    return objective.function(b.new, b.old, b.adv, b.mask.bool(), clip_eps_low=low, clip_eps_high=high,
                              dual_clip=None, **objective.resolve_options(o))  # fmt: skip


def test_gmpo_float64_equals_verl(verl):
    """In float64 our GMPO is verl's to float64 rounding: the same per-sequence denominators n_b + 1e-8,
    and no extra 1 + 1e-8 per sequence in the aggregation (where a difference would show: float32
    absorbs it)."""
    case, b = CASES["gmpo"], make_batch("grpo", torch.float64)
    ours, theirs = run_ours(case, b), run_theirs(verl, case, b)
    rel = float(ours.loss) / float(theirs.loss) - 1
    n = b.mask.sum(-1)
    assert abs(rel) <= C_TOKEN * U[torch.float64] * float(n.max()) * len(n)


SCENARIOS = {
    # masked positions of every input hold nan / inf / 1e30 for ours; verl gets the clean batch
    "garbage": dict(garbage=True),
    "is-mask": dict(is_mode="mask"),
    "is-clip": dict(is_mode="clip"),
    "global-counts": dict(counts="global"),
    "all": dict(garbage=True, is_mode="mask", counts="global"),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("key, token_level_loss", MODES)
def test_objective_matches_verl_scenarios(verl, key, token_level_loss, scenario):
    """Masked garbage (ours finite, equal to verl on the clean batch that agrees on every unmasked
    position), the IS coefficient as verl's rollout_is_weights, the global counts as verl's
    global_batch_info."""
    case, b = CASES[key], make_batch("grpo")
    spec = dict(SCENARIOS[scenario])
    counts = global_counts(b.mask) if spec.pop("counts", None) else None
    if case.name == "gmpo" and spec.get("is_mode") == "mask":
        # token-level mask mode's zero weights have no per-sequence geometric mean: refused (verl's rejection
        # drops the token from the mask instead, which OpenRLHF's mask mode does not); GMPO takes clip mode
        with pytest.raises(ValueError, match="sequence-level objective"):
            run_ours(case, b, token_level_loss=token_level_loss, counts=counts, **spec)
        spec["is_mode"] = "clip"
    ours = run_ours(case, b, token_level_loss=token_level_loss, counts=counts, **spec)
    assert torch.isfinite(ours.grad).all() and math.isfinite(float(ours.loss))
    assert all(v is None or torch.isfinite(v).all() for v in ours.outputs)
    assert all(torch.isfinite(v) for v in ours.metrics.values())
    is_mode = spec.get("is_mode")
    theirs = run_theirs(verl, case, b, token_level_loss=token_level_loss, is_mode=is_mode, counts=counts)
    tol = tolerances(case, b, token_level_loss=token_level_loss, is_mode=is_mode, counts=counts)
    assert mismatches(ours, theirs, tol) == {}
    assert ppo_kl_and_metrics_match(case, b, ours, theirs) == []
    if is_mode is not None:  # vllm_kl and is_filter_ratio are OpenRLHF's own (its PolicyLoss on the clean batch)
        reference = PolicyLoss(0.2, 0.2, is_correction_level="token", is_correction_mode=is_mode,
                               is_correction_threshold=IS_THRESHOLD)  # fmt: skip
        _, _, _, vllm_kl, filtered = reference(b.new, b.old, b.adv, b.mask, rollout_log_probs=b.rollout)
        u = U[torch.float32]
        assert abs(float(ours.outputs[3]) - float(vllm_kl)) <= mean_tol(b.rollout - b.old, b.mask, u)
        assert abs(float(ours.outputs[4]) - float(filtered)) <= share_tol(float(filtered), u, float(b.mask.sum()))
        assert float(filtered) > 0


@pytest.mark.parametrize("key", list(CASES))
def test_verl_is_not_finite_on_masked_garbage(verl, key):
    """Why the garbage comparison gives verl the clean batch: verl multiplies by the mask after the
    arithmetic, so a masked nan / inf reaches its loss or its gradient (0 * nan); ours does not."""
    case, b = CASES[key], make_batch("grpo")
    new, old, adv = (with_garbage(t, b.mask, k) for k, t in enumerate((b.new, b.old, b.adv)))
    theirs = VO.run_verl(verl, case.name, new, old, adv, b.mask, seed=SEED, **case.arguments())
    assert not (math.isfinite(float(theirs.loss)) and torch.isfinite(theirs.grad).all())
    ours = run_ours(case, b, garbage=True)
    assert math.isfinite(float(ours.loss)) and torch.isfinite(ours.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sapo_aggregation_mapping(verl, dtype):
    """verl's SAPO aggregates seq-mean-token-mean whatever loss_agg_mode it gets (the matrix its
    agg_loss receives says so); ours token_level_loss=False is that loss, token_level_loss=True is
    verl's own per-token matrix aggregated by verl's agg_loss in token-mean (with the same counts):
    loss and gradient."""
    case = CASES["sapo"]
    for kind, global_ in (("grpo", False), ("token", False), ("grpo", True)):
        b = make_batch(kind, dtype)
        counts = global_counts(b.mask) if global_ else None
        theirs_token = run_theirs(verl, case, b, token_level_loss=True, counts=counts)
        theirs_seq = run_theirs(verl, case, b, token_level_loss=False, counts=counts)
        assert theirs_token.agg_mode == theirs_seq.agg_mode == "seq-mean-token-mean"
        assert float(theirs_token.loss) == float(theirs_seq.loss) and torch.equal(theirs_token.grad, theirs_seq.grad)
        ours_seq = run_ours(case, b, token_level_loss=False, counts=counts)
        tol_seq = tolerances(case, b, token_level_loss=False, counts=counts)
        assert mismatches(ours_seq, theirs_seq, tol_seq) == {}
        # token-mean: verl's per-token matrix, aggregated by verl's own agg_loss, differentiated
        info = {"dp_size": 1, **(counts or {})}
        token_mean = verl.agg_loss(theirs_token.loss_mat_graph, b.mask, "token-mean", **info)
        (grad,) = torch.autograd.grad(token_mean, theirs_token.log_prob)
        verl_token_mean = VO.VerlResult(token_mean.detach(), grad, {}, None, None)
        ours_token = run_ours(case, b, token_level_loss=True, counts=counts)
        tol_token = tolerances(case, b, token_level_loss=True, counts=counts)
        assert mismatches(ours_token, verl_token_mean, tol_token) == {}
        # and the two aggregations do differ (the mapping is not vacuous)
        assert "grad" in mismatches(ours_token, theirs_seq, tol_token)


def test_sapo_gate_weight_metric_is_verls_gradient_factor(verl):
    """sapo/gate_weight_mean is the mean of 4 s (1 - s), s = sigmoid(tau (r - 1)): verl's gradient per
    token is -A 4 s (1 - s) r / (n_b sequences) (seq-mean-token-mean), so the factor is read from
    verl's own gradient (per-token advantages: no A = 0)."""
    case, b = CASES["sapo"], make_batch("token")
    theirs = run_theirs(verl, case, b, token_level_loss=False)
    ours = run_ours(case, b, token_level_loss=False)
    d = aggregation_weights(b.mask, False, None)
    m = b.mask.bool()
    r = (b.new.double() - b.old.double()).exp()
    scale = -b.adv.double() * r * d
    factor = theirs.grad.double()[m] / scale[m]
    grad_tol = tolerances(case, b, token_level_loss=False).grad[m] / scale[m].abs()
    n = float(m.sum())
    tol = float(grad_tol.sum()) / n + mean_tol(factor, torch.ones_like(factor), U[torch.float32])
    assert abs(float(ours.metrics["sapo/gate_weight_mean"]) - float(factor.mean())) <= tol
    # gated: factor below one half, away from the threshold by more than the factor's own tolerance
    clear = (factor - 0.5).abs() > grad_tol
    assert int((~clear).sum()) <= 10
    gated_verl = int(((factor < 0.5) & clear).sum())
    unclear = int((~clear).sum())
    assert abs(float(ours.metrics["sapo/gated_frac"]) * n - gated_verl) <= unclear + 4 * U[torch.float32] * n
    assert gated_verl > 0


def test_gmpo_aggregation_mapping(verl):
    """verl's geo_mean: torch.mean over the micro-batch's sequences, loss_agg_mode and
    global_batch_info unread; ours: OpenRLHF's sample mean over the global count, whatever
    token_level_loss. So ours = verl x B dp / global_batch_size, and with a fully masked sequence
    (verl counts it as a 0) ours = verl x B / (B - 1) without counts."""
    case, b = CASES["gmpo"], make_batch("grpo")
    batch = b.mask.shape[0]
    theirs = run_theirs(verl, case, b)
    assert theirs.loss_mat is None  # geo_mean does not call agg_loss
    for mode in (True, False):  # verl ignores loss_agg_mode ...
        other = run_theirs(verl, case, b, token_level_loss=mode, counts=global_counts(b.mask))  # ... and the counts
        assert float(other.loss) == float(theirs.loss) and torch.equal(other.grad, theirs.grad)
        ours = run_ours(case, b, token_level_loss=mode)  # ours ignores token_level_loss
        assert mismatches(ours, theirs, tolerances(case, b, token_level_loss=mode)) == {}

    counts = dict(dp_size=DP_SIZE, global_batch_size=DP_SIZE * batch + 7.0)
    ours = run_ours(case, b, counts=counts)
    factor = batch * DP_SIZE / counts["global_batch_size"]
    tol = tolerances(case, b, counts=counts, verl_gmpo=False)
    scaled = VO.VerlResult(theirs.loss * factor, theirs.grad * factor, {}, None, None)
    assert mismatches(ours, scaled, tol) == {}
    assert "grad" in mismatches(ours, theirs, tol)  # the counts do matter

    empty = Batch(b.new, b.old, b.rollout, b.adv, b.mask.clone())
    empty.mask[3] = 0.0
    theirs_empty = run_theirs(verl, case, empty)
    ours_empty = run_ours(case, empty)
    factor = batch / (batch - 1)
    tol = tolerances(case, empty, verl_gmpo=False)
    scaled = VO.VerlResult(theirs_empty.loss * factor, theirs_empty.grad * factor, {}, None, None)
    assert mismatches(ours_empty, scaled, tol) == {}
    assert "grad" in mismatches(ours_empty, theirs_empty, tol)


def test_gmpo_clip_ratio_is_the_moved_share(verl):
    """GMPO's forward clip_ratio counts every token whose log-ratio the clip moved; with no A = 0 it
    is verl's pg_clipfrac + pg_clipfrac_lower."""
    case, b = CASES["gmpo"], make_batch("token")
    theirs, ours = run_theirs(verl, case, b), run_ours(case, b)
    total = theirs.metrics["actor/pg_clipfrac"] + theirs.metrics["actor/pg_clipfrac_lower"]
    assert abs(float(ours.outputs[1]) - total) <= 2 * share_tol(total, U[torch.float32], float(b.mask.sum()))


def _clip_cov_selected_ours(case: Case, b: Batch, seed: int, **changes) -> torch.Tensor:
    """The tokens our registered clip_cov function detaches, with torch.manual_seed(seed) first."""
    return registered(case, b, seed, **changes).metrics["selected_frac"]


@pytest.mark.parametrize("ratio", [0.0002, 0.02])
def test_clip_cov_random_choice_is_verls(verl, ratio):
    """Ours draws torch.randperm from torch's default CPU generator exactly as verl does: with
    torch.manual_seed(s) before each call the selected set is identical (verl's: the zeros of its
    per-token loss matrix, per-token advantages so that no other token's loss is 0), and so are the
    losses and gradients; another seed selects another set of the same size."""
    case, b = CASES["clip_cov"], make_batch("token")
    changes = dict(clip_cov_ratio=ratio)
    case = Case(case.name, case.low, case.high, tuple({**case.opts, **changes}.items()))
    m = b.mask.bool()
    count = max(int(ratio * float(b.mask.sum())), 1)
    sets = {}
    for seed in (0, 1):
        theirs = run_theirs(verl, case, b, seed=seed)
        selected_verl = (theirs.loss_mat == 0) & m
        selected_ours = _clip_cov_selected_ours(case, b, seed)
        assert int(selected_verl.sum()) == count
        assert torch.equal(selected_ours, selected_verl)
        ours = run_ours(case, b, seed=seed)
        assert mismatches(ours, theirs, tolerances(case, b)) == {}
        assert (ours.grad[selected_ours] == 0).all()
        assert float(ours.metrics["clip_cov/selected_frac"]) * float(b.mask.sum()) == pytest.approx(count, abs=1e-2)
        sets[seed] = selected_ours
    assert not torch.equal(sets[0], sets[1]) and int(sets[0].sum()) == int(sets[1].sum())
    # eligible tokens far outnumber the selected ones (the random choice is a choice)
    eligible = float(ours.metrics["clip_cov/eligible_frac"]) * float(b.mask.sum())
    assert eligible > 10 * count


def test_clip_cov_clip_ratio_is_openrlhfs_ppo_clip_ratio(verl):
    """Clip-Cov's forward clip_ratio is OpenRLHF's PPO clip share (its PolicyLoss, same eps)."""
    case, b = CASES["clip_cov"], make_batch("grpo")
    ours = run_ours(case, b)
    reference = PolicyLoss(case.low, case.high)
    _, clip_ratio, ppo_kl, _, _ = reference(b.new, b.old, b.adv, b.mask)
    n = float(b.mask.sum())
    assert abs(float(ours.outputs[1]) - float(clip_ratio)) <= share_tol(float(clip_ratio), U[torch.float32], n)
    assert abs(float(ours.outputs[2]) - float(ppo_kl)) <= mean_tol(b.new - b.old, b.mask, U[torch.float32])


@pytest.mark.parametrize("ratio", [0.0002, 0.02])
def test_kl_cov_top_k_is_verls(verl, ratio):
    """KL-Cov's selection is deterministic (top-k by covariance, on the CPU as verl computes it): the
    same tokens as verl's (those where verl's per-token loss carries the penalty coef |log r|)."""
    base = CASES["kl_cov"]
    case = Case(base.name, options=tuple({**base.opts, "kl_cov_ratio": ratio}.items()))
    for kind in ("grpo", "token"):
        b = make_batch(kind)
        theirs = run_theirs(verl, case, b)
        m = b.mask.bool()
        lr = b.new - b.old
        # verl's gradient per token, over the aggregation weight: -A r, plus coef sign(log r) where penalised
        per_token = theirs.grad.double() / aggregation_weights(b.mask, True, None).clamp(min=1e-300)
        penalty = per_token + b.adv.double() * lr.double().exp()
        penalised = m & (penalty.abs() > 0.5 * case.opts["ppo_kl_coef"])
        selected = registered(case, b).metrics["selected_frac"]
        count = max(1, int(float(b.mask.sum()) * ratio))
        assert int(selected.sum()) == count
        distinguishable = m & (lr != 0)  # sign(0) = 0: no penalty gradient at log r = 0
        assert torch.equal(selected & distinguishable, penalised & distinguishable)
        ours = run_ours(case, b)
        assert float(ours.outputs[1]) * float(b.mask.sum()) == pytest.approx(count, abs=1e-2)


NEGATIVE_CONTROLS = {
    # (case key, our deviating option, or "drop": one unmasked token masked in ours only)
    "sapo: tau_pos 1.2 for 1.0": ("sapo", dict(tau_pos=1.2)),
    "sapo: tau_neg 1.0 for 1.05": ("sapo", dict(tau_neg=1.0)),
    "cispo: eps_high 0.2 for 0.28": ("cispo", dict(clip_eps_high=0.2)),
    "cispo: eps_low 0.2 for 10": ("cispo-10/0.2", dict(clip_eps_low=0.2)),
    "gmpo: eps_low 0.3 for 0.2": ("gmpo", dict(clip_eps_low=0.3)),
    "gmpo: eps_high 0.2 for 0.28": ("gmpo", dict(clip_eps_high=0.2)),
    "clip_cov: eps_high 0.2 for 0.28": ("clip_cov", dict(clip_eps_high=0.2)),
    "kl_cov: kl_cov_ratio 0.01 for 0.02": ("kl_cov", dict(kl_cov_ratio=0.01)),
    "kl_cov: ppo_kl_coef 0.2 for 0.1": ("kl_cov", dict(ppo_kl_coef=0.2)),
    **{f"{key}: a dropped token": (key, "drop") for key in ("cispo", "sapo", "gmpo", "clip_cov", "kl_cov", "gpg")},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(NEGATIVE_CONTROLS))
def test_comparison_catches_a_different_rule(verl, name, dtype):
    """Each deviation must fail the comparison that the faithful configuration passes."""
    key, change = NEGATIVE_CONTROLS[name]
    case, b = CASES[key], make_batch("grpo", dtype)
    token_level_loss = case.name != "sapo"  # SAPO: the aggregation verl uses
    theirs = run_theirs(verl, case, b, token_level_loss=token_level_loss)
    tol = tolerances(case, b, token_level_loss=token_level_loss)
    assert mismatches(run_ours(case, b, token_level_loss=token_level_loss), theirs, tol) == {}
    if change == "drop":
        mask = b.mask.clone()
        mask[1, 2] = 0.0  # an unmasked token of a sequence with A != 0
        assert b.mask[1, 2] == 1 and b.adv[1, 2] != 0
        ours = run_ours(case, b, token_level_loss=token_level_loss, mask=mask)
    else:
        ours = run_ours(case, b, token_level_loss=token_level_loss, **change)
    assert mismatches(ours, theirs, tol) != {}, name


def test_log_ratio_clamp_difference(verl):
    """Ours clamps log r to [-20, 20] for every objective (OpenRLHF's convention); verl's cispo and
    sapo do too, its geo_mean, clip_cov and kl_cov do not. At log r = 25 those three differ from ours
    (verl's loss grows with e^25, its gradient does not stop), at log r = 100 verl's overflows (inf /
    nan) while ours stays finite, equal to ours at log r = 20, and with no gradient through the
    clamped ratio (CISPO's -sg(w) A log pi keeps its gradient: w is bounded). Metrics: verl's
    cispo / sapo ppo_kl is the clamped mean, ours OpenRLHF's unclamped one; kl_cov/abs_kl is the
    clamped |log r|, verl's unclamped."""
    old = torch.full((2, 4), -30.0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    base = old + torch.tensor([[-0.1, 0.0, 0.1, 0.0], [0.0, 0.0, 0.0, 0.0]])
    for far in (25.0, 100.0):
        new, at_20 = base.clone(), base.clone()
        new[0, 1], new[1, 0] = -30.0 + far, -30.0 + far
        at_20[0, 1], at_20[1, 0] = -10.0, -10.0
        for sign in (1.0, -1.0):
            adv = torch.full((2, 4), sign)
            b, b20 = Batch(new, old, old, adv, mask), Batch(at_20, old, old, adv, mask)
            for key in ("cispo", "sapo", "gmpo", "clip_cov", "kl_cov"):
                case, level = CASES[key], key != "sapo"  # SAPO: verl's seq-mean-token-mean
                ours, ours20 = run_ours(case, b, token_level_loss=level), run_ours(case, b20, token_level_loss=level)
                theirs = run_theirs(verl, case, b, token_level_loss=level)
                assert math.isfinite(float(ours.loss)) and torch.isfinite(ours.grad).all(), (key, far, sign)
                if key != "cispo":  # CISPO's loss has log pi itself in it
                    assert float(ours.loss) == float(ours20.loss), (key, far, sign)
                tol = tolerances(case, b20, token_level_loss=level)
                if key in ("cispo", "sapo"):  # verl clamps too
                    assert mismatches(ours, theirs, tol) == {}, (key, far, sign)
                    assert theirs.metrics["actor/ppo_kl"] == pytest.approx(-float(
                        (at_20 - old)[mask.bool()].mean()), rel=1e-6)  # fmt: skip
                    assert float(ours.outputs[2]) == pytest.approx(-float((new - old)[mask.bool()].mean()), rel=1e-6)
                    continue
                if key in ("clip_cov", "kl_cov"):
                    assert ours.grad[0, 1] == 0 and ours.grad[1, 0] == 0  # no gradient through the clamped ratio
                if key == "kl_cov":
                    assert float(ours.metrics["kl_cov/abs_kl"]) == pytest.approx(float(
                        (at_20 - old)[mask.bool()].abs().mean()), rel=1e-6)  # fmt: skip
                verl_finite = math.isfinite(float(theirs.loss)) and bool(torch.isfinite(theirs.grad).all())
                differs = not verl_finite or mismatches(ours, theirs, tol) != {}
                # clip_cov with A > 0 clips the far token on both sides: the same loss, and verl's gradient there
                # is 0 * inf = nan at log r = 100, 0 at 25
                if key == "clip_cov" and sign > 0 and far == 25.0:
                    assert mismatches(ours, theirs, tol) == {}
                    continue
                if key == "gmpo" and sign > 0:  # A > 0: min(log r, eps_high) = eps_high on both sides
                    assert mismatches(ours, theirs, tol) == {}
                    continue
                assert differs, (key, far, sign)
                if far == 100.0 and not (key == "gmpo" and sign > 0):
                    assert not verl_finite, (key, sign)


def test_objective_policy_loss_refuses_band_bounds_and_dual_clip():
    with pytest.raises(ValueError, match="bounds='band'"):
        ObjectivePolicyLoss(policy_loss_type="cispo", bounds="band")
    for name in ("cispo", "sapo", "gmpo", "kl_cov", "gpg"):
        with pytest.raises(ValueError, match="dual_clip"):
            make_policy_loss(name, dual_clip=3.0)
    make_policy_loss("clip_cov", dual_clip=3.0)  # Clip-Cov is PPO's clipped min: it takes OpenRLHF's dual clip
