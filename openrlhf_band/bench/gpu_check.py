"""The GPU check's correctness step: the fused Band loss kernel against the torch reference on the device.

Run by bench/gpu_check.sh as `python3 -m openrlhf_band.bench.gpu_check --out DIR` on a CUDA machine with
torch and Triton (nothing else; the repository on PYTHONPATH). Writes DIR/correctness.json:

- `cases`: the kernel (`backend="triton"`) against the reference (`backend="torch"`) on the same device,
  loss, gradient, bounds and flags, with masked garbage (NaN log-probs, +inf old log-probs), the simplex
  edges (p = 1, p = 0 masked, log p = -1e-7) and bf16: for every divergence and dtype, all options off,
  all on, and each option alone (dual clip, relax, upper cap, per-sequence advantages); a per-token
  radius for every divergence; three shapes for kl.
- `offsets`: scalar kl on one row of 2^31 + 2^20 tokens (int64 offsets in the kernels), the loss and the
  gradient of loss.sum() checked against the reference on windows at the start, across 2^31 and at the end.
  Needs ~45 GB of free device memory (skipped below 48 GB, and said so).
- `jit_resources`: registers and spills of every kernel the run compiled, as the driver loaded them.
- `verdict`: PASS when every case and the offsets check pass, else FAIL (exit status 1).

`--dry-run --device cpu` runs the same code at tiny sizes in Triton's interpreter (TRITON_INTERPRET=1),
so this file is executed in the unit suite (tests/bench/test_gpu_check.py) before any device is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from openrlhf_band import DIVERGENCES, band_bounds
from openrlhf_band.functional import band_token_loss

OPTION_DEFAULTS = {"dual_clip": None, "relax": None, "upper_cap": None, "per_sequence_adv": False}
OPTION_VALUES = {"dual_clip": 10.0, "relax": (0.2, 0.28), "upper_cap": 10.0, "per_sequence_adv": True}
OFFSETS_TOKENS = 2**31 + 2**20
OFFSETS_MIN_FREE_BYTES = 48 * 2**30
OFFSETS_WINDOW = 4096


def option_sets() -> list[dict]:
    """All options off, all on, and each alone: every option's code path, without the 2^4 factorial."""
    sets = [dict(OPTION_DEFAULTS), dict(OPTION_VALUES)]
    for name, value in OPTION_VALUES.items():
        sets.append({**OPTION_DEFAULTS, name: value})
    return sets


def check_case(
    divergence: str,
    dtype: torch.dtype,
    dual_clip: float | None,
    relax: tuple[float, float] | None,
    upper_cap: float | None,
    shape: tuple[int, int],
    per_sequence_adv: bool,
    seed: int = 0,
    per_token: bool = False,
    device: str | torch.device = "cuda",
) -> list[str]:
    """The kernel against the torch reference on one random input on `device`; the problems found ([] = pass)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    # the radius: the scalar, or per token log-uniform over [1e-4, 1] (the range the oracle tests cover)
    delta = 10 ** (-4 * torch.rand(shape, device=device, generator=gen)) if per_token else 0.05
    old = -torch.rand(shape, device=device, generator=gen) * 12
    old[..., :3] = torch.tensor([0.0, -float("inf"), -1e-7], device=device)[: shape[-1]]
    new = (old.clamp(min=-30) + 0.4 * torch.randn(shape, device=device, generator=gen)).to(dtype)
    adv_shape = (shape[0], 1) if per_sequence_adv else shape
    adv = torch.randn(adv_shape, device=device, generator=gen)
    mask = torch.rand(shape, device=device, generator=gen) > 0.2
    mask[..., 1] = False  # p = 0 is masked here (its surrogate is undefined: r = inf)
    garbage = ~mask
    new = torch.where(garbage, torch.full_like(new, float("nan")), new).requires_grad_(True)
    old = torch.where(garbage & (torch.rand(shape, device=device, generator=gen) > 0.5), float("inf"), old)
    upstream = torch.randn(shape, device=device, generator=gen)
    kwargs = dict(divergence=divergence, delta=delta, dual_clip=dual_clip, relax=relax, upper_cap=upper_cap,
                  return_bounds=True)  # fmt: skip
    fused = band_token_loss(new, old, adv, mask, backend="triton", **kwargs)
    ref = band_token_loss(new, old, adv, mask, backend="torch", **kwargs)
    (g_fused,) = torch.autograd.grad(fused.loss, new, upstream)
    (g_ref,) = torch.autograd.grad(ref.loss, new, upstream)
    # float32: the bounds to a few ulps (tables or solver vs band_bounds), a loss of bound * A; bf16: one
    # bf16 ulp (2^-8) of the gradient where the two float32 values straddle a rounding boundary
    tol = dict(atol=1e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    lower, upper = band_bounds(old, divergence, delta, upper_cap=upper_cap, relax=relax)
    problems = []
    for name, a, b in [
        ("loss", fused.loss, ref.loss),
        ("grad", g_fused.float(), g_ref.float()),
        ("lower", fused.lower[mask], lower[mask]),
        ("upper", fused.upper[mask], upper[mask]),
    ]:
        if not torch.allclose(a, b, **tol, equal_nan=False):
            problems.append(f"{name}: max abs diff {(a - b).abs().nan_to_num(1e30).max().item():.3e}")
    flags_mismatch = sum(
        int((getattr(fused, f) != getattr(ref, f)).sum()) for f in ("clipped_upper", "clipped_lower", "dual_clipped")
    )
    if flags_mismatch > max(2, fused.loss.numel() // 100000):  # exact ties r == bound may differ in the last ulp
        problems.append(f"flags differ at {flags_mismatch} tokens")
    masked_loss = fused.loss[~mask].abs().max().item() if (~mask).any() else 0.0
    masked_grad = g_fused[~mask].abs().max().item() if (~mask).any() else 0.0
    if masked_loss != 0 or masked_grad != 0:
        problems.append("masked positions not exactly 0")
    if not torch.isfinite(fused.loss).all() or not torch.isfinite(g_fused).all():
        problems.append("non-finite loss or gradient")
    return problems


def check_offsets(num_tokens: int, device: str | torch.device, window: int = OFFSETS_WINDOW) -> dict:
    """Scalar kl on one row of `num_tokens` (beyond 2^31 on the device: the kernels' int64 offsets).

    bf16 log-probs, float32 old log-probs, one advantage for the row, no mask; the loss and the gradient of
    loss.sum() (an expanded upstream, read with stride 0) against the reference on three windows."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if free < OFFSETS_MIN_FREE_BYTES:
            return {
                "verdict": "SKIPPED",
                "reason": f"{free / 2**30:.0f} GiB free, needs {OFFSETS_MIN_FREE_BYTES >> 30}",
            }
    start = time.time()
    gen = torch.Generator(device=device).manual_seed(3)
    old = torch.empty((1, num_tokens), device=device).uniform_(-12.0, 0.0, generator=gen)
    log_probs = (old + 0.3 * torch.randn(old.shape, device=device, generator=gen)).to(torch.bfloat16)
    log_probs.requires_grad_(True)
    adv = torch.tensor([[-0.7]], device=device)
    out = band_token_loss(log_probs, old, adv, divergence="kl", delta=0.05, upper_cap=10.0, backend="triton")
    (grad,) = torch.autograd.grad(out.loss.sum(), log_probs)
    middle = min(2**31, num_tokens // 2)
    windows = {"start": (0, window), "across 2^31": (middle - window // 2, middle + window // 2),
               "end": (num_tokens - window, num_tokens)}  # fmt: skip
    problems = []
    for name, (lo, hi) in windows.items():
        part = log_probs.detach()[:, lo:hi].clone().requires_grad_(True)
        ref = band_token_loss(part, old[:, lo:hi], adv, divergence="kl", delta=0.05, upper_cap=10.0, backend="torch")
        (ref_grad,) = torch.autograd.grad(ref.loss.sum(), part)
        if not torch.allclose(out.loss[:, lo:hi], ref.loss, atol=1e-5, rtol=2e-5):
            problems.append(f"loss differs in window {name} [{lo}, {hi})")
        if not torch.allclose(grad[:, lo:hi].float(), ref_grad.float(), atol=2e-2, rtol=2e-2):
            problems.append(f"grad differs in window {name} [{lo}, {hi})")
    del out, grad, log_probs, old
    return {"verdict": "FAIL" if problems else "PASS", "tokens": num_tokens, "windows": windows,
            "problems": problems, "seconds": round(time.time() - start, 1)}  # fmt: skip


def jit_resources() -> list[dict]:
    """Registers and spills of every Band kernel this process compiled, as the driver loaded them.

    Read from the JIT caches of the two kernels (triton 3.6+: device_caches[device][0] holds the
    CompiledKernels); n_regs per thread, n_spills as the driver reports it, shared bytes per block."""
    from openrlhf_band.ops import band_loss

    rows = []
    for name in ("_band_loss_fwd_kernel", "_band_loss_bwd_kernel"):
        fn = getattr(band_loss, name)
        for caches in getattr(fn, "device_caches", {}).values():
            for kernel in caches[0].values():
                try:
                    kernel._init_handles()
                except Exception:  # noqa: BLE001 - older/newer triton: read what is there
                    pass
                consts = getattr(kernel.src, "constants", {}) if hasattr(kernel, "src") else {}
                kinds = {str(k): v for k, v in consts.items() if isinstance(v, (bool, int, float))}
                rows.append(
                    {"kernel": name, "n_regs": getattr(kernel, "n_regs", None),
                     "n_spills": getattr(kernel, "n_spills", None), "num_warps": kernel.metadata.num_warps,
                     "shared_B": kernel.metadata.shared, "constexprs": kinds}
                )  # fmt: skip
    return rows


def run(device: str, dry_run: bool) -> dict:
    """Every case and the offsets check on `device`; the report written as correctness.json."""
    import triton

    shape = (2, 70) if dry_run else (5, 4093)
    report: dict = {"step": "correctness", "device": device, "dry_run": dry_run, "torch": torch.__version__,
                    "triton": triton.__version__, "cases": []}  # fmt: skip
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    start = time.time()
    cases = []
    for divergence in DIVERGENCES:
        for dtype in (torch.float32, torch.bfloat16):
            for options in option_sets() if not dry_run else [dict(OPTION_VALUES)]:
                cases.append(dict(divergence=divergence, dtype=dtype, shape=shape, **options))
            cases.append(dict(divergence=divergence, dtype=dtype, shape=shape, per_token=True,
                              **{**OPTION_VALUES, "relax": None, "per_sequence_adv": True}))  # fmt: skip
    for kl_shape in [(3, 47)] if dry_run else [(1, 70000), (3, 47), (64, 8192)]:
        cases.append(dict(divergence="kl", dtype=torch.float32, shape=kl_shape, **OPTION_VALUES))
    for case in cases:
        problems = check_case(device=device, **case)
        report["cases"].append(
            {**case, "dtype": str(case["dtype"]), "shape": list(case["shape"]), "problems": problems}
        )
    failing = [c for c in report["cases"] if c["problems"]]
    report["failures"] = len(failing)
    report["offsets"] = check_offsets(
        3000 if dry_run else OFFSETS_TOKENS, device, window=256 if dry_run else OFFSETS_WINDOW
    )
    report["seconds"] = round(time.time() - start, 1)
    try:
        report["jit_resources"] = jit_resources() if device == "cuda" else []
    except Exception as err:  # noqa: BLE001 - a report, not a check
        report["jit_resources"] = f"not read ({type(err).__name__}: {err})"
    report["verdict"] = "FAIL" if failing or report["offsets"]["verdict"] == "FAIL" else "PASS"
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/gpu"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes (with --device cpu: the interpreter)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device; use --device cpu --dry-run (TRITON_INTERPRET=1) for the CPU run")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args.device, args.dry_run)
    (args.out / "correctness.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"correctness: {len(report['cases'])} cases, {report['failures']} failing; offsets "
          f"{report['offsets']['verdict']}; {report['seconds']:.0f} s: {report['verdict']}")  # fmt: skip
    for case in report["cases"]:
        if case["problems"]:
            print("  FAIL", case)
    if isinstance(report["jit_resources"], list) and report["jit_resources"]:
        rows = report["jit_resources"]
        spilled = sum(1 for r in rows if r["n_spills"])
        print(f"jit resources: {len(rows)} compiled kernels, max {max(r['n_regs'] or 0 for r in rows)} registers, "
              f"{spilled} with spills")  # fmt: skip
    return 0 if report["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
