"""verl 0.9.1's released policy objectives (`compute_policy_loss_cispo`, `_sapo`, `_geo_mean`,
`_clip_cov`, `_kl_cov`, `_gpg`), run from the installed wheel itself, as ground truth for
`openrlhf_band.objectives` (tests/objectives/test_verl_objectives.py).

As in `verl_dppo` (whose loader this module reuses): importing `verl.trainer.ppo.core_algos` needs
omegaconf, ray and more, none of which this venv has, so the functions' source is read from
`.venv/ground-truth/verl-0.9.1` with `ast` (the `@register_policy_loss(...)` decorator dropped) and
`exec`'d in a namespace holding only the names their bodies use. Nothing of verl's code is copied
into this repository.

The namespace's stand-ins, for what the bodies read:

* `ActorConfig`: cispo and sapo `assert isinstance(config, ActorConfig)`; the config object
  (`VerlActorConfig`) is an instance of it. It carries `clip_ratio` / `clip_ratio_low` /
  `clip_ratio_high`, `tau_pos` / `tau_neg` (SAPO), `policy_loss.<key>` (Clip-Cov's clip_cov_ratio /
  clip_cov_lb / clip_cov_ub, KL-Cov's kl_cov_ratio / ppo_kl_coef) and `global_batch_info` (agg_loss's
  keyword arguments dp_size, batch_num_tokens, global_batch_size).
* `AlgoConfig`: a distinct class (clip_cov, kl_cov and geo_mean assert the config is not one).
* `agg_loss`: verl's own agg_loss, wrapped so that each call records its `loss_mat`, `loss_mask` and
  `loss_agg_mode` (`RECORDER`): verl's per-token loss matrix, before aggregation. geo_mean does not
  call agg_loss (it averages its per-sequence losses with torch.mean), so it records nothing.

`run_verl` calls one of them with OpenRLHF-style arguments (`token_level_loss`, `clip_eps_low` /
`clip_eps_high`, `dp_size` / `batch_num_tokens` / `global_batch_size`, the objective's options) and
returns the loss, its gradient w.r.t. the new log-probs, verl's metrics and the recorded matrix (also
still attached to the new log-probs, so that another aggregation of verl's own per-token losses can be
differentiated).

`rollout_batch` draws rollout-like float32 batches (old log-probs of tokens sampled from a softmax
policy, new log-probs from perturbed logits, vLLM log-probs from slightly different logits,
variable lengths, GRPO or per-token advantages); `draw_policies`, its first draws (the old policy, the
sampled tokens, the new policy), is also test_dppo_verl's. `load_or_fail` is both tests' `verl` fixture:
a missing wheel fails the test, never skips it.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

import pytest
import torch
from verl_dppo import (
    CORE_ALGOS,
    VERL_ROOT,
    VERL_VERSION,
    AlgoConfig,
    VerlGroundTruthMissing,
    _exec_functions,
    checked_version,
    load_functional,
)

__all__ = [
    "VERL_VERSION",
    "AlgoConfig",
    "ActorConfig",
    "VerlActorConfig",
    "VerlGroundTruthMissing",
    "POLICY_LOSSES",
    "RECORDER",
    "load",
    "load_or_fail",
    "run_verl",
    "rollout_batch",
    "draw_policies",
]

# our objective name -> verl 0.9.1's function
POLICY_LOSSES = {
    "cispo": "compute_policy_loss_cispo",
    "sapo": "compute_policy_loss_sapo",
    "gmpo": "compute_policy_loss_geo_mean",
    "clip_cov": "compute_policy_loss_clip_cov",
    "kl_cov": "compute_policy_loss_kl_cov",
    "gpg": "compute_policy_loss_gpg",
}
# OpenRLHF's token_level_loss -> verl's loss_agg_mode
AGG_MODES = {True: "token-mean", False: "seq-mean-token-mean"}
# the options that verl reads from config.policy_loss (the rest are ActorConfig attributes)
POLICY_LOSS_KEYS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")
T = TypeVar("T")


class ActorConfig:
    """Stand-in for verl.workers.config.ActorConfig, the class cispo and sapo assert."""


@dataclass
class VerlActorConfig(ActorConfig):
    """The part of verl's ActorConfig the five objectives read. `policy_loss` keys left None take the
    function's own fallback (e.g. kl_cov's ppo_kl_coef 1.0)."""

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    policy_loss: types.SimpleNamespace = field(
        default_factory=lambda: types.SimpleNamespace(**dict.fromkeys(POLICY_LOSS_KEYS))
    )
    global_batch_info: dict = field(default_factory=dict)


@dataclass
class Recorder:
    """What the last agg_loss call received (verl's per-token loss matrix, its mask and mode)."""

    calls: list = field(default_factory=list)

    def clear(self) -> None:
        self.calls.clear()

    @property
    def last(self):
        return self.calls[-1] if self.calls else None


RECORDER = Recorder()


@functools.cache
def load(root: Path = VERL_ROOT) -> types.SimpleNamespace:
    """verl 0.9.1's six objectives (keyed by our names), its agg_loss (unwrapped), masked_sum and
    masked_mean, from the wheel installed at `root`. VerlGroundTruthMissing (saying to run `make
    venv`) when the wheel is missing or not verl 0.9.1."""
    version = checked_version(root)
    verl_F = load_functional(root)
    namespace = {
        "torch": torch,
        "Optional": Optional,
        "Any": Any,
        "verl_F": verl_F,
        "AlgoConfig": AlgoConfig,
        "ActorConfig": ActorConfig,
    }
    _exec_functions(root / CORE_ALGOS, ["agg_loss", *POLICY_LOSSES.values()], namespace)
    agg_loss = namespace["agg_loss"]

    def recording_agg_loss(loss_mat, loss_mask, loss_agg_mode, **kwargs):
        RECORDER.calls.append(
            types.SimpleNamespace(loss_mat=loss_mat.detach().clone(), graph=loss_mat, loss_mask=loss_mask,
                                  mode=loss_agg_mode, kwargs=dict(kwargs))
        )  # fmt: skip
        return agg_loss(loss_mat, loss_mask, loss_agg_mode, **kwargs)

    namespace["agg_loss"] = recording_agg_loss  # the bodies look agg_loss up in this namespace when called
    return types.SimpleNamespace(
        version=version,
        root=root,
        losses={ours: namespace[name] for ours, name in POLICY_LOSSES.items()},
        agg_loss=agg_loss,
        masked_sum=verl_F.masked_sum,
        masked_mean=verl_F.masked_mean,
    )


def load_or_fail(load: Callable[[], T]) -> T:
    """`load()` (verl_dppo.load or this module's load), or the calling test fails, never skips, with the
    VerlGroundTruthMissing message (which says to run `make venv`): a test that cannot run must fail."""
    try:
        return load()
    except VerlGroundTruthMissing as err:
        pytest.fail(str(err))


def verl_config(
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dp_size: int = 1,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
    **options,
) -> VerlActorConfig:
    """verl's config for OpenRLHF-style arguments: clip_eps_low / clip_eps_high are clip_ratio_low /
    clip_ratio_high (clip_ratio, verl's symmetric fallback, is never read then); the global counts are
    `global_batch_info` (only those given: verl's agg_loss takes the micro-batch's otherwise); tau_pos /
    tau_neg are ActorConfig attributes, the Clip-Cov / KL-Cov options `policy_loss.<key>`."""
    info = {"dp_size": dp_size}
    if batch_num_tokens is not None:
        info["batch_num_tokens"] = batch_num_tokens
    if global_batch_size is not None:
        info["global_batch_size"] = global_batch_size
    config = VerlActorConfig(clip_ratio_low=clip_eps_low, clip_ratio_high=clip_eps_high, global_batch_info=info)
    for key, value in options.items():
        if key in POLICY_LOSS_KEYS:
            setattr(config.policy_loss, key, value)
        elif key in ("tau_pos", "tau_neg"):
            setattr(config, key, value)
        else:
            raise KeyError(f"verl's objectives read no option {key!r}")
    return config


@dataclass
class VerlResult:
    loss: torch.Tensor  # the aggregated loss (detached)
    grad: torch.Tensor  # its gradient w.r.t. the new log-probs, (B, T)
    metrics: dict  # verl's pg_metrics
    loss_mat: torch.Tensor | None  # the per-token matrix verl's agg_loss received (None for geo_mean)
    agg_mode: str | None  # the loss_agg_mode verl's agg_loss received
    log_prob: torch.Tensor | None = None  # the leaf the gradient is taken w.r.t.
    loss_mat_graph: torch.Tensor | None = None  # loss_mat still attached to log_prob (its graph retained)


def run_verl(
    verl,
    name: str,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    token_level_loss: bool = True,
    rollout_is_weights: torch.Tensor | None = None,
    seed: int | None = None,
    **arguments,
) -> VerlResult:
    """verl's objective `name` (our name: cispo, sapo, gmpo, clip_cov, kl_cov) on OpenRLHF-style
    arguments: advantages (B, T) or per sequence (B, 1), broadcast to (B, T) as verl needs them;
    token_level_loss -> loss_agg_mode; `arguments` as `verl_config`'s. `seed`: torch.manual_seed(seed)
    right before the call (Clip-Cov's randperm draws from torch's default CPU generator)."""
    config = verl_config(**arguments)
    log_prob = log_probs.detach().clone().requires_grad_(True)
    advantages = advantages.expand(log_probs.shape)
    RECORDER.clear()
    if seed is not None:
        torch.manual_seed(seed)
    loss, metrics = verl.losses[name](
        old_log_probs, log_prob, advantages, action_mask, AGG_MODES[token_level_loss], config, rollout_is_weights
    )
    (grad,) = torch.autograd.grad(loss, log_prob, retain_graph=True)
    record = RECORDER.last
    return VerlResult(
        loss=loss.detach(),
        grad=grad,
        metrics=metrics,
        loss_mat=None if record is None else record.loss_mat,
        agg_mode=None if record is None else record.mode,
        log_prob=log_prob,
        loss_mat_graph=None if record is None else record.graph,
    )


def draw_policies(
    gen: torch.Generator,
    batch: int,
    length: int,
    vocab: int,
    *,
    max_temperature: float,
    max_boost: float,
    sigmas: tuple[float, ...],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The old policy, its sampled tokens and a perturbed new policy of a rollout-like batch, drawn from
    `gen` in one fixed order (the rollout batches here and in test_dppo_verl draw the rest after these).

    Old policy: log_softmax of N(0, s^2) logits, a per-sequence temperature s log-uniform in
    [0.3, max_temperature], and on 30% of the positions one token boosted by U(0, max_boost) (confident
    tokens); the sampled token is drawn from the old policy (2% uniformly: rare tokens). New policy: the
    logits plus sigma N(0, 1), sigma per sequence drawn uniformly from `sigmas`.

    Returns (logits, old_all, new_all, tokens): the old policy's logits and both policies' log-probs,
    float32 (batch, length, vocab), and the sampled token ids, int64 (batch, length).
    """
    scale = torch.empty(batch, 1, 1).uniform_(math.log(0.3), math.log(max_temperature), generator=gen).exp()
    logits = torch.randn(batch, length, vocab, generator=gen) * scale
    boost = (torch.rand(batch, length, 1, generator=gen) < 0.3) * torch.empty(batch, length, 1).uniform_(
        0, max_boost, generator=gen
    )
    logits.scatter_add_(-1, torch.randint(0, vocab, (batch, length, 1), generator=gen), boost)
    old_all = torch.log_softmax(logits, dim=-1)
    tokens = torch.multinomial(old_all.exp().view(-1, vocab), 1, generator=gen).view(batch, length)
    uniform = torch.randint(0, vocab, (batch, length), generator=gen)
    tokens = torch.where(torch.rand(batch, length, generator=gen) < 0.02, uniform, tokens)
    pick = torch.randint(0, len(sigmas), (batch,), generator=gen)
    sigma = torch.tensor(sigmas)[pick].view(batch, 1, 1)
    new_all = torch.log_softmax(logits + sigma * torch.randn(batch, length, vocab, generator=gen), dim=-1)
    return logits, old_all, new_all, tokens


def rollout_batch(
    seed: int,
    batch: int = 96,
    length: int = 512,
    vocab: int = 128,
    group: int = 8,
    per_token_advantages: bool = False,
):
    """(new, old, rollout, advantages, mask), float32, (B, T) (advantages (B, 1) for GRPO).

    Old policy: log_softmax of N(0, s^2) logits, a per-sequence temperature s log-uniform in [0.3, 8],
    and on 30% of the positions one token boosted by U(0, 20) (confident tokens); the sampled token is
    drawn from the old policy (2% uniformly: rare tokens). New policy: the logits plus sigma N(0, 1),
    sigma per sequence in {0.02, 0.1, 0.3, 0.8}, so that ratios cross every clip value both ways.
    Rollout (vLLM) policy: the old logits plus 0.05 N(0, 1), and on 3% of the positions 1.5 N(0, 1)
    (train/rollout mismatches that OpenRLHF's (0.5, 5) threshold filters). Right padding to a random
    length in [length / 3, length], one sequence in 16 of length 1..8. GRPO advantages: groups of
    `group` sequences with Bernoulli rewards, (r - mean) / (std + 1e-6): both signs, and exactly 0 for
    a group with equal rewards (the last group always). Per-token: N(0, 1) per token (no exact zero).

    Returned as fresh clones (a cache holds the originals).
    """
    return tuple(t.clone() for t in _rollout_batch(seed, batch, length, vocab, group, per_token_advantages))


@functools.cache
def _rollout_batch(seed, batch, length, vocab, group, per_token_advantages):
    gen = torch.Generator().manual_seed(seed)
    logits, old_all, new_all, tokens = draw_policies(
        gen, batch, length, vocab, max_temperature=8.0, max_boost=20, sigmas=(0.02, 0.1, 0.3, 0.8)
    )
    jump = torch.where(torch.rand(batch, length, 1, generator=gen) < 0.03, 1.5, 0.05)
    rollout_all = torch.log_softmax(logits + jump * torch.randn(batch, length, vocab, generator=gen), dim=-1)
    pick = tokens[..., None]
    old, new, rollout = (t.gather(-1, pick)[..., 0] for t in (old_all, new_all, rollout_all))
    lengths = torch.randint(length // 3, length + 1, (batch,), generator=gen)
    short = torch.arange(batch) % 16 == 5
    lengths = torch.where(short, torch.randint(1, 9, (batch,), generator=gen), lengths)
    mask = (torch.arange(length)[None] < lengths[:, None]).float()
    if per_token_advantages:
        adv = torch.randn(batch, length, generator=gen)
    else:
        success = torch.rand(batch // group, 1, generator=gen)
        success[-1] = 1.0  # one group all right: A = 0 on all its tokens
        success = success.expand(-1, group)
        rewards = (torch.rand(batch // group, group, generator=gen) < success).float()
        adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).reshape(batch, 1)
    return new, old, rollout, adv, mask
