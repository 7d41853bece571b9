"""`openrlhf-band bench kernel`: the fused Band loss against the torch reference and PPO clipping.

Providers, side by side in one run on the same inputs (round-robin timing):
  fused-<div>   the Triton kernel (CUDA only: the CPU interpreter is a correctness tool, not a
                speed one, so it is skipped on CPU)
  torch-<div>   the pure-torch reference (`band_token_loss_reference`)
  ...-pt        the same two with a per-token delta tensor (log-uniform in [0.01, 0.2], float32)
  ppo-clip      per-token PPO clipping exactly as OpenRLHF 0.11.2's PolicyLoss computes it
                (clamped log-ratio, exp, two surrogates, min) with autograd
Modes: forward, backward (given a forward graph), full (forward + backward). Peak memory per
provider on CUDA; on CPU, the bytes autograd saves for backward. On CUDA also the fused kernel's
achieved bandwidth against a device-to-device copy measured in the same run.
"""

from __future__ import annotations

import argparse
import csv
import math

import torch

from openrlhf_band.band.spec import spec_from_keywords
from openrlhf_band.bench.common import (
    machine_info,
    results_dir,
    rollout_log_probs,
    synchronize,
    time_side_by_side,
    write_json,
)
from openrlhf_band.ops.reference import LOG_RATIO_CLAMP, band_token_loss_reference


def ppo_clip_token_loss(log_probs, old_log_probs, advantages, eps_low=0.2, eps_high=0.2):
    """OpenRLHF 0.11.2 PolicyLoss.forward's per-token loss ("ppo", no dual-clip), before aggregation."""
    log_ratio = (log_probs - old_log_probs).clamp(min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    return -torch.min(surr1, surr2)


def make_inputs(num_tokens: int, device: torch.device, seq_len: int = 4096):
    rows = max(1, num_tokens // seq_len)
    old = rollout_log_probs(rows * seq_len, device=device).view(rows, seq_len)
    gen = torch.Generator(device="cpu").manual_seed(1)
    drift = (0.1 * torch.randn(rows, seq_len, generator=gen)).to(device)
    log_probs = (old + drift).requires_grad_(True)
    advantages = torch.randn(rows, 1, generator=gen).to(device)  # GRPO: one advantage per sequence
    mask = (torch.rand(rows, seq_len, generator=gen) < 0.9).to(device)
    upstream = torch.rand(rows, seq_len, generator=gen).to(device)
    return log_probs, old, advantages, mask, upstream


def per_token_delta(like: torch.Tensor) -> torch.Tensor:
    """A per-token radius, log-uniform in [0.01, 0.2], float32, of like's shape and device."""
    gen = torch.Generator(device="cpu").manual_seed(2)
    u = torch.rand(like.shape, generator=gen)
    return torch.exp(math.log(0.01) + u * (math.log(0.2) - math.log(0.01))).to(like.device)


def _band(divergence: str, delta) -> dict:
    """The launchers' band arguments (the spec, and a per-token radius or None) with the scripts' cap 10."""
    spec, radius = spec_from_keywords(divergence, delta, upper_cap=10.0)
    return {"spec": spec, "radius": radius}


def _providers(inputs, divergences, device, with_per_token: bool = True):
    log_probs, old, adv, mask, _ = inputs
    deltas = {"": 0.05, "-pt": per_token_delta(old)} if with_per_token else {"": 0.05}
    providers = {}
    if device.type == "cuda":
        from openrlhf_band.ops.band_loss import band_token_loss_triton

        for div in divergences:
            for suffix, delta in deltas.items():
                band = _band(div, delta)
                providers[f"fused-{div}{suffix}"] = lambda band=band: (
                    band_token_loss_triton(log_probs, old, adv, mask, **band).loss
                )
    for div in divergences:
        for suffix, delta in deltas.items():
            band = _band(div, delta)
            providers[f"torch-{div}{suffix}"] = lambda band=band: (
                band_token_loss_reference(log_probs, old, adv, mask, **band).loss
            )
    providers["ppo-clip"] = lambda: ppo_clip_token_loss(log_probs, old, adv) * mask
    return providers


def _saved_bytes(fn) -> int:
    """Bytes of tensors autograd saves for backward while running fn (CPU memory proxy)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def run(num_tokens: int, repeats: int, device: torch.device, divergences, threads: int | None) -> dict:
    if threads is not None and device.type == "cpu":
        torch.set_num_threads(threads)
    inputs = make_inputs(num_tokens, device)
    log_probs, upstream = inputs[0], inputs[4]
    providers = _providers(inputs, divergences, device)

    forward = {name: (lambda f=fn: f()) for name, fn in providers.items()}

    def full_of(f):
        return lambda: torch.autograd.grad(f(), log_probs, upstream)

    full = {name: full_of(fn) for name, fn in providers.items()}
    results = {
        "forward": time_side_by_side(forward, device, repeats),
        "full": time_side_by_side(full, device, repeats),
    }
    # backward alone = full - forward (medians): isolates it without timing graph construction
    results["backward"] = {
        name: {"median_ms": results["full"][name]["median_ms"] - results["forward"][name]["median_ms"]}
        for name in providers
    }

    memory = {}
    for name, fn in providers.items():
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            torch.autograd.grad(fn(), log_probs, upstream)
            synchronize(device)
            memory[name] = {"peak_extra_bytes": torch.cuda.max_memory_allocated() - base}
        else:
            memory[name] = {"saved_for_backward_bytes": _saved_bytes(fn)}

    ratios = {}
    for div in divergences:
        for mode in ("forward", "backward", "full"):
            clip = results[mode]["ppo-clip"]["median_ms"]
            for kind in ("fused", "torch"):
                for suffix in ("", "-pt"):
                    name = f"{kind}-{div}{suffix}"
                    if name in results[mode] and clip > 0:
                        ratios[f"{name} / ppo-clip ({mode})"] = results[mode][name]["median_ms"] / clip
    bandwidth = {}
    if device.type == "cuda":
        blob = torch.empty(num_tokens * 8, dtype=torch.uint8, device=device)
        copy_ms = time_side_by_side({"copy": lambda: blob.clone()}, device, repeats)["copy"]["median_ms"]
        copy_bytes_per_s = 2 * blob.numel() / (copy_ms / 1e3)
        from openrlhf_band.bench.gpu_speed import kernel_bytes_per_token  # the kernel's real bytes, from the tensors

        n = log_probs.numel()
        _, old, adv, mask, _ = inputs
        for div in divergences:
            for suffix, radius in (("", 0.05), ("-pt", per_token_delta(old))):
                name = f"fused-{div}{suffix}"
                if name not in results["forward"]:
                    continue
                fwd = results["forward"][name]["median_ms"] / 1e3
                moved = kernel_bytes_per_token(log_probs, old, adv, mask, radius) * n
                bandwidth[f"{name} forward"] = {
                    "bytes_per_s": moved / fwd,
                    "fraction_of_copy": moved / fwd / copy_bytes_per_s,
                }
        bandwidth["device_copy_bytes_per_s"] = copy_bytes_per_s
    return {
        "benchmark": "kernel",
        "config": {"num_tokens": log_probs.numel(), "repeats": repeats, "divergences": list(divergences)},
        "machine": machine_info(device),
        "timings": results,
        "memory": memory,
        "ratios": ratios,
        "bandwidth": bandwidth,
    }


def append_csv(result: dict) -> None:
    """Long format, one row per (device, tokens, provider, mode), appended across runs."""
    path = results_dir() / "kernel.csv"
    new = not path.exists()
    with path.open("a", newline="") as fh:
        writer = csv.writer(fh)
        if new:
            writer.writerow(["device", "gpu", "num_tokens", "provider", "mode", "median_ms"])
        for mode, per_provider in result["timings"].items():
            for provider, t in per_provider.items():
                writer.writerow(
                    [
                        result["machine"]["device"],
                        result["machine"].get("gpu", ""),
                        result["config"]["num_tokens"],
                        provider,
                        mode,
                        f"{t['median_ms']:.4f}",
                    ]
                )


def format_report(result: dict) -> str:
    lines = [
        f"kernel benchmark: {result['config']['num_tokens']:,} tokens, device={result['machine']['device']}"
        f" {result['machine'].get('gpu', '')}, threads={result['machine']['threads']}"
    ]
    lines.append(f"{'provider':<22}{'forward ms':>12}{'backward ms':>13}{'full ms':>10}{'memory MiB':>12}")
    for name in result["timings"]["forward"]:
        mem = next(iter(result["memory"][name].values())) / 2**20
        lines.append(
            f"{name:<22}{result['timings']['forward'][name]['median_ms']:>12.2f}"
            f"{result['timings']['backward'][name]['median_ms']:>13.2f}"
            f"{result['timings']['full'][name]['median_ms']:>10.2f}{mem:>12.1f}"
        )
    lines.append("ratios to ppo-clip (same run):")
    lines += [f"  {k:<44}{v:>8.2f}" for k, v in result["ratios"].items()]
    for k, v in result["bandwidth"].items():
        if isinstance(v, dict):
            lines.append(f"  {k}: {v['bytes_per_s'] / 1e9:.0f} GB/s = {v['fraction_of_copy']:.0%} of device copy")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, nargs="+", default=[524_288, 4_194_304])
    parser.add_argument("--divergences", nargs="+", default=["kl", "chi2"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present, else cpu)")


def main(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for num_tokens in args.tokens:
        result = run(num_tokens, args.repeats, device, args.divergences, args.threads)
        path = write_json(f"kernel_{device.type}_{num_tokens}.json", result)
        append_csv(result)
        print(format_report(result))
        print(f"wrote {path}")
    return 0
