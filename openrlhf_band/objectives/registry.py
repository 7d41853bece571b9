"""The registry of policy objectives other than PPO's clipped min (verl's registry shape: one entry
is one function plus its options).

An objective's function computes the per-token (or, for a sequence-level objective, per-sequence)
loss, before OpenRLHF's train/rollout IS correction and aggregation, which `ObjectivePolicyLoss`
applies to every objective alike. Each option is a `train_ppo_ray` flag `--actor.<objective>.<name>`,
named after verl's config key, with verl's default; `make_policy_loss(objective, name=...)` takes the
same names.

Function contract (all tensors (B, T) unless said otherwise; masked positions already hold finite
values: the caller replaces them, so that nothing a masked position holds reaches the loss or its
gradient):

    fn(log_probs, old_log_probs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip, **options)
        -> ObjectiveLoss

`log_probs` carries the gradient; `old_log_probs` and `advantages` do not; `mask` is bool. An objective
whose `reads_rollout_log_probs(options)` is true also gets `rollout_log_probs=` (B, T): log mu, the
rollout engine's log-probs of the sampled tokens (vLLM's), without gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import Tensor


class ObjectiveLoss(NamedTuple):
    """What an objective's function returns.

    loss: (B, T) per token (exactly 0 at masked positions), or (B,) per sequence for a
        sequence-level objective; differentiable w.r.t. log_probs.
    clipped: (B, T) bool, the tokens OpenRLHF's `ppo_clip_ratio` counts for this objective (its
        clip, gate or selection; named in the entry's `clip_ratio_means`).
    metrics: name -> (B, T) bool or float tensor; each is logged as `<objective>/<name>`, the mean
        over unmasked tokens (a token share for a bool).
    """

    loss: Tensor
    clipped: Tensor
    metrics: dict[str, Tensor]


@dataclass(frozen=True)
class ObjectiveOption:
    """One option of an objective: keyword and flag `--actor.<objective>.<name>`, verl's key for it
    and verl's default, and the parse-time check (a one-line reason, or None when valid)."""

    name: str
    default: float | str
    verl_key: str  # verl's config key, or the authors' where the objective is not verl's (Objective.code)
    help: str
    check: Callable[[float | str], str | None]
    choices: tuple[str, ...] | None = None

    def parse(self, text: str) -> float | str:
        """The flag's text as the option's value (ValueError with a one-line reason)."""
        if self.choices is not None:
            if text not in self.choices:
                raise ValueError(f"expected one of {', '.join(self.choices)}, got {text!r}")
            return text
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None

    def validate(self, value) -> None:
        problem = self.check(value)
        if problem is not None:
            raise ValueError(f"{self.name} {problem}, got {value!r}")


@dataclass(frozen=True)
class Objective:
    """A registered objective.

    name: `--actor.policy_loss_type NAME` (alias `--loss NAME`).
    function: the loss (the module docstring's contract).
    options: its own options, beyond OpenRLHF's.
    verl_name: the verl 0.9.1 registry name of the same objective (`core_algos.py`), or None where verl has
        none and `code` names the authors' code the options are named after.
    source: the paper.
    sequence_level: the loss is per sequence (aggregated over sequences whatever loss_agg_mode).
    uses_clip_eps: OpenRLHF's --actor.eps_clip / --actor.eps_clip_low_high (verl's clip_ratio_low /
        clip_ratio_high) are the objective's clip values.
    takes_dual_clip: --actor.dual_clip applies (a PPO-style clipped min).
    clip_ratio_means: what OpenRLHF's `ppo_clip_ratio` holds for this objective.
    metric_docs: metric name -> what it is, and verl's metric for it where there is one.
    check_together: a check of the options' values together (a one-line reason, or None).
    code: whose code the options' keys (`ObjectiveOption.verl_key`) and defaults are taken from.
    reads_rollout_log_probs: options -> whether the function reads the sampler's log-probs mu (then it
        gets `rollout_log_probs=`, vLLM is asked for them, and the IS correction is refused: the
        objective's ratio is already against mu).
    """

    name: str
    function: Callable[..., ObjectiveLoss]
    options: tuple[ObjectiveOption, ...]
    verl_name: str | None
    source: str
    sequence_level: bool
    uses_clip_eps: bool
    takes_dual_clip: bool
    clip_ratio_means: str
    metric_docs: dict[str, str] = field(default_factory=dict)
    check_together: Callable[[dict], str | None] | None = None
    code: str = "verl 0.9.1"
    reads_rollout_log_probs: Callable[[dict], bool] = field(default=lambda options: False)

    def option(self, name: str) -> ObjectiveOption:
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(name)

    def resolve_options(self, given: dict) -> dict:
        """`given` checked against the options (unknown names and bad values: ValueError), defaults
        filled in."""
        known = {o.name for o in self.options}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(
                f"{self.name} has no option {unknown[0]!r}; its options: {', '.join(sorted(known)) or 'none'}"
            )
        resolved = {}
        for option in self.options:
            value = given.get(option.name, option.default)
            option.validate(value)
            resolved[option.name] = value
        problem = self.check_together(resolved) if self.check_together is not None else None
        if problem is not None:
            raise ValueError(problem)
        return resolved


OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str, **entry) -> Callable[[Callable[..., ObjectiveLoss]], Callable[..., ObjectiveLoss]]:
    """Decorator: register `function` as the objective `name` with the `Objective` fields `entry`."""

    def register(function: Callable[..., ObjectiveLoss]) -> Callable[..., ObjectiveLoss]:
        if name in OBJECTIVES:
            raise ValueError(f"objective {name!r} is already registered")
        OBJECTIVES[name] = Objective(name=name, function=function, **entry)
        return function

    return register


def get_objective(name: str) -> Objective:
    from openrlhf_band import objectives  # noqa: F401  (registers the built-in objectives)

    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; registered: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def sampler_is_refusal(name: str) -> str:
    """Why an objective whose ratio is against the sampler refuses OpenRLHF's train/rollout IS correction."""
    return (
        f"{name}'s ratio is pi / mu against the sampler's log-probs already: the train/rollout IS correction "
        "(is_correction_level) would weigh its tokens by pi_old / mu a second time"
    )


# ------------------------------------------------------------------------------------------ checks
def positive(value) -> str | None:
    return None if _number(value) and value > 0.0 and math.isfinite(value) else "must be a finite number > 0"


def non_negative(value) -> str | None:
    return None if _number(value) and value >= 0.0 and math.isfinite(value) else "must be a finite number >= 0"


def share(value) -> str | None:
    return None if _number(value) and 0.0 < value <= 1.0 else "must be a share in (0, 1]"


def one_of(choices: tuple[str, ...]) -> Callable[[object], str | None]:
    """The check of an option whose value is one of `choices`."""
    return lambda value: None if value in choices else f"must be one of {', '.join(choices)}"


def finite(value) -> str | None:
    return None if _number(value) and math.isfinite(value) else "must be a finite number"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
