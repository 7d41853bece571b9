"""GPU correctness and speed check for the fused Band loss kernel, in one process.

Run by bench/gpu_check.sh (`python3 -m openrlhf_band.bench.gpu_check`, the repository on
PYTHONPATH) on a CUDA machine whose image has torch and triton (it installs nothing).
Correctness: the kernel against the torch reference on CUDA for every divergence and option,
including masked garbage and bf16. The benchmarks (speed) are bench/gpu_check.sh's next steps.
Everything is written under $OUT (default out/bench/gpu).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch

from openrlhf_band import DIVERGENCES, band_bounds
from openrlhf_band.functional import band_token_loss


def check_case(divergence, dtype, dual_clip, relax, upper_cap, shape, per_sequence_adv, seed=0, per_token=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    # the radius: the scalar, or per token log-uniform over [1e-4, 1] (the range the oracle tests cover)
    delta = 10 ** (-4 * torch.rand(shape, device="cuda", generator=gen)) if per_token else 0.05
    old = -torch.rand(shape, device="cuda", generator=gen) * 12
    old[..., :3] = torch.tensor([0.0, -float("inf"), -1e-7], device="cuda")[: shape[-1]]
    new = (old.clamp(min=-30) + 0.4 * torch.randn(shape, device="cuda", generator=gen)).to(dtype)
    adv_shape = (shape[0], 1) if per_sequence_adv else shape
    adv = torch.randn(adv_shape, device="cuda", generator=gen)
    mask = torch.rand(shape, device="cuda", generator=gen) > 0.2
    mask[..., 1] = False  # p = 0 is masked here (its surrogate is undefined: r = inf)
    garbage = ~mask
    new = torch.where(garbage, torch.full_like(new, float("nan")), new).requires_grad_(True)
    old = torch.where(garbage & (torch.rand(shape, device="cuda", generator=gen) > 0.5), float("inf"), old)
    upstream = torch.randn(shape, device="cuda", generator=gen)
    kwargs = dict(divergence=divergence, delta=delta, dual_clip=dual_clip, relax=relax, upper_cap=upper_cap,
                  return_bounds=True)
    fused = band_token_loss(new, old, adv, mask, backend="triton", **kwargs)
    ref = band_token_loss(new, old, adv, mask, backend="torch", **kwargs)
    (g_fused,) = torch.autograd.grad(fused.loss, new, upstream)
    (g_ref,) = torch.autograd.grad(ref.loss, new, upstream)
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
    if fused.loss[~mask].abs().max().item() != 0 or g_fused[~mask].abs().max().item() != 0:
        problems.append("masked positions not exactly 0")
    if not torch.isfinite(fused.loss).all() or not torch.isfinite(g_fused).all():
        problems.append("non-finite loss or gradient")
    return problems


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


def main() -> int:
    out = Path(os.environ.get("OUT", "out/bench/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    assert torch.cuda.is_available(), "gpu_check.py needs CUDA"
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    import triton

    report["triton"] = triton.__version__
    failures = 0
    start = time.time()
    grid = itertools.product(
        DIVERGENCES, (torch.float32, torch.bfloat16), (None, 10.0), (None, (0.2, 0.28)), (None, 10.0), (False, True)
    )
    for divergence, dtype, dual, relax, cap, per_seq in grid:
        problems = check_case(divergence, dtype, dual, relax, cap, (5, 4093), per_seq)
        failures += bool(problems)
        report["cases"].append(
            {"divergence": divergence, "dtype": str(dtype), "dual_clip": dual, "relax": relax, "upper_cap": cap,
             "per_sequence_adv": per_seq, "problems": problems}
        )  # fmt: skip
    for divergence, dtype in itertools.product(DIVERGENCES, (torch.float32, torch.bfloat16)):
        problems = check_case(divergence, dtype, 10.0, None, 10.0, (5, 4093), True, per_token=True)
        failures += bool(problems)
        report["cases"].append(
            {"divergence": divergence, "dtype": str(dtype), "per_token_delta": True, "problems": problems}
        )  # fmt: skip
    for shape in [(1, 70000), (3, 47), (64, 8192)]:
        problems = check_case("kl", torch.float32, 10.0, None, 10.0, shape, False)
        failures += bool(problems)
        report["cases"].append({"divergence": "kl", "shape": list(shape), "problems": problems})
    report["failures"] = failures
    report["seconds"] = time.time() - start
    (out / "gpu_correctness.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"correctness: {len(report['cases'])} cases, {failures} failing, {report['seconds']:.0f} s")
    try:
        jit = jit_resources()
        (out / "gpu_jit_resources.json").write_text(json.dumps(jit, indent=1, default=str) + "\n")
        spilled = [r for r in jit if r["n_spills"]]
        print(f"jit resources: {len(jit)} compiled kernels, max {max((r['n_regs'] or 0) for r in jit)} registers, "
              f"{len(spilled)} with spills")
    except Exception as err:  # noqa: BLE001 - a report, not a check
        print(f"jit resources: not read ({type(err).__name__}: {err})")
    for case in report["cases"]:
        if case["problems"]:
            print("  FAIL", case)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
