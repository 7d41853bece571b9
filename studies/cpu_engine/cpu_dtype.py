"""The dtype the CPU harness trains and samples in when a run does not say: bf16, the recipe's, where
the CPU computes it natively; float32 where it would emulate it.

    python studies/cpu_engine/cpu_dtype.py          # prints bf16 or float32, and why on stderr

A CPU without AVX512_BF16 or AMX-BF16 emulates bf16 matrix products: PyTorch and oneDNN convert to
float32 and back around a scalar path. Measured on this project's machine with oneDNN, ATen and MKL
capped at AVX2 (the way `make ci-no-bf16` runs the suite), a 512 x 512 bf16 matmul costs 44-65x
float32's, against 0.12x with the native instructions (docs/tests.md#timings). The harness's runs then
take float32 (the shim's `float32_on_cpu`) except those that pin bf16 to keep the recipe's dtype
covered end to end (tests/e2e: the chi2 run).

Read from the CPU's flags, not measured, so that every process of a run and every run of a session
agree whatever the machine's load. The ISA caps of the libraries that do the arithmetic count too: a
CPU with the flags whose oneDNN is capped below bf16 (ONEDNN_MAX_CPU_ISA) or whose ATen kernels are
capped below AVX-512 (ATEN_CPU_CAPABILITY) emulates bf16 as one without them does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA, case-insensitive) at or above the first with bf16 instructions
ONEDNN_ISAS_WITH_BF16 = {
    "all", "default", "avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx", "avx512_core_amx_fp16",
    "avx10_1_512", "avx10_1_512_amx", "avx10_1_512_amx_fp16", "avx10_2_512", "avx10_2_512_amx_2",
}  # fmt: skip
ATEN_CAPABILITIES_WITH_BF16 = {"avx512", "amx"}  # ATEN_CPU_CAPABILITY: avx2 and default have no bf16 dot products


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags of the first processor in /proc/cpuinfo's text (x86: `flags`, others have none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def bf16_verdict(cpuinfo: str, env: Mapping[str, str]) -> tuple[bool, str]:
    """(whether bf16 runs natively, why) from /proc/cpuinfo's text and the environment's ISA caps."""
    native = [flag for flag in NATIVE_BF16_FLAGS if flag in cpu_flags(cpuinfo)]
    if not native:
        return False, f"the CPU has none of {', '.join(NATIVE_BF16_FLAGS)}"
    onednn = env.get("ONEDNN_MAX_CPU_ISA", "").strip().lower()
    if onednn and onednn not in ONEDNN_ISAS_WITH_BF16:
        return False, f"ONEDNN_MAX_CPU_ISA={onednn.upper()} caps oneDNN below its bf16 instructions"
    aten = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten and aten not in ATEN_CAPABILITIES_WITH_BF16:
        return False, f"ATEN_CPU_CAPABILITY={aten} caps PyTorch's kernels below AVX-512"
    return True, f"the CPU has {', '.join(native)}"


def harness_dtype(cpuinfo: str, env: Mapping[str, str]) -> str:
    """`bf16` or `float32`: the value E2E_PARAM_DTYPE takes when the caller does not set it."""
    return "bf16" if bf16_verdict(cpuinfo, env)[0] else "float32"


def main() -> int:
    path = Path("/proc/cpuinfo")
    cpuinfo = path.read_text() if path.exists() else ""
    native, why = bf16_verdict(cpuinfo, os.environ)
    print(f"cpu_dtype: {'bf16' if native else 'float32'} ({why})", file=sys.stderr)
    print("bf16" if native else "float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
