"""Look before you train: the band next to fixed clipping, as a table or a plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from openrlhf_band.band.bounds import band_bounds
from openrlhf_band.band.divergences import DIVERGENCES

#: Fixed-clip intervals shown for comparison: PPO/GRPO eps 0.2 and Clip-Higher 0.2 / 0.28.
FIXED_CLIPS: dict[str, tuple[float, float]] = {"clip 0.2": (0.8, 1.2), "clip-higher 0.2/0.28": (0.8, 1.28)}


def bounds_rows(
    probs: Sequence[float],
    divergence: str = "kl",
    delta: float = 0.05,
    upper_cap: float | None = None,
) -> list[tuple[float, ...]]:
    """Per old probability p: (p, r_low, r_up, the band's largest new probability q = min(r_up * p, 1),
    then each fixed clip's (`FIXED_CLIPS`, in order)). `bounds_table` prints them; docs render them.

    Args:
        probs: old probabilities in (0, 1].
    """
    for p in probs:
        if not 0.0 < p <= 1.0:
            raise ValueError(f"probabilities must lie in (0, 1], got {p!r}")
    log_p = torch.tensor([math.log(p) for p in probs], dtype=torch.float64)
    lower, upper = band_bounds(log_p, divergence, delta, upper_cap=upper_cap)
    return [
        (p, lo, up, min(up * p, 1.0), *(min(high * p, 1.0) for _, high in FIXED_CLIPS.values()))
        for p, lo, up in zip(probs, lower.tolist(), upper.tolist())
    ]


def bounds_table(
    probs: Sequence[float],
    divergence: str = "kl",
    delta: float = 0.05,
    upper_cap: float | None = None,
) -> str:
    """A plain-text table of `bounds_rows`: per old probability p, the band [r_low, r_up] and the largest
    new probability q = min(r * p, 1) that the band and each fixed clip allow.

    Args:
        probs: old probabilities in (0, 1].
    """
    header = ["p", "band r_low", "band r_up", "band max q"] + [f"{n} max q" for n in FIXED_CLIPS]
    rows = [[f"{v:.6g}" for v in row] for row in bounds_rows(probs, divergence, delta, upper_cap)]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    cap = f", upper_cap={upper_cap:g}" if upper_cap is not None else ""
    lines = [f"band: divergence={divergence}, delta={delta:g}{cap}   (q = new probability = r * p)"]
    lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def plot_bounds(
    path: str,
    delta: float = 0.05,
    divergences: Sequence[str] = DIVERGENCES,
    upper_cap: float | None = None,
) -> str:
    """Draw r_up (top, log scale) and r_low (bottom) against p (log axis) for each divergence,
    with the fixed clips and the simplex edge r = 1/p. Writes a PNG to `path` and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log_p = torch.linspace(math.log(1e-6), 0.0, 600, dtype=torch.float64)
    p = log_p.exp().numpy()
    fig, (ax_up, ax_low) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    for name in divergences:
        lower, upper = band_bounds(log_p, name, delta, upper_cap=upper_cap)
        ax_up.plot(p, upper.numpy(), label=name)
        ax_low.plot(p, lower.numpy(), label=name)
    ax_up.plot(p, 1.0 / p, "k:", lw=1, label="simplex edge 1/p")
    for (label, (lo, hi)), style in zip(FIXED_CLIPS.items(), ["--", "-."]):
        ax_up.axhline(hi, color="grey", ls=style, lw=1, label=label)
        ax_low.axhline(lo, color="grey", ls=style, lw=1, label=label if style == "--" else None)
    ax_up.set_xscale("log")
    ax_up.set_yscale("log")
    ax_up.set_ylim(0.9, max(1e3, upper_cap or 0.0))
    ax_up.set_ylabel("upper bound r_up")
    ax_up.set_title(f"Band bounds vs old probability p (delta = {delta:g})")
    ax_low.set_ylabel("lower bound r_low")
    ax_low.set_xlabel("old probability p")
    ax_low.set_ylim(-0.02, 1.02)
    for ax in (ax_up, ax_low):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
