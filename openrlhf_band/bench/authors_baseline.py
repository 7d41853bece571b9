"""Re-implementation of the BandPO authors' band-bound computation, kept as a benchmark baseline.

This module reproduces, in plain PyTorch, the algorithm the BandPO authors (arXiv 2603.04918)
use to map a per-token f-divergence trust region onto ratio-clip bounds. Source read:
repository ``OpenMOSS/BandPO`` (commit d2a0503b865c7d1e80af79b47bdab8d09a92eeed), files

* ``RLtraining/verl/verl/bandpo/band/band.py`` (the ``band`` dispatcher), and
* ``RLtraining/verl/verl/bandpo/band/solver.py`` (``universal_bisection_solver``),

as called from ``RLtraining/verl/verl/trainer/ppo/core_algos.py`` (relax off, ``MIN_LOGP=-700``).

It exists ONLY as a baseline for speed/accuracy benchmarks. It is not this project's operator and
must not be used for training. Its behaviour, quirks included, follows the authors' code:

* log-probs are clamped to ``[-700, 0]`` and ``p = exp(logp)`` (in fp32 here, so ``p`` underflows
  to 0 below about -104, which makes the upper bracket ``1/p`` infinite for those entries);
* ``kl`` is solved numerically by two bisections over the whole tensor: upper root in
  ``[1, 1/p]``, lower root in ``[0, 1]``, at most ``num_steps`` steps each; after every step the
  bracket width is reduced with ``.max().item()`` (a host synchronisation) and the loop stops once
  it is ``<= tol``; the root is the bracket midpoint;
* ``g_f(p, r) = p f(r) + (1 - p) f(c)``, ``c = (1 - r p)/(1 - p)``, is evaluated with ``r`` and
  ``c`` clamped below at ``1e-12``;
* simplex saturation is tested by evaluating that clamped ``g_f`` at ``r = 1/p`` and ``r = 0``
  (so the clamp decides it for kl: e.g. the kl lower bound is reported as 0 for p below ~1.9e-3);
* ``tv`` and ``chi2`` use the authors' closed forms ``1 -+ delta/p`` and
  ``1 -+ sqrt(delta (1 - p)/p)``, clipped to ``[0, 1/p]`` (the authors bisect only for kl;
  :func:`authors_bisection_solver` runs their bisection for any of the three if needed);
* limit overrides: ``p > 1 - 1e-6`` gives ``[r*, 1]`` with ``r* = exp(-delta)`` (kl),
  ``max(1 - delta, 0)`` (tv), ``1`` (chi2); ``p < 1e-6`` gives ``[0, 1/max(p, 1e-12)]`` for every
  divergence;
* finally ``lower`` is clamped to ``[0, 1]`` and ``upper`` to ``[1, upper_cap]`` (the authors'
  ``upper_bound_max``, 10 in their runs; ``None`` here means no cap).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["authors_band_bounds", "authors_bisection_solver"]

_MIN_LOGP = -700.0  # the authors' clamp on old log-probs
_G_EPS = 1e-12  # the authors' clamp on r and c inside g_f
_LIMIT_EPS = 1e-6  # the authors' thresholds for the p -> 0 and p -> 1 overrides
_P_FLOOR = 1e-12  # the authors' floor on p in the p -> 0 override 1/p


def _f_kl(u: torch.Tensor) -> torch.Tensor:
    """KL generator ``f(u) = -log u + u - 1`` (elementwise, any shape)."""
    return -torch.log(u) + u - 1.0


def _f_tv(u: torch.Tensor) -> torch.Tensor:
    """Total-variation generator ``f(u) = |u - 1| / 2`` (elementwise, any shape)."""
    return 0.5 * torch.abs(u - 1.0)


def _f_chi2(u: torch.Tensor) -> torch.Tensor:
    """Pearson chi^2 generator ``f(u) = (u - 1)^2`` (elementwise, any shape)."""
    return (u - 1.0) ** 2


# name -> (generator, lower limit r* as p -> 1, whether the authors use a closed form)
_DIVERGENCES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[float], float], bool]] = {
    "kl": (_f_kl, lambda d: math.exp(-d), False),
    "tv": (_f_tv, lambda d: max(1.0 - d, 0.0), True),
    "chi2": (_f_chi2, lambda d: 1.0, True),
}


def _canonical(divergence: str) -> str:
    """Map ``kl``/``bandkl`` etc. to the keys of ``_DIVERGENCES``; raise on anything else."""
    name = divergence.lower()
    if name.startswith("band"):
        name = name[len("band") :]
    if name not in _DIVERGENCES:
        raise ValueError(f"unsupported divergence {divergence!r}; expected one of {sorted(_DIVERGENCES)}")
    return name


def _g_clamped(p: torch.Tensor, r: torch.Tensor, f: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The authors' ``g_f(p, r)`` with ``r`` and ``c`` clamped below at 1e-12.

    Args:
        p: old probabilities, shape ``S``.
        r: ratios, shape ``S`` (broadcastable).

    Returns:
        ``p f(r) + (1 - p) f(c)``, shape ``S``.
    """
    c = (1.0 - r * p) / (1.0 - p)
    return p * f(torch.clamp(r, min=_G_EPS)) + (1.0 - p) * f(torch.clamp(c, min=_G_EPS))


@torch.no_grad()
def authors_bisection_solver(
    p: torch.Tensor,
    delta: float,
    divergence: str = "kl",
    num_steps: int = 50,
    tol: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' ``universal_bisection_solver``: saturation test plus two bisections.

    No limit overrides and no final clamps are applied here (see :func:`authors_band_bounds`).

    Args:
        p: old probabilities in ``(0, 1]``, any shape ``S``; computed in ``p.dtype``.
        delta: trust-region radius.
        divergence: ``"kl"``, ``"tv"`` or ``"chi2"`` (a ``"band"`` prefix is accepted).
        num_steps: maximum bisection steps per root.
        tol: the loop for a root stops once ``max(hi - lo) <= tol`` (checked on the host each step).

    Returns:
        ``(lower, upper)``, each of shape ``S`` and dtype ``p.dtype``.
    """
    f = _DIVERGENCES[_canonical(divergence)][0]

    r_max = 1.0 / p
    upper_sat = _g_clamped(p, r_max, f) <= delta
    lower_sat = _g_clamped(p, torch.zeros_like(p), f) <= delta

    # upper root: g increases on [1, 1/p]
    lo = torch.ones_like(p)
    hi = r_max
    for _ in range(num_steps):
        mid = 0.5 * (lo + hi)
        below = _g_clamped(p, mid, f) < delta
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
        if (hi - lo).max().item() <= tol:  # host sync every step, as in the authors' code
            break
    upper = torch.where(upper_sat, r_max, 0.5 * (lo + hi))

    # lower root: g decreases on [0, 1]
    lo = torch.zeros_like(p)
    hi = torch.ones_like(p)
    for _ in range(num_steps):
        mid = 0.5 * (lo + hi)
        below = _g_clamped(p, mid, f) < delta
        hi = torch.where(below, mid, hi)
        lo = torch.where(below, lo, mid)
        if (hi - lo).max().item() <= tol:
            break
    lower = torch.where(lower_sat, torch.zeros_like(p), 0.5 * (lo + hi))

    return lower, upper


@torch.no_grad()
def authors_band_bounds(
    old_log_probs: torch.Tensor,
    divergence: str = "kl",
    delta: float = 0.05,
    upper_cap: float | None = None,
    num_steps: int = 50,
    tol: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token band ratio bounds exactly as the BandPO authors compute them (relax off).

    Args:
        old_log_probs: log pi_old of the sampled tokens, any shape ``S`` (e.g. ``(batch, seq_len)``);
            cast to fp32 before anything else.
        divergence: ``"kl"`` (bisection), ``"tv"`` or ``"chi2"`` (closed forms); a ``"band"`` prefix
            (the authors' spelling, e.g. ``"bandkl"``) is accepted.
        delta: trust-region radius.
        upper_cap: the authors' ``upper_bound_max`` applied last (10 in their runs); ``None``: no cap.
        num_steps: maximum bisection steps per root (kl only).
        tol: bracket-width tolerance of the per-step host-synchronising early-exit check (kl only).

    Returns:
        ``(lower, upper)`` ratio bounds, each of shape ``S``, fp32, no grad.
    """
    name = _canonical(divergence)
    _, r_star_fn, closed_form = _DIVERGENCES[name]

    lp = torch.clamp(old_log_probs.detach().to(torch.float32), _MIN_LOGP, 0.0)
    p = torch.exp(lp)

    if closed_form:
        half_width = delta / p if name == "tv" else torch.sqrt(delta * (1.0 - p) / p)
        upper = torch.clamp(1.0 + half_width, max=1.0 / p)
        lower = torch.clamp(1.0 - half_width, min=0.0)
    else:
        lower, upper = authors_bisection_solver(p, delta, name, num_steps=num_steps, tol=tol)

    near_one = p > 1.0 - _LIMIT_EPS
    upper = torch.where(near_one, torch.ones_like(p), upper)
    lower = torch.where(near_one, torch.full_like(p, r_star_fn(delta)), lower)

    near_zero = p < _LIMIT_EPS
    upper = torch.where(near_zero, 1.0 / torch.clamp(p, min=_P_FLOOR), upper)
    lower = torch.where(near_zero, torch.zeros_like(p), lower)

    lower = torch.clamp(lower, min=0.0, max=1.0)
    upper = torch.clamp(upper, min=1.0) if upper_cap is None else torch.clamp(upper, min=1.0, max=upper_cap)
    return lower, upper
