"""`openrlhf-band bench logprobs`: OpenRLHF 0.11.2's log-prob step against `fused_linear_logprobs`.

The same inputs for both (seeded): hidden states (N, H) and an lm_head weight (V, H) in the model
dtype, labels (N,), upstream gradients for the log-probs (and the entropy). OpenRLHF's path is
`Actor.forward`'s: full logits F.linear(hidden, W) in the model dtype, `.to(float32)`, `.div_(T)`,
`log_probs_from_logits` and `compute_entropy` from `openrlhf.models.utils` (on CPU without flash-attn
its torch fallback; `compute_entropy` is torch.compile'd in OpenRLHF, run eagerly on CPU, compiled on
CUDA). The fused path is `openrlhf_band.ops.fused_linear_logprobs`.

Each (path, size) runs in a fresh subprocess, so that one's memory cannot hide in the other's. Peak
memory is measured, not computed: on CPU the process's peak resident set (VmHWM) minus
its resident set right before the step (inputs allocated, a small warm-up step done; the peak counter
VmHWM reset then through /proc/self/clear_refs, so building the inputs is not counted); on CUDA the
allocator's peak (torch.cuda.max_memory_allocated after reset_peak_memory_stats) minus what was
allocated before the step. Times are one run each (CPU: wall seconds on a shared machine, noise at
the ~10% level; their ratio is what to read). Max differences (log-probs, entropy, gradients w.r.t.
hidden and weight) are taken where both paths ran. Results: out/bench/logprobs_<device>.json (--results-dir).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from openrlhf_band.bench.common import machine_info, require_modules, write_json

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384], help="N, tokens per step")
    parser.add_argument("--vocab", type=int, default=151936, help="V (Qwen2.5's vocabulary by default)")
    parser.add_argument("--hidden", type=int, default=896, help="H (Qwen2.5-0.5B's hidden size by default)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="the model's dtype (weights, hidden)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--entropy", action="store_true", help="also compute the entropy and back-propagate into it")
    parser.add_argument("--chunk-tokens", type=int, default=None, help="the fused path's chunk (default: automatic)")
    parser.add_argument(
        "--openrlhf-max-tokens", type=int, default=None,
        help="skip OpenRLHF's path above this N (default: where its logits, ~13 B x N x V, fit in 80%% of the "
        "device's memory; 0: the fused path only, OpenRLHF not needed)",
    )  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="logprobs", help="result file stem under the results folder")
    parser.add_argument("--worker", nargs=3, metavar=("PATH", "TOKENS", "OUTPUT"), help=argparse.SUPPRESS)


def _inputs(n: int, v: int, h: int, dtype: torch.dtype, device: torch.device, entropy: bool):
    gen = torch.Generator().manual_seed(0)
    hidden = (torch.randn(n, h, generator=gen) * 1.0).to(dtype).to(device).requires_grad_(True)
    weight = (torch.randn(v, h, generator=gen) * h**-0.5).to(dtype).to(device).requires_grad_(True)
    labels = torch.randint(0, v, (n,), generator=gen).to(device)
    grad_lp = torch.randn(n, generator=gen).to(device)
    grad_ent = torch.randn(n, generator=gen).to(device) if entropy else None
    return hidden, weight, labels, grad_lp, grad_ent


def _openrlhf_functions():
    """OpenRLHF 0.11.2's `log_probs_from_logits` and `compute_entropy`: imported, or (on an image without
    OpenRLHF and DeepSpeed, such as the lent GPU's) read from the released `openrlhf/models/utils.py`
    named by $OPENRLHF_UTILS_PY with the three functions' source and the names they use, never re-typed."""
    try:
        from openrlhf.models.utils import compute_entropy, log_probs_from_logits

        return log_probs_from_logits, compute_entropy
    except ImportError:
        path = os.environ.get("OPENRLHF_UTILS_PY")
        if not path:
            raise
    import ast

    source = Path(path).read_text()
    wanted = {"_logsumexp_by_chunk", "log_probs_from_logits", "compute_entropy"}
    nodes = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    if {n.name for n in nodes} != wanted:
        raise RuntimeError(f"{path} does not define {sorted(wanted)}")
    namespace = {"torch": torch, "F": torch.nn.functional}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), path, "exec"), namespace)  # noqa: S102 - OpenRLHF's code
    return namespace["log_probs_from_logits"], namespace["compute_entropy"]


def _openrlhf_step(hidden, weight, labels, temperature: float, entropy: bool):
    log_probs_from_logits, compute_entropy = _openrlhf_functions()

    logits = torch.nn.functional.linear(hidden, weight).to(torch.float32)  # Actor.forward, line by line
    if temperature != 1.0:
        logits.div_(temperature)
    log_probs = log_probs_from_logits(logits, labels)
    if not entropy:
        return log_probs, None
    entropy_fn = compute_entropy if logits.is_cuda else getattr(compute_entropy, "_torchdynamo_orig_callable",
                                                                compute_entropy)  # fmt: skip
    return log_probs, entropy_fn(logits)


def _fused_step(hidden, weight, labels, temperature: float, entropy: bool, chunk_tokens):
    from openrlhf_band.ops.fused_logprobs import fused_linear_logprobs

    out = fused_linear_logprobs(hidden, weight, labels, temperature=temperature, return_entropy=entropy,
                                chunk_tokens=chunk_tokens)  # fmt: skip
    return out if entropy else (out, None)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _start_peak(device: torch.device) -> int:
    """Reset the peak counter; return what is allocated now (the step's baseline)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:  # Linux: "5" resets the peak resident set (VmHWM)
        f.write("5")
    return _rss_bytes()


def _peak_since(device: torch.device, base: int) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    return hwm - base


def _worker(args: argparse.Namespace) -> int:
    path, tokens, output = args.worker[0], int(args.worker[1]), args.worker[2]
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    hidden, weight, labels, grad_lp, grad_ent = _inputs(tokens, args.vocab, args.hidden, dtype, device, args.entropy)

    def step(h, w, y, g, e):
        if path == "openrlhf":
            lp, ent = _openrlhf_step(h, w, y, args.temperature, args.entropy)
        else:
            lp, ent = _fused_step(h, w, y, args.temperature, args.entropy, args.chunk_tokens)
        return lp, ent

    # warm-up on a few tokens: libraries loaded, allocator and thread pools up, outside the measurement
    small = [t[:8].detach().requires_grad_(t.requires_grad) if t is not None and t.dim() and t.shape[0] == tokens
             else t for t in (hidden, weight, labels, grad_lp, grad_ent)]  # fmt: skip
    lp, ent = step(*small)
    torch.autograd.backward([lp] + ([ent] if ent is not None else []),
                            [small[3]] + ([small[4]] if ent is not None else []))  # fmt: skip
    weight.grad = None
    base = _start_peak(device)
    start = time.perf_counter()
    with torch.no_grad():  # the experience maker's old-policy and reference passes
        lp_nograd, _ = step(hidden.detach(), weight.detach(), labels, grad_lp, grad_ent)
    forward_peak = _peak_since(device, base)
    forward_s = time.perf_counter() - start
    del lp_nograd
    base = _start_peak(device)
    start = time.perf_counter()
    lp, ent = step(hidden, weight, labels, grad_lp, grad_ent)
    torch.autograd.backward([lp] + ([ent] if ent is not None else []),
                            [grad_lp] + ([grad_ent] if ent is not None else []))  # fmt: skip
    train_peak = _peak_since(device, base)
    train_s = time.perf_counter() - start
    torch.save({"log_probs": lp.detach().cpu(), "entropy": None if ent is None else ent.detach().cpu(),
                "grad_hidden": hidden.grad.cpu(), "grad_weight": weight.grad.cpu(),
                "forward_peak_bytes": forward_peak, "train_peak_bytes": train_peak,
                "forward_s": forward_s, "train_s": train_s}, output)  # fmt: skip
    return 0


def _device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _run_worker(args, path: str, tokens: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "openrlhf_band.bench.logprobs_bench", "--worker", path, str(tokens), str(out),
           "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--dtype", args.dtype,
           "--temperature", str(args.temperature), "--device", args.device]  # fmt: skip
    if args.entropy:
        cmd.append("--entropy")
    if args.chunk_tokens is not None:
        cmd += ["--chunk-tokens", str(args.chunk_tokens)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{path} at {tokens} tokens failed:\n{done.stderr[-3000:]}")
    return torch.load(out, weights_only=False)


def _max_diff(a, b) -> float | None:
    if a is None or b is None:
        return None
    return float((a.float() - b.float()).abs().max())


def main(args: argparse.Namespace) -> int:
    if args.worker:
        return _worker(args)
    # the baseline's workers need OpenRLHF's functions (not with --openrlhf-max-tokens 0: the fused path only)
    if not os.environ.get("OPENRLHF_UTILS_PY") and args.openrlhf_max_tokens != 0:
        require_modules("openrlhf")
    device = torch.device(args.device)
    limit = args.openrlhf_max_tokens
    if limit is None:  # OpenRLHF's step holds ~13 bytes per logit (bf16 + float32 logits, their gradient)
        per_token = (28 if args.entropy else 13) * args.vocab
        limit = int(0.8 * _device_memory(device) / per_token)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tokens in args.tokens:
            fused = _run_worker(args, "fused", tokens, Path(tmp) / "fused.pt")
            ours = tokens <= limit
            base = _run_worker(args, "openrlhf", tokens, Path(tmp) / "openrlhf.pt") if ours else None
            row = {
                "tokens": tokens,
                "fused": {k: fused[k] for k in ("forward_peak_bytes", "train_peak_bytes", "forward_s", "train_s")},
                "openrlhf": None if base is None else
                {k: base[k] for k in ("forward_peak_bytes", "train_peak_bytes", "forward_s", "train_s")},
            }  # fmt: skip
            if base is not None:
                row["memory_ratio_train"] = fused["train_peak_bytes"] / base["train_peak_bytes"]
                row["memory_ratio_forward"] = fused["forward_peak_bytes"] / base["forward_peak_bytes"]
                row["time_ratio_train"] = fused["train_s"] / base["train_s"]
                row["max_diff"] = {k: _max_diff(fused[k], base[k]) for k in
                                   ("log_probs", "entropy", "grad_hidden", "grad_weight")}  # fmt: skip
            else:
                row["openrlhf_skipped"] = f"N = {tokens} > {limit} (--openrlhf-max-tokens; default: where it fits)"
            rows.append(row)
            _print_row(row)
    payload = {
        "benchmark": "log-prob step: OpenRLHF 0.11.2 Actor.forward vs fused_linear_logprobs",
        "command": "openrlhf-band bench logprobs " + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "logprobs"]
                                                              else sys.argv[1:]),  # fmt: skip
        "memory_method": "CUDA: max_memory_allocated - allocated before the step" if device.type == "cuda" else
        "CPU: peak resident set (VmHWM, reset through /proc/self/clear_refs before the step) - resident set "
        "before the step, one process per (path, size)",
        "config": {"vocab": args.vocab, "hidden": args.hidden, "dtype": args.dtype, "temperature": args.temperature,
                   "entropy": args.entropy, "chunk_tokens": args.chunk_tokens},
        "machine": machine_info(device),
        "rows": rows,
    }  # fmt: skip
    path = write_json(f"{args.out}_{device.type}.json", payload)
    print(f"wrote {path}")
    return 0


def _print_row(row: dict) -> None:
    gib = 2.0**30
    fused, base = row["fused"], row["openrlhf"]
    line = f"N={row['tokens']:>6}: fused train peak {fused['train_peak_bytes'] / gib:6.2f} GiB"
    line += f", {fused['train_s']:6.1f} s"
    if base is not None:
        line += (f" | OpenRLHF {base['train_peak_bytes'] / gib:6.2f} GiB, {base['train_s']:6.1f} s | memory x"
                 f"{row['memory_ratio_train']:.3f}, time x{row['time_ratio_train']:.2f}, max |d log p| "
                 f"{row['max_diff']['log_probs']:.2e}")  # fmt: skip
    else:
        line += f" | OpenRLHF skipped ({row['openrlhf_skipped']})"
    print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
