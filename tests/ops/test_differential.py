"""Seeded differential sweep: the fused kernel (backend="triton", in Triton's CPU interpreter)
against the torch reference (backend="torch") on ~330,000 tokens, in few large launches.

Covered: every divergence; scalar, per-token (B, T), per-sequence (B, 1) and (B,) radius (the
(B,) one with B == T); relax, upper_cap, dual_clip and the lower floor on and off; DPPO's options
(asymmetric radii through lower_delta, no cap, the ratio truncation) for tv and kl; float32 and bfloat16 log_probs;
ratios placed 0-2 float32 ulps from each bound (band_bounds gives the bound, log_probs is nudged
so that exp(log_probs - old) lands on its nextafter neighbours) and from the dual-clip threshold,
plus random ratios at several scales (some beyond the +-20 log-ratio clamp); A = 0 and denormal
advantages (whose products tie: torch.min splits the gradient); masked positions holding nan,
+-inf or huge values in every input (log_probs, old, advantages, per-token radius, upstream
gradient), and a fully masked row with a nan per-sequence radius.

Compared: loss, the four flags (floor_clipped too), the returned bounds, and d sum(loss * upstream) / d log_probs
for a random upstream. The one tolerated difference is a clip decision (and the loss and gradient
that follow) at a token whose float32 ratio lies within three float32 ulps of a bound (either
backend's) or of the dual-clip threshold: the interpreter's float32 exp (numpy's) is not
correctly rounded and can differ from torch's by up to three ulps (see NEAR_ULPS).
`test_near_bound_where_ratio_and_bound_agree` then holds even those tokens to exact agreement
wherever the two backends provably see the same ratio and the same bound (ties included). Masked
positions must be exactly 0 in loss and gradient on both backends. Bounds agree to 1e-6 relative
(1e-6 absolute for tiny lower bounds): the kernel and band_bounds reach the float64 band by
different routes before rounding once to float32.

With OPENRLHF_BAND_TEST_DEVICE=cuda the sweep runs on a GPU instead (tests/support/kernel_device.py):
the kernel compiled for it against the reference on CUDA tensors, the near-bound allowance widened to
the device's float32 exp (NEAR_ULPS below).

Runtime: ~1-2 minutes in the interpreter (each case is one forward and one backward launch of
8-16 programs per backend).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from kernel_device import DEVICE, ON_CUDA, kernel_module, on_device, pin_interpreter, prepare_environment

prepare_environment()  # before openrlhf_band.ops.band_loss is imported

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kernel_device import skip_module_without_device  # noqa: E402

skip_module_without_device()

from openrlhf_band import DIVERGENCES, band_bounds  # noqa: E402
from openrlhf_band.functional import band_token_loss  # noqa: E402
from openrlhf_band.ops.reference import LOG_RATIO_CLAMP  # noqa: E402

band_loss_module = kernel_module()
band_token_loss = on_device(band_token_loss)  # noqa: F811 - the same function, on the tests' device

FLAGS = ("clipped_upper", "clipped_lower", "dual_clipped", "floor_clipped")
TINY = 2.0**-149  # smallest float32 denormal
BOUNDS_ATOL, BOUNDS_RTOL = 1e-6, 1e-6
# the loss at a clipped token is bound * A: the bounds' relative tolerance (1e-6), plus exp's <= 3 ulps
# and one rounding (<= 4 * 2^-23 ~ 5e-7)
LOSS_RTOL = 2e-6
# gradients: float32 -u r A to a few ulps (exp's <= 3 and two roundings on each side: <= 7 * 2^-23 ~ 8e-7
# relative); bfloat16 is that float32 value rounded by each backend
# (one bf16 ulp apart where it straddles a rounding boundary). With a denormal A the two backends
# multiply u, r and A in different orders, and a denormal intermediate loses up to 2^-150: the
# absolute error is then up to ~(r + |u|) 2^-149, the atol per token (see `_assert_grad_close`).
GRAD_RTOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3}
# Where the sweep places ratios: 0-2 float32 ulps from a bound or c.
PLACE_ULPS = 2
# Tokens this close to a bound or c (in float32 ulps) may be decided differently by the two backends:
# numpy's SIMD float32 exp (the interpreter's tl.exp) is documented to ~2.5 ulps of exp, torch's (Sleef,
# glibc) to 1 ulp, so the two may lie up to 3 float32 steps apart (2 measured on x86-64); the
# comparison of exact decisions starts at 4 steps away.
NEAR_ULPS = 3
# On a CUDA device (OPENRLHF_BAND_TEST_DEVICE=cuda) Triton lowers float32 tl.exp(x) to ex2.approx.f32(x log2 e):
# the product's rounding (2^-24 |x log2 e| in the exponent) moves the result by up to |x| 2^-24 relative, at
# most |x| <= 20 ulps at the +-20 clamp, plus ex2.approx's 2 ulps; CUDA's expf (torch) is within 2 ulps:
# 24 steps.
if ON_CUDA:
    NEAR_ULPS = 24


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    pin_interpreter(monkeypatch)


@dataclass(frozen=True)
class Config:
    divergence: str
    radius: str  # "scalar", "token" (B, T), "seq2" (B, 1), "seq1" (B,)
    dtype: torch.dtype
    shape: tuple[int, int]
    relax: tuple[float, float] | None = None
    upper_cap: float | None = None
    dual_clip: float | None = None
    adv: str = "token"  # or "seq1": (B,)
    delta: float = 0.05
    lower_floor: float | None = None
    lower_delta: float | None = None
    ratio_truncation: float | None = None

    @property
    def band_options(self) -> dict:
        return dict(lower_floor=self.lower_floor, lower_delta=self.lower_delta)


def _configs() -> list:
    params = []
    scalar_deltas = {"kl": 0.05, "tv": 0.02, "chi2": 0.1, "reverse_kl": 0.2, "hellinger": 0.01}
    for div in DIVERGENCES:
        d = scalar_deltas.get(div, 0.05)
        for name, cfg in (
            ("scalar-fp32", Config(div, "scalar", torch.float32, (8, 2048), delta=d)),
            (
                "scalar-bf16-relax-cap-dual",
                Config(div, "scalar", torch.bfloat16, (8, 2048), (0.2, 0.28), 10.0, 3.0, delta=d),
            ),
            ("token-fp32-dual", Config(div, "token", torch.float32, (4, 2048), dual_clip=2.0)),
            ("seq2-bf16-cap-seqadv", Config(div, "seq2", torch.bfloat16, (16, 1024), upper_cap=5.0, adv="seq1")),
            ("seq1-square-fp32-relax-dual", Config(div, "seq1", torch.float32, (96, 96), (0.1, 0.1), None, 1.5)),
        ):
            params.append(pytest.param(cfg, id=f"{div}-{name}"))
        for name, cfg in (
            ("scalar-fp32-floor", Config(div, "scalar", torch.float32, (8, 2048), delta=d, lower_floor=0.8)),
            (
                "scalar-bf16-relax-floor-cap-dual",
                Config(div, "scalar", torch.bfloat16, (8, 2048), (0.5, 0.28), 10.0, 3.0, delta=d, lower_floor=0.7),
            ),
        ):
            params.append(pytest.param(cfg, id=f"{div}-{name}"))
    token_floor = Config("kl", "token", torch.float32, (4, 2048), lower_floor=0.6)
    params.append(pytest.param(token_floor, id="kl-token-fp32-floor"))
    for div, (low, high) in (("tv", (0.1, 0.2)), ("kl", (0.03, 0.08))):  # DPPO: asymmetric radii, no cap, c
        for dtype, c in ((torch.float32, 1.5), (torch.bfloat16, 1e4)):
            cfg = Config(div, "scalar", dtype, (8, 2048), delta=high, lower_delta=low, ratio_truncation=c)
            params.append(pytest.param(cfg, id=f"{div}-dppo-{str(dtype)[6:]}-c{c:g}"))
    return params


CONFIGS = _configs()


def _ulps(x: torch.Tensor, k: torch.Tensor | int) -> torch.Tensor:
    """x moved k (or k[i]) float32 ulps."""
    k = torch.as_tensor(k).expand_as(x)
    out = x.clone()
    for step in range(1, int(k.abs().max()) + 1 if k.numel() else 1):
        out = torch.where(k >= step, torch.nextafter(out, torch.full_like(out, math.inf)), out)
        out = torch.where(k <= -step, torch.nextafter(out, torch.full_like(out, -math.inf)), out)
    return out


def _place_near(old: torch.Tensor, lp: torch.Tensor, target_fn, want: torch.Tensor) -> torch.Tensor:
    """old (float32) moved, where `want`, so that the float32 ratio exp(lp - old) lands as close
    as it can to target_fn(old) (a bound of old itself moved k ulps). old is moved rather than
    log_probs because bfloat16 log_probs are far too coarse to reach a given float32 ratio; p
    changes by < 0.1% relative (tokens that would need more, such as an upper bound on the
    simplex edge 1/p, which moves with old, keep their ratio)."""
    lp64 = lp.double()
    cur = old.clone()
    for _ in range(3):  # fixed point old = lp - log target(old): the bound moves little with p
        new = (lp64 - target_fn(cur).double().log()).float()
        ok = want & torch.isfinite(new) & ((new - old).abs() <= 1e-3 * old.abs().clamp(min=1e-3))
        cur = torch.where(ok, new, cur)
    best, best_err = cur, torch.full_like(cur, math.inf, dtype=torch.float64)
    for j in range(-3, 4):  # then the float32 neighbours, each with its own bound
        cand = _ulps(cur, j)
        target = target_fn(cand).double()
        ratio = torch.exp((lp.float() - cand).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).double()
        err = torch.where(torch.isfinite(target), (ratio - target).abs(), math.inf)
        better = want & (err < best_err)
        best, best_err = torch.where(better, cand, best), torch.where(better, err, best_err)
    return best


def _garbage(n: int, g: torch.Generator) -> torch.Tensor:
    values = torch.tensor([math.nan, math.inf, -math.inf, 3e38, -3e38, 1e30], dtype=torch.float32)
    return values[torch.randint(0, len(values), (n,), generator=g)]


@cache
def make_case(cfg: Config, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    b, t = cfg.shape
    n = b * t
    # old probabilities log-spread over (1.5e-8, 1), some exactly 1 and some a hair below
    neglogp = torch.empty(n, dtype=torch.float64).uniform_(math.log(1e-4), math.log(18.0), generator=g).exp()
    old = (-neglogp).float()
    u = torch.rand(n, generator=g)
    old = torch.where(u < 0.02, 0.0, torch.where(u < 0.03, -1e-7, old))
    # the radius: a number, per token, or per sequence
    if cfg.radius == "scalar":
        delta = cfg.delta
        delta_full = cfg.delta
    else:
        rows = 10 ** torch.empty(b, dtype=torch.float64).uniform_(-3, -0.5, generator=g)
        if cfg.radius == "token":
            delta = (10 ** torch.empty(b, t, dtype=torch.float64).uniform_(-3, -0.5, generator=g)).float()
            delta_full = delta
        else:
            delta = rows.float() if cfg.radius == "seq1" else rows.float()[:, None]
            delta_full = rows.float()[:, None]  # (B, 1): band_bounds' per-sequence form

    def bounds_of(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = band_bounds(o.reshape(b, t), cfg.divergence, delta_full, upper_cap=cfg.upper_cap, relax=cfg.relax,
                             **cfg.band_options)  # fmt: skip
        return lo.reshape(-1), hi.reshape(-1)

    # the ratio of each token: random at several scales (~6% beyond the +-20 clamp), or 0-PLACE_ULPS ulps
    # from its lower bound, its upper bound or the dual-clip threshold c
    kind = torch.randint(0, 10, (n,), generator=g)
    scales = torch.tensor([0.02, 0.2, 1.0, 8.0], dtype=torch.float64)
    log_r = torch.randn(n, dtype=torch.float64, generator=g) * scales[torch.randint(0, 4, (n,), generator=g)]
    k = torch.randint(-PLACE_ULPS, PLACE_ULPS + 1, (n,), generator=g)
    c = torch.full((n,), math.nan if cfg.dual_clip is None else cfg.dual_clip)

    def target_fn(o: torch.Tensor) -> torch.Tensor:
        lo, hi = bounds_of(o)
        target = torch.where(kind < 2, lo, torch.where(kind < 4, hi, c))
        return _ulps(target, k)

    target = target_fn(old)
    want = (kind < 5) & torch.isfinite(target) & (target > 0)
    want &= target.double().log().abs() < LOG_RATIO_CLAMP - 0.5
    lp = (old.double() + torch.where(want, target.double().log(), log_r)).to(cfg.dtype)
    old = _place_near(old, lp, target_fn, want)

    adv = torch.randn(n, generator=g)
    v = torch.rand(n, generator=g)
    adv = torch.where(v < 0.04, 0.0, adv)
    adv = torch.where((v >= 0.04) & (v < 0.07), TINY * torch.randint(-3, 4, (n,), generator=g), adv)
    upstream = torch.randn(n, generator=g)

    mask = torch.rand(n, generator=g) < 0.85
    masked = ~mask
    lp = torch.where(masked, _garbage(n, g).to(cfg.dtype), lp)
    old = torch.where(masked, _garbage(n, g), old)
    adv = torch.where(masked, _garbage(n, g), adv)
    upstream = torch.where(masked, _garbage(n, g), upstream)
    mask = mask.reshape(b, t)
    if cfg.radius == "token":
        delta = torch.where(mask, delta, _garbage(n, g).reshape(b, t))
    adv = adv.reshape(b, t)
    if cfg.adv == "seq1":
        adv = torch.randn(b, generator=g)
    if cfg.radius in ("seq1", "seq2"):  # a fully masked last row may hold garbage per sequence too
        mask[-1] = False
        delta = delta.clone()
        delta[-1] = math.nan
        if cfg.adv == "seq1":
            adv[-1] = math.nan
    return dict(
        log_probs=lp.reshape(b, t),
        old=old.reshape(b, t),
        adv=adv,
        mask=mask,
        delta=delta,
        upstream=upstream.reshape(b, t),
    )


@cache
def results(cfg: Config) -> dict:
    """Both backends' outputs and gradients for the config (computed once per module)."""
    case = make_case(cfg)
    out = {}
    for backend in ("triton", "torch"):
        lp = case["log_probs"].clone().requires_grad_()
        res = band_token_loss(
            lp, case["old"], case["adv"], case["mask"], divergence=cfg.divergence, delta=case["delta"],
            upper_cap=cfg.upper_cap, relax=cfg.relax, dual_clip=cfg.dual_clip, backend=backend,
            return_bounds=True, ratio_truncation=cfg.ratio_truncation, **cfg.band_options,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(res.loss, lp, grad_outputs=case["upstream"])
        out[backend] = (res, grad)
    return out


def _ratio(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(ratio, log-ratio before the clamp), float32, as the torch reference computes them
    (masked positions: 1 and 0)."""
    mask = case["mask"]
    raw = torch.where(mask, case["log_probs"].float(), 0.0) - torch.where(mask, case["old"], 0.0)
    # on the tests' device: the reference's exp is that device's
    return torch.exp(raw.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).to(DEVICE)).cpu(), raw


def _near(ratio: torch.Tensor, edges: list[torch.Tensor]) -> torch.Tensor:
    """Tokens whose ratio lies within NEAR_ULPS float32 ulps of any of the edges."""
    near = torch.zeros_like(ratio, dtype=torch.bool)
    for e in edges:
        e = e.float().expand_as(ratio)
        ulp = torch.nextafter(e, torch.full_like(e, math.inf)) - e
        ok = torch.isfinite(e) & (e > 0)
        near |= ok & ((ratio.double() - e.double()).abs() <= NEAR_ULPS * ulp.double())
    return near


def _edges(cfg: Config, res_t, res_r) -> list[torch.Tensor]:
    edges = [res_t.lower, res_t.upper, res_r.lower, res_r.upper]
    if cfg.dual_clip is not None:
        edges.append(torch.tensor(cfg.dual_clip))
    if cfg.lower_floor is not None:  # floor_clipped also compares r with the band's own lower bound
        edges.append(_unfloored_lower(cfg))
    return edges


@cache
def _unfloored_lower(cfg: Config) -> torch.Tensor:
    case = make_case(cfg)
    delta = case["delta"]
    if isinstance(delta, torch.Tensor) and delta.dim() == 1:
        delta = delta[:, None]
    old = torch.where(case["mask"], case["old"], 0.0)
    lower, _ = band_bounds(old, cfg.divergence, delta, upper_cap=cfg.upper_cap, relax=cfg.relax)
    return lower


@pytest.mark.parametrize("cfg", CONFIGS)
def test_differential(cfg: Config):
    case = make_case(cfg)
    (kres, kgrad), (rres, rgrad) = results(cfg)["triton"], results(cfg)["torch"]
    mask = case["mask"]
    ratio, _ = _ratio(case)
    # the sweep places what it claims: ratios within PLACE_ULPS (<= NEAR_ULPS) ulps of the bounds
    near = _near(ratio, _edges(cfg, kres, rres)) & mask
    assert near.sum() > (0.05 if cfg.dtype == torch.float32 else 0.002) * mask.sum()

    # masked: exactly 0 (loss, gradient), no flag, bounds 1, on both backends
    for res, grad in ((kres, kgrad), (rres, rgrad)):
        assert res.loss.dtype == torch.float32 and grad.dtype == cfg.dtype
        assert (res.loss[~mask] == 0).all() and (grad[~mask] == 0).all()
        for name in FLAGS:
            assert not getattr(res, name)[~mask].any(), name
        assert (res.lower[~mask] == 1).all() and (res.upper[~mask] == 1).all()

    # bounds at every unmasked token
    torch.testing.assert_close(kres.lower[mask], rres.lower[mask], atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)
    torch.testing.assert_close(kres.upper[mask], rres.upper[mask], atol=BOUNDS_ATOL, rtol=BOUNDS_RTOL)

    # everything else at unmasked tokens away from the bounds
    cmp = mask & ~near
    for name in FLAGS:  # exact on every CPU: the two ratios differ by less than the distance to any edge
        k, r = getattr(kres, name), getattr(rres, name)
        assert torch.equal(k[cmp], r[cmp]), f"{name}: {(k[cmp] != r[cmp]).sum().item()} tokens differ"
    torch.testing.assert_close(kres.loss[cmp], rres.loss[cmp], rtol=LOSS_RTOL, atol=4 * TINY)
    _assert_grad_close(kgrad, rgrad, ratio, case["upstream"], cmp, cfg.dtype)


def _assert_grad_close(kgrad, rgrad, ratio, upstream, where, dtype, what: str = "") -> None:
    """|kernel - torch| <= rtol |torch| + 4 (r + |u| + 1) 2^-149 at the tokens `where`."""
    k, r = kgrad[where].double(), rgrad[where].double()
    atol = 4 * TINY * (ratio[where].double() + upstream[where].double().abs() + 1)
    if dtype == torch.bfloat16:  # the interpreter rounds float32 denormals to bf16 up to 2^-126 off
        atol = atol + 2.0**-126
    bad = ~((k - r).abs() <= GRAD_RTOL[dtype] * r.abs() + atol) & ~(k.isnan() & r.isnan())
    assert not bad.any(), (
        f"gradient differs {what} at {int(bad.sum())} of {int(where.sum())} tokens, e.g. kernel "
        f"{k[bad][:5].tolist()} vs torch {r[bad][:5].tolist()} (ratio {ratio[where][bad][:5].tolist()})"
    )


@triton.jit
def _tl_exp_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.exp(tl.load(x_ptr + offs, mask=offs < n, other=0.0)), mask=offs < n)


def _kernel_exp_agrees(raw: torch.Tensor) -> torch.Tensor:
    """Where the kernel's float32 exp equals torch's on the tests' device: numpy's exp in the
    interpreter (what tl.exp runs there); on CUDA, tl.exp as the device computes it."""
    x = raw.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if not ON_CUDA:
        return torch.from_numpy(np.exp(x.numpy())) == torch.exp(x)
    x = x.contiguous().to(DEVICE)
    out = torch.empty_like(x)
    _tl_exp_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return (out == torch.exp(x)).cpu()


@pytest.mark.parametrize("cfg", CONFIGS)
def test_near_bound_where_ratio_and_bound_agree(cfg: Config):
    """The tolerance above is only for the ulps the kernel's exp can be off. Where both
    backends provably see the same float32 ratio (the kernel's exp equals torch's on that log-ratio)
    and the same float32 bounds, a token near a bound must be decided identically, ties included
    (r A == clip(r) A in float32 with r just outside the band: half the gradient, as torch.min)."""
    case = make_case(cfg)
    (kres, kgrad), (rres, rgrad) = results(cfg)["triton"], results(cfg)["torch"]
    mask = case["mask"]
    ratio, raw = _ratio(case)
    near = _near(ratio, _edges(cfg, kres, rres)) & mask
    same = near & _kernel_exp_agrees(raw) & (kres.lower == rres.lower) & (kres.upper == rres.upper)
    assert same.sum() > 0.5 * near.sum()
    for name in FLAGS:
        k, r = getattr(kres, name), getattr(rres, name)
        assert torch.equal(k[same], r[same]), f"{name}: {(k[same] != r[same]).sum().item()} tokens differ"
    torch.testing.assert_close(kres.loss[same], rres.loss[same], rtol=LOSS_RTOL, atol=4 * TINY)
    # first the tokens without a float32 tie, then the ties (torch.min / torch.max split them)
    ties = _ties(case, rres, cfg.dual_clip)
    _assert_grad_close(kgrad, rgrad, ratio, case["upstream"], same & ~ties, cfg.dtype)
    assert (same & ties).any()
    _assert_grad_close(kgrad, rgrad, ratio, case["upstream"], same & ties, cfg.dtype, "at float32 ties")


def _ties(case: dict, res, dual_clip: float | None) -> torch.Tensor:
    """Unmasked tokens where r A == clip(r) A in float32 (A != 0), or the dual-clip floor c A
    equals the clipped objective: where torch.min / torch.max pass half the gradient each way.
    The edge rule (upper = +inf where log r <= -log p) is ignored here: no tie there at r > 1/p."""
    mask = case["mask"]
    ratio, _ = _ratio(case)
    adv = case["adv"] if case["adv"].shape == mask.shape else case["adv"].reshape(-1, 1).expand_as(mask)
    adv = torch.where(mask, adv, 0.0)
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, res.lower, res.upper) * adv
    ties = (surr1 == surr2) & (adv != 0) & ((ratio < res.lower) | (ratio > res.upper))
    if dual_clip is not None:
        ties |= (adv < 0) & (dual_clip * adv == torch.min(surr1, surr2))
    return ties & mask
