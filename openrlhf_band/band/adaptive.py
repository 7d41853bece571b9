"""Adaptive radii for the Band: a radius per token from the policy's entropy, and a controller that
moves the base radius over training toward a target entropy.

Entropy rule (per token t, no gradient):

    delta_t = clamp(delta * (H_t / H_mean) ** alpha, delta_low, delta_high)

H_t is the entropy (nats) of the policy's next-token distribution at t, H_mean a token-weighted
mean entropy (which tokens: see `BandPolicyLoss`), alpha >= 0 the power (alpha = 0: delta_t =
delta exactly). Tokens where the policy is surer than average get a tighter trust region, uncertain
ones a looser one: the direction the BandPO paper names first.

Controller (after each optimizer step, from that step's mean entropy H over all its tokens):

    delta <- clamp(delta * exp(rate * clip(H / H_target - 1, -0.2, 0.2)), delta_low, delta_high)

in the spirit of OpenRLHF's adaptive KL controller (a proportional error, clipped, applied
multiplicatively). The sign is the trust region's: entropy below the target means the policy is
collapsing faster than wanted, so the radius, the size of each step, shrinks; entropy above it lets
the steps grow. At most a factor e^(0.2 rate) per optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from openrlhf_band.band.bounds import PER_TOKEN_DELTA_RANGE
from openrlhf_band.band.divergences import get_divergence
from openrlhf_band.band.spec import is_positive_finite_number, is_real_number

ADAPTIVE_RULES = ("none", "entropy")
CONTROLLER_ERROR_CLIP = 0.2
# Defaults (docs/training.md, the adaptive radius): alpha = 1 (the radius proportional to the relative entropy),
# radii within a factor 4 of the base radius, the controller's step at most e^(0.2 x 0.1) = 2% per
# optimizer step.
DEFAULT_ENTROPY_POWER = 1.0
DEFAULT_RANGE_FACTOR = 4.0
DEFAULT_CONTROLLER_RATE = 0.1


def default_delta_range(delta: float) -> tuple[float, float]:
    """[delta / 4, 4 delta] (capped at 1, the top of the operator's tested range; delta itself if larger)."""
    return float(delta) / DEFAULT_RANGE_FACTOR, min(float(delta) * DEFAULT_RANGE_FACTOR, max(1.0, float(delta)))


def validate_adaptive(
    delta: float,
    adaptive: str,
    entropy_power: float,
    delta_range: tuple[float, float],
    target_entropy: float | None,
    controller_rate: float,
    divergence: str | None = None,
) -> None:
    """ValueError for an unknown rule, alpha < 0, a range that is not 0 < low <= delta <= high < inf,
    a target entropy or rate that is not a positive finite number, or (given the divergence) an
    entropy rule whose per-token radii could leave the range where the kl / reverse_kl per-token
    solver is exact (`PER_TOKEN_DELTA_RANGE`: its tokens would get nan bounds)."""
    if adaptive not in ADAPTIVE_RULES:
        raise ValueError(f"adaptive must be one of {', '.join(ADAPTIVE_RULES)}, got {adaptive!r}")
    if not (is_real_number(entropy_power) and math.isfinite(entropy_power) and entropy_power >= 0):
        raise ValueError(f"entropy_power (alpha) must be a finite number >= 0, got {entropy_power!r}")
    ok = isinstance(delta_range, (tuple, list)) and len(delta_range) == 2
    ok = ok and all(is_real_number(v) and math.isfinite(v) for v in delta_range)
    if not ok or not 0 < delta_range[0] <= delta_range[1]:
        raise ValueError(f"delta_range must be two finite numbers 0 < LOW <= HIGH, got {delta_range!r}")
    if not delta_range[0] <= delta <= delta_range[1]:
        raise ValueError(f"delta {delta!r} must lie in delta_range [{delta_range[0]!r}, {delta_range[1]!r}]")
    if adaptive == "entropy" and divergence is not None and per_token_start_table_exists(divergence):
        low, high = PER_TOKEN_DELTA_RANGE
        if not (low <= delta_range[0] and delta_range[1] <= high):
            raise ValueError(
                f"delta_range [{delta_range[0]!r}, {delta_range[1]!r}] leaves [1e-8, {high:g}], the per-token "
                f"radii the {divergence} band is exact for: pass --actor.band.delta_range LOW HIGH inside it"
            )
    if target_entropy is not None and not is_positive_finite_number(target_entropy):
        raise ValueError(f"target_entropy must be a positive finite number (nats), got {target_entropy!r}")
    if not is_positive_finite_number(controller_rate):
        raise ValueError(f"controller_rate must be a positive finite number, got {controller_rate!r}")


def per_token_start_table_exists(divergence: str) -> bool:
    """Whether a per-token radius of this divergence goes through the start-table solver (kl,
    reverse_kl), whose radii are limited to PER_TOKEN_DELTA_RANGE."""
    div = get_divergence(divergence)
    return div.closed_form is None and (div.tabulate or div.edge_inverse is not None)


@torch.no_grad()
def entropy_adaptive_delta(
    delta: float, entropy: Tensor, mean_entropy: Tensor | float, power: float, delta_range: tuple[float, float]
) -> Tensor:
    """delta_t = clamp(delta * (H_t / H_mean) ** power, low, high), float32, entropy's shape.

    A zero entropy (a one-hot policy) gives delta_low for power > 0; a zero or non-finite mean
    gives delta itself (no information to scale by); power = 0 gives delta exactly."""
    h = entropy.detach().float().clamp(min=0.0)
    mean = torch.as_tensor(mean_entropy, dtype=torch.float32, device=h.device)
    if power == 0:
        return torch.full_like(h, float(delta))
    usable = torch.isfinite(mean) & (mean > 0)
    relative = torch.where(usable, h / torch.where(usable, mean, 1.0), 1.0)
    return (float(delta) * relative.pow(float(power))).clamp(float(delta_range[0]), float(delta_range[1]))


@dataclass
class RadiusController:
    """The base radius, moved after each optimizer step toward the one that keeps the mean entropy at
    `target_entropy` (module docstring). `state_dict` / `load_state_dict` for checkpoints."""

    delta: float
    target_entropy: float
    rate: float
    delta_range: tuple[float, float]
    steps: int = 0

    def update(self, mean_entropy: float) -> float:
        if math.isfinite(mean_entropy):
            error = min(max(mean_entropy / self.target_entropy - 1.0, -CONTROLLER_ERROR_CLIP), CONTROLLER_ERROR_CLIP)
            low, high = self.delta_range
            self.delta = min(max(self.delta * math.exp(self.rate * error), low), high)
        self.steps += 1
        return self.delta

    def state_dict(self) -> dict:
        return {"delta": self.delta, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.delta, self.steps = float(state["delta"]), int(state["steps"])


class AdaptiveRadius:
    """The adaptive radius over training (module docstring): the radius each forward uses, the
    entropy the current optimizer step has seen, the previous step's mean entropy (the entropy
    rule's normaliser) and the controller. One per loss; `state_dict` / `load_state_dict` carry it
    through checkpoints.

    A step's mean entropy is token-weighted over all its micro-batches (and, through the caller's
    all-reduce of `take_step_totals`, all ranks): one normaliser for every token of the next step,
    whichever micro-batch or rank it lands in. Before the first step the rule uses the micro-batch's
    own mean. Validated when built (`validate_adaptive`); `delta_range` defaults to
    `default_delta_range(delta)`.
    """

    def __init__(
        self,
        delta: float,
        adaptive: str = "none",
        entropy_power: float = DEFAULT_ENTROPY_POWER,
        delta_range: tuple[float, float] | None = None,
        target_entropy: float | None = None,
        controller_rate: float = DEFAULT_CONTROLLER_RATE,
        divergence: str | None = None,
    ) -> None:
        delta_range = tuple(delta_range) if delta_range is not None else default_delta_range(delta)
        validate_adaptive(delta, adaptive, entropy_power, delta_range, target_entropy, controller_rate, divergence)
        self.delta, self.adaptive, self.entropy_power = float(delta), adaptive, float(entropy_power)
        self.delta_range = delta_range
        self.controller = (
            RadiusController(float(delta), float(target_entropy), float(controller_rate), delta_range)
            if target_entropy is not None
            else None
        )
        self.previous_entropy_mean: float | None = None
        self._entropy_sum = self._entropy_count = 0.0  # over the micro-batches of the current optimizer step

    @property
    def needs_entropy(self) -> bool:
        """Whether `radius` needs the entropy: the entropy rule, or the controller (its signal)."""
        return self.adaptive == "entropy" or self.controller is not None

    def radius(self, entropy: Tensor | None, action_mask: Tensor | None) -> tuple[float | Tensor, dict[str, Tensor]]:
        """This forward's radius (a float, or a per-token float32 tensor of entropy's shape (B, T)
        for the entropy rule) and the entropy metrics (`band/entropy_mean`,
        `band/controller_delta`); accumulates the entropy (nats, detached) for the step's mean."""
        base = self.controller.delta if self.controller is not None else self.delta
        if not self.needs_entropy:
            return base, {}
        if entropy is None:
            raise ValueError("this BandPolicyLoss adapts its radius to the entropy: pass forward(..., entropy=H)")
        h = entropy.detach().float()
        mask = torch.ones_like(h, dtype=torch.bool) if action_mask is None else action_mask != 0
        h_sum, count = torch.where(mask, h, 0.0).sum(), mask.sum()
        # accumulated on the device: no host sync per micro-batch, one per optimizer step
        self._entropy_sum = self._entropy_sum + h_sum.double()
        self._entropy_count = self._entropy_count + count.double()
        local_mean = (h_sum / count.clamp(min=1)).float()
        metrics = {"band/entropy_mean": local_mean}
        if self.controller is not None:
            metrics["band/controller_delta"] = torch.tensor(base, dtype=torch.float32, device=h.device)
        if self.adaptive != "entropy" or self.entropy_power == 0:  # power 0: the constant radius, exactly
            return base, metrics
        # before the first optimizer step there is no previous mean: this micro-batch's own
        mean = local_mean if self.previous_entropy_mean is None else self.previous_entropy_mean
        deltas = entropy_adaptive_delta(base, torch.where(mask, h, 0.0), mean, self.entropy_power, self.delta_range)
        return deltas, metrics

    def take_step_totals(self) -> Tensor:
        """The current step's (entropy sum, token count) as a float64 tensor of shape (2,), for the
        caller to all-reduce across ranks; the accumulators restart at 0."""
        totals = torch.stack([torch.as_tensor(self._entropy_sum, dtype=torch.float64),
                              torch.as_tensor(self._entropy_count, dtype=torch.float64)])  # fmt: skip
        self._entropy_sum = self._entropy_count = 0.0
        return totals

    def close_step(self, entropy_sum: float, token_count: float) -> None:
        """End an optimizer step with its totals over all ranks: its mean entropy becomes the next
        step's normaliser and the controller moves the radius. A step without tokens changes nothing."""
        if token_count == 0:
            return
        mean = entropy_sum / token_count
        self.previous_entropy_mean = mean
        if self.controller is not None:
            self.controller.update(mean)

    def state_dict(self) -> dict:
        """What a checkpoint must carry to resume the adaptive radius exactly."""
        state = {"previous_entropy_mean": self.previous_entropy_mean}
        if self.controller is not None:
            state["controller"] = self.controller.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.previous_entropy_mean = state.get("previous_entropy_mean")
        if self.controller is not None and "controller" in state:
            self.controller.load_state_dict(state["controller"])

