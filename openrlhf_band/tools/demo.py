"""`openrlhf-band demo`: GRPO on a CPU in the regime where the clip binds: clip, Clip-Higher, BandPO
(kl, tv, chi2; with the entropy-adaptive radius; with a lower floor), DCPO, DPPO (tv, kl), and one
diagnostic ablation, paired from one warm-up checkpoint per seed.

`make demo` runs DEFAULT_METHODS (clip, band-kl, band-kl-floor, band-kl+clip-low) over 3 seeds x
80 rollouts, two runs at a time (its measured times: docs/demo.md); `--full` every method of METHODS
over 5 seeds; `--quick` clip and band-kl over 1 seed x 15 rollouts.

The task (a "fork": one rare token decides the reward; docs/demo.md). A prompt is [BOS, key,
difficulty]; its one correct response is 6 answer tokens determined by the key. A supervised
warm-up on noisy data (targets correct with probability 0.88 at the five easy positions; at the fork
position, the 4th token, 0.05 on hard prompts and 0.3 on medium ones, else a distractor) leaves the
model near those probabilities: the correct fork token on hard prompts at p = 0.108 in the committed
full run (docs/demo_summary.txt).
The reward is exact match (+1 correct, 0 else), so a rare correct fork token is what a group's
advantage rewards, and that token is where a fixed clip caps the rise (q <= 1.2 p per rollout).

The regime. Each rollout (16 prompts x 16 samples) is trained for 4 epochs of 8 minibatches with
Adam at lr 1e-4: 32 small steps on the same samples, so a token's own earlier updates move its
ratio and the clip binds (with one epoch, a token's clip is only ever triggered by other tokens'
updates and every method looks alike). Loss settings as the paper's: seq-mean-token-mean, the k3
KL loss at 0.001 to the warm-up model, group-normalised advantages; the losses are OpenRLHF's own
`PolicyLoss` (clip, Clip-Higher) and this project's `BandPolicyLoss` (band, floor, DPPO, DCPO, the
ablation), each band variant through the loss's own options (lower_floor, adaptive, lower_delta,
ratio_truncation, upper_cap=None), DCPO and the ablation through bounds_fn.

Metrics, fixed before the runs: mean@32 and pass@32 overall and on hard prompts, computed exactly
from P(correct response) = prod_t pi(c_t | prompt, c_<t) on 256 fixed evaluation prompts
(mean@32 = P, pass@32 = 1 - (1 - P)^32: the expectations of the 32-sample estimators); token
entropy along the correct response; and clip rates per old-probability bin, each method under its
own bounds: the share of positive-advantage tokens clipped above and of negative-advantage tokens
clipped below. Differences to clip are paired: same seed, same warm-up checkpoint, same prompts
and sampling noise.
"""

from __future__ import annotations

import argparse
import copy
import csv
import functools
import hashlib
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from openrlhf_band.integration.methods import METHOD_FLAGS, method_loss_kwargs, method_spec, resolve_method


# Each method is a way to get (lower, upper) ratio bounds from the old log-probs, named as in
# openrlhf_band.integration.methods (the train_ppo_ray flags of each, the one source): "clip" kinds run
# through OpenRLHF's PolicyLoss, the others through BandPolicyLoss built from those flags, with the
# demo's radius (DemoConfig.delta, 0.05) and cap (10) for the band rules (DPPO keeps its own radii and
# has no cap; DCPO takes the cap). METHODS holds what the demo reads of each: its kind and options.
# One diagnostic is the demo's own: "band-kl+clip-low", the kl band's upper bound with the fixed
# clip's lower bound (tests the reason given for the band's lower entropy: its lower bound goes to 0
# for rare tokens); the floor (lower bound max(r_low, F)) is its training form: the kl band's own
# r_low (delta 0.05) exceeds 0.8 for p > 0.751 (0.867 at p = 0.9), where the floor leaves it alone.
def _facets(name: str) -> dict:
    """What the demo reads of a registered method, from what its flags resolve to (resolved once)."""
    method = resolve_method(name)
    loss_type, loss_kwargs = method.loss_type, method.loss_kwargs
    if loss_kwargs is None:
        if loss_type == "ppo":
            return {"kind": "clip", "eps": method.clip_eps}
        return {"kind": "objective", "objective": loss_type, "eps": method.clip_eps,
                "options": method.objective_options}  # fmt: skip
    spec = loss_kwargs["band"]
    if loss_type == "cispo":  # CISPO with the band's bounds
        return {"kind": "band-cispo", "divergence": spec.divergence}
    if spec.rule == "dcpo":
        return {"kind": "dcpo", "eps": spec.dcpo_eps}
    if spec.rule == "dppo":
        return {"kind": "dppo", "divergence": spec.divergence, "delta": spec.delta, "lower_delta": spec.lower_delta,
                "truncation": spec.ratio_truncation}  # fmt: skip
    facets = {"kind": "band", "divergence": spec.divergence}
    if loss_kwargs["adaptive"] != "none":
        facets["adaptive"] = loss_kwargs["adaptive"]
    if spec.lower_floor is not None:
        facets["lower_floor"] = spec.lower_floor
    return facets


METHODS: dict[str, dict] = {}
for _name in METHOD_FLAGS:
    METHODS[_name] = _facets(_name)
    if _name == "dcpo":
        METHODS["band-kl+clip-low"] = {"kind": "band-upper-clip-lower", "divergence": "kl", "eps_low": 0.2}
del _name
# what `make demo` runs: the clip, the kl band, the kl band with the lower floor 0.8, and the
# diagnostic ablation the floor is the training form of (4 methods x 3 seeds, 2 workers; docs/demo.md's timings)
DEFAULT_METHODS = ["clip", "band-kl", "band-kl-floor", "band-kl+clip-low"]
BINS = ((0.0, 0.01, "p<0.01"), (0.01, 0.1, "p0.01-0.1"), (0.1, 0.5, "p0.1-0.5"), (0.5, 1.0, "p>=0.5"))
REPORTED = ("mean@32", "mean@32_hard", "pass@32", "pass@32_hard", "entropy")


@dataclass
class DemoConfig:
    rollouts: int = 80
    seeds: int = 3
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    workers: int = 2  # parallel runs (processes, one torch thread each)
    prompts_per_rollout: int = 16
    samples_per_prompt: int = 16
    epochs: int = 4
    minibatches: int = 8
    lr: float = 1e-4
    delta: float = 0.05
    upper_cap: float = 10.0
    kl_coef: float = 0.001
    eval_every: int = 5
    eval_prompts: int = 256
    # task
    keys: int = 128
    answer_tokens: int = 32
    response_len: int = 6
    fork_position: int = 3
    easy_p: float = 0.88
    fork_p_hard: float = 0.05
    fork_p_medium: float = 0.30
    warmup_steps: int = 800
    out: str = "out/demo"

    def early_middle_final(self) -> tuple[int, int, list[int]]:
        """The steps the paired table reports: early, middle, and the last three evaluations."""
        evals = list(range(self.eval_every, self.rollouts + 1, self.eval_every))
        early = min(evals, key=lambda s: abs(s - self.rollouts / 4))
        middle = min(evals, key=lambda s: abs(s - self.rollouts / 2))
        return early, middle, evals[-3:]


# ---------------------------------------------------------------------------------------------- the task
def _vocab(cfg: DemoConfig) -> tuple[int, int, int, int]:
    """(first key token, hard token, medium token, first answer token); 0 is BOS."""
    key0 = 1
    hard = key0 + cfg.keys
    return key0, hard, hard + 1, hard + 2


def vocab_size(cfg: DemoConfig) -> int:
    return _vocab(cfg)[3] + cfg.answer_tokens


@functools.lru_cache(maxsize=8)
def _answer_table(keys: int, answer_tokens: int, response_len: int, fork_position: int) -> tuple[Tensor, Tensor]:
    """(correct (keys, T), fork distractor (keys,)) answer-token offsets, drawn once at random (a fixed
    task seed): a lookup table without structure, so that what is learned for one key does not
    carry over to another and every key's rare fork token has to be found on its own."""
    gen = torch.Generator().manual_seed(12_345)
    correct = torch.randint(0, answer_tokens, (keys, response_len), generator=gen)
    shift = torch.randint(1, answer_tokens, (keys,), generator=gen)
    return correct, (correct[:, fork_position] + shift) % answer_tokens


def correct_response(keys: Tensor, cfg: DemoConfig) -> Tensor:
    """(N, response_len) the one correct response of each key."""
    *_, answer0 = _vocab(cfg)
    correct, _ = _answer_table(cfg.keys, cfg.answer_tokens, cfg.response_len, cfg.fork_position)
    return answer0 + correct[keys]


def fork_distractor(keys: Tensor, cfg: DemoConfig) -> Tensor:
    *_, answer0 = _vocab(cfg)
    _, distractor = _answer_table(cfg.keys, cfg.answer_tokens, cfg.response_len, cfg.fork_position)
    return answer0 + distractor[keys]


def sample_prompts(n: int, cfg: DemoConfig, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """(prompts (N, 3), hard (N,) bool): keys uniform, half the prompts hard."""
    key0, hard_token, medium_token, _ = _vocab(cfg)
    keys = torch.randint(0, cfg.keys, (n,), generator=gen)
    hard = torch.rand(n, generator=gen) < 0.5
    difficulty = torch.where(hard, hard_token, medium_token)
    return torch.stack([torch.zeros(n, dtype=torch.long), key0 + keys, difficulty], dim=1), hard


def _keys(prompts: Tensor, cfg: DemoConfig) -> Tensor:
    return prompts[:, 1] - _vocab(cfg)[0]


def build_actor(cfg: DemoConfig, seed: int):
    """A tiny random Qwen2 in OpenRLHF's Actor (CPU, float32, eager attention; no downloads)."""
    from openrlhf.models import Actor

    from openrlhf_band.tools.tiny_model import tiny_qwen2

    model = tiny_qwen2(vocab_size(cfg), hidden=64, max_positions=32, seed=seed, tie_word_embeddings=True,
                       attn_implementation="eager")  # fmt: skip
    actor = Actor(model)
    actor.packing_samples = False  # OpenRLHF 0.11.2: Actor(model_object) never sets it
    return actor


def _logits(actor, sequences: Tensor) -> Tensor:
    return actor.model(input_ids=sequences, attention_mask=torch.ones_like(sequences)).logits.float()


def warm_up(actor, cfg: DemoConfig, seed: int) -> None:
    """Supervised warm-up on noisy data: at easy positions the target is correct with probability
    easy_p (else a uniformly drawn other answer token); at the fork, correct with fork_p_hard /
    fork_p_medium, else the distractor. Fitting it leaves the model near those probabilities."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    *_, answer0 = _vocab(cfg)
    optim = torch.optim.Adam(actor.model.parameters(), lr=3e-3)
    actor.train()
    for _ in range(cfg.warmup_steps):
        prompts, hard = sample_prompts(128, cfg, gen)
        keys = _keys(prompts, cfg)
        correct = correct_response(keys, cfg)
        other = answer0 + (correct - answer0 + torch.randint(1, cfg.answer_tokens, correct.shape, generator=gen)) % (
            cfg.answer_tokens
        )
        keep = torch.rand(correct.shape, generator=gen) < cfg.easy_p
        fork_p = torch.where(hard, cfg.fork_p_hard, cfg.fork_p_medium)
        keep[:, cfg.fork_position] = torch.rand(len(keys), generator=gen) < fork_p
        other[:, cfg.fork_position] = fork_distractor(keys, cfg)
        targets = torch.where(keep, correct, other)
        sequences = torch.cat([prompts, targets], dim=1)
        logits = _logits(actor, sequences[:, :-1])[:, -cfg.response_len :]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()


@torch.no_grad()
def evaluate(actor, prompts: Tensor, hard: Tensor, cfg: DemoConfig) -> dict[str, float]:
    """Exact mean@32 / pass@32 (overall and hard), token entropy along the correct response, and the
    mean probability of the correct fork token on hard prompts."""
    actor.eval()
    correct = correct_response(_keys(prompts, cfg), cfg)
    logits = _logits(actor, torch.cat([prompts, correct], dim=1)[:, :-1])[:, -cfg.response_len :]
    log_probs = torch.log_softmax(logits, dim=-1)
    token_log_p = log_probs.gather(-1, correct[..., None])[..., 0]  # (N, T)
    p_correct = token_log_p.sum(-1).exp()
    pass_at_32 = 1.0 - (1.0 - p_correct) ** 32
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # (N, T), nats
    return {
        "mean@32": p_correct.mean().item(),
        "mean@32_hard": p_correct[hard].mean().item(),
        "pass@32": pass_at_32.mean().item(),
        "pass@32_hard": pass_at_32[hard].mean().item(),
        "entropy": entropy.mean().item(),
        "p_fork_hard": token_log_p[hard, cfg.fork_position].exp().mean().item(),
    }


# ---------------------------------------------------------------------------------------------- methods
def _demo_flags(method: str, cfg: DemoConfig) -> tuple[str, ...]:
    """The demo's settings after a method's flags: the torch backend (CPU), and DemoConfig's radius
    and cap for the band rules (DPPO keeps its radii and has no cap; DCPO takes the cap)."""
    kind = METHODS[method]["kind"]
    if kind == "objective":
        return ()
    flags = ("--actor.band.backend", "torch")
    if kind in ("band", "band-cispo"):
        flags += ("--band_delta", repr(cfg.delta), "--actor.band.upper_cap", repr(cfg.upper_cap))
    elif kind == "dcpo":
        flags += ("--actor.band.upper_cap", repr(cfg.upper_cap))
    return flags


def method_bounds(method: str, cfg: DemoConfig):
    """old_log_probs -> (lower, upper): the bounds the method clips to (also used for its clip stats)."""
    from openrlhf_band.band.bounds import band_bounds, spec_bounds

    facets = METHODS[method]
    kind = facets["kind"]
    if kind == "clip":
        eps_low, eps_high = facets["eps"]
        return lambda old: (torch.full_like(old, 1 - eps_low), torch.full_like(old, 1 + eps_high))
    if kind in ("band", "dppo", "dcpo", "band-cispo"):  # (the loss reports the per-token bounds it used)
        return functools.partial(spec_bounds, method_spec(method, *_demo_flags(method, cfg)))
    if kind == "objective":  # an objective's clip interval on the ratio, where it has one
        objective, (eps_low, eps_high) = facets["objective"], facets["eps"]
        if objective in ("cispo", "clip_cov"):
            return lambda old: (torch.full_like(old, 1 - eps_low), torch.full_like(old, 1 + eps_high))
        if objective == "gmpo":  # GMPO clips log r to [-eps_low, eps_high]
            return lambda old: (torch.full_like(old, math.exp(-eps_low)), torch.full_like(old, math.exp(eps_high)))
        return None  # SAPO's gate and KL-Cov's penalty: no interval to count clips against
    if kind == "band-upper-clip-lower":

        def bounds(old):
            _, upper = band_bounds(old, facets["divergence"], cfg.delta, upper_cap=cfg.upper_cap)
            return torch.full_like(upper, 1 - facets["eps_low"]), upper

        return bounds
    raise ValueError(f"unknown method {method!r}")


def make_loss(method: str, cfg: DemoConfig):
    """The method's loss module: OpenRLHF's PolicyLoss for the clip, else BandPolicyLoss from the
    method's flags as train_ppo_ray resolves them (the ablation: its bounds as bounds_fn)."""
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_band.integration.objective_loss import make_policy_loss
    from openrlhf_band.integration.policy_loss import BandPolicyLoss

    facets = METHODS[method]
    common = dict(token_level_loss=False)  # seq-mean-token-mean, as in the recipe
    if facets["kind"] == "clip":
        return PolicyLoss(*facets["eps"], **common)
    if facets["kind"] == "band-upper-clip-lower":
        return BandPolicyLoss(backend="torch", bounds_fn=method_bounds(method, cfg), **common)
    if facets["kind"] == "objective":
        eps_low, eps_high = facets["eps"]
        return make_policy_loss(facets["objective"], clip_eps_low=eps_low, clip_eps_high=eps_high, **facets["options"],
                                **common)  # fmt: skip
    if facets["kind"] == "band-cispo":
        return BandPolicyLoss(policy_loss_type="cispo", **method_loss_kwargs(method, *_demo_flags(method, cfg)),
                              **common)  # fmt: skip
    return BandPolicyLoss(**method_loss_kwargs(method, *_demo_flags(method, cfg)), **common)


class ClipStats:
    """Per old-probability bin: tokens with A > 0 and how many were clipped above; A < 0 and how
    many clipped below, each under the method's own bounds. Counts add over minibatches."""

    def __init__(self) -> None:
        self.counts = {name: [0, 0, 0, 0] for *_, name in BINS}  # pos, pos clipped up, neg, neg clipped low

    def add(self, old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, lower: Tensor, upper: Tensor) -> None:
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
        out = {}
        for name, (pos, up, neg, low) in self.counts.items():
            out[f"clip_up_{name}"] = up / pos if pos else math.nan
            out[f"clip_low_{name}"] = low / neg if neg else math.nan
            out[f"n_pos_{name}"], out[f"n_neg_{name}"] = pos, neg
        return out


@torch.no_grad()
def sample_responses(actor, prompts: Tensor, g: int, cfg: DemoConfig, gen: torch.Generator) -> Tensor:
    """(N * g, 3 + T) sequences: g responses per prompt sampled token by token at temperature 1."""
    actor.eval()
    sequences = prompts.repeat_interleave(g, 0)
    for _ in range(cfg.response_len):
        probs = torch.softmax(_logits(actor, sequences)[:, -1], dim=-1)
        sequences = torch.cat([sequences, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return sequences


def train_method(method: str, seed: int, warm_state: dict, cfg: DemoConfig) -> list[dict]:
    """GRPO from the warm-up checkpoint; one row of metrics per evaluation."""
    from openrlhf.models.loss import aggregate_loss
    from openrlhf.models.utils import compute_approx_kl

    torch.set_num_threads(1)
    actor = build_actor(cfg, seed)
    actor.model.load_state_dict(warm_state)
    reference = build_actor(cfg, seed)
    reference.model.load_state_dict(warm_state)
    reference.eval()
    loss_fn = make_loss(method, cfg)
    needs_entropy = getattr(loss_fn, "needs_entropy", False)
    bounds_of = method_bounds(method, cfg)
    optim = torch.optim.Adam(actor.model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(20_000 + seed)  # same prompts and sampling noise for every method
    eval_prompts, eval_hard = sample_prompts(cfg.eval_prompts, cfg, torch.Generator().manual_seed(30_000 + seed))
    n, g = cfg.prompts_per_rollout, cfg.samples_per_prompt
    rows = [{"method": method, "seed": seed, "step": 0, **evaluate(actor, eval_prompts, eval_hard, cfg)}]
    stats, clip_fracs = ClipStats(), []
    band_fracs = {"floor_frac": [], "truncated_frac": []}  # what the floor / the truncation did, if on
    for step in range(1, cfg.rollouts + 1):
        prompts, _ = sample_prompts(n, cfg, gen)
        sequences = sample_responses(actor, prompts, g, cfg, gen)
        correct = correct_response(_keys(prompts, cfg), cfg).repeat_interleave(g, 0)
        reward = (sequences[:, -cfg.response_len :] == correct).all(-1).float().reshape(n, g)
        # group-normalised advantages, as OpenRLHF's group_norm estimator
        adv = ((reward - reward.mean(-1, keepdim=True)) / (reward.std(-1, keepdim=True) + 1e-9)).reshape(-1, 1)
        attention_mask = torch.ones_like(sequences)
        action_mask = torch.ones(n * g, cfg.response_len)
        with torch.no_grad():
            actor.eval()
            old = actor(sequences, action_mask, attention_mask=attention_mask)
            ref = reference(sequences, action_mask, attention_mask=attention_mask)
            lower, upper = bounds_of(old) if bounds_of is not None else (None, None)
        actor.train()
        for _epoch in range(cfg.epochs):
            for idx in torch.randperm(n * g, generator=gen).chunk(cfg.minibatches):
                log_probs, output = actor(sequences[idx], action_mask[idx], attention_mask=attention_mask[idx],
                                          return_output=True, return_entropy=needs_entropy)  # fmt: skip
                # as OpenRLHF's training_step (and the patch's band_loss_inputs): the detached entropy
                extra = {"entropy": output.entropy[:, -cfg.response_len :].detach()} if needs_entropy else {}
                policy_loss, clip_ratio, *_ = loss_fn(log_probs, old[idx], adv[idx], action_mask=action_mask[idx],
                                                      **extra)  # fmt: skip
                kl = compute_approx_kl(log_probs, ref[idx], kl_estimator="k3")
                loss = policy_loss + cfg.kl_coef * aggregate_loss(kl, action_mask[idx], token_level_loss=False)
                optim.zero_grad()
                loss.backward()
                optim.step()
                if needs_entropy:
                    loss_fn.after_optimizer_step()  # as the patch's band_after_step
                used = getattr(loss_fn, "last_bounds", None)
                if used is None and bounds_of is not None:
                    used = (lower[idx], upper[idx])
                if used is not None:
                    stats.add(old[idx], log_probs.detach(), adv[idx].expand_as(log_probs), action_mask[idx], *used)
                clip_fracs.append(clip_ratio.item())
                metrics = getattr(loss_fn, "band_metrics", {})
                for name, key in (("floor_frac", "band/clip_frac_floor"), ("truncated_frac", "band/truncated_frac")):
                    if key in metrics:
                        band_fracs[name].append(metrics[key].item())
        if step % cfg.eval_every == 0:
            row = {"method": method, "seed": seed, "step": step, **evaluate(actor, eval_prompts, eval_hard, cfg)}
            row["clip_frac"] = statistics.fmean(clip_fracs)
            for name, values in band_fracs.items():
                if values:
                    row[name] = statistics.fmean(values)
                    values.clear()
            row.update(stats.rates())  # cumulative over training so far
            rows.append(row)
            clip_fracs = []
    return rows


def mechanism_check(cfg: DemoConfig, warm_state: dict, seed: int = 0, step: float = 0.005, max_updates: int = 2000):
    """One update from the warm-up checkpoint: how far the rare correct fork token of a hard prompt,
    with advantage +1, may rise under clip 0.2 and under the kl band. Each step moves the weights
    along the loss gradient by just enough to raise log p by `step` (first order), until the bound
    takes the gradient away: so the rise stops within one small step past the bound, about 1.2
    under clip and about r_up(p) under the band. (Plain optimizer steps would overshoot by the last
    step's size, which grows with the ratio.) Returns p_old, each method's ratio and upper bound."""
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_band.band.bounds import band_bounds
    from openrlhf_band.integration.policy_loss import BandPolicyLoss

    torch.set_num_threads(1)
    key0, hard_token, _, _ = _vocab(cfg)
    prompt = torch.tensor([[0, key0 + 3, hard_token]])
    correct = correct_response(torch.tensor([3]), cfg)
    sequences = torch.cat([prompt, correct[:, : cfg.fork_position + 1]], dim=1)  # up to the fork token
    action_mask, advantages = torch.ones(1, 1), torch.ones(1, 1)
    attention_mask = torch.ones_like(sequences)
    warm = build_actor(cfg, seed)
    warm.model.load_state_dict(warm_state)
    warm.eval()
    with torch.no_grad():
        old = warm(sequences, action_mask, attention_mask=attention_mask)
    result = {"p_old": old.exp().item()}
    losses = {
        "clip": PolicyLoss(0.2, 0.2),
        "band-kl": BandPolicyLoss(divergence="kl", delta=cfg.delta, upper_cap=cfg.upper_cap, backend="torch"),
    }
    for name, loss_fn in losses.items():
        actor = build_actor(cfg, seed)
        actor.model.load_state_dict(warm_state)
        actor.eval()  # no dropout: the same function at every step
        params = [p for p in actor.model.parameters() if p.requires_grad]
        for _ in range(max_updates):
            new = actor(sequences, action_mask, attention_mask=attention_mask)
            loss = loss_fn(new, old, advantages, action_mask=action_mask)[0]
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            norm2 = sum(float((g * g).sum()) for g in grads if g is not None)
            if norm2 == 0.0:  # clipped: the bound took the gradient away
                break
            ratio = float((new - old).detach().exp())
            with torch.no_grad():  # grad = -r grad(log p), so this step raises log p by `step` to first order
                for p, g in zip(params, grads):
                    if g is not None:
                        p.sub_(g, alpha=step * ratio / norm2)
        with torch.no_grad():
            result[f"ratio_{name}"] = (actor(sequences, action_mask, attention_mask=attention_mask) - old).exp().item()
    result["bound_clip"] = 1.2
    result["bound_band-kl"] = band_bounds(old, "kl", cfg.delta, upper_cap=cfg.upper_cap)[1].item()
    return result


def format_mechanism(m: dict[str, float]) -> str:
    return (
        f"one update from the warm-up checkpoint, the rare correct fork token (p = {m['p_old']:.3f}), advantage +1: "
        f"rises x{m['ratio_clip']:.2f} under clip 0.2 (bound 1.2), x{m['ratio_band-kl']:.2f} under the kl band "
        f"(bound {m['bound_band-kl']:.2f})"
    )


# ---------------------------------------------------------------------------------------------- the report
def paired_differences(rows: list[dict], method: str, key: str, steps: list[int], baseline: str = "clip"):
    """mean and sd over seeds of (method - baseline) at the given steps (averaged over them)."""
    by = {(r["method"], r["seed"], r["step"]): r[key] for r in rows}
    seeds = sorted({r["seed"] for r in rows if r["method"] == method})
    diffs = [statistics.fmean(by[(method, s, t)] - by[(baseline, s, t)] for t in steps) for s in seeds]
    return statistics.fmean(diffs), (statistics.stdev(diffs) if len(diffs) > 1 else math.nan), len(diffs)


def pooled_clip_rates(rows: list[dict], method: str) -> dict[str, float]:
    """Clip rates per bin over the whole training, pooled over seeds (the last row holds the totals)."""
    last = {}
    for r in rows:
        if r["method"] == method and r["step"] > 0:
            if r["seed"] not in last or r["step"] > last[r["seed"]]["step"]:
                last[r["seed"]] = r
    out = {}
    for *_, name in BINS:
        pos = sum(r[f"n_pos_{name}"] for r in last.values())
        neg = sum(r[f"n_neg_{name}"] for r in last.values())
        up = sum(r[f"clip_up_{name}"] * r[f"n_pos_{name}"] for r in last.values() if r[f"n_pos_{name}"])
        low = sum(r[f"clip_low_{name}"] * r[f"n_neg_{name}"] for r in last.values() if r[f"n_neg_{name}"])
        out[name] = (up / pos if pos else math.nan, low / neg if neg else math.nan)
    return out


def _paired_block(rows: list[dict], methods: list[str], baseline: str, steps: list[tuple[str, list[int]]]):
    """Lines of paired differences (method - baseline), mean +- sd over seeds, one row per method and step."""
    lines = [f"{'method':<{W}}{'step':>7}" + "".join(f"{k:>18}" for k in REPORTED)]
    for method in methods:
        for label, at in steps:
            cells = []
            for key in REPORTED:
                mean, sd, _ = paired_differences(rows, method, key, at, baseline=baseline)
                cells.append(f"{mean:+.3f} +- {sd:.3f}" if not math.isnan(sd) else f"{mean:+.3f}")
            lines.append(f"{method:<{W}}{label:>7}" + "".join(f"{c:>18}" for c in cells))
    return lines


W = 23  # the method column: the longest name, band-kl-entropy-floor, and two spaces


def format_summary(rows: list[dict], cfg: DemoConfig, start: dict, mechanism: dict | None) -> str:
    early, middle, final = cfg.early_middle_final()
    steps = [(str(early), [early]), (str(middle), [middle]), ("final", final)]
    seeds = len({r["seed"] for r in rows})
    lines = [
        f"CPU GRPO demo: {seeds} seeds x {cfg.rollouts} rollouts, methods {', '.join(cfg.methods)}",
        f"after warm-up: mean@32 {start['mean@32']:.3f} (hard {start['mean@32_hard']:.3f}), pass@32 "
        f"{start['pass@32']:.3f}, token entropy {start['entropy']:.3f} nats, correct fork token on hard prompts "
        f"p = {start['p_fork_hard']:.3f}",
        "",
        "absolute values (mean over seeds), final = mean of the last three evaluations:",
        f"{'method':<{W}}" + "".join(f"{k:>14}" for k in REPORTED) + f"{'clip frac':>11}",
    ]
    for method in cfg.methods:
        finals = [r for r in rows if r["method"] == method and r["step"] in final]
        values = [statistics.fmean(r[k] for r in finals) for k in REPORTED]
        clip = statistics.fmean(r["clip_frac"] for r in rows if r["method"] == method and r["step"] > 0)
        lines.append(f"{method:<{W}}" + "".join(f"{v:>14.3f}" for v in values) + f"{clip:>11.3f}")
    if "clip" in cfg.methods:
        lines += ["", f"paired differences to clip, mean +- sd over {seeds} seeds (same seed, checkpoint, prompts):"]
        lines += _paired_block(rows, [m for m in cfg.methods if m != "clip"], "clip", steps)
    others = [m for m in cfg.methods if m not in ("clip", "band-kl")]
    if "band-kl" in cfg.methods and others:
        lines += ["", "paired differences to the constant kl band (method - band-kl), mean +- sd over seeds:"]
        lines += _paired_block(rows, others, "band-kl", steps)
    lines += ["", "clip rates per old-probability bin over all of training (upper among A > 0 | lower among A < 0):"]
    lines.append(f"{'method':<{W}}" + "".join(f"{name:>18}" for *_, name in BINS))
    for method in cfg.methods:
        rates = pooled_clip_rates(rows, method)
        lines.append(f"{method:<{W}}" + "".join(f"{f'{u:.2f} | {lo:.2f}':>18}" for u, lo in rates.values()))
    extra = [m for m in cfg.methods if METHODS[m].get("lower_floor") or METHODS[m]["kind"] == "dppo"]
    if extra:
        lines += ["", "share of all tokens over training clipped below by the floor alone (r_low <= r < F), and, "
                  "under DPPO, inside the band with the weight min(r, c) truncated to c:"]  # fmt: skip
        for method in extra:
            cells = []
            for key in ("floor_frac", "truncated_frac"):
                values = [r[key] for r in rows if r["method"] == method and r["step"] > 0 and key in r]
                values = [v for v in values if not math.isnan(v)]
                if values:
                    cells.append(f"{key} {statistics.fmean(values):.4f}")
            lines.append(f"{method:<{W}}" + "   ".join(cells))
    if mechanism:
        lines += ["", format_mechanism(mechanism)]
    return "\n".join(lines)


def plot(rows: list[dict], cfg: DemoConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("mean@32", "mean@32"), ("mean@32_hard", "mean@32, hard prompts"), ("pass@32", "pass@32"),
              ("entropy", "token entropy (nats)")]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2))
    palette = plt.get_cmap("tab10").colors  # past ten methods the colours repeat, dashed
    for i, method in enumerate(cfg.methods):
        steps = sorted({r["step"] for r in rows if r["method"] == method})
        for ax, (key, label) in zip(axes, panels):
            per_step = [[r[key] for r in rows if r["method"] == method and r["step"] == s] for s in steps]
            mean = [statistics.fmean(v) for v in per_step]
            style = {"color": palette[i % 10], "linestyle": "-" if i < 10 else "--"}
            line = ax.plot(steps, mean, label=method, **style)[0]
            if len(per_step[0]) > 1:
                sd = [statistics.stdev(v) for v in per_step]
                ax.fill_between(steps, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                                color=line.get_color(), alpha=0.15)  # fmt: skip
            ax.set_xlabel("rollout")
            ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    seeds = len({r["seed"] for r in rows})
    fig.suptitle(f"GRPO on CPU, clip binding (4 epochs x 8 minibatches): mean +- sd over {seeds} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- running it
def _task_key(cfg: DemoConfig) -> str:
    """Hash of what the warm-up depends on: a cached checkpoint is reused only for the same task."""
    task = ("keys", "answer_tokens", "response_len", "fork_position", "easy_p", "fork_p_hard", "fork_p_medium",
            "warmup_steps", "_answer_table v1")
    fields = {k: v for k, v in asdict(cfg).items() if k in task}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def warm_checkpoint(cfg: DemoConfig, seed: int) -> Path:
    """The seed's warm-up checkpoint under OUT/cache, built once (same task, same seed: same file)."""
    path = Path(cfg.out) / "cache" / f"warm-{_task_key(cfg)}-seed{seed}.pt"
    if not path.exists():
        torch.set_num_threads(1)
        actor = build_actor(cfg, seed)
        warm_up(actor, cfg, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(actor.model.state_dict(), tmp)
        tmp.replace(path)
    return path


def _job(args) -> list[dict]:
    method, seed, cfg = args
    from openrlhf_band.tools.quiet import quiet_third_party_startup

    quiet_third_party_startup()
    state = torch.load(warm_checkpoint(cfg, seed), weights_only=True)
    return train_method(method, seed, state, cfg)


def _warm_job(args) -> Path:
    cfg, seed = args
    from openrlhf_band.tools.quiet import quiet_third_party_startup

    quiet_third_party_startup()
    return warm_checkpoint(cfg, seed)


def _write_csv(rows: list[dict], path: Path) -> None:
    fieldnames = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("method", "seed", "step"), k))
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def run(cfg: DemoConfig) -> dict:
    import multiprocessing

    from tqdm import tqdm

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    jobs = [(method, seed, cfg) for seed in range(cfg.seeds) for method in cfg.methods]
    context = multiprocessing.get_context("spawn")
    with context.Pool(max(1, cfg.workers)) as pool:
        list(pool.imap_unordered(_warm_job, [(cfg, s) for s in range(cfg.seeds)]))
        rows = []
        with tqdm(total=len(jobs), desc="runs (method x seed)") as bar:
            for result in pool.imap_unordered(_job, jobs):
                rows += result
                rows.sort(key=lambda r: (cfg.methods.index(r["method"]), r["seed"], r["step"]))
                _write_csv(rows, out / "metrics.csv")  # after every run: a late failure loses nothing
                bar.update(1)
    starts = [r for r in rows if r["step"] == 0 and r["method"] == cfg.methods[0]]
    start = {k: statistics.fmean(r[k] for r in starts) for k in ("mean@32", "mean@32_hard", "pass@32", "entropy",
                                                                 "p_fork_hard")}  # fmt: skip
    mechanism = mechanism_check(cfg, torch.load(warm_checkpoint(cfg, 0), weights_only=True))
    plot(rows, cfg, out / "curves.png")
    text = format_summary(rows, cfg, start, mechanism)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {out / 'metrics.csv'}, {out / 'curves.png'}, {out / 'summary.txt'} in {time.time() - started:.0f} s")
    return {"rows": rows, "start": start, "mechanism": mechanism}


FULL = {"seeds": 5, "rollouts": 80, "methods": list(METHODS)}
QUICK = {"seeds": 1, "rollouts": 15, "methods": ["clip", "band-kl"], "eval_every": 5}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    full = f"every method ({len(FULL['methods'])}), {FULL['seeds']} seeds, {FULL['rollouts']} rollouts"
    parser.add_argument("--full", action="store_true",
                        help=f"{full} (docs/demo.md: the committed summary is an 8-method run, with its command)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: clip and band-kl, 1 seed, 15 rollouts")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--methods", nargs="+", default=None, choices=list(METHODS))
    parser.add_argument("--workers", type=int, default=None, help="parallel runs (default 2)")
    parser.add_argument("--out", default="out/demo")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    if args.full and args.quick:
        raise ValueError("--full and --quick exclude each other")
    cfg = DemoConfig(out=args.out)
    for preset, on in ((FULL, args.full), (QUICK, args.quick)):
        if on:
            for key, value in preset.items():
                setattr(cfg, key, copy.copy(value))
    for key in ("seeds", "rollouts", "methods", "workers"):
        if getattr(args, key) is not None:
            setattr(cfg, key, list(args.methods) if key == "methods" else getattr(args, key))
    if cfg.seeds < 1 or cfg.rollouts < 3 * cfg.eval_every or cfg.workers < 1:
        raise ValueError(f"--seeds >= 1, --rollouts >= {3 * cfg.eval_every} and --workers >= 1, please")
    return cfg


def main(args: argparse.Namespace) -> int:
    run(config_from_args(args))
    return 0
