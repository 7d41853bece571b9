"""A GRPO loop for any causal LM whose forward returns `.logits` (a Hugging Face model such as the demo's
tiny Qwen2, or a pretrained one): the policy, the sampling function, the reward function and the
evaluation are arguments, so the loop knows nothing of a task. The demo passes its "fork" task's
(openrlhf_band/tools/demo/task.py); a real model passes its tokenizer's sampling and its task's scorer.

What runs is what OpenRLHF 0.11.2's trainer runs on one rollout: log-probs and entropies from its `Actor`
around the model (the trainer's own path, float32 logits), any of its policy losses (`PolicyLoss`, this
project's `BandPolicyLoss` or objectives: `loss_fn(log_probs, old, advantages, action_mask=...)` ->
`(loss, clip_ratio, ...)`), group-normalised advantages (its group_norm estimator) and the k3 KL to a
frozen reference, aggregated as the policy loss is here (seq-mean-token-mean), under Adam.

One rollout: N prompts from `next_prompts(N, gen)`, G samples of each from `sample(model, prompts, G, gen)`,
rewards from `reward(prompts, samples)`; the old (and reference) log-probs once; then epochs x minibatches
of optimizer steps on the same samples, so a token's own earlier updates move its ratio (the regime where
a clip binds). One generator draws the prompts, the sampling noise and the minibatch order, in that order:
two methods at one seed see the same prompts and noise while their policies agree.

A lagging sampler (`LoopSettings.sampler_lag` = k > 0), as an asynchronous trainer's: rollout s is sampled
with the weights after rollout s - 1 - k's update (the starting weights while fewer exist), and its log-probs
of the sampled tokens are mu, the rollout engine's log-probs (here computed by the same `Actor` forward as
pi_old, so the lag is the only difference between them: no engine-vs-trainer numerics). The centre of the
update (`anchor`): "recomputed", pi_old from the current weights (OpenRLHF's default), or "rollout", pi_old
= mu and no recompute pass (`--actor.band.anchor rollout`). A loss that reads mu (DRPO, IPO) gets it as
`rollout_log_probs`. With k = 0 the sampler is the policy itself and mu is pi_old, bit for bit.

Shapes and units: sequences (N * G, P + T) token ids, row i * G + j the j-th sample of prompt i;
attention_mask (N * G, P + T), 1 on real tokens; action_mask (N * G, T), 1 on the response tokens that
count (the last T columns of the sequences); rewards (N * G,) float; log-probs and entropies in nats.
"""

from __future__ import annotations

import collections
import copy
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from openrlhf.models import Actor

# old-probability bins of the clip rates: (lo, hi, name), p in [lo, hi) ([lo, hi] for the last)
BINS = ((0.0, 0.01, "p<0.01"), (0.01, 0.1, "p0.01-0.1"), (0.1, 0.5, "p0.1-0.5"), (0.5, 1.0, "p>=0.5"))


@dataclass(frozen=True)
class Samples:
    """One rollout's sampled sequences, as OpenRLHF lays them out (shapes: the module docstring)."""

    sequences: Tensor  # (N * G, P + T) long: prompt, then response
    attention_mask: Tensor  # (N * G, P + T): 1 on real tokens, 0 on padding
    action_mask: Tensor  # (N * G, T) float: 1 on the response tokens the loss counts


@dataclass
class LoopSettings:
    """The loop's shape and optimizer: N prompts x G samples per rollout, `epochs` passes of `minibatches`
    Adam steps each, the k3 KL to the reference at `kl_coef` (no reference: no KL term), an evaluation
    every `eval_every` rollouts."""

    rollouts: int
    prompts_per_rollout: int  # N
    samples_per_prompt: int  # G, the group
    epochs: int
    minibatches: int
    lr: float
    kl_coef: float = 0.0
    eval_every: int = 1
    betas: tuple[float, float] = (0.9, 0.999)  # torch's Adam defaults (OpenRLHF's trainer: (0.9, 0.95))
    sampler_lag: int = 0  # policy versions (rollouts' updates) the sampler's weights lag the policy's by

    def __post_init__(self) -> None:
        if not (isinstance(self.sampler_lag, int) and self.sampler_lag >= 0):
            raise ValueError(f"sampler_lag must be a whole number of policy versions >= 0, got {self.sampler_lag!r}")


def as_actor(model: torch.nn.Module) -> Actor:
    """OpenRLHF's `Actor` around a causal LM object: `actor(sequences, action_mask, attention_mask=...)` gives
    (N, T) log-probs of the action tokens, as the trainer computes them."""
    from openrlhf.models import Actor

    actor = Actor(model)
    actor.packing_samples = False  # OpenRLHF 0.11.2: Actor(model_object) never sets it
    return actor


def group_advantages(rewards: Tensor) -> Tensor:
    """(N, G) rewards -> (N * G, 1) advantages, normalised within each group as OpenRLHF's group_norm
    estimator: (r - mean) / (std + 1e-9)."""
    return ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)).reshape(-1, 1)


class ClipStats:
    """Per old-probability bin: tokens with A > 0 and how many were clipped above; A < 0 and how
    many clipped below, each under the method's own bounds. Counts add over minibatches."""

    def __init__(self) -> None:
        self.counts = {name: [0, 0, 0, 0] for *_, name in BINS}  # pos, pos clipped up, neg, neg clipped low

    def add(self, old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, lower: Tensor, upper: Tensor) -> None:
        """Count one minibatch: (B, T) old and new log-probs, advantages, action mask and ratio bounds."""
        from openrlhf_band.ops.reference import LOG_RATIO_CLAMP

        ratio = torch.exp((new - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        p = old.exp()
        live = mask != 0
        pos, neg = live & (adv > 0), live & (adv < 0)
        for lo, hi, name in BINS:
            in_bin = (p >= lo) & ((p < hi) if hi < 1.0 else (p <= hi))
            c = self.counts[name]
            c[0] += int((pos & in_bin).sum())
            c[1] += int((pos & in_bin & (ratio > upper)).sum())
            c[2] += int((neg & in_bin).sum())
            c[3] += int((neg & in_bin & (ratio < lower)).sum())

    def rates(self) -> dict[str, float]:
        """clip_up_BIN / clip_low_BIN (nan where the bin has no such token) and the counts n_pos_BIN / n_neg_BIN."""
        out = {}
        for name, (pos, up, neg, low) in self.counts.items():
            out[f"clip_up_{name}"] = up / pos if pos else math.nan
            out[f"clip_low_{name}"] = low / neg if neg else math.nan
            out[f"n_pos_{name}"], out[f"n_neg_{name}"] = pos, neg
        return out


# what the band's losses report of their own, as the rows name them: clips by the lower floor alone, and
# DPPO's truncated weights (a loss without these metrics adds nothing)
BAND_FRACTIONS = (("floor_frac", "band/clip_frac_floor"), ("truncated_frac", "band/truncated_frac"))


class GRPOTrainer:
    """One policy's GRPO updates under one loss: Adam on the model's parameters, the k3 KL to a frozen
    reference (when given), and the bookkeeping the rows report (clip fractions, the band's own
    fractions, clip rates per bin under the bounds the loss used, else under `bounds_of(old)`). `anchor`:
    where pi_old comes from, as `--actor.band.anchor` (openrlhf_band.integration.policy_loss.ANCHORS: "recomputed"
    from the current weights, or "rollout", the sampler's mu, which `update` then needs)."""

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: torch.nn.Module,
        settings: LoopSettings,
        *,
        reference: torch.nn.Module | None = None,
        bounds_of: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None,
        anchor: str = "recomputed",
    ) -> None:
        from openrlhf_band.integration.policy_loss import ANCHORS

        if anchor not in ANCHORS:
            raise ValueError(f"anchor must be one of {ANCHORS}, got {anchor!r}")
        self.model, self.loss_fn, self.settings, self.bounds_of = model, loss_fn, settings, bounds_of
        self.anchor = anchor
        self.reads_rollout_log_probs = getattr(loss_fn, "reads_rollout_log_probs", False)  # DRPO, IPO
        self.actor = as_actor(model)
        self.reference = None
        if reference is not None:
            self.reference = as_actor(reference)
            self.reference.eval()
        self.needs_entropy = getattr(loss_fn, "needs_entropy", False)  # the entropy-adaptive radius
        self.optim = torch.optim.Adam(model.parameters(), lr=settings.lr, betas=settings.betas)
        self.stats = ClipStats()  # cumulative over training
        self.clip_fracs: list[float] = []  # per optimizer step, since the last take_metrics
        self.band_fracs: dict[str, list[float]] = {name: [] for name, _ in BAND_FRACTIONS}
        self.sampler_kl: list[float] = []  # per rollout with a lagging sampler and pi_old recomputed

    def update(
        self, samples: Samples, rewards: Tensor, gen: torch.Generator, rollout_log_probs: Tensor | None = None
    ) -> list[float]:
        """One rollout's updates: epochs x minibatches in the order `gen` draws. `rewards` (N * G,) with G =
        settings.samples_per_prompt; `rollout_log_probs` (N * G, T): mu, the sampler's log-probs of the sampled
        tokens, where the sampler is not the policy itself (None: it is, and mu is pi_old). Returns each
        optimizer step's loss (policy loss + KL term)."""
        from openrlhf.models.loss import aggregate_loss
        from openrlhf.models.utils import compute_approx_kl

        settings, actor, loss_fn = self.settings, self.actor, self.loss_fn
        sequences, attention_mask, action_mask = samples.sequences, samples.attention_mask, samples.action_mask
        adv = group_advantages(rewards.reshape(-1, settings.samples_per_prompt))
        with torch.no_grad():
            actor.eval()
            if self.anchor == "rollout" and rollout_log_probs is not None:
                old = rollout_log_probs  # the sampler's: no recompute pass, as --actor.band.anchor rollout
            else:
                old = actor(sequences, action_mask, attention_mask=attention_mask)
            mu = old if rollout_log_probs is None else rollout_log_probs
            if rollout_log_probs is not None and self.anchor == "recomputed":
                # KL(mu || pi_old) on the sampled tokens (k1: they are mu's samples), nats per token
                self.sampler_kl.append(((mu - old) * action_mask).sum().item() / action_mask.sum().item())
            ref = None
            if self.reference is not None:
                ref = self.reference(sequences, action_mask, attention_mask=attention_mask)
            lower, upper = self.bounds_of(old) if self.bounds_of is not None else (None, None)
        actor.train()
        width = action_mask.shape[1]
        losses = []
        for _epoch in range(settings.epochs):
            for idx in torch.randperm(len(sequences), generator=gen).chunk(settings.minibatches):
                log_probs, output = actor(sequences[idx], action_mask[idx], attention_mask=attention_mask[idx],
                                          return_output=True, return_entropy=self.needs_entropy)  # fmt: skip
                # as OpenRLHF's training_step (and the patch's band_loss_inputs): the detached entropy
                extra = {"entropy": output.entropy[:, -width:].detach()} if self.needs_entropy else {}
                if self.reads_rollout_log_probs:
                    extra["rollout_log_probs"] = mu[idx]
                policy_loss, clip_ratio, *_ = loss_fn(log_probs, old[idx], adv[idx], action_mask=action_mask[idx],
                                                      **extra)  # fmt: skip
                loss = policy_loss
                if ref is not None:
                    kl = compute_approx_kl(log_probs, ref[idx], kl_estimator="k3")
                    loss = loss + settings.kl_coef * aggregate_loss(kl, action_mask[idx], token_level_loss=False)
                self.optim.zero_grad()
                loss.backward()
                self.optim.step()
                if self.needs_entropy:
                    loss_fn.after_optimizer_step()  # as the patch's band_after_step
                used = getattr(loss_fn, "last_bounds", None)
                if used is None and self.bounds_of is not None:
                    used = (lower[idx], upper[idx])
                if used is not None:
                    self.stats.add(old[idx], log_probs.detach(), adv[idx].expand_as(log_probs), action_mask[idx], *used)
                self.clip_fracs.append(clip_ratio.item())
                metrics = getattr(loss_fn, "band_metrics", {})
                for name, key in BAND_FRACTIONS:
                    if key in metrics:
                        self.band_fracs[name].append(metrics[key].item())
                losses.append(loss.item())
        return losses

    def take_metrics(self) -> dict[str, float]:
        """clip_frac: the mean clip fraction of the optimizer steps since the last call; floor_frac /
        truncated_frac likewise, where the loss reports them; the clip rates per bin over all training
        so far (ClipStats.rates); sampler_kl, the mean KL(mu || pi_old) per token over the rollouts since the last
        call, where the sampler lags and pi_old is recomputed."""
        row = {"clip_frac": statistics.fmean(self.clip_fracs)}
        if self.sampler_kl:
            row["sampler_kl"] = statistics.fmean(self.sampler_kl)
            self.sampler_kl.clear()
        for name, values in self.band_fracs.items():
            if values:
                row[name] = statistics.fmean(values)
                values.clear()
        row.update(self.stats.rates())  # cumulative over training so far
        self.clip_fracs = []
        return row


def train_grpo(
    model: torch.nn.Module,
    loss_fn: torch.nn.Module,
    settings: LoopSettings,
    *,
    next_prompts: Callable[[int, torch.Generator], Any],
    sample: Callable[[torch.nn.Module, Any, int, torch.Generator], Samples],
    reward: Callable[[Any, Samples], Tensor],
    gen: torch.Generator,
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    reference: torch.nn.Module | None = None,
    bounds_of: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None,
    labels: dict[str, Any] | None = None,
    anchor: str = "recomputed",
) -> list[dict]:
    """GRPO on `model` (trained in place) for settings.rollouts rollouts; one row per evaluation: at step 0
    and every settings.eval_every rollouts, `labels`, the step, `evaluate(model)` and GRPOTrainer's
    metrics. The prompts are opaque to the loop: `next_prompts(N, gen)` makes them, `sample` and
    `reward` read them (a tensor of token ids for the demo, rows of a dataset for a real task). With
    settings.sampler_lag = k > 0 a copy of the model holding the weights of k updates ago samples (the module
    docstring); `anchor` centres the update (GRPOTrainer)."""
    trainer = GRPOTrainer(model, loss_fn, settings, reference=reference, bounds_of=bounds_of, anchor=anchor)
    labels = dict(labels or {})
    lag = settings.sampler_lag
    sampler, versions = model, None
    if lag:
        sampler = copy.deepcopy(model)
        sampler.requires_grad_(False)
        # the weights after each of the last lag + 1 updates (the starting weights first); the oldest samples
        versions = collections.deque([_weights(model)], maxlen=lag + 1)
        sampler_actor = as_actor(sampler)

    def evaluation() -> dict[str, float]:
        return evaluate(model) if evaluate is not None else {}

    rows = [{**labels, "step": 0, **evaluation()}]
    for step in range(1, settings.rollouts + 1):
        prompts = next_prompts(settings.prompts_per_rollout, gen)
        mu = None
        if lag:
            sampler.load_state_dict(versions[0])
        samples = sample(sampler, prompts, settings.samples_per_prompt, gen)
        if lag:
            with torch.no_grad():
                sampler_actor.eval()
                mu = sampler_actor(samples.sequences, samples.action_mask, attention_mask=samples.attention_mask)
        trainer.update(samples, reward(prompts, samples), gen, rollout_log_probs=mu)
        if lag:
            versions.append(_weights(model))
        if step % settings.eval_every == 0:
            rows.append({**labels, "step": step, **evaluation(), **trainer.take_metrics()})
    return rows


def _weights(model: torch.nn.Module) -> dict[str, Tensor]:
    """A copy of the model's weights (a policy version)."""
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
