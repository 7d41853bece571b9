"""The speed step of bench/gpu_check.sh: the fused Band loss timed properly on a GPU, and judged.

    python3 -m openrlhf_band.bench.gpu_speed --out DIR [--dry-run] [--device cuda|cpu]

writes DIR/speed.json and exits 0 when every judged check passes (or on a dry run), 1 when one
fails, 2 when it refuses to run (a CPU without --dry-run: a speed measured in Triton's interpreter
says nothing about the kernel). Budgeted for ~130 s of wall time on a bare CUDA machine (torch and
triton only, nothing installed), Triton's compiles included; with --dry-run it runs the same code
at tiny sizes with `time.perf_counter` (on a CPU, in Triton's interpreter: the unit suite's run),
every check NOT_JUDGED but judged all the same, so the judging code cannot rot unseen.

What is timed, at 4,194,304 and 16,777,216 tokens (dry run: 2,048 and 4,096), on the inputs of
`openrlhf-band bench kernel` (`kernel_bench.make_inputs`: float32 log-probs, one advantage per
sequence, a bool mask, a float32 upstream gradient):
  providers  fused-kl and fused-chi2 (scalar radius 0.05), fused-kl-pt (kl with a float32 radius
             per token, log-uniform in [0.01, 0.2]), all with the scripts' upper cap 10, and
             ppo-clip: OpenRLHF's PolicyLoss per-token loss in eager torch (`ppo_clip_token_loss`)
             times the mask, timed before and after the others (a drift over 10% between the two
             medians marks the checks that divide by it "UNSTABLE"; they are judged on the mean)
  entry      forward and full (forward + `torch.autograd.grad(loss, log_probs, upstream)`) through
             `band_token_loss_triton`, the kernel's entry point
  raw        `_launch_forward` and `_launch_backward` (each kernel and its output allocations), the
             backward on a coefficient the forward stored
  copy       `dst.copy_(src)` of a 256 MiB uint8 buffer (dry run: 1 MiB), 2 x its size moved,
             timed first and last; the faster of the two is the bar
Timers on CUDA: `triton.testing.do_bench(warmup=25, rep=100, return_mode="all")` (CUDA events, L2
cleared before every sample; the median of >= 20 samples, asserted), and for the raw kernels and
the copy also `do_bench_cudagraph` (launch latency out of the picture: at 4M tokens a forward
kernel is ~20 us, comparable to the Python cost of a launch), which the bandwidth checks then use.
A cudagraph replay does not clear L2, so at 4M tokens (~37 MB of inputs) part of a kernel's
reads may hit in L2: the bandwidth it reports can be flattering, never harsh.

Checks (`judge`, a pure function of the figures):
  (a) full entry point, fused-kl / ppo-clip <= 1.3 at each token count; fused-chi2 held to the
      same bar;
  (b) full entry point, fused-kl-pt / ppo-clip <= 1.5 at each token count;
  (c) at 4M tokens, the raw forward kernel (fused-kl) and the raw backward kernel each move
      >= 0.60 x the copy's bytes per second, counting the bytes `kernel_bytes_per_token` gives.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

CUDA_TOKENS = (4_194_304, 16_777_216)
DRY_RUN_TOKENS = (2_048, 4_096)
SEQ_LEN = 4096  # kernel_bench's sequence length (dry runs use shorter rows, so that 2,048 tokens exist)
CUDA_COPY_BYTES = 256 * 2**20
DRY_RUN_COPY_BYTES = 2**20
SCALAR_RADIUS = 0.05
DO_BENCH_WARMUP_MS, DO_BENCH_REP_MS = 25, 100
MIN_SAMPLES = 20
DRY_RUN_REPEATS = 3
CLIP_DRIFT_LIMIT = 0.10  # |after - before| / min(before, after) above this: the clip baseline is UNSTABLE

FULL_RATIO_LIMIT = 1.3  # (a) fused, scalar radius / eager clip, forward + backward
PER_TOKEN_RATIO_LIMIT = 1.5  # (b) fused, per-token radius / eager clip, forward + backward
BANDWIDTH_FRACTION_LIMIT = 0.60  # (c) raw kernel bandwidth / copy bandwidth

CLIP = "ppo-clip"
# (provider, divergence, radius: None for the scalar, "per-token" for the tensor)
FUSED = (("fused-kl", "kl", None), ("fused-chi2", "chi2", None), ("fused-kl-pt", "kl", "per-token"))
RATIO_CHECKS = (
    ("fused-kl", FULL_RATIO_LIMIT),
    ("fused-chi2", FULL_RATIO_LIMIT),
    ("fused-kl-pt", PER_TOKEN_RATIO_LIMIT),
)
BANDWIDTH_CHECKS = ("forward-kl", "backward")


# ---------------------------------------------------------------- bytes per token


def _streamed_bytes(t, log_probs: Tensor, view: Callable[[Tensor], Tensor] | None = None) -> int:
    """Bytes per token the kernel reads of `t`: its element size where it varies along the token axis,
    0 for None, a scalar, or a tensor broadcast along the tokens (stride 0: read once per sequence)."""
    if not isinstance(t, Tensor) or t.numel() <= 1:
        return 0
    if view is not None:
        t = view(t)
    elif t.shape != log_probs.shape:
        try:
            t = t.broadcast_to(log_probs.shape)
        except RuntimeError:
            return 0  # a per-sequence shape the launcher reshapes: nothing per token
    if t.dim() and t.stride(-1) == 0:
        return 0
    return t.element_size()


def kernel_bytes_per_token(
    log_probs: Tensor,
    old: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    radius: Tensor | float | None,
    *,
    return_bounds: bool = False,
    forward: bool = True,
    upstream: Tensor | None = None,
) -> int:
    """Bytes the fused kernels move per token, from the tensors they are given.

    Forward loads log_probs and old (their element sizes), the advantage (its element size when it
    varies per token, 0 for one per sequence: a stride-0 column), the mask (1 for bool / uint8, 0
    when None) and the radius (its element size, 4 for a float32 tensor per token; 0 for the scalar
    or one per sequence); it stores loss 4 + gradient coefficient 4 + the clip flags F + 8 with
    return_bounds (lower and upper, float32), where F is `band_loss.FORWARD_FLAG_BYTES_PER_TOKEN` (4: a
    bool plane per flag).
    Backward (forward=False) reads the coefficient 4 + the upstream gradient (its element size, 0
    when stride 0; 4 when not given: the loss is float32) and writes the gradient in log_probs'
    dtype: 12 for float32, 10 for bf16.

    With the benchmark's inputs (float32, per-sequence advantage, bool mask, scalar radius) the
    forward moves 4 + 4 + 0 + 1 + 0 loaded + 4 + 4 + F stored = 17 + F bytes, 4 more with the
    per-token radius. Nominal bytes: the backward skips upstream where the coefficient is 0, and
    reads of a table or a per-sequence value (L2 hits) are not counted.
    """
    from openrlhf_band.band.spec import radius_view
    from openrlhf_band.ops import band_loss
    from openrlhf_band.ops.token_loss import broadcast_advantages

    if not forward:
        upstream_bytes = 4 if upstream is None else _streamed_bytes(upstream, log_probs)
        return 4 + upstream_bytes + log_probs.element_size()

    def radius_per_token(r: Tensor) -> Tensor:
        return torch.broadcast_to(radius_view(r, log_probs), log_probs.shape)

    def advantage_per_token(a: Tensor) -> Tensor:
        return a if a.shape == log_probs.shape else broadcast_advantages(a, log_probs.shape)

    loads = (
        log_probs.element_size()
        + _streamed_bytes(old, log_probs)
        + _streamed_bytes(advantages, log_probs, advantage_per_token)
        + _streamed_bytes(mask, log_probs)
        + _streamed_bytes(radius, log_probs, radius_per_token)
    )
    stores = 4 + 4 + band_loss.FORWARD_FLAG_BYTES_PER_TOKEN + (8 if return_bounds else 0)
    return loads + stores


# ---------------------------------------------------------------- judging


def _verdict(ok) -> str:
    return "PASS" if ok else "FAIL"


def clip_baseline(entry_ms: dict, mode: str = "full") -> tuple[float, float]:
    """(the eager clip's time, mean of before and after; its drift |after - before| / min of the two)."""
    before, after = entry_ms[mode][f"{CLIP}-before"], entry_ms[mode][f"{CLIP}-after"]
    return (before + after) / 2, abs(after - before) / min(before, after)


def bandwidth_fraction(figures: dict, tokens: int, name: str) -> tuple[float, float, float]:
    """(kernel bytes/s, copy bytes/s, their ratio) of raw kernel `name` at `tokens`, with the raw timer."""
    timer = figures["raw_timer"]
    kernel_ms = figures["raw_ms"][str(tokens)][timer][name]
    kernel_bps = figures["bytes_per_token"][name] * tokens / (kernel_ms / 1e3)
    copy_bps = figures["copy_bytes_moved"] / (figures["copy_ms"][timer] / 1e3)
    return kernel_bps, copy_bps, kernel_bps / copy_bps


def judge(figures: dict) -> list[dict]:
    """The checks, each {name, verdict PASS | FAIL, value, limit, rule, tokens, ...}, from the figures alone.

    Reads figures["tokens"], ["entry_ms"][str(tokens)]["full"][provider] (ms; ppo-clip as
    "ppo-clip-before" and "ppo-clip-after"), ["bandwidth_tokens"], ["raw_timer"],
    ["raw_ms"][str(tokens)][raw_timer][name], ["bytes_per_token"][name], ["copy_ms"][raw_timer]
    and ["copy_bytes_moved"]. A value that cannot be computed (nan, a zero time) fails its check."""
    checks = []
    for tokens in figures["tokens"]:
        entry = figures["entry_ms"][str(tokens)]
        clip_ms, drift = clip_baseline(entry)
        stability = "UNSTABLE" if drift > CLIP_DRIFT_LIMIT else "STABLE"
        for provider, limit in RATIO_CHECKS:
            ratio = entry["full"][provider] / clip_ms
            radius = "per-token radius" if provider.endswith("-pt") else "scalar radius"
            checks.append(
                {"name": f"full {provider} / {CLIP} @ {tokens}", "verdict": _verdict(ratio <= limit),
                 "value": ratio, "limit": limit,
                 "rule": f"<= {limit}x eager {CLIP} (forward + backward, entry point, {radius})",
                 "tokens": tokens, "stability": stability, "clip_drift": drift}
            )  # fmt: skip
    tokens = figures["bandwidth_tokens"]
    for name in BANDWIDTH_CHECKS:
        try:
            _, _, fraction = bandwidth_fraction(figures, tokens, name)
        except (KeyError, ZeroDivisionError) as err:
            fraction, missing = float("nan"), f"{type(err).__name__}: {err}"
        else:
            missing = None
        check = {
            "name": f"raw {name} bandwidth / copy @ {tokens}",
            "verdict": _verdict(fraction >= BANDWIDTH_FRACTION_LIMIT),  # nan fails
            "value": fraction,
            "limit": BANDWIDTH_FRACTION_LIMIT,
            "rule": f">= {BANDWIDTH_FRACTION_LIMIT:.2f}x device copy bandwidth "
            f"({figures.get('bytes_per_token', {}).get(name)} B/token, timer {figures.get('raw_timer')})",
            "tokens": tokens,
        }
        if missing:
            check["error"] = missing
        checks.append(check)
    return checks


def derived(figures: dict) -> dict:
    """Ratios to the clip (forward and full), the clip's drift, and bandwidths: for a reader of speed.json."""
    out = {"ratios": {}, "clip_drift": {}, "bandwidth_GBps": {}, "bandwidth_fraction_of_copy": {}}
    for tokens in figures["tokens"]:
        entry, key = figures["entry_ms"][str(tokens)], str(tokens)
        out["ratios"][key], out["clip_drift"][key] = {}, {}
        for mode in entry:
            clip_ms, drift = clip_baseline(entry, mode)
            out["clip_drift"][key][mode] = drift
            out["ratios"][key][mode] = {p: entry[mode][p] / clip_ms for p, *_ in FUSED if p in entry[mode]}
        raw = figures["raw_ms"][key][figures["raw_timer"]]
        out["bandwidth_GBps"][key], out["bandwidth_fraction_of_copy"][key] = {}, {}
        for name in raw:
            kernel_bps, copy_bps, fraction = bandwidth_fraction(figures, tokens, name)
            out["bandwidth_GBps"][key][name] = kernel_bps / 1e9
            out["bandwidth_fraction_of_copy"][key][name] = fraction
            out["bandwidth_GBps"]["copy"] = copy_bps / 1e9
    return out


# ---------------------------------------------------------------- timing


class Timer:
    """Median milliseconds of a callable: CUDA events through triton.testing (CUDA), or perf_counter (dry run)."""

    def __init__(self, device: torch.device, dry_run: bool):
        self.device = device
        self.dry_run = dry_run
        self.name = "perf_counter" if dry_run else "do_bench"
        self.cudagraph = None
        if not dry_run:
            import triton.testing

            self.do_bench = triton.testing.do_bench
            self.cudagraph = getattr(triton.testing, "do_bench_cudagraph", None)
        self.samples: dict[str, int | None] = {}  # label -> how many samples its median is of (None: unknown)
        self.graph_errors: dict[str, str] = {}  # label -> why do_bench_cudagraph failed (do_bench is used then)

    @staticmethod
    def _takes_return_mode(fn) -> bool:
        return "return_mode" in inspect.signature(fn).parameters

    def _perf_counter(self, fn) -> list[float]:
        fn()
        samples = []
        for _ in range(DRY_RUN_REPEATS):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            fn()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            samples.append((time.perf_counter() - start) * 1e3)
        return samples

    def _do_bench(self, fn) -> list[float] | None:
        if not self._takes_return_mode(self.do_bench):  # an older triton: its median only
            return None
        rep = DO_BENCH_REP_MS
        for _ in range(3):
            try:
                samples = self.do_bench(fn, warmup=DO_BENCH_WARMUP_MS, rep=rep, return_mode="all")
            except AssertionError:  # a return_mode without "all": its median only
                return None
            if not isinstance(samples, list | tuple):
                return None
            if len(samples) >= MIN_SAMPLES:
                return list(samples)
            rep = math.ceil(rep * (MIN_SAMPLES + 5) / max(1, len(samples)))  # a slow fn: a longer rep window
        raise AssertionError(f"do_bench gave {len(samples)} samples, fewer than {MIN_SAMPLES}")

    def entry(self, label: str, fn) -> float:
        """Median ms of fn with the step's timer (do_bench on CUDA, perf_counter on a dry run)."""
        if self.dry_run:
            samples = self._perf_counter(fn)
        else:
            samples = self._do_bench(fn)
            if samples is None:
                self.samples[label] = None
                return float(self.do_bench(fn, warmup=DO_BENCH_WARMUP_MS, rep=DO_BENCH_REP_MS, quantiles=[0.5]))
            assert len(samples) >= MIN_SAMPLES, (label, len(samples))
        self.samples[label] = len(samples)
        return statistics.median(samples)

    def graphed(self, label: str, fn) -> float | None:
        """Median ms of fn replayed from a CUDA graph (>= 20 samples, each a mean of many calls), or None."""
        if self.cudagraph is None:
            return None
        samples: list[float] = []
        try:
            while len(samples) < MIN_SAMPLES:
                if self._takes_return_mode(self.cudagraph):
                    got = self.cudagraph(fn, return_mode="all")
                else:
                    got = self.cudagraph(fn, quantiles=[0.5])
                samples += list(got) if isinstance(got, list | tuple) else [got]
        except Exception as err:  # noqa: BLE001 - a capture that fails: the raw kernels fall back to do_bench
            self.graph_errors[label] = f"{type(err).__name__}: {err}"
            return None
        self.samples[label + " (cudagraph)"] = len(samples)
        return statistics.median(samples)


# ---------------------------------------------------------------- measuring


def _versions(device: torch.device) -> dict:
    import triton

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return info


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def measure_copy(timer: Timer, device: torch.device, size: int) -> dict[str, float]:
    src = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)

    ms = {timer.name: timer.entry(f"copy {size}", copy)}
    graphed = timer.graphed(f"copy {size}", copy)
    if graphed is not None:
        ms["cudagraph"] = graphed
    return ms


def launch_config(band_loss, band: dict):
    """`_launch_forward`'s config for a band, with the entry point's defaults otherwise."""
    return band_loss._Config(band["spec"], band["radius"], dual_clip=None, return_bounds=False, bounds=None,
                             backend="triton")  # fmt: skip


def measure_tokens(timer: Timer, device: torch.device, num_tokens: int, log=print) -> dict:
    """Entry-point and raw-kernel timings (ms) at one token count, and the kernels' bytes per token."""
    from openrlhf_band.bench.kernel_bench import _band, make_inputs, per_token_delta, ppo_clip_token_loss
    from openrlhf_band.ops import band_loss

    log_probs, old, adv, mask, upstream = make_inputs(num_tokens, device, seq_len=min(SEQ_LEN, num_tokens))
    tokens = log_probs.numel()
    radius_pt = per_token_delta(old)
    bands = {name: _band(div, radius_pt if radius == "per-token" else SCALAR_RADIUS) for name, div, radius in FUSED}

    def clip_forward():
        return ppo_clip_token_loss(log_probs, old, adv) * mask

    def fused_forward(band):
        return lambda: band_loss.band_token_loss_triton(log_probs, old, adv, mask, **band).loss

    def full(forward):
        return lambda: torch.autograd.grad(forward(), log_probs, upstream)

    def raw_forward(band):
        config = launch_config(band_loss, band)
        return lambda: band_loss._launch_forward(log_probs, old, adv, mask, config)

    coef = band_loss._launch_forward(log_probs, old, adv, mask, launch_config(band_loss, bands["fused-kl"]))[1]
    up2d = upstream.reshape(coef.shape)

    def raw_backward():
        return band_loss._launch_backward(up2d, coef, log_probs.dtype)

    entry_fns = {"forward": {}, "full": {}}
    raw_fns = {"backward": raw_backward}
    for name, *_ in FUSED:
        entry_fns["forward"][name] = fused_forward(bands[name])
        entry_fns["full"][name] = full(entry_fns["forward"][name])
        raw_fns["forward-" + name.removeprefix("fused-")] = raw_forward(bands[name])
    clip_fns = {"forward": clip_forward, "full": full(clip_forward)}

    # compile every kernel and build every table first: nothing host-heavy between the two clip timings
    start = time.perf_counter()
    for fn in [*entry_fns["full"].values(), *raw_fns.values(), clip_fns["full"]]:
        fn()
    _free(device)
    log(f"  {tokens:,} tokens: compiled and warmed in {time.perf_counter() - start:.1f} s")

    entry_ms = {"forward": {}, "full": {}}
    for mode, fn in clip_fns.items():
        entry_ms[mode][f"{CLIP}-before"] = timer.entry(f"{tokens} {mode} {CLIP}-before", fn)
    for mode, fns in entry_fns.items():
        for name, fn in fns.items():
            entry_ms[mode][name] = timer.entry(f"{tokens} {mode} {name}", fn)
    raw_ms = {timer.name: {}}
    graphed = {}
    for name, fn in raw_fns.items():
        raw_ms[timer.name][name] = timer.entry(f"{tokens} raw {name}", fn)
        graphed[name] = timer.graphed(f"{tokens} raw {name}", fn)
    if all(v is not None for v in graphed.values()):
        raw_ms["cudagraph"] = graphed
    for mode, fn in clip_fns.items():
        entry_ms[mode][f"{CLIP}-after"] = timer.entry(f"{tokens} {mode} {CLIP}-after", fn)

    bytes_per_token = {
        "forward-" + name.removeprefix("fused-"): kernel_bytes_per_token(
            log_probs, old, adv, mask, bands[name]["radius"]
        )
        for name, *_ in FUSED
    }
    bytes_per_token["backward"] = kernel_bytes_per_token(log_probs, old, adv, mask, None, forward=False, upstream=up2d)
    log(f"  {tokens:,} tokens: full ms " + ", ".join(f"{k} {v:.3f}" for k, v in entry_ms["full"].items()))
    return {"tokens": tokens, "entry_ms": entry_ms, "raw_ms": raw_ms, "bytes_per_token": bytes_per_token}


def _report(device, dry_run, timer_name, versions, checks, figures, error=None) -> dict:
    if error:  # a measurement that did not complete is a failed check of its own, named in the list
        checks = [*checks, {"name": "measurement", "verdict": "FAIL", "value": None, "limit": None,
                            "rule": "every figure measured", "error": error}]  # fmt: skip
    verdicts = [c["verdict"] for c in checks]
    if dry_run:
        for check in checks:
            check["would_be"], check["verdict"] = check["verdict"], "NOT_JUDGED"
        verdict = "NOT_JUDGED"
    else:
        verdict = "FAIL" if error or not checks or "FAIL" in verdicts else "PASS"
    report = {
        "step": "speed", "verdict": verdict, "dry_run": dry_run, "device": str(device), "versions": versions,
        "timer": timer_name, "checks": checks, "figures": figures,
    }  # fmt: skip
    if error:
        report["error"] = error
    return report


def _json_safe(value):
    """nan and inf as None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _write(out: Path, report: dict) -> Path:
    path = out / "speed.json"
    path.write_text(json.dumps(_json_safe(report), indent=2) + "\n")
    return path


def run(out: Path, device: torch.device, dry_run: bool, log=print) -> int:
    started = time.perf_counter()
    timer = Timer(device, dry_run)
    versions = _versions(device)
    token_counts = DRY_RUN_TOKENS if dry_run else CUDA_TOKENS
    copy_bytes = DRY_RUN_COPY_BYTES if dry_run else CUDA_COPY_BYTES
    from openrlhf_band.ops import band_loss

    figures: dict = {
        "tokens": [], "bandwidth_tokens": None, "raw_timer": None, "entry_ms": {}, "raw_ms": {},
        "bytes_per_token": {}, "copy_bytes_moved": 2 * copy_bytes, "copy_ms": {}, "copy_ms_runs": {},
        "forward_flag_bytes_per_token": band_loss.FORWARD_FLAG_BYTES_PER_TOKEN,
    }  # fmt: skip
    try:
        first_copy = measure_copy(timer, device, copy_bytes)
        _free(device)
        for num_tokens in token_counts:
            # until the last count is measured, a kill (the step's timeout) leaves a FAIL behind, not nothing
            _write(out, _report(device, dry_run, timer.name, versions, [], figures,
                                error=f"incomplete: stopped before {num_tokens:,} tokens were measured"))  # fmt: skip
            result = measure_tokens(timer, device, num_tokens, log)
            _free(device)  # the inputs and outputs of this count, before the next
            key = str(result["tokens"])
            figures["tokens"].append(result["tokens"])
            figures["entry_ms"][key] = result["entry_ms"]
            figures["raw_ms"][key] = result["raw_ms"]
            figures["bytes_per_token"] = result["bytes_per_token"]
        figures["bandwidth_tokens"] = figures["tokens"][0]
        last_copy = measure_copy(timer, device, copy_bytes)
        figures["copy_ms_runs"] = {"first": first_copy, "last": last_copy}
        timers = set(first_copy) & set(last_copy)
        figures["copy_ms"] = {t: min(first_copy[t], last_copy[t]) for t in timers}  # the faster copy: the higher bar
        raw_timers = set.intersection(timers, *(set(v) for v in figures["raw_ms"].values()))
        figures["raw_timer"] = "cudagraph" if "cudagraph" in raw_timers else timer.name
        figures["samples"] = timer.samples
        figures["cudagraph_errors"] = timer.graph_errors
        checks = judge(figures)
        figures["derived"] = derived(figures)
        error = None
    except Exception as err:  # noqa: BLE001 - the step reports a FAIL with its reason, in speed.json
        if dry_run:
            raise
        checks, error = [], f"{type(err).__name__}: {err}"
    figures["seconds"] = time.perf_counter() - started
    report = _report(device, dry_run, timer.name, versions, checks, figures, error)
    path = _write(out, report)
    for check in report["checks"]:
        finite = isinstance(check["value"], float) and math.isfinite(check["value"])
        value = f"{check['value']:.3f}" if finite else "n/a"
        extra = " (clip baseline UNSTABLE)" if check.get("stability") == "UNSTABLE" else ""
        log(f"  {check['verdict']:<10} {check['name']}: {value} ({check['rule']}){extra}")
    if error:
        log(f"  error: {error}")
    log(f"speed: {report['verdict']} in {figures['seconds']:.0f} s; wrote {path}")
    return 1 if report["verdict"] == "FAIL" else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m openrlhf_band.bench.gpu_speed", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for speed.json")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, perf_counter, nothing judged")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when present")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu" and not args.dry_run:
        print(
            "gpu_speed: refusing to time the kernel on a CPU: Triton's interpreter measures Python, not the "
            "kernel. Run it on a CUDA machine, or pass --dry-run to exercise the step at tiny sizes.",
            file=sys.stderr,
        )
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_speed: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    if device.type == "cpu":
        # the kernels run on CPU tensors only in the interpreter, chosen when band_loss is first imported
        os.environ["TRITON_INTERPRET"] = "1"
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args.out, device, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
