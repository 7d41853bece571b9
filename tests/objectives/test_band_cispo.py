"""CISPO with the band's bounds (`make_policy_loss("cispo", bounds="band", ...)`, a
`BandPolicyLoss(policy_loss_type="cispo")`) against a torch reference of the formula written here:

    loss_t = -sg(clip(r_t, lo_t, up_t)) A_t log pi_t,   r_t = pi_t / pi_old,t (log r clamped to [-20, 20])
    lo_t = max(r_low(p_t), F),  up_t = min(r_up(p_t), cap)

with r_low / r_up the exact roots of the band (tests/support/band_exact.py, mpmath, at the token's
float p and radius), F the lower floor as float32 holds it (the band loss's convention, as for the
band's own PPO-style loss: float32(0.8) = 0.800000011920929...), aggregated as OpenRLHF's aggregate_loss
does (token-mean: / tokens; seq-mean-token-mean: per-sequence sums / (count + 1e-8), / sequences). At a
saturated upper bound (the simplex edge 1/p, not moved by the cap) no token is above it: r = q / p <=
1/p exactly for q <= 1. Clip metrics: a token is clipped above when r > up (either sign of A: CISPO
bounds the weight, it never drops a gradient), below when r < lo, by the floor alone when r < F but
r >= r_low.

Tolerances: ours takes its bounds from `band_bounds`, within BOUNDS_RTOL of the exact roots (the bounds
accuracy tests' figures: tests/band/test_bounds_accuracy.py, 1e-12 float64, 2e-6 float32), so a
clipped token's weight is off by that much relative; the rest is C_TOKEN ulps of the per-token
magnitudes and the worst-case summation bound (k - 1) u sum |x| for the loss value, as in
test_verl_objectives.py. A token whose r lies within that tolerance of a bound may be flagged either
way ("ambiguous": on these batches only q = 1 tokens, where kl's upper root is within float rounding
of 1/p): our per-token flags must be the formula's on every other token, and the metrics must be the
shares of our flags.

Negative controls (another radius, cap, floor or divergence in the reference) must fail the same
comparison.
"""

from __future__ import annotations

import functools
import math

import band_exact
import pytest
import torch
import verl_objectives as VO
from torch.autograd.gradcheck import GradcheckError

from openrlhf_band.band.spec import BandSpec
from openrlhf_band.integration.objective_loss import make_policy_loss
from openrlhf_band.integration.policy_loss import BandPolicyLoss
from openrlhf_band.objectives.band_cispo import band_cispo_token_loss

U = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
BOUNDS_RTOL = {torch.float32: 2e-6, torch.float64: 1e-12}
C_TOKEN = 64
DELTAS = {"kl": 0.05, "tv": 0.1, "chi2": 0.1}
FLOOR = 0.8
FLOOR32 = float(torch.tensor(FLOOR, dtype=torch.float32))
GARBAGE = (math.nan, math.inf, -math.inf, 1e30, -1e30)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for these small element-wise ops (thread hand-offs cost more than they
    save at this size, and much more on a loaded machine); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------ data
@functools.cache
def _batch():
    """8 sequences x 48 (variable lengths): old log-probs of rollout-like tokens
    (tests/support/verl_objectives.py: p down to e^-30 and up to 1 - 1e-7), new log-probs the old plus
    sigma N(0, 1), sigma per token in {0.1, 0.5, 1.5} (so that every bound clips, the cap and the
    floor too), at most 0 (q <= 1: some tokens reach q = 1, the simplex edge); per-token N(0, 1) and
    per-sequence N(0, 1) advantages; radii log-uniform in [0.01, 0.3] per token and per sequence. All
    float32-representable, so that the float32 and float64 runs share their exact roots."""
    _, old, _, adv, mask = VO.rollout_batch(6, batch=8, length=48, vocab=64, per_token_advantages=True)
    gen = torch.Generator().manual_seed(6)
    sigma = torch.tensor([0.1, 0.5, 1.5])[torch.randint(0, 3, old.shape, generator=gen)]
    new = (old + sigma * torch.randn(old.shape, generator=gen)).clamp(max=0.0)
    adv_seq = torch.randn(8, 1, generator=gen)
    low, high = math.log(0.01), math.log(0.3)
    radius_token = torch.empty(8, 48).uniform_(low, high, generator=gen).exp()
    radius_seq = torch.empty(8, 1).uniform_(low, high, generator=gen).exp()
    return new, old, adv, adv_seq, mask, radius_token, radius_seq


def batch(dtype, advantages="token"):
    new, old, adv, adv_seq, mask, radius_token, radius_seq = (t.to(dtype, copy=True) for t in _batch())
    return new, old, adv if advantages == "token" else adv_seq, mask, radius_token, radius_seq


def with_garbage(x, mask, shift):
    fill = torch.tensor(GARBAGE, dtype=x.dtype)[(torch.arange(x.numel()) + shift) % len(GARBAGE)].view(x.shape)
    return torch.where(mask != 0, x, fill)


@functools.cache
def _exact(divergence: str, log_p: float, delta: float) -> tuple[float, float, bool]:
    lower, upper, _, saturated_up = band_exact.exact_bounds(divergence, log_p, delta)
    return float(lower), float(upper), bool(saturated_up)


def exact_roots(divergence, old, mask, radius):
    """(r_low, r_up, saturated_up) from the exact roots, per unmasked token (float64; bounds 1 at
    masked positions); saturated_up: r_up is the simplex edge 1/p itself. `radius`: a number, or a
    tensor broadcastable to old."""
    radius = torch.as_tensor(radius, dtype=torch.float64).expand(old.shape)
    lower, upper = torch.ones(old.shape, dtype=torch.float64), torch.ones(old.shape, dtype=torch.float64)
    saturated = torch.zeros(old.shape, dtype=torch.bool)
    for i, j in mask.nonzero().tolist():
        lower[i, j], upper[i, j], saturated[i, j] = _exact(divergence, float(old[i, j]), float(radius[i, j]))
    return lower, upper, saturated


# ------------------------------------------------------------------------------------- reference
def reference(new, old, adv, mask, roots, *, cap, floor, token_level_loss, coef=None):
    """The formula (module docstring) in float64: (loss, gradient w.r.t. the new log-probs, flags,
    the intermediates). At a saturated upper bound 1/p (not moved by the cap) no token with q <= 1 is
    above it (r = q / p <= 1/p exactly): decided so, not by float64 exp(log q - log p) against the
    rounded 1/p."""
    r_low, r_up, saturated = roots
    m = mask.double()
    live = mask != 0
    lo = r_low.clamp(min=FLOOR32) if floor else r_low
    up = r_up.clamp(max=cap) if cap is not None else r_up
    edge = saturated & (new.double() <= 0) & ((r_up <= cap) if cap is not None else True)
    up = torch.where(edge, math.inf, up)
    log_probs = torch.where(live, new.double(), 0.0).requires_grad_(True)
    a = torch.where(live, adv.double().expand(new.shape), 0.0)
    log_ratio = (log_probs.detach() - torch.where(live, old.double(), 0.0)).clamp(-20, 20)
    r = log_ratio.exp()
    weight = torch.minimum(torch.maximum(r, lo), up)  # clip(r, lo, up), sg
    per_token = -weight * a * log_probs * m
    if coef is not None:
        per_token = per_token * coef.double()
    n_b = m.sum(-1, keepdim=True)
    if token_level_loss:
        d = m / m.sum()
    else:
        d = m / ((n_b + 1e-8) * float((n_b > 0).sum()))  # OpenRLHF's aggregate_loss: count + 1e-8
    loss = (per_token * d).sum()
    (grad,) = torch.autograd.grad(loss, log_probs)
    flags = dict(upper=live & (r > up), lower=live & (r < lo), floor=live & (r < lo) & (r >= r_low) & bool(floor))
    return loss.detach(), grad, flags, dict(r=r, lo=lo, up=up, r_low=r_low, weight=weight, d=d, a=a, lp=log_probs,
                                            q_one=live & (new == 0))  # fmt: skip


def ambiguous(x, dtype):
    """Unmasked tokens whose r lies within the bounds' tolerance (plus r's own rounding) of lo, up,
    or (the floor flag) r_low: either flag is right there."""
    tol = BOUNDS_RTOL[dtype] + 4 * U[dtype] * (1 + x["r"].log().abs())

    def near(bound):
        return torch.isfinite(bound) & ((x["r"] - bound).abs() <= tol * bound)

    return (x["d"] > 0) & (near(x["lo"]) | near(x["up"]) | near(x["r_low"]))


def tolerances(ref, dtype, coef=None):
    """Per-token gradient tolerance and the loss value's: the weight within BOUNDS_RTOL + C_TOKEN u
    (1 + |log r|) relative; the loss value adds both sides' sums."""
    u = U[dtype]
    w, a, d, lp = ref["weight"], ref["a"].abs(), ref["d"], ref["lp"].detach().abs()
    rel = BOUNDS_RTOL[dtype] + C_TOKEN * u * (1 + ref["r"].log().abs())
    c = 1.0 if coef is None else coef.double()
    grad = rel * w * a * d * c
    k = float((d > 0).sum())
    loss = float((rel * w * a * lp * d * c).sum()) + 2 * k * u * float((w * a * lp * d * c).sum())
    return grad, loss


def run(dtype, divergence, *, cap=10.0, floor=False, radius="scalar", token_level_loss=True, garbage=False,
        advantages="token", reference_changes=None, **extra):  # fmt: skip
    """Ours through make_policy_loss and the reference; returns (ours dict, reference tuple, ambiguous,
    inputs). `reference_changes`: the reference's own divergence / delta / cap / floor (negative
    controls; default: ours)."""
    new, old, adv, mask, radius_token, radius_seq = batch(dtype, advantages)
    delta = DELTAS[divergence]
    ref_options = {**dict(divergence=divergence, delta=delta, cap=cap, floor=floor), **(reference_changes or {})}
    call_radius = {"scalar": None, "token": radius_token, "sequence": radius_seq}[radius]
    options = dict(divergence=divergence, delta=delta, upper_cap=cap, token_level_loss=token_level_loss, **extra)
    if floor:
        options["lower_floor"] = FLOOR
    loss_fn = make_policy_loss("cispo", bounds="band", **options)
    assert isinstance(loss_fn, BandPolicyLoss) and loss_fn.policy_loss_type == "cispo"
    x_new, x_old, x_adv = new, old, adv
    if garbage:
        x_new, x_old = with_garbage(new, mask, 0), with_garbage(old, mask, 1)
        if adv.shape == new.shape:
            x_adv = with_garbage(adv, mask, 2)
    log_probs = x_new.clone().requires_grad_(True)
    kwargs = {} if call_radius is None else {"delta": call_radius}
    outputs = loss_fn(log_probs, x_old, x_adv, mask, **kwargs)
    (grad,) = torch.autograd.grad(outputs[0], log_probs)
    # our per-token flags: the function BandPolicyLoss calls, on the same inputs
    flags = band_cispo_token_loss(x_new, x_old, x_adv, mask, loss_fn.band, radius=call_radius)
    ours = dict(loss=outputs[0].detach(), grad=grad, outputs=outputs, metrics=dict(loss_fn.band_metrics), flags=flags)
    ref_radius = ref_options["delta"] if call_radius is None else call_radius
    roots = exact_roots(ref_options["divergence"], old, mask, ref_radius)
    ref = reference(new, old, adv, mask, roots, cap=ref_options["cap"], floor=ref_options["floor"],
                    token_level_loss=token_level_loss)  # fmt: skip
    return ours, ref, ambiguous(ref[3], dtype), (new, old, adv, mask, call_radius)


def compare(ours, ref, amb, dtype) -> list[str]:
    loss, grad, flags, x = ref
    grad_tol, loss_tol = tolerances(x, dtype)
    fails = []
    if not abs(float(ours["loss"]) - float(loss)) <= loss_tol:
        fails.append(f"loss: ours {float(ours['loss'])!r} reference {float(loss)!r} (tol {loss_tol:.3g})")
    bad = ~((ours["grad"].double() - grad).abs() <= grad_tol)
    if bad.any():
        fails.append(f"gradient: {int(bad.sum())} tokens beyond tolerance")
    # flags: ours (per token) are the formula's on every token that is not ambiguous, and the metrics
    # are the shares of ours (float32 shares: a few ulps)
    live = x["d"] > 0
    n = float(live.sum())
    clear = live & ~amb
    mine = {"upper": ours["flags"].clipped_upper, "lower": ours["flags"].clipped_lower,
            "floor": ours["flags"].floor_clipped}  # fmt: skip
    for key, value in mine.items():
        if not torch.equal(value & clear, flags[key] & clear):
            fails.append(f"{key} flags differ on {int(((value != flags[key]) & clear).sum())} clear tokens")
    shares = {"band/clip_frac_upper": mine["upper"], "band/clip_frac_lower": mine["lower"],
              "clip_ratio": mine["upper"] | mine["lower"]}  # fmt: skip
    if "band/clip_frac_floor" in ours["metrics"]:
        shares["band/clip_frac_floor"] = mine["floor"]
    for name, value in shares.items():
        got = float(ours["outputs"][1]) if name == "clip_ratio" else float(ours["metrics"][name])
        share = float((value & live).sum()) / n
        if not abs(got - share) <= 4 * U[torch.float32] * share:
            fails.append(f"{name}: ours {got!r}, the share of its flags {share!r}")
    return fails


# ------------------------------------------------------------------------------------------ tests
def test_batch_covers_the_cases():
    """Each divergence clips above and below for both signs of A, the cap and the floor bind, and
    few tokens are ambiguous."""
    for divergence in DELTAS:
        for floor, cap in ((False, None), (True, 2.0)):
            ours, ref, amb, (new, old, adv, mask, _) = run(torch.float64, divergence, cap=cap, floor=floor)
            flags, x = ref[2], ref[3]
            a = x["a"]
            for key in ("upper", "lower"):
                assert int((flags[key] & (a > 0)).sum()) >= 5 and int((flags[key] & (a < 0)).sum()) >= 5, key
            if floor:
                assert int(flags["floor"].sum()) >= 5
            if cap is not None:  # the cap is the bound that clips
                assert int(((x["up"] == cap) & flags["upper"]).sum()) >= 3
            # ambiguous: only q = 1 tokens (kl's upper root within float rounding of 1/p as p -> 1), and few
            assert int((amb & ~x["q_one"]).sum()) <= 2 and int(amb.sum()) <= 0.1 * int(mask.sum())
            assert int(x["q_one"].sum()) >= 10  # the simplex edge is in the batch
    assert int(batch(torch.float64)[3].sum()) >= 200


MODES = {"token-mean": True, "seq-mean-token-mean": False}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("cap, floor", [(None, False), (10.0, True), (2.0, False)])
@pytest.mark.parametrize("radius", ["scalar", "token", "sequence"])
@pytest.mark.parametrize("divergence", list(DELTAS))
def test_band_cispo_matches_the_formula(divergence, radius, cap, floor, mode, dtype):
    ours, ref, amb, _ = run(dtype, divergence, cap=cap, floor=floor, radius=radius, token_level_loss=MODES[mode])
    assert compare(ours, ref, amb, dtype) == []
    assert ("band/clip_frac_floor" in ours["metrics"]) == floor
    if radius != "scalar":  # the per-call radius is the one used, and reported
        _, _, _, mask, radius_token, radius_seq = batch(dtype)
        used = (radius_token if radius == "token" else radius_seq).double().expand(mask.shape)
        expected = float((used * mask.double()).sum() / mask.double().sum())
        n = float(mask.sum())  # a float32 mean of n positive radii: (n - 1) u relative for the sum, u for the division
        assert float(ours["metrics"]["band/delta_mean"]) == pytest.approx(expected, rel=(n + 2) * U[torch.float32])


NEGATIVE_CONTROLS = {
    # ours (divergence, options) -> the reference's deviating options
    "radius 0.06 for 0.05": ("kl", dict(), dict(delta=0.06)),
    "no cap where the cap binds": ("kl", dict(cap=2.0), dict(cap=None)),
    "a cap of 2 for none": ("tv", dict(cap=None), dict(cap=2.0)),
    "no floor": ("chi2", dict(floor=True), dict(floor=False)),
    "tv's roots for kl's": ("kl", dict(), dict(divergence="tv", delta=0.05)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(NEGATIVE_CONTROLS))
def test_comparison_catches_a_different_rule(name, dtype):
    divergence, options, changes = NEGATIVE_CONTROLS[name]
    ours, ref, amb, _ = run(dtype, divergence, reference_changes=changes, **options)
    assert compare(ours, ref, amb, dtype) != [], name
    ours, ref, amb, _ = run(dtype, divergence, **options)  # the faithful reference passes
    assert compare(ours, ref, amb, dtype) == []


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("divergence", list(DELTAS))
def test_clip_flags_match_the_formula(divergence, dtype):
    """Per token: our clipped_upper / clipped_lower / floor_clipped (band_cispo_token_loss) are the
    formula's r > up, r < lo, r < F <= ... for either sign of A, except ambiguous tokens; the loss
    per token too."""
    for radius in ("scalar", "token"):
        ours, ref, amb, (new, old, adv, mask, call_radius) = run(dtype, divergence, cap=2.0, floor=True, radius=radius)
        spec = BandSpec(divergence=divergence, delta=DELTAS[divergence], upper_cap=2.0, lower_floor=FLOOR)
        out = band_cispo_token_loss(new, old, adv, mask, spec, radius=call_radius)
        flags, x = ref[2], ref[3]
        clear = ~amb
        assert torch.equal(out.clipped_upper & clear, flags["upper"] & clear)
        assert torch.equal(out.clipped_lower & clear, flags["lower"] & clear)
        assert torch.equal(out.floor_clipped & clear, flags["floor"] & clear)
        assert not out.dual_clipped.any()
        # per-token loss: -w A log pi
        expected = -x["weight"] * x["a"] * x["lp"].detach()
        tol = (BOUNDS_RTOL[dtype] + C_TOKEN * U[dtype] * (1 + x["r"].log().abs())) * (expected.abs())
        assert ((out.loss.double() - expected).abs() <= tol).all()
        # bounds reported: lo (floor included) and up, 1 at masked positions
        live = mask != 0
        rtol = BOUNDS_RTOL[dtype] + 2 * U[torch.float32]  # reported as float32
        up = torch.where(torch.isinf(x["up"]), 1 / old.double().exp(), x["up"])  # the edge 1/p itself
        assert ((out.lower.double() - x["lo"]).abs() <= rtol * x["lo"])[live].all()
        assert ((out.upper.double() - up).abs() <= rtol * up)[live].all()
        assert (out.lower[~live] == 1).all() and (out.upper[~live] == 1).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("advantages", ["token", "sequence"])
@pytest.mark.parametrize("divergence", list(DELTAS))
def test_masked_garbage(divergence, advantages, mode, dtype):
    """Masked positions holding nan / inf / 1e30 in the log-probs, old log-probs and advantages:
    the loss, its gradient (0 at masked positions), clip_ratio and the band metrics are finite and
    equal the formula on the clean batch."""
    ours, ref, amb, (_, _, _, mask, _) = run(dtype, divergence, floor=True, radius="token", garbage=True,
                                            token_level_loss=MODES[mode], advantages=advantages)  # fmt: skip
    assert math.isfinite(float(ours["loss"])) and torch.isfinite(ours["grad"]).all()
    assert (ours["grad"][mask == 0] == 0).all()
    assert math.isfinite(float(ours["outputs"][1]))
    assert all(math.isfinite(float(v)) for v in ours["metrics"].values())
    assert compare(ours, ref, amb, dtype) == []


def test_is_correction_multiplies_each_token():
    """OpenRLHF's token-level IS coefficient (mask mode) multiplies each token's CISPO loss."""
    dtype = torch.float64
    new, old, adv, mask, _, _ = batch(dtype)
    gen = torch.Generator().manual_seed(11)
    rollout = old + torch.where(torch.rand(old.shape, generator=gen) < 0.1, 1.5, 0.05) * torch.randn(
        old.shape, generator=gen, dtype=dtype
    )
    loss_fn = make_policy_loss("cispo", bounds="band", divergence="kl", delta=0.05, is_correction_level="token")
    log_probs = new.clone().requires_grad_(True)
    outputs = loss_fn(log_probs, old, adv, mask, rollout_log_probs=rollout)
    (grad,) = torch.autograd.grad(outputs[0], log_probs)
    w = (old - rollout).exp()
    coef = torch.where((w >= 0.5) & (w <= 5.0), w, 0.0)
    assert int((coef[mask != 0] == 0).sum()) > 0
    roots = exact_roots("kl", old, mask, 0.05)
    loss, ref_grad, _, x = reference(new, old, adv, mask, roots, cap=10.0, floor=False, token_level_loss=True,
                                     coef=coef)  # fmt: skip
    grad_tol, loss_tol = tolerances(x, dtype, coef)
    assert abs(float(outputs[0]) - float(loss)) <= loss_tol
    assert ((grad.double() - ref_grad).abs() <= grad_tol).all()


def fixed_cispo_tolerances(new, old, adv, mask, low, high, token_level_loss, coef=None):
    """Two float32 computations of fixed-bound CISPO on the same inputs: per-token gradient -w A d
    within C_TOKEN ulps of w |A| (1 + |log r|) d each, the loss value adds both sums' worst-case
    bound ((k - 1) u sum |x| for k nonzero terms), as test_verl_objectives.py."""
    u = U[torch.float32]
    lr = (new.double() - old.double()).clamp(-20, 20)
    size = lr.exp().clamp(1 - low, 1 + high) * adv.double().abs().expand(new.shape)
    if coef is not None:
        size = size * coef.double()
    m = mask.double()
    n_b = m.sum(-1, keepdim=True)
    d = m / m.sum() if token_level_loss else m / ((n_b + 1e-8) * float((n_b > 0).sum()))
    k = float(m.sum()) if token_level_loss else float(n_b.max()) + mask.shape[0]
    grad = 2 * C_TOKEN * u * size * (1 + lr.abs()) * d
    value = size * new.double().abs() * d
    return grad, 2 * C_TOKEN * u * float((value * (1 + lr.abs())).sum()) + 2 * k * u * float(value.sum())


def test_fixed_bounds_fn_equals_objective_cispo_and_verl():
    """With bounds_fn giving the fixed interval [1 - eps_low, 1 + eps_high], band CISPO is
    ObjectivePolicyLoss's CISPO (and so verl's compute_policy_loss_cispo): loss, gradient, clip_ratio,
    ppo_kl, vllm_kl, is_filter_ratio, and the band's upper / lower shares are cispo/clip_frac_upper /
    _lower; on a float32 rollout batch (>= 30k tokens), with and without the IS correction."""
    verl = VO.load()
    new, old, rollout, adv, mask = VO.rollout_batch(0)
    u = U[torch.float32]
    n = float(mask.sum())
    assert n >= 30_000
    lr = (new.double() - old.double()) * mask.double()
    kl_tol = 4 * u * float(lr.abs().sum()) / n  # a mean of n values: (n - 1) u sum |x| / n per side, and the division
    for low, high in ((0.2, 0.28), (10.0, 0.2)):
        for token_level_loss in (True, False):
            for is_level in ("off", "token"):
                common = dict(token_level_loss=token_level_loss, is_correction_level=is_level)

                def fixed(old_log_probs, low=low, high=high):
                    return torch.full_like(old_log_probs, 1 - low), torch.full_like(old_log_probs, 1 + high)

                band = make_policy_loss("cispo", bounds="band", bounds_fn=fixed, **common)
                objective = make_policy_loss("cispo", clip_eps_low=low, clip_eps_high=high, **common)
                results = []
                for loss_fn in (band, objective):
                    log_probs = new.clone().requires_grad_(True)
                    outputs = loss_fn(log_probs, old, adv, mask, rollout_log_probs=rollout)
                    (grad,) = torch.autograd.grad(outputs[0], log_probs)
                    results.append((outputs, grad))
                (out_b, grad_b), (out_o, grad_o) = results
                coef = None
                if is_level == "token":
                    w = (old - rollout).exp()
                    coef = torch.where((w >= 0.5) & (w <= 5.0), w, 0.0)
                grad_tol, loss_tol = fixed_cispo_tolerances(new, old, adv, mask, low, high, token_level_loss, coef)
                assert ((grad_b.double() - grad_o.double()).abs() <= grad_tol).all()
                assert abs(float(out_b[0]) - float(out_o[0])) <= loss_tol
                share = float(out_o[1])
                assert abs(float(out_b[1]) - share) <= 4 * u * share  # clip_ratio
                assert abs(float(out_b[2]) - float(out_o[2])) <= kl_tol  # ppo_kl
                for k in (3, 4):  # vllm_kl, is_filter_ratio: the same IS correction
                    assert (out_b[k] is None) == (out_o[k] is None) == (is_level == "off")
                    if out_b[k] is not None:
                        assert abs(float(out_b[k]) - float(out_o[k])) <= 4 * u * abs(float(out_o[k])) + kl_tol
                for side in ("upper", "lower"):
                    share = float(objective.loss_metrics[f"cispo/clip_frac_{side}"])
                    assert abs(float(band.band_metrics[f"band/clip_frac_{side}"]) - share) <= 4 * u * share
                if is_level == "off":  # and verl's
                    theirs = VO.run_verl(verl, "cispo", new, old, adv, mask, token_level_loss=token_level_loss,
                                         clip_eps_low=low, clip_eps_high=high)  # fmt: skip
                    assert ((grad_b.double() - theirs.grad.double()).abs() <= grad_tol).all()
                    assert abs(float(out_b[0]) - float(theirs.loss)) <= loss_tol
                    share = theirs.metrics["actor/pg_clipfrac"]
                    assert abs(float(out_b[1]) - share) <= 4 * u * share


@pytest.mark.parametrize("divergence", list(DELTAS))
def test_gradcheck_away_from_the_clip_kinks(divergence):
    """torch.autograd.gradcheck (float64) where every token's weight is clipped with a wide margin: there
    the weight is a constant of log pi, so the stop-gradient loss -w A log pi is differentiable as
    written and autograd must match finite differences, through the mask, the floor, the cap, both
    aggregations and a per-token radius. Where r is inside the bounds the weight is r itself and the
    stop-gradient makes autograd's -r A differ from the derivative of the loss value, -r A (1 + log pi):
    gradcheck must fail there (CISPO's surrogate by design)."""
    torch.manual_seed(0)
    dtype = torch.float64
    old = torch.tensor([[-0.7, -1.2, -2.0, -0.4, -3.0], [-1.6, -0.9, -2.5, -1.1, -0.6]], dtype=dtype)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=dtype)
    adv = torch.tensor([[1.0, -0.5, 2.0, -1.5, 0.3], [-0.7, 1.2, 0.4, 1.0, -2.0]], dtype=dtype)
    radius = torch.tensor([[0.05, 0.1, 0.02, 0.08, 0.05], [0.03, 0.2, 0.05, 0.05, 0.05]], dtype=dtype)
    spec = BandSpec(divergence=divergence, delta=DELTAS[divergence], upper_cap=3.0, lower_floor=FLOOR)
    out = band_cispo_token_loss(old, old, adv, mask, spec, radius=radius)
    lower, upper = out.lower.double(), out.upper.double()
    # above the upper bound (q = r p <= 1 holds: log q < 0) for even positions, well below for odd ones
    up_side = (torch.arange(5)[None] % 2 == 0).expand(2, 5)
    log_r = torch.where(up_side, torch.log(upper * 1.3), torch.log(lower * 0.6))
    new = old + log_r
    assert (new[mask != 0] < 0).all()
    for token_level_loss in (True, False):
        loss_fn = make_policy_loss("cispo", bounds="band", divergence=divergence, delta=DELTAS[divergence],
                                   upper_cap=3.0, lower_floor=FLOOR, token_level_loss=token_level_loss)  # fmt: skip
        log_probs = new.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda lp, f=loss_fn: f(lp, old, adv, mask, delta=radius)[0], (log_probs,))
        assert float(loss_fn.band_metrics["band/clip_frac_upper"]) + float(
            loss_fn.band_metrics["band/clip_frac_lower"]
        ) == pytest.approx(1.0)
    # inside the bounds: the stop-gradient
    inside = old + 0.3 * torch.log(upper).clamp(max=0.05) * torch.where(up_side, 1.0, -1.0)
    loss_fn = make_policy_loss("cispo", bounds="band", divergence=divergence, delta=DELTAS[divergence])
    log_probs = inside.clone().requires_grad_(True)
    out = loss_fn(log_probs, old, adv, mask, delta=radius)
    assert float(out[1]) == 0.0
    (grad,) = torch.autograd.grad(out[0], log_probs)
    r = (inside - old).exp()
    assert torch.allclose(grad, -r * adv * mask / mask.sum(), rtol=1e-12, atol=0)
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(lambda lp: loss_fn(lp, old, adv, mask, delta=radius)[0], (log_probs,))


def test_dual_clip_and_dppo_are_refused():
    with pytest.raises(ValueError, match="dual_clip"):
        make_policy_loss("cispo", bounds="band", divergence="kl", delta=0.05, dual_clip=3.0)
    with pytest.raises(ValueError, match="DPPO"):
        make_policy_loss("cispo", bounds="band", divergence="tv", delta=0.1, rule="dppo", upper_cap=None)
    with pytest.raises(ValueError, match="DPPO"):
        BandPolicyLoss(policy_loss_type="cispo", band=BandSpec(divergence="kl", delta=0.05, rule="dppo"))
    spec = BandSpec(divergence="tv", delta=0.1, rule="dppo")
    x = torch.full((1, 3), -1.0)
    with pytest.raises(ValueError, match="DPPO"):
        band_cispo_token_loss(x, x, x, None, spec)
