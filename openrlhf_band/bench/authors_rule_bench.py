"""How the authors' p > 1 - 1e-6 rule changes clip fractions: the same rollout-like batch, the same
ratios and advantages, clipped by this project's band and by the authors' (their code sets the band
to [exp(-delta), 1] (kl), [1 - delta, 1] (tv), [1, 1] (chi2) for every token with p > 1 - 1e-6).

The batch: old log-probs from `rollout_log_probs` with a share of near-certain tokens added
(1 - p log-uniform in [1e-9, 1e-6]: the tokens a reasoning trace is full of), new probabilities from
a small logit-space step of the sampled token, logit(q) = logit(p) + z with z ~ N(0, sigma), and
advantages of random sign. A token counts as clipped as in `band/clip_frac_*`: A > 0 and r > r_up,
or A < 0 and r < r_low. Also reported: the largest weight (1 - p) that the clipped near-certain
tokens have in the gradient with respect to the logits, which is what training feels of them.

    openrlhf-band bench authors-rule --sigma 0.5     # out/bench/authors_rule_cpu_sigma0.5.json
"""

from __future__ import annotations

import argparse

import torch

from openrlhf_band.band.bounds import band_bounds
from openrlhf_band.bench.authors_baseline import authors_band_bounds
from openrlhf_band.bench.common import machine_info, rollout_log_probs, write_json

DIVERGENCES = ("kl", "tv", "chi2")


def batch(num_tokens: int, near_certain_share: float, sigma: float, seed: int = 0):
    """(old_log_probs, log_probs, advantages), float32, shape (num_tokens,)."""
    gen = torch.Generator().manual_seed(seed)
    old = rollout_log_probs(num_tokens, seed=seed).to(torch.float64)
    u = torch.rand(num_tokens, generator=gen, dtype=torch.float64)
    certain = torch.log1p(-torch.exp(torch.log(torch.tensor(1e-9)) + u * torch.log(torch.tensor(1e3))))
    old = torch.where(torch.rand(num_tokens, generator=gen) < near_certain_share, certain, old)
    logit = old - torch.log(-torch.expm1(old))  # log p - log(1 - p)
    z = sigma * torch.randn(num_tokens, generator=gen, dtype=torch.float64)
    new = torch.nn.functional.logsigmoid(logit + z)
    advantages = torch.where(torch.rand(num_tokens, generator=gen) < 0.5, 1.0, -1.0)
    return old.float(), new.float(), advantages.float()


def clipped(lower, upper, old, new, advantages):
    ratio = torch.exp(new - old)
    return ((advantages > 0) & (ratio > upper)) | ((advantages < 0) & (ratio < lower))


def run(num_tokens: int, delta: float, near_certain_share: float, sigma: float, upper_cap: float) -> dict:
    old, new, adv = batch(num_tokens, near_certain_share, sigma)
    near_one = old.double().exp() > 1 - 1e-6  # the authors' threshold, on their fp32 p
    rows = {}
    for div in DIVERGENCES:
        ours = clipped(*band_bounds(old, div, delta, upper_cap=upper_cap), old, new, adv)
        theirs = clipped(*authors_band_bounds(old, div, delta, upper_cap=upper_cap), old, new, adv)
        extra = theirs & ~ours
        weight = (-torch.expm1(old.double()))[extra & near_one]
        rows[div] = {
            "clip_frac_ours": ours.double().mean().item(),
            "clip_frac_authors": theirs.double().mean().item(),
            "clipped_by_authors_only": extra.double().mean().item(),
            "of_which_p_above_1_minus_1e-6": (extra & near_one).double().mean().item(),
            "max_logit_gradient_weight_of_those": weight.max().item() if weight.numel() else 0.0,
        }
    return {
        "benchmark": "authors_rule",
        "tokens": num_tokens,
        "delta": delta,
        "upper_cap": upper_cap,
        "near_certain_share_added": near_certain_share,
        "logit_step_sigma": sigma,
        "share_p_above_1_minus_1e-6": near_one.double().mean().item(),
        "machine": machine_info(torch.device("cpu")),
        "divergences": rows,
    }


def format_report(result: dict) -> str:
    lines = [
        f"{result['tokens']:,} tokens, delta {result['delta']}, cap {result['upper_cap']:g}, "
        f"{100 * result['share_p_above_1_minus_1e-6']:.1f}% with p > 1 - 1e-6, "
        f"logit step sigma {result['logit_step_sigma']}",
        f"{'band':<6}{'ours':>9}{'authors':>9}{'authors only':>14}{'of which p>1-1e-6':>19}{'max (1-p) there':>17}",
    ]
    for div, row in result["divergences"].items():
        lines.append(
            f"{div:<6}{100 * row['clip_frac_ours']:>8.2f}%{100 * row['clip_frac_authors']:>8.2f}%"
            f"{100 * row['clipped_by_authors_only']:>13.2f}%{100 * row['of_which_p_above_1_minus_1e-6']:>18.2f}%"
            f"{row['max_logit_gradient_weight_of_those']:>17.1e}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=524_288)
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--near-certain-share", type=float, default=0.3, help="share of tokens with p > 1 - 1e-6")
    parser.add_argument("--sigma", type=float, default=0.5, help="std of the sampled token's logit step")
    parser.add_argument("--upper-cap", type=float, default=10.0)


def main(args: argparse.Namespace) -> int:
    result = run(args.tokens, args.delta, args.near_certain_share, args.sigma, args.upper_cap)
    print(format_report(result))
    print(f"wrote {write_json(f'authors_rule_cpu_sigma{args.sigma:g}.json', result)}")
    return 0
