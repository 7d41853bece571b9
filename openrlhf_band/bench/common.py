"""Shared benchmark plumbing: rollout-shaped inputs, side-by-side timing, result files."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def require_modules(*names: str) -> None:
    """Raise ModuleNotFoundError (the CLI turns it into the install line) for the first of `names` that
    this environment lacks, before a benchmark starts worker processes that would fail one by one."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def rollout_log_probs(num_tokens: int, seed: int = 0, device: str | torch.device = "cpu") -> torch.Tensor:
    """Old log-probs shaped like real LLM rollouts, float32, shape (num_tokens,).

    Most sampled tokens are near-certain (p close to 1); a minority are spread log-uniformly down to
    p ~ 1e-8. The mix: 75% with 1 - p ~ LogUniform(1e-6, 0.1), 25% with p ~ LogUniform(1e-8, 0.9).
    """
    gen = torch.Generator().manual_seed(seed)
    confident = torch.rand(num_tokens, generator=gen, dtype=torch.float64)
    one_minus_p = torch.exp(torch.log(torch.tensor(1e-6)) + confident * torch.log(torch.tensor(1e5)))
    head = torch.log1p(-one_minus_p)
    tail = torch.log(torch.tensor(1e-8)) + torch.rand(num_tokens, generator=gen, dtype=torch.float64) * (
        torch.log(torch.tensor(0.9)) - torch.log(torch.tensor(1e-8))
    )
    pick_tail = torch.rand(num_tokens, generator=gen) < 0.25
    return torch.where(pick_tail, tail, head).to(torch.float32).to(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_side_by_side(
    providers: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 1
) -> dict[str, dict[str, float]]:
    """Time each provider `repeats` times, round-robin (so drift hits all alike); ms statistics."""
    for fn in providers.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in providers}
    for _ in range(repeats):
        for name, fn in providers.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {
        name: {"median_ms": statistics.median(s), "min_ms": min(s), "max_ms": max(s), "repeats": len(s)}
        for name, s in samples.items()
    }


def machine_info(device: torch.device) -> dict[str, object]:
    info: dict[str, object] = {
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# where a benchmark writes unless told: not bench/results/, the committed tables, which a run updates only
# when asked (`openrlhf-band bench ... --results-dir bench/results`, or OPENRLHF_BAND_BENCH_DIR)
DEFAULT_RESULTS_DIR = "out/bench"


def results_dir() -> Path:
    """OPENRLHF_BAND_BENCH_DIR (set by `--results-dir`), else out/bench, under the current directory."""
    path = Path(os.environ.get("OPENRLHF_BAND_BENCH_DIR") or DEFAULT_RESULTS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(name: str, payload: dict) -> Path:
    path = results_dir() / name
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path
