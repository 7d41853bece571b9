"""The CPU harness's default dtype (studies/cpu_engine/cpu_dtype.py): bf16 only where the CPU computes it natively
and no library that does the arithmetic is capped below its bf16 instructions."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "studies" / "cpu_engine" / "cpu_dtype.py"


def load():
    spec = importlib.util.spec_from_file_location("cpu_dtype_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cpu_dtype = load()

# flags lines as /proc/cpuinfo prints them (shortened): a Sapphire Rapids, a Cooper Lake, a Zen 3 EPYC, an ARM
SAPPHIRE = (
    "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu\n"
)
COOPER = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"
EPYC = "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16\n"


@pytest.mark.parametrize(
    ("cpuinfo", "dtype"), [(SAPPHIRE, "bf16"), (COOPER, "bf16"), (EPYC, "float32"), (ARM, "float32"), ("", "float32")]
)
def test_the_flags_decide(cpuinfo, dtype):
    assert cpu_dtype.harness_dtype(cpuinfo, {}) == dtype


def test_only_the_first_processors_flags_are_read():
    assert cpu_dtype.cpu_flags(SAPPHIRE) == {"fpu", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


@pytest.mark.parametrize(
    ("env", "dtype"),
    [
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "float32"),
        ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, "float32"),  # AVX-512 without its bf16 instructions
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "bf16"),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "bf16"),
        ({"ONEDNN_MAX_CPU_ISA": "ALL"}, "bf16"),
        ({"ATEN_CPU_CAPABILITY": "avx2"}, "float32"),
        ({"ATEN_CPU_CAPABILITY": "default"}, "float32"),
        ({"ATEN_CPU_CAPABILITY": "avx512"}, "bf16"),
    ],
)
def test_an_isa_cap_below_bf16_means_emulated_bf16(env, dtype):
    assert cpu_dtype.harness_dtype(SAPPHIRE, env) == dtype
    assert cpu_dtype.harness_dtype(EPYC, env) == "float32"  # no cap gives a CPU instructions it lacks


def test_the_verdict_says_why():
    assert "none of avx512_bf16, amx_bf16" in cpu_dtype.bf16_verdict(EPYC, {})[1]
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in cpu_dtype.bf16_verdict(SAPPHIRE, {"ONEDNN_MAX_CPU_ISA": "avx2"})[1]


def test_the_script_prints_one_word_for_the_harness():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True,
                          env={"ONEDNN_MAX_CPU_ISA": "AVX2", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert proc.stdout == "float32\n" and proc.stderr.startswith("cpu_dtype: float32 (")
