"""`openrlhf-band bench bounds`: the Band operator against fixed clipping and the authors' solver.

All providers run in one process on the same input, round-robin, so the printed ratios compare
like with like; absolute times on a shared CPU are noise, ratios are the result.

Providers:
  band-<div>      our `band_bounds` for each registered divergence (float32 input), scalar delta
  band-<div>-pt   the same with a per-token delta tensor (log-uniform in [0.01, 0.2], float32)
  clip            fixed clipping, the cost the band replaces: ratio.clamp(1 - 0.2, 1 + 0.2)
  authors-kl      the authors' published kl algorithm (bisection, host sync each step)
  authors-chi2    the authors' chi2 closed form (for reference)
"""

from __future__ import annotations

import argparse

import torch

from openrlhf_band.band.bounds import band_bounds
from openrlhf_band.band.divergences import DIVERGENCES
from openrlhf_band.bench.authors_baseline import authors_band_bounds
from openrlhf_band.bench.common import machine_info, rollout_log_probs, time_side_by_side, write_json

TARGET_SPEEDUP_VS_AUTHORS = 30.0
TARGET_MAX_RATIO_TO_CHI2 = 4.0
TARGET_MAX_REVERSE_KL_OVER_KL = 2.5


def run(num_tokens: int, delta: float, repeats: int, device: torch.device, threads: int | None) -> dict:
    if threads is not None and device.type == "cpu":
        torch.set_num_threads(threads)
    old_log_probs = rollout_log_probs(num_tokens, device=device)
    ratio = torch.exp(old_log_probs * 0.01)  # any ratio tensor of the same size
    gen = torch.Generator().manual_seed(1)
    per_token = torch.exp(torch.empty(num_tokens).uniform_(torch.log(torch.tensor(0.01)).item(),
                                                           torch.log(torch.tensor(0.2)).item(), generator=gen))
    per_token = per_token.to(device)
    providers = {f"band-{name}": (lambda n=name: band_bounds(old_log_probs, n, delta)) for name in DIVERGENCES}
    providers.update(
        {f"band-{name}-pt": (lambda n=name: band_bounds(old_log_probs, n, per_token)) for name in DIVERGENCES}
    )
    providers["clip"] = lambda: ratio.clamp(0.8, 1.2)
    providers["authors-kl"] = lambda: authors_band_bounds(old_log_probs, "kl", delta)
    providers["authors-chi2"] = lambda: authors_band_bounds(old_log_probs, "chi2", delta)
    timings = time_side_by_side(providers, device, repeats)

    # accuracy next to speed: largest relative deviation from our float64 path (which the test
    # suite checks against 50-digit mpmath roots), over tokens where the bound is >= 1e-3
    reference = {n: band_bounds(old_log_probs.double(), n, delta) for n in ("kl", "chi2")}

    def max_rel_error(got: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]) -> float:
        worst = 0.0
        for g, r in zip(got, ref):
            keep = torch.isfinite(r) & (r >= 1e-3)
            err = ((g.double() - r).abs() / r)[keep]
            worst = max(worst, float(err.max()) if err.numel() else 0.0)
        return worst

    reference["reverse_kl"] = band_bounds(old_log_probs.double(), "reverse_kl", delta)
    accuracy = {
        "band-kl": max_rel_error(band_bounds(old_log_probs, "kl", delta), reference["kl"]),
        "band-chi2": max_rel_error(band_bounds(old_log_probs, "chi2", delta), reference["chi2"]),
        "band-reverse_kl": max_rel_error(band_bounds(old_log_probs, "reverse_kl", delta), reference["reverse_kl"]),
        "authors-kl": max_rel_error(authors_band_bounds(old_log_probs, "kl", delta), reference["kl"]),
    }
    for name in ("kl", "reverse_kl"):
        want = band_bounds(old_log_probs.double(), name, per_token.double())
        accuracy[f"band-{name}-pt"] = max_rel_error(band_bounds(old_log_probs, name, per_token), want)
    med = {k: v["median_ms"] for k, v in timings.items()}
    ratios = {
        "authors-kl / band-kl (speedup)": med["authors-kl"] / med["band-kl"],
        "band-kl / band-chi2": med["band-kl"] / med["band-chi2"],
        "band-kl / clip": med["band-kl"] / med["clip"],
        "band-chi2 / clip": med["band-chi2"] / med["clip"],
        "band-reverse_kl / band-kl": med["band-reverse_kl"] / med["band-kl"],
        "band-kl-pt / band-kl": med["band-kl-pt"] / med["band-kl"],
        "band-chi2-pt / band-chi2": med["band-chi2-pt"] / med["band-chi2"],
    }
    return {
        "benchmark": "bounds",
        "config": {
            "num_tokens": num_tokens,
            "delta": delta,
            "repeats": repeats,
            "input": "rollout_log_probs",
        },
        "machine": machine_info(device),
        "timings": timings,
        "ratios": ratios,
        "max_rel_error_vs_float64": accuracy,
        "targets": {
            "speedup_vs_authors_kl_at_least": TARGET_SPEEDUP_VS_AUTHORS,
            "kl_over_chi2_at_most": TARGET_MAX_RATIO_TO_CHI2,
            "reverse_kl_over_kl_at_most": TARGET_MAX_REVERSE_KL_OVER_KL,
            "met": ratios["authors-kl / band-kl (speedup)"] >= TARGET_SPEEDUP_VS_AUTHORS
            and ratios["band-kl / band-chi2"] <= TARGET_MAX_RATIO_TO_CHI2
            and ratios["band-reverse_kl / band-kl"] <= TARGET_MAX_REVERSE_KL_OVER_KL,
        },
    }


def format_report(result: dict) -> str:
    lines = [
        f"bounds benchmark: {result['config']['num_tokens']:,} tokens, delta={result['config']['delta']}, "
        f"device={result['machine']['device']}, threads={result['machine']['threads']}, "
        f"median of {result['config']['repeats']}",
        f"{'provider':<22}{'median ms':>12}{'min ms':>10}",
    ]
    for name, t in result["timings"].items():
        lines.append(f"{name:<22}{t['median_ms']:>12.2f}{t['min_ms']:>10.2f}")
    lines.append("ratios (same run):")
    lines += [f"  {k:<34}{v:>10.2f}" for k, v in result["ratios"].items()]
    lines.append("max relative error vs float64 (bounds >= 1e-3):")
    lines += [f"  {k:<34}{v:>10.2e}" for k, v in result["max_rel_error_vs_float64"].items()]
    t = result["targets"]
    lines.append(
        f"targets: speedup >= {t['speedup_vs_authors_kl_at_least']:g}x, kl/chi2 <= "
        f"{t['kl_over_chi2_at_most']:g}x, reverse_kl/kl <= {t['reverse_kl_over_kl_at_most']:g}x "
        f"-> {'met' if t['met'] else 'NOT met'}"
    )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=524_288)
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1, as in the brief)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cpu, then cuda when present)")


def main(args: argparse.Namespace) -> int:
    devices = [torch.device(args.device)] if args.device else [torch.device("cpu")]
    if args.device is None and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    for device in devices:
        result = run(args.tokens, args.delta, args.repeats, device, args.threads)
        path = write_json(f"bounds_{device.type}.json", result)
        print(format_report(result))
        print(f"wrote {path}")
    return 0
