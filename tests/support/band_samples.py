"""Sample points shared by the operator's and the kernel's oracle tests."""

from __future__ import annotations

import math
import random


def whole_range_pairs(n: int, seed: int) -> list[tuple[float, float]]:
    """(log p, delta) over the per-token solver's whole range: delta log-uniform over [1e-8, 10], p
    log-uniform down to 1e-30, 1 - p down to 1e-12, and p just above reverse_kl's lower saturation
    edge 1 - e^-delta (within a factor 1 + 1e-6 .. 2) and just below its upper edge e^-delta."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        delta = 10 ** rng.uniform(-8, 1)
        kind = i % 4
        if kind == 0:
            log_p = math.log(10 ** rng.uniform(-30, math.log10(0.5)))
        elif kind == 1:
            log_p = math.log1p(-(10 ** rng.uniform(-12, math.log10(0.5))))
        elif kind == 2:  # just above the lower edge p = 1 - e^-delta
            p = -math.expm1(-delta) * (1 + 10 ** rng.uniform(-6, 0))
            log_p = math.log(min(p, 0.999))
        else:  # just inside the upper edge p = e^-delta (unsaturated side: p < e^-delta)
            log_p = -delta * (1 + 10 ** rng.uniform(-6, 0))
        pairs.append((log_p, delta))
    return pairs
