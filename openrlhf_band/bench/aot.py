"""`openrlhf-band aot`: ahead-of-time compile of the fused Band loss kernels for GPU targets, no GPU needed.

What is compiled: the real `JITFunction`s `_band_loss_fwd_kernel` / `_band_loss_bwd_kernel`, specialised
from real launch arguments. Each variant calls the public launcher `band_token_loss_triton` (and
`.loss.sum().backward()` for the backward kernel) on small CPU tensors while those two module
attributes are replaced by a recorder that stores `(grid, args, kwargs)` and runs nothing. The
recorded arguments go through Triton's own binder (`create_function_from_signature`, the native
`specialize_impl`: pointer alignment to 16 bytes, ints divisible by 16 or equal to 1, constexprs) and
`JITFunction._pack_args`, exactly as `JITFunction.run` does, and then
`triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget(...))`. No driver is
touched (no `torch.cuda`, no `triton.runtime.driver.active`). The module must be imported without
TRITON_INTERPRET=1 (then the kernels are JITFunctions); this command refuses to run otherwise.

Resources per (variant, target), all from the compiled cubin and ptxas' own `-v` log:
* registers: per thread ("Used N registers"); spill_stores_B / spill_loads_B: bytes (ptxas);
  local_B: the stack frame in bytes per thread (local memory); shared_B: bytes per block
  (Triton's dynamic shared memory + ptxas' static smem).
* num_warps, elems_per_thread = BLOCK / (num_warps * warp_size).
* f64_per_token / f32_per_token: STATIC counts of SASS instructions (`cuobjdump -sass` of the cubin,
  every instruction line once, predicated or not, including both sides of branches; not an
  executed count) divided by elems_per_thread, i.e. instructions per token if every token of a
  thread takes the same path. The opcode rule (`classify_opcode`), on the opcode with its
  modifiers (the token after an optional `@P` / `@!P` predicate):
    - float64: base opcode in DADD DMUL DFMA DSETP DSET DMNMX DMMA; MUFU.RCP64H / MUFU.RSQ64H;
      F2F, F2I, I2F, FRND with a `.F64` modifier (either side of a conversion, e.g. F2F.F32.F64).
    - float32: base opcode in FADD FMUL FFMA FSETP FSET FMNMX FSEL FCHK FCMP FSWZADD; every other MUFU
      (EX2, LG2, RCP, RSQ, SQRT, SIN, COS, TANH); F2F, F2I, I2F, FRND, F2FP without `.F64`.
    - anything else (integer, memory, control, half-precision H*) is neither.
* blocks_per_sm: occupancy from registers (allocated per warp in units of 256, over 4 SM
  sub-partitions), shared memory (+1 KiB the CUDA runtime reserves per block, 128-byte granularity),
  threads and resident blocks per SM, with the per-arch limits in `ARCH_LIMITS`.
* compile_cpu_s: CPU seconds of `triton.compile`, this process's and its children's (ptxas): the compile's
  own work, which another job on the machine does not inflate as it does the wall time; the 10 s bound
  of `make test` is on it.
* compile_s: wall seconds of `triton.compile` (Triton's cache is bypassed, TRITON_ALWAYS_COMPILE),
  after one untimed warm-up compile: a process's first compile also loads Triton's compiler
  libraries, which took 13 s in a fresh venv once (the kernel itself compiles in ~1 s).
* AMD targets (`--targets gfx942 gfx90a`): registers = VGPRs (TotalNumVgprs), local_B = ScratchSize
  (a non-zero scratch counts as a spill), f64/f32 per token = static `v_*f64*` / other `v_*f32*` VALU
  instructions of the amdgcn listing / elems_per_thread (wavefront 64); no occupancy (0).
  The wheel's AMD backend (its LLVM and linker are inside libtriton) compiles without a device.

Output: `aot_triton-<version>.json` and `.csv` under --out, and a compact table on stdout. Exit
status 1 on any compile error or any spill (the failing variants are named), else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from openrlhf_band.band.spec import DPPO_DIVERGENCES

DIVERGENCE_NAMES = ("kl", "tv", "chi2", "reverse_kl", "hellinger")
RADII = ("scalar", "per-token", "per-seq")
DEFAULT_TARGETS = (80, 89, 90, 100, 120)
AMD_TARGETS = ("gfx942", "gfx90a")

# Per-arch occupancy limits. Source: NVIDIA CUDA C++ Programming Guide, "Compute Capabilities",
# table "Technical Specifications per Compute Capability" (resident blocks / threads per SM, 32-bit
# registers per SM, shared memory per SM and per block), and the CUDA Occupancy Calculator
# (cuda_occupancy.h: register allocation unit 256 per warp, 4 sub-partitions, 1 KiB reserved shared
# memory per block since CUDA 11, 128-byte shared allocation granularity). Shared memory is the
# maximum carve-out in bytes.
ARCH_LIMITS: dict[int, dict[str, int]] = {
    80: {"threads_per_sm": 2048, "blocks_per_sm": 32, "regs_per_sm": 65536, "smem_per_sm": 164 * 1024},
    89: {"threads_per_sm": 1536, "blocks_per_sm": 24, "regs_per_sm": 65536, "smem_per_sm": 100 * 1024},
    90: {"threads_per_sm": 2048, "blocks_per_sm": 32, "regs_per_sm": 65536, "smem_per_sm": 228 * 1024},
    100: {"threads_per_sm": 2048, "blocks_per_sm": 32, "regs_per_sm": 65536, "smem_per_sm": 228 * 1024},
    120: {"threads_per_sm": 1536, "blocks_per_sm": 32, "regs_per_sm": 65536, "smem_per_sm": 100 * 1024},
}
_REG_ALLOC_UNIT = 256  # registers, allocated per warp
_SUB_PARTITIONS = 4
_SMEM_RESERVED_PER_BLOCK = 1024  # bytes
_SMEM_GRANULARITY = 128  # bytes

# --------------------------------------------------------------------------------------------- SASS

_F64_BASE = {"DADD", "DMUL", "DFMA", "DSETP", "DSET", "DMNMX", "DMMA"}
_F32_BASE = {"FADD", "FMUL", "FFMA", "FSETP", "FSET", "FMNMX", "FSEL", "FCHK", "FCMP", "FSWZADD"}
_CONVERSIONS = {"F2F", "F2I", "I2F", "FRND", "F2FP"}
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:\{\s*)?(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


def classify_opcode(opcode: str) -> str | None:
    """'f64', 'f32' or None for one SASS opcode with its modifiers (e.g. 'MUFU.RCP64H', 'F2F.F32.F64')."""
    base, *mods = opcode.split(".")
    if base in _F64_BASE or (base == "MUFU" and any(m in ("RCP64H", "RSQ64H") for m in mods)):
        return "f64"
    if base in _CONVERSIONS:
        return "f64" if "F64" in mods else "f32"
    if base in _F32_BASE or base == "MUFU":
        return "f32"
    return None


def count_sass(sass: str) -> dict[str, int]:
    """Static instruction counts of a `cuobjdump -sass` listing: {'f64': n, 'f32': n, 'total': n}."""
    counts = {"f64": 0, "f32": 0, "total": 0}
    for line in sass.splitlines():
        match = _SASS_LINE.match(line)
        if not match:
            continue
        counts["total"] += 1
        kind = classify_opcode(match.group(1))
        if kind:
            counts[kind] += 1
    return counts


def _nvidia_tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def sass_of(cubin: bytes) -> str:
    """The SASS listing of a cubin (the wheel's cuobjdump)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [_nvidia_tool("cuobjdump"), "-sass", f.name], check=True, capture_output=True, text=True
        ).stdout


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(log: str) -> dict[str, int] | None:
    """registers, stack (local) bytes, spill store / load bytes and static smem bytes from `ptxas -v`."""
    regs, spill = _PTXAS_REGS.search(log), _PTXAS_SPILL.search(log)
    if not regs or not spill:
        return None
    smem = _PTXAS_SMEM.search(log)
    return {
        "registers": int(regs.group(1)),
        "local_B": int(spill.group(1)),
        "spill_stores_B": int(spill.group(2)),
        "spill_loads_B": int(spill.group(3)),
        "static_smem_B": int(smem.group(1)) if smem else 0,
    }


def occupancy(arch: int, registers: int, shared_B: int, threads_per_block: int) -> int:
    """Resident blocks per SM for `arch` (a key of ARCH_LIMITS; others use the closest lower one)."""
    key = max((a for a in ARCH_LIMITS if a <= arch), default=min(ARCH_LIMITS))
    lim = ARCH_LIMITS[key]
    warps = -(-threads_per_block // 32)
    by_blocks = lim["blocks_per_sm"]
    by_threads = lim["threads_per_sm"] // threads_per_block
    regs_per_warp = -(-max(registers, 1) * 32 // _REG_ALLOC_UNIT) * _REG_ALLOC_UNIT
    warps_per_sub = (lim["regs_per_sm"] // _SUB_PARTITIONS) // regs_per_warp
    by_regs = (warps_per_sub * _SUB_PARTITIONS) // warps
    smem = -(-(shared_B + _SMEM_RESERVED_PER_BLOCK) // _SMEM_GRANULARITY) * _SMEM_GRANULARITY
    by_smem = lim["smem_per_sm"] // smem
    return max(0, min(by_blocks, by_threads, by_regs, by_smem))


# --------------------------------------------------------------------------------------- launches


@dataclass
class Launch:
    """One recorded kernel launch: which kernel ('fwd' / 'bwd'), its grid, args and kwargs."""

    kernel: str
    grid: Any
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands in for a JITFunction: `kernel[grid](*args, **kwargs)` records the launch, runs nothing."""

    def __init__(self, kernel: str, sink: list[Launch]) -> None:
        self.kernel, self.sink = kernel, sink

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.sink.append(Launch(self.kernel, grid, args, dict(kwargs)))

        return launch


def capture_launches(call: Callable[[], Any]) -> list[Launch]:
    """Run `call()` with both Band kernels replaced by recorders; return the launches it made."""
    from openrlhf_band.ops import band_loss

    launches: list[Launch] = []
    saved = band_loss._band_loss_fwd_kernel, band_loss._band_loss_bwd_kernel
    band_loss._band_loss_fwd_kernel = _Recorder("fwd", launches)
    band_loss._band_loss_bwd_kernel = _Recorder("bwd", launches)
    try:
        call()
    finally:
        band_loss._band_loss_fwd_kernel, band_loss._band_loss_bwd_kernel = saved
    return launches


@dataclass(frozen=True)
class Variant:
    """A user-reachable launch: which kernel, and how `band_token_loss_triton` is called."""

    name: str
    kernel: str  # 'fwd' or 'bwd'
    divergence: str = "kl"
    radius: str = "scalar"  # 'scalar' (delta = 0.05), 'per-token' (B, T), 'per-seq' (B, 1), 'bounds'
    # 'bare': no mask, no option, no bounds out (the least code); 'scripts': mask, return_bounds, upper_cap=10,
    # dual_clip=10 (what the example scripts run); 'floor': + lower_floor 0.8; 'all': + relax, the floor and a
    # ratio truncation (every option at once: the most code); 'dppo': DPPO's options (asymmetric radii,
    # truncation, no cap, no dual clip; a scalar radius, the only one asymmetric radii take)
    options: str = "scripts"
    dtype: str = "fp32"  # of log_probs: fp32, bf16 or fp16 (the three the launcher takes)


DTYPES = ("fp32", "bf16", "fp16")
#: the forward's option sets per (divergence, radius) and which dtypes each is compiled in: what the kernel
#: specialises on is its bounds kind, the radius' strides, the 8 option flags and the input dtype; these are
#: the least code, the scripts', every option at once and DPPO's (docs/kernel.md#the-variants-compiled)
OPTION_DTYPES = {"bare": ("fp32", "bf16"), "scripts": DTYPES, "all": DTYPES, "dppo": ("fp32", "bf16")}


#: what `make test` compiles for each of its five targets (`--set ci`), within its time budget: every option at once
#: (the most code) in fp32 and bf16, the scripts' options in bf16 (the dtype whose load has spilled where another's
#: did not, docs/kernel.md), DPPO's options for DPPO's divergences (the rule takes tv and kl), the floor, given
#: bounds and the backward. `--set full`, the default and bench/aot_versions.sh's, adds fp16, the scripts' options
#: in fp32, the bare variants and DPPO's options on every divergence (docs/kernel.md#the-variants-compiled)
CI_OPTION_DTYPES = {"scripts": ("bf16",), "all": ("fp32", "bf16"), "dppo": ("fp32", "bf16")}
VARIANT_SETS = ("full", "ci")


def variants(variant_set: str = "full") -> list[Variant]:
    """The variants of `variant_set` ('full': OPTION_DTYPES; 'ci': CI_OPTION_DTYPES), see the module docstring."""
    if variant_set not in VARIANT_SETS:
        raise ValueError(f"unknown variant set {variant_set!r}; choose one of {VARIANT_SETS}")
    ci = variant_set == "ci"
    out = []
    for div in DIVERGENCE_NAMES:
        for radius in RADII:
            for options, dtypes in (CI_OPTION_DTYPES if ci else OPTION_DTYPES).items():
                if options == "dppo" and (radius != "scalar" or (ci and div not in DPPO_DIVERGENCES)):
                    continue
                for dtype in dtypes:
                    out.append(Variant(f"fwd-{div}-{radius}-{options}-{dtype}", "fwd", div, radius, options, dtype))
    for dtype in ("bf16",) if ci else ("fp32", "bf16"):
        out.append(Variant(f"fwd-kl-scalar-floor-{dtype}", "fwd", "kl", "scalar", "floor", dtype))
        for options in ("scripts",) if ci else ("bare", "scripts"):
            out.append(Variant(f"fwd-bounds-{options}-{dtype}", "fwd", "kl", "bounds", options, dtype))
    for dtype in ("fp32", "bf16") if ci else DTYPES:
        out.append(Variant(f"bwd-{dtype}", "bwd", dtype=dtype))
    return out


def launch_variant(variant: Variant, batch: int = 4, tokens: int = 1000) -> Launch:
    """The real launch of `variant`'s kernel by the public launcher, on CPU tensors (nothing runs)."""
    import torch

    from openrlhf_band.band.spec import spec_from_keywords
    from openrlhf_band.ops import band_loss

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[variant.dtype]
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(batch, tokens, generator=gen) * 5
    log_probs = (old + 0.1 * torch.randn(batch, tokens, generator=gen)).to(dtype).requires_grad_(True)
    adv = torch.randn(batch, tokens, generator=gen)
    mask = torch.rand(batch, tokens, generator=gen) > 0.1
    kwargs: dict[str, Any] = {"divergence": variant.divergence, "return_bounds": True, "dual_clip": 10.0}
    if variant.options == "bare":
        kwargs.update(return_bounds=False, dual_clip=None)
        mask = None
    if variant.radius == "per-token":
        kwargs["delta"] = torch.full((batch, tokens), 0.05)
    elif variant.radius == "per-seq":
        kwargs["delta"] = torch.full((batch, 1), 0.05)
    elif variant.radius == "bounds":
        kwargs["bounds"] = (torch.full((batch, tokens), 0.8), torch.full((batch, tokens), 1.3))
    else:
        kwargs["delta"] = 0.05
    if variant.radius != "bounds" and variant.options != "bare":
        kwargs["upper_cap"] = 10.0
        if variant.options in ("floor", "all"):
            kwargs["lower_floor"] = 0.8
        if variant.options == "all":
            kwargs.update(relax=(0.2, 0.28), ratio_truncation=1e4)
    if variant.options == "dppo":
        kwargs.update(upper_cap=None, dual_clip=None, delta=0.2 if variant.divergence == "tv" else 0.08,
                      lower_delta=0.1 if variant.divergence == "tv" else 0.03, ratio_truncation=1e4)  # fmt: skip

    band_keys = ("divergence", "delta", "upper_cap", "relax", "lower_floor", "lower_delta", "ratio_truncation")
    spec, radius = spec_from_keywords(**{key: kwargs.pop(key) for key in band_keys if key in kwargs})
    kwargs.update(spec=spec, radius=radius)

    def call() -> None:
        out = band_loss.band_token_loss_triton(log_probs, old, adv, mask, **kwargs)
        if variant.kernel == "bwd":
            out.loss.sum().backward()

    launches = [launch for launch in capture_launches(call) if launch.kernel == variant.kernel]
    if len(launches) != 1:
        raise RuntimeError(f"{variant.name}: expected one {variant.kernel} launch, recorded {len(launches)}")
    return launches[0]


# ---------------------------------------------------------------------------------- specialisation


def _kernel_fn(kernel: str) -> Any:
    from triton.runtime.jit import JITFunction

    from openrlhf_band.ops import band_loss

    fn = band_loss._band_loss_fwd_kernel if kernel == "fwd" else band_loss._band_loss_bwd_kernel
    if not isinstance(fn, JITFunction):
        raise RuntimeError(
            f"{kernel} kernel is a {type(fn).__name__}, not a JITFunction: unset TRITON_INTERPRET and re-import"
        )
    return fn


def specialize(fn: Any, backend: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, dict, dict, dict]:
    """(options, signature, constexprs, attrs) of one launch, as `JITFunction.run` computes them.

    Uses Triton's own binder and `_pack_args` (triton 3.6 - 3.9), with the two kwargs `run` adds."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    if hasattr(knobs.compilation, "instrumentation_mode"):
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    return fn._pack_args(backend, kwargs, bound_args, specialization, options)


def make_target(spec: str | int) -> Any:
    """GPUTarget for '90' / 90 (CUDA sm_90, warp 32) or 'gfx942' (HIP, wavefront 64)."""
    from triton.backends.compiler import GPUTarget

    text = str(spec)
    if text.startswith("gfx"):
        return GPUTarget("hip", text, 64)
    return GPUTarget("cuda", int(text.removeprefix("sm_").removeprefix("sm")), 32)


@contextlib.contextmanager
def _compile_env():
    """Always compile (no cache hit, so compile seconds and the ptxas log are real), log ptxas -v."""
    saved = {k: os.environ.get(k) for k in ("TRITON_ALWAYS_COMPILE", "TRITON_DUMP_PTXAS_LOG")}
    os.environ.update({"TRITON_ALWAYS_COMPILE": "1", "TRITON_DUMP_PTXAS_LOG": "1"})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ptxas_rerun(ptx: str, arch: int) -> str:
    """ptxas -v on Triton's PTX, for Triton versions that print no ptxas log (same main flags)."""
    blackwell = arch >= 100 and Path(_nvidia_tool("ptxas-blackwell")).exists()
    tool = _nvidia_tool("ptxas-blackwell" if blackwell else "ptxas")
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [tool, "-lineinfo", "-v", f"--gpu-name=sm_{arch}{suffix}", str(src), "-o", str(Path(d) / "k.o")]
        return subprocess.run(cmd, capture_output=True, text=True).stderr


@dataclass
class Row:
    """One (variant, target) of the resource table (units in the module docstring)."""

    variant: str
    target: str
    ok: bool = False
    error: str = ""
    registers: int = 0
    spill_stores_B: int = 0
    spill_loads_B: int = 0
    local_B: int = 0
    shared_B: int = 0
    num_warps: int = 0
    elems_per_thread: float = 0.0
    f64_per_token: float = 0.0
    f32_per_token: float = 0.0
    sass_instructions: int = 0
    blocks_per_sm: int = 0
    compile_s: float = 0.0
    compile_cpu_s: float = 0.0
    signature_hints: dict = field(default_factory=dict)


def _cpu_seconds() -> float:
    """CPU seconds used so far by this process and its waited-for children (ptxas, cuobjdump)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def compile_launch(kernel: str, launch: Launch, target: Any) -> tuple[Any, str, float, float]:
    """(compiled kernel, ptxas log, wall seconds, CPU seconds) of one recorded launch for `target`."""
    import triton
    from triton.compiler import ASTSource, make_backend

    fn = _kernel_fn(kernel)
    backend = make_backend(target)
    options, signature, constexprs, attrs = specialize(fn, backend, launch.args, launch.kwargs)
    src = ASTSource(fn, signature, constexprs, attrs)
    log = io.StringIO()
    cpu, start = _cpu_seconds(), time.perf_counter()
    with _compile_env(), contextlib.redirect_stdout(log):
        compiled = triton.compile(src, target=target, options=options.__dict__)
    return compiled, log.getvalue(), time.perf_counter() - start, _cpu_seconds() - cpu


def _hints(fn: Any, launch: Launch, backend: Any) -> dict[str, str]:
    """Readable specialisation per argument: type plus 'D' (divisible by 16) or the constexpr value."""
    _options, signature, constexprs, attrs = specialize(fn, backend, launch.args, launch.kwargs)
    names = [p.name for p in fn.params]
    out = {}
    for i, name in enumerate(names):
        ty = signature[name]
        if ty == "constexpr":
            out[name] = f"={constexprs.get((i,))}"
        elif any(a and a[0][0] == "tt.divisibility" for a in [attrs.get((i,), [])]):
            out[name] = f"{ty}:16"
        else:
            out[name] = ty
    return out


def for_backend(launch: Launch, target: Any) -> Launch:
    """The launch as the launcher makes it for `target`'s backend: the recorder runs on a CPU build of torch,
    which launches as CUDA does; on AMD (a ROCm torch) the launcher leaves out the CUDA-only options."""
    from openrlhf_band.ops import band_loss

    if target.backend == "cuda":
        return launch
    kwargs = {k: v for k, v in launch.kwargs.items() if k not in band_loss._CUDA_ONLY_LAUNCH_OPTIONS}
    return Launch(launch.kernel, launch.grid, launch.args, kwargs)


def check_one(variant: Variant, target_spec: str | int, sass: bool = True) -> Row:
    """Compile one variant for one target and measure it (a failed compile is a row with ok=False)."""
    target = make_target(target_spec)
    row = Row(variant.name, str(target_spec))
    try:
        launch = for_backend(launch_variant(variant), target)
        from triton.compiler import make_backend

        row.signature_hints = _hints(_kernel_fn(variant.kernel), launch, make_backend(target))
        compiled, log, seconds, cpu_seconds = compile_launch(variant.kernel, launch, target)
    except Exception as err:  # noqa: BLE001 - every failure is a row in the table
        row.error = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
        return row
    row.compile_s, row.compile_cpu_s = round(seconds, 2), round(cpu_seconds, 2)
    meta = compiled.metadata
    row.num_warps = int(meta.num_warps)
    warp = int(getattr(meta, "warp_size", 32) or 32)
    block = int(launch.kwargs.get("BLOCK", 0))
    row.elems_per_thread = block / (row.num_warps * warp) if block else 0.0
    row.shared_B = int(getattr(meta, "shared", 0) or 0)
    if target.backend != "cuda":  # AMD: VGPRs, scratch and v_*_f64 / v_*_f32 counts from the amdgcn listing
        gcn = compiled.asm.get("amdgcn", "")
        vgprs, scratch = re.search(r"; TotalNumVgprs: (\d+)", gcn), re.search(r"; ScratchSize: (\d+)", gcn)
        row.registers = int(vgprs.group(1)) if vgprs else 0
        row.local_B = int(scratch.group(1)) if scratch else 0
        ops = re.findall(r"^\s+(v_\w+)", gcn, flags=re.M)
        per = row.elems_per_thread or 1.0
        row.sass_instructions = len(ops)
        row.f64_per_token = round(sum("f64" in op for op in ops) / per, 2)
        row.f32_per_token = round(sum("f32" in op and "f64" not in op for op in ops) / per, 2)
        row.ok = True
        return row
    arch = int(target.arch)
    res = parse_ptxas_log(log) or parse_ptxas_log(_ptxas_rerun(compiled.asm["ptx"], arch))
    if res is None:
        row.error = "no ptxas -v resource line"
        return row
    row.registers, row.local_B = res["registers"], res["local_B"]
    row.spill_stores_B, row.spill_loads_B = res["spill_stores_B"], res["spill_loads_B"]
    row.shared_B += res["static_smem_B"]
    # the static SASS counts (cuobjdump, about as much CPU as the compile itself); sass=False leaves them 0
    counts = count_sass(sass_of(compiled.asm["cubin"])) if sass else {"total": 0, "f64": 0, "f32": 0}
    row.sass_instructions = counts["total"]
    per = row.elems_per_thread or 1.0
    row.f64_per_token = round(counts["f64"] / per, 2)
    row.f32_per_token = round(counts["f32"] / per, 2)
    row.blocks_per_sm = occupancy(arch, row.registers, row.shared_B, row.num_warps * warp)
    row.ok = True
    return row


def amd_support() -> str:
    """One line: whether this Triton wheel compiles the backward kernel for gfx942 / gfx90a without a device."""
    variant = next(v for v in variants() if v.kernel == "bwd")
    results = []
    for arch in AMD_TARGETS:
        try:
            target = make_target(arch)
            compiled, _log, seconds, _cpu = compile_launch("bwd", for_backend(launch_variant(variant), target), target)
            results.append(f"{arch}: yes ({'hsaco' if 'hsaco' in compiled.asm else 'no hsaco'}, {seconds:.1f} s)")
        except Exception as err:  # noqa: BLE001
            msg = str(err).strip().splitlines()[0] if str(err).strip() else ""
            results.append(f"{arch}: no ({type(err).__name__}: {msg[:120]})")
    return "AMD (hip) without a device: " + "; ".join(results)


# ------------------------------------------------------------------------------------------- CLI

_COLUMNS = (
    ("variant", 30), ("target", 6), ("registers", 4), ("spill_stores_B", 6), ("spill_loads_B", 6), ("local_B", 6),
    ("shared_B", 6), ("num_warps", 2), ("elems_per_thread", 4), ("f64_per_token", 7), ("f32_per_token", 7),
    ("blocks_per_sm", 3), ("compile_s", 6),
)  # fmt: skip
_SHORT = {"registers": "reg", "spill_stores_B": "st_B", "spill_loads_B": "ld_B", "local_B": "lmem", "shared_B": "smem",
          "num_warps": "w", "elems_per_thread": "ept", "f64_per_token": "f64/tok", "f32_per_token": "f32/tok",
          "blocks_per_sm": "blk", "compile_s": "sec"}  # fmt: skip


def format_table(rows: Sequence[Row]) -> str:
    """The compact table printed by the command."""
    head = " ".join(_SHORT.get(c, c).rjust(w) if c not in ("variant",) else c.ljust(w) for c, w in _COLUMNS)
    lines = [head]
    for r in rows:
        if not r.ok:
            lines.append(f"{r.variant.ljust(30)} {r.target.rjust(6)} ERROR {r.error}")
            continue
        cells = []
        for c, w in _COLUMNS:
            v = getattr(r, c)
            text = f"{v:g}" if isinstance(v, float) else str(v)
            cells.append(text.ljust(w) if c == "variant" else text.rjust(w))
        lines.append(" ".join(cells))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `openrlhf-band aot`."""
    parser.add_argument("--targets", nargs="+", default=[str(t) for t in DEFAULT_TARGETS],
                        help="CUDA compute capabilities (80 90 ...), or gfx942 / gfx90a")  # fmt: skip
    parser.add_argument("--set", dest="variant_set", choices=VARIANT_SETS, default="full",
                        help="full: every variant (default); ci: what make test compiles")  # fmt: skip
    parser.add_argument("--variants", nargs="+", default=None,
                        help="only variants whose name contains one of these substrings (e.g. fwd-kl bwd)")  # fmt: skip
    parser.add_argument("--out", default="out/bench",
                        help="folder for aot_triton-<version>.json / .csv (bench/results: the committed)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="compiles in parallel (processes)")
    parser.add_argument("--no-amd", action="store_true", help="skip the AMD (hip) compile probe")
    parser.add_argument("--no-sass", action="store_true",
                        help="no SASS instruction counts (f64/f32 per token 0): about half the CPU")  # fmt: skip
    parser.add_argument("--tag", default="", help="suffix for the output file names (e.g. -device)")


def select_variants(patterns: Sequence[str] | None, variant_set: str = "full") -> list[Variant]:
    """Variants of `variant_set` whose name contains any of `patterns` (all when None)."""
    pool = variants(variant_set)
    chosen = [v for v in pool if not patterns or any(p in v.name for p in patterns)]
    if not chosen:
        raise ValueError(f"no variant matches {list(patterns or [])}; names: {[v.name for v in pool]}")
    return chosen


def _warm_up(target: str) -> None:
    """One untimed compile (the small backward kernel): a process's first compile also loads Triton's
    compiler, which took 13 s once in a fresh venv and would be charged to the first variant."""
    check_one(next(v for v in variants() if v.kernel == "bwd"), target)


def _check_pair(pair: tuple[Variant, str, bool]) -> Row:
    return check_one(*pair)


def run_check(
    targets: Sequence[str | int],
    patterns: Sequence[str] | None = None,
    jobs: int = 1,
    variant_set: str = "full",
    sass: bool = True,
) -> list[Row]:
    """Rows for every selected variant x target, in that order (sass=False: no SASS instruction counts)."""
    pairs = [(v, str(t), sass) for t in targets for v in select_variants(patterns, variant_set)]
    rows = []

    def progress(row: Row) -> None:  # one line per compile on stderr, so a long run shows where it is
        state = "ok" if row.ok else "ERROR"
        print(f"[{len(rows)}/{len(pairs)}] {row.variant}@{row.target} {state} {row.compile_s} s", file=sys.stderr)

    if not pairs:
        return rows
    if jobs <= 1:
        _warm_up(pairs[0][1])
        for pair in pairs:
            rows.append(_check_pair(pair))
            progress(rows[-1])
        return rows
    import multiprocessing

    # the warm-up runs in each worker, after the fork: a parent that compiled first would fork Triton's
    # threads into the workers and deadlock them
    with multiprocessing.get_context("fork").Pool(jobs, initializer=_warm_up, initargs=(pairs[0][1],)) as pool:
        for row in pool.imap(_check_pair, pairs, chunksize=1):
            rows.append(row)
            progress(row)
    return rows


def failures(rows: Sequence[Row]) -> list[str]:
    """'variant@target: why' for every compile error or spill."""
    bad = []
    for r in rows:
        if not r.ok:
            bad.append(f"{r.variant}@{r.target}: compile error: {r.error}")
        elif r.target.startswith("gfx") and r.local_B:
            bad.append(f"{r.variant}@{r.target}: {r.local_B} B scratch (spills)")
        elif r.spill_stores_B or r.spill_loads_B:
            bad.append(f"{r.variant}@{r.target}: spills {r.spill_stores_B} B stored, {r.spill_loads_B} B loaded")
    return bad


def interpreter_refusal(command: str) -> str | None:
    """Why `command` cannot compile here, or None: under TRITON_INTERPRET the kernels are interpreter functions,
    not JITFunctions, and nothing can be compiled for a GPU target."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return f"{command}: TRITON_INTERPRET is set; unset it (the kernels must be JITFunctions)"
    return None


def main(args: argparse.Namespace) -> int:
    """Compile, print the table, write JSON + CSV; 1 on any compile error or spill."""
    if refusal := interpreter_refusal("openrlhf-band aot"):
        print(refusal)
        return 2
    import torch
    import triton

    start = time.perf_counter()
    rows = run_check(args.targets, args.variants, args.jobs, args.variant_set, sass=not args.no_sass)
    amd = "AMD probe skipped" if args.no_amd else amd_support()
    print(format_table(rows))
    print(amd)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"aot_triton-{triton.__version__}{args.tag}"
    report = {
        "triton": triton.__version__,
        "torch": torch.__version__,
        "targets": [str(t) for t in args.targets],
        "variant_set": args.variant_set,
        "sass_counts": not args.no_sass,
        "amd": amd,
        "seconds": round(time.perf_counter() - start, 1),
        "units": "registers per thread; *_B bytes (spills, local per thread, shared per block); "
        "f64/f32_per_token: static SASS count / elems_per_thread; compile_s: wall seconds; compile_cpu_s: CPU seconds",
        "rows": [asdict(r) for r in rows],
    }
    Path(f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    with open(f"{stem}.csv", "w", newline="") as f:
        names = [n for n in Row.__dataclass_fields__ if n != "signature_hints"]
        writer = csv.DictWriter(f, fieldnames=names, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    print(f"wrote {stem}.json and {stem}.csv ({report['seconds']} s)")
    bad = failures(rows)
    for line in bad:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="openrlhf-band aot", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
