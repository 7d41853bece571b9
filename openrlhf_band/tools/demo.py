"""`openrlhf-band demo`: GRPO on a CPU with a tiny random transformer, clip vs Clip-Higher vs BandPO.

The task has the exploration bottleneck built in. A prompt is a few random tokens; its correct
answers are a small set of answer tokens determined by the prompt (a rule the model can learn).
A short supervised warm-up on data where correct answers are rare (most targets are a distractor
token) leaves each correct answer at a low probability, the regime where a fixed clip caps how
far a rare good token may rise per rollout (q <= 1.2 p) and the band does not (q <= r_up(p) p).

Then, from the same checkpoint, with the same seeds, prompts and number of steps, every method
trains through the real pieces: OpenRLHF's `Actor` around a transformers Qwen2 model, OpenRLHF's
`PolicyLoss` (clip baselines) or this project's `BandPolicyLoss` (band), group-normalised
advantages and the k3 KL loss to the warm-up reference as OpenRLHF computes them
(`compute_approx_kl`, `aggregate_loss`), several optimizer steps per rollout as in the recipe.
"""

from __future__ import annotations

import argparse
import copy
import csv
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

METHODS = {
    "clip": {"loss": "ppo", "eps": (0.2, 0.2)},
    "clip-higher": {"loss": "ppo", "eps": (0.2, 0.28)},
    "band-kl": {"loss": "band", "divergence": "kl"},
    "band-tv": {"loss": "band", "divergence": "tv"},
    "band-chi2": {"loss": "band", "divergence": "chi2"},
}


@dataclass
class DemoConfig:
    steps: int = 40  # rollouts per method
    seeds: int = 3
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    inner_steps: int = 8  # optimizer steps per rollout (mini-batches of one rollout)
    lr: float = 1e-3
    delta: float = 0.05
    upper_cap: float = 10.0
    kl_coef: float = 0.001
    reward_threshold: float = 0.8
    warmup_steps: int = 300
    # task
    prompt_len: int = 3
    num_prompt_tokens: int = 8
    num_answers: int = 8
    correct_per_prompt: int = 2
    warmup_correct_fraction: float = 0.12
    out: str = "out/demo"


# vocabulary: 0 = BOS, then prompt tokens, then answer tokens, then the distractor
def _vocab(cfg: DemoConfig) -> tuple[int, int, int]:
    prompt0 = 1
    answer0 = prompt0 + cfg.num_prompt_tokens
    distractor = answer0 + cfg.num_answers
    return prompt0, answer0, distractor


def correct_answers(prompts: Tensor, cfg: DemoConfig) -> Tensor:
    """(N, correct_per_prompt) answer token ids: the rule the model must discover."""
    _, answer0, _ = _vocab(cfg)
    base = (prompts[:, 1] - 1) % cfg.num_answers  # a lookup from the first prompt token
    offsets = torch.arange(cfg.correct_per_prompt) * (cfg.num_answers // cfg.correct_per_prompt)
    return answer0 + (base[:, None] + offsets[None, :]) % cfg.num_answers


def sample_prompts(n: int, cfg: DemoConfig, gen: torch.Generator) -> Tensor:
    prompt0, _, _ = _vocab(cfg)
    body = prompt0 + torch.randint(0, cfg.num_prompt_tokens, (n, cfg.prompt_len - 1), generator=gen)
    return torch.cat([torch.zeros(n, 1, dtype=torch.long), body], dim=1)  # BOS first


def build_actor(cfg: DemoConfig, seed: int):
    """A tiny random Qwen2 in OpenRLHF's Actor (CPU, float32, eager attention; no downloads)."""
    from openrlhf.models import Actor
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    _, _, distractor = _vocab(cfg)
    config = Qwen2Config(
        vocab_size=distractor + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True,
    )  # fmt: skip
    config._attn_implementation = "eager"
    actor = Actor(Qwen2ForCausalLM(config))
    actor.packing_samples = False  # OpenRLHF 0.11.2: Actor(model_object) never sets it
    return actor


def answer_logits(actor, prompts: Tensor) -> Tensor:
    """Next-token logits after each prompt, (N, vocab)."""
    return actor.model(input_ids=prompts, attention_mask=torch.ones_like(prompts)).logits[:, -1, :].float()


def warm_up(actor, cfg: DemoConfig, seed: int) -> None:
    """Supervised warm-up where correct answers are rare: targets are the distractor, except a
    `warmup_correct_fraction` of them, spread over the correct answers with skewed weights."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    _, _, distractor = _vocab(cfg)
    optim = torch.optim.Adam(actor.model.parameters(), lr=3e-3)
    weights = torch.tensor([0.7, 0.3] + [0.0] * max(0, cfg.correct_per_prompt - 2))[: cfg.correct_per_prompt]
    actor.train()
    for _ in range(cfg.warmup_steps):
        prompts = sample_prompts(128, cfg, gen)
        correct = correct_answers(prompts, cfg)
        pick = torch.multinomial(weights / weights.sum(), 128, replacement=True, generator=gen)
        targets = torch.where(
            torch.rand(128, generator=gen) < cfg.warmup_correct_fraction,
            correct.gather(1, pick[:, None])[:, 0],
            torch.full((128,), distractor),
        )
        loss = torch.nn.functional.cross_entropy(answer_logits(actor, prompts), targets)
        optim.zero_grad()
        loss.backward()
        optim.step()


@torch.no_grad()
def evaluate(actor, prompts: Tensor, cfg: DemoConfig) -> dict[str, float]:
    """Expected reward (probability mass on correct answers) and answer entropy, in nats."""
    actor.eval()
    probs = torch.softmax(answer_logits(actor, prompts), dim=-1)
    correct = correct_answers(prompts, cfg)
    p_correct = probs.gather(1, correct).sum(-1)
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
    rare = probs.gather(1, correct[:, -1:])[:, 0]  # the rarer correct answer after warm-up
    return {
        "expected_reward": p_correct.mean().item(),
        "entropy": entropy.mean().item(),
        "p_rare_correct": rare.mean().item(),
    }


def make_loss(method: str, cfg: DemoConfig):
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_band.integration.policy_loss import BandPolicyLoss

    spec = METHODS[method]
    common = dict(token_level_loss=False)  # seq-mean-token-mean, as in the recipe
    if spec["loss"] == "ppo":
        return PolicyLoss(*spec["eps"], **common)
    return BandPolicyLoss(
        divergence=spec["divergence"], delta=cfg.delta, upper_cap=cfg.upper_cap, backend="torch", **common
    )


def train_method(method: str, seed: int, warm_state: dict, cfg: DemoConfig, eval_prompts: Tensor, progress=None):
    """GRPO from the warm-up checkpoint; returns one row of metrics per rollout."""
    from openrlhf.models.loss import aggregate_loss
    from openrlhf.models.utils import compute_approx_kl

    actor = build_actor(cfg, seed)
    actor.model.load_state_dict(warm_state)
    reference = build_actor(cfg, seed)
    reference.model.load_state_dict(warm_state)
    reference.eval()
    loss_fn = make_loss(method, cfg)
    optim = torch.optim.Adam(actor.model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(20_000 + seed)  # same prompts and sampling noise for every method
    n, g = cfg.prompts_per_step, cfg.samples_per_prompt
    rows = []
    for step in range(1, cfg.steps + 1):
        prompts = sample_prompts(n, cfg, gen)
        with torch.no_grad():
            actor.eval()
            probs = torch.softmax(answer_logits(actor, prompts), dim=-1)
            answers = torch.multinomial(probs, g, replacement=True, generator=gen)  # (n, g)
        sequences = torch.cat([prompts.repeat_interleave(g, 0), answers.reshape(-1, 1)], dim=1)
        attention_mask = torch.ones_like(sequences)
        action_mask = torch.ones(n * g, 1)
        correct = (answers[:, :, None] == correct_answers(prompts, cfg)[:, None, :]).any(-1).float()
        # group-normalised advantages, as OpenRLHF's group_norm estimator
        adv = (correct - correct.mean(-1, keepdim=True)) / (correct.std(-1, keepdim=True) + 1e-9)
        advantages = adv.reshape(-1, 1)
        with torch.no_grad():
            old_log_probs = actor(sequences, action_mask, attention_mask=attention_mask)
            ref_log_probs = reference(sequences, action_mask, attention_mask=attention_mask)

        actor.train()
        clip_fracs, band_upper = [], []
        order = torch.randperm(n * g, generator=gen).chunk(cfg.inner_steps)
        for idx in order:
            log_probs = actor(sequences[idx], action_mask[idx], attention_mask=attention_mask[idx])
            policy_loss, clip_ratio, _, _, _ = loss_fn(
                log_probs, old_log_probs[idx], advantages[idx], action_mask=action_mask[idx]
            )
            kl = compute_approx_kl(log_probs, ref_log_probs[idx], kl_estimator="k3")
            kl_loss = aggregate_loss(kl, action_mask[idx], token_level_loss=False)
            loss = policy_loss + cfg.kl_coef * kl_loss
            optim.zero_grad()
            loss.backward()
            optim.step()
            clip_fracs.append(clip_ratio.item())
            metrics = getattr(loss_fn, "band_metrics", None)
            if metrics:
                band_upper.append(metrics["band/upper_mean"].item())
        row = {"method": method, "seed": seed, "step": step, "sampled_reward": correct.mean().item()}
        row.update(evaluate(actor, eval_prompts, cfg))
        row["clip_frac"] = statistics.fmean(clip_fracs)
        row["band_upper_mean"] = statistics.fmean(band_upper) if band_upper else float("nan")
        rows.append(row)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(reward=f"{row['expected_reward']:.2f}", entropy=f"{row['entropy']:.2f}")
    return rows


def mechanism_check(
    cfg: DemoConfig, warm_state: dict | None = None, seed: int = 0, updates: int = 600, lr: float = 1e-4
) -> dict[str, float]:
    """One update (many optimizer steps on one rollout) from the warm-up checkpoint: how far the
    rarer correct answer, sampled with advantage +1, may rise under clip 0.2 and under the kl band.

    Once a token's ratio passes its upper bound its gradient is zero, so the rise saturates near
    the bound: about 1.2 under clip and about r_up(p) under the band. Plain SGD in small steps
    (lr 1e-4: one step of lr 0.05 already multiplies p by 15, clip or not, as the bound only acts
    on the next step),
    because Adam keeps moving on its momentum after the gradient has vanished and would blur the
    bound. Returns geometric means over the tokens of p_old, each method's ratio pi_new / pi_old,
    and each method's upper bound.
    """
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_band.band.bounds import band_bounds
    from openrlhf_band.integration.policy_loss import BandPolicyLoss

    warm = build_actor(cfg, seed)
    if warm_state is None:
        warm_up(warm, cfg, seed)
    else:
        warm.model.load_state_dict(warm_state)
    state = copy.deepcopy(warm.model.state_dict())
    # a single token: with several, the ones still below their bound keep moving the shared weights
    # and drag the clipped ones along (a real effect of clipping, but not the one measured here)
    prompts = sample_prompts(1, cfg, torch.Generator().manual_seed(40_000 + seed))
    sequences = torch.cat([prompts, correct_answers(prompts, cfg)[:, -1:]], dim=1)
    attention_mask, action_mask = torch.ones_like(sequences), torch.ones(len(prompts), 1)
    advantages = torch.ones(len(prompts), 1)
    with torch.no_grad():
        warm.eval()
        old = warm(sequences, action_mask, attention_mask=attention_mask)
    result = {"p_old": old.mean().exp().item()}
    losses = {
        "clip": PolicyLoss(0.2, 0.2),
        "band-kl": BandPolicyLoss(divergence="kl", delta=cfg.delta, upper_cap=cfg.upper_cap, backend="torch"),
    }
    for name, loss_fn in losses.items():
        actor = build_actor(cfg, seed)
        actor.model.load_state_dict(state)
        actor.train()
        optim = torch.optim.SGD(actor.model.parameters(), lr=lr)
        for _ in range(updates):
            loss = loss_fn(actor(sequences, action_mask, attention_mask=attention_mask), old, advantages,
                           action_mask=action_mask)[0]  # fmt: skip
            optim.zero_grad()
            loss.backward()
            optim.step()
        with torch.no_grad():
            actor.eval()
            new = actor(sequences, action_mask, attention_mask=attention_mask)
        result[f"ratio_{name}"] = (new - old).mean().exp().item()
    result["bound_clip"] = 1.2
    result["bound_band-kl"] = band_bounds(old, "kl", cfg.delta, upper_cap=cfg.upper_cap)[1].log().mean().exp().item()
    return result


def format_mechanism(m: dict[str, float]) -> str:
    return (
        f"one update from the warm-up checkpoint, rare correct answer (p = {m['p_old']:.3f}), advantage +1: "
        f"rises x{m['ratio_clip']:.2f} under clip 0.2 (bound 1.2), x{m['ratio_band-kl']:.2f} under the kl band "
        f"(bound {m['bound_band-kl']:.2f})"
    )


def summarize(rows: list[dict], cfg: DemoConfig) -> list[dict]:
    summary = []
    for method in cfg.methods:
        runs: dict[int, list[dict]] = {}
        for r in rows:
            if r["method"] == method:
                runs.setdefault(r["seed"], []).append(r)
        finals = [run[-1] for run in runs.values()]
        reach = []
        for run in runs.values():
            hit = next((r["step"] for r in run if r["expected_reward"] >= cfg.reward_threshold), None)
            reach.append(hit)
        summary.append(
            {
                "method": method,
                "final_reward": statistics.fmean(f["expected_reward"] for f in finals),
                "steps_to_threshold": (
                    statistics.fmean(s for s in reach if s is not None) if all(s is not None for s in reach) else None
                ),
                "reached": f"{sum(s is not None for s in reach)}/{len(reach)}",
                "final_entropy": statistics.fmean(f["entropy"] for f in finals),
                "final_p_rare_correct": statistics.fmean(f["p_rare_correct"] for f in finals),
                "clip_frac": statistics.fmean(r["clip_frac"] for run in runs.values() for r in run),
            }
        )
    return summary


def format_summary(summary: list[dict], cfg: DemoConfig, start: dict) -> str:
    lines = [
        f"after warm-up: expected reward {start['expected_reward']:.3f}, entropy {start['entropy']:.3f} nats, "
        f"rarer correct answer p = {start['p_rare_correct']:.3f}",
        f"{'method':<12}{'final reward':>13}{'steps to ' + format(cfg.reward_threshold, 'g'):>14}{'reached':>9}"
        f"{'entropy':>9}{'p(rare ok)':>11}{'clip frac':>11}",
    ]
    for s in summary:
        steps = f"{s['steps_to_threshold']:.1f}" if s["steps_to_threshold"] is not None else "-"
        lines.append(
            f"{s['method']:<12}{s['final_reward']:>13.3f}{steps:>14}{s['reached']:>9}{s['final_entropy']:>9.3f}"
            f"{s['final_p_rare_correct']:>11.3f}{s['clip_frac']:>11.3f}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], cfg: DemoConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [("expected_reward", "expected reward"), ("entropy", "answer entropy (nats)"),
              ("p_rare_correct", "p(rarer correct answer)")]  # fmt: skip
    for method in cfg.methods:
        steps = sorted({r["step"] for r in rows if r["method"] == method})
        for ax, (key, label) in zip(axes, panels):
            per_step = [[r[key] for r in rows if r["method"] == method and r["step"] == s] for s in steps]
            mean = [statistics.fmean(v) for v in per_step]
            line = ax.plot(steps, mean, label=method)[0]
            if cfg.seeds > 1:
                ax.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step],
                                color=line.get_color(), alpha=0.15)  # fmt: skip
            ax.set_xlabel("rollout step")
            ax.set_ylabel(label)
    axes[0].axhline(cfg.reward_threshold, color="grey", ls=":", lw=1)
    axes[0].legend()
    fig.suptitle(f"GRPO on CPU from one warm-up checkpoint (mean and min-max over {cfg.seeds} seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg: DemoConfig) -> dict:
    from tqdm import tqdm

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows, starts, first_warm_state = [], [], None
    for seed in range(cfg.seeds):
        warm = build_actor(cfg, seed)
        warm_up(warm, cfg, seed)
        warm_state = copy.deepcopy(warm.model.state_dict())
        first_warm_state = first_warm_state or warm_state
        eval_prompts = sample_prompts(512, cfg, torch.Generator().manual_seed(30_000 + seed))
        starts.append(evaluate(warm, eval_prompts, cfg))
        for method in cfg.methods:
            with tqdm(total=cfg.steps, desc=f"seed {seed} {method:<12}", leave=True) as bar:
                rows += train_method(method, seed, warm_state, cfg, eval_prompts, bar)
    start = {k: statistics.fmean(s[k] for s in starts) for k in starts[0]}
    summary = summarize(rows, cfg)
    mechanism = mechanism_check(cfg, first_warm_state)
    with (out / "metrics.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, cfg, out / "curves.png")
    text = format_summary(summary, cfg, start) + "\n" + format_mechanism(mechanism)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    print(f"wrote {out / 'metrics.csv'}, {out / 'curves.png'}, {out / 'summary.txt'} in {time.time() - started:.0f} s")
    return {"rows": rows, "summary": summary, "start": start, "mechanism": mechanism}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one seed, fewer steps (about 2 minutes)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--methods", nargs="+", default=None, choices=list(METHODS))
    parser.add_argument("--out", default="out/demo")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    cfg = DemoConfig(out=args.out)
    if args.quick:
        cfg.seeds, cfg.steps = 1, 25
    if args.seeds is not None:
        cfg.seeds = args.seeds
    if args.steps is not None:
        cfg.steps = args.steps
    if args.methods:
        cfg.methods = list(args.methods)
    if cfg.seeds < 1 or cfg.steps < 1:
        raise ValueError("--seeds and --steps must be >= 1")
    return cfg


def main(args: argparse.Namespace) -> int:
    run(config_from_args(args))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
