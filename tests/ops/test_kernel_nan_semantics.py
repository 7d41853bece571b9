"""NaN in the fused kernel behaves as in the torch reference on a GPU too, not only in Triton's interpreter.

On a GPU tl.minimum / tl.maximum default to PropagateNan.NONE, which lower to PTX min / max: they drop a
NaN (min(nan, 10) = 10). Triton's interpreter runs the same ops as np.minimum / np.maximum, which keep it,
and every kernel test runs in the interpreter: a NaN band capped at 10 read 10 on a device and NaN in the
reference (torch.clamp / minimum / maximum keep NaN), and no test saw it. Two checks:

* a lint over the kernel's source: every tl.minimum / tl.maximum / tl.clamp passes
  propagate_nan=tl.PropagateNan.ALL, or its statement is in `GUARDED` with the reason NaN cannot reach it;
* the kernel against the reference on NaN inputs at unmasked tokens (old log-probs; per-token radii that
  are NaN, <= 0, inf or out of range) with every option that moves a bound, in the interpreter as it is
  and with the NaN-dropping ops patched to behave as on a device (np.fmin / np.fmax).

The interpreter is forced as in tests/ops/test_band_loss_kernel.py (see its docstring).
"""

from __future__ import annotations

import ast
import importlib
import math
import os
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before openrlhf_band.ops.band_loss is imported

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction, InterpreterBuilder  # noqa: E402

import openrlhf_band.ops.band_loss as band_loss_module  # noqa: E402
from openrlhf_band import DIVERGENCES  # noqa: E402
from openrlhf_band.band.bounds import PER_TOKEN_DELTA_RANGE  # noqa: E402
from openrlhf_band.functional import band_token_loss  # noqa: E402

if not isinstance(band_loss_module._band_loss_fwd_kernel, InterpretedFunction):
    band_loss_module = importlib.reload(band_loss_module)
assert isinstance(band_loss_module._band_loss_fwd_kernel, InterpretedFunction)
assert isinstance(band_loss_module._band_loss_bwd_kernel, InterpretedFunction)

KERNEL_SOURCE = Path(band_loss_module.__file__).read_text()


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


# ----------------------------------------------------------------------------------------------
# the lint
# ----------------------------------------------------------------------------------------------
_NAN_DROPPING = ("minimum", "maximum", "clamp")  # tl ops whose propagate_nan defaults to NONE
# (function, statement as ast.unparse writes it): why NaN cannot reach its min / max. Each has NaN
# replaced in the same statement or is fed by one that did; the lint fails on a stale entry too.
GUARDED = {
    ("_table_position", "pos = tl.minimum(tl.maximum(tl.where(pos == pos, pos, 0.0), 0.0), cells * 1.0)"):
        "nan replaced by 0 inside the clamp",
    ("_table_position", "cell = tl.minimum(tl.floor(pos), cells - 1.0)"):
        "pos was clamped to [0, cells] without nan the line before",
    ("_started_lower_log_root", "pc = tl.minimum(tl.maximum(tl.where(pc == pc, pc, 0.0), 0.0), rows - 1.0)"):
        "nan replaced by 0 inside the clamp",
    ("_started_lower_log_root", "ps = tl.minimum(tl.maximum(tl.where(ps == ps, ps, 0.0), 0.0), cols - 1.0)"):
        "nan replaced by 0 inside the clamp",
    ("_started_lower_log_root", "i = tl.minimum(tl.floor(pc), rows - 2.0)"): "pc is clamped, without nan",
    ("_started_lower_log_root", "j = tl.minimum(tl.floor(ps), cols - 2.0)"): "ps is clamped, without nan",
    ("_band_loss_fwd_kernel",
     "log_ratio = tl.where(raw == raw, tl.minimum(tl.maximum(raw, -LR_CLAMP), LR_CLAMP), raw)"):
        "a nan log-ratio takes the where's other branch, itself",
    ("_band_loss_fwd_kernel", "x = tl.where(old == old, tl.minimum(old, 0.0), old)"):
        "a nan old log-prob takes the where's other branch, itself",
}  # fmt: skip


def min_max_sites(source: str) -> list[tuple[str, str, str, bool]]:
    """(function, statement, call, passes propagate_nan=tl.PropagateNan.ALL) for every tl.minimum,
    tl.maximum and tl.clamp call in `source`; function and statement are the innermost around it."""
    sites = []

    def visit(node, function, statement):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.stmt):
            statement = node
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _NAN_DROPPING
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "tl"
        ):
            propagates = any(
                k.arg == "propagate_nan" and ast.unparse(k.value) == "tl.PropagateNan.ALL" for k in node.keywords
            )
            sites.append((function, ast.unparse(statement), ast.unparse(node), propagates))
        for child in ast.iter_child_nodes(node):
            visit(child, function, statement)

    visit(ast.parse(source), "<module>", None)
    return sites


def unguarded(source: str) -> list[tuple[str, str]]:
    """(function, call) of every NaN-dropping call that neither propagates NaN nor sits in `GUARDED`."""
    return [(f, call) for f, stmt, call, ok in min_max_sites(source) if not ok and (f, stmt) not in GUARDED]


def test_every_min_max_in_the_kernel_propagates_nan_or_is_guarded():
    assert unguarded(KERNEL_SOURCE) == []
    sites = min_max_sites(KERNEL_SOURCE)
    assert len(sites) > 20  # the lint sees the kernel's calls (nested ones and the jit helpers' included)
    # no stale entry: each guarded statement is in the kernel and holds a call that does not propagate
    needed = {(f, stmt) for f, stmt, _call, ok in sites if not ok}
    assert set(GUARDED) == needed


# the statements that held the kernel's unguarded calls before issue 61 (commit 28763df), verbatim, in stub functions
_BEFORE = """
def _started_lower_log_root(x, p, b, step, lo, hi):
    b = tl.minimum(b, 1e300)  # b ~ delta / p overflows for p < ~1e-300; any b that large gives q = 0
    log_q = tl.minimum(tl.maximum(log_q - step, lo), hi)

def _band(delta, delta_lo):
    d = tl.minimum(delta, 4.0)
    d_lo = tl.minimum(delta_lo, 4.0)

def _band_loss_fwd_kernel(old, lo, hi, relax_lo, relax_hi, lower_floor, upper_cap):
    x = tl.minimum(old, 0.0)  # log p slightly above 0 from rounding counts as p = 1
    x = tl.where(old == old, x, old)  # keep nan as nan (min(nan, 0) may drop it)
    lo = tl.minimum(lo, relax_lo)
    at_edge = at_edge & (hi >= relax_hi)
    hi = tl.maximum(hi, relax_hi)
    lo = tl.maximum(lo, lower_floor, propagate_nan=tl.PropagateNan.ALL)
    hi = tl.minimum(hi, upper_cap)
"""


def test_the_lint_flags_the_kernel_before_the_fix():
    assert unguarded(_BEFORE) == [
        ("_started_lower_log_root", "tl.minimum(b, 1e+300)"),
        ("_started_lower_log_root", "tl.minimum(tl.maximum(log_q - step, lo), hi)"),
        ("_started_lower_log_root", "tl.maximum(log_q - step, lo)"),
        ("_band", "tl.minimum(delta, 4.0)"),
        ("_band", "tl.minimum(delta_lo, 4.0)"),
        ("_band_loss_fwd_kernel", "tl.minimum(old, 0.0)"),  # guarded, but a statement later: not by the lint
        ("_band_loss_fwd_kernel", "tl.minimum(lo, relax_lo)"),
        ("_band_loss_fwd_kernel", "tl.maximum(hi, relax_hi)"),
        ("_band_loss_fwd_kernel", "tl.minimum(hi, upper_cap)"),
    ]


def test_the_lint_flags_a_dropped_propagate_nan_in_todays_kernel():
    line = "hi = tl.minimum(hi, upper_cap, propagate_nan=tl.PropagateNan.ALL)"
    assert KERNEL_SOURCE.count(line) == 1
    mutated = KERNEL_SOURCE.replace(line, "hi = tl.minimum(hi, upper_cap)")
    assert unguarded(mutated) == [("_band_loss_fwd_kernel", "tl.minimum(hi, upper_cap)")]
    # and a guard outside the statement does not count
    guarded = "x = tl.where(old == old, tl.minimum(old, 0.0), old)"
    mutated = KERNEL_SOURCE.replace(guarded, "x = tl.minimum(old, 0.0)\n    x = tl.where(old == old, x, old)")
    assert unguarded(mutated) == [("_band_loss_fwd_kernel", "tl.minimum(old, 0.0)")]


# ----------------------------------------------------------------------------------------------
# device semantics in the interpreter
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def device_min_max(monkeypatch):
    """tl.minimum / tl.maximum with PropagateNan.NONE as on a GPU: Triton lowers them to minnumf / maxnumf
    (PTX min / max, which return the other operand for a nan one), PropagateNan.ALL to minimumf /
    maximumf; the interpreter maps both to np.minimum / np.maximum. np.fmin / np.fmax drop NaN as PTX does."""
    monkeypatch.setattr(InterpreterBuilder, "create_minnumf", lambda self, a, b: self.binary_op(a, b, np.fmin))
    monkeypatch.setattr(InterpreterBuilder, "create_maxnumf", lambda self, a, b: self.binary_op(a, b, np.fmax))


@triton.jit
def _min_max_kernel(x_ptr, out_ptr, PROPAGATE: tl.constexpr):
    offs = tl.arange(0, 4)
    x = tl.load(x_ptr + offs)
    if PROPAGATE:
        lo = tl.minimum(x, 10.0, propagate_nan=tl.PropagateNan.ALL)
        hi = tl.maximum(x, -10.0, propagate_nan=tl.PropagateNan.ALL)
    else:
        lo = tl.minimum(x, 10.0)
        hi = tl.maximum(x, -10.0)
    tl.store(out_ptr + offs, lo)
    tl.store(out_ptr + 4 + offs, hi)


def _min_max(propagate: bool) -> list[float]:
    x = torch.tensor([math.nan, 3.0, 20.0, -20.0])
    out = torch.empty(8)
    _min_max_kernel[(1,)](x, out, PROPAGATE=propagate)
    return out.tolist()


def test_the_device_fixture_drops_nan_where_a_gpu_does(device_min_max):
    dropped, kept = _min_max(False), _min_max(True)
    assert dropped == [10.0, 3.0, 10.0, -20.0, -10.0, 3.0, 20.0, -10.0]
    assert math.isnan(kept[0]) and math.isnan(kept[4]) and kept[1:4] + kept[5:] == dropped[1:4] + dropped[5:]


def test_the_interpreter_alone_keeps_nan():
    assert math.isnan(_min_max(False)[0]) and math.isnan(_min_max(True)[0])


# every option that moves a bound or the objective after the band (a cap alone too: relax in front of it
# would hide a cap that drops NaN)
OPTIONS = {
    "cap": dict(upper_cap=10.0),
    "relax-floor-cap-dual": dict(upper_cap=10.0, relax=(0.2, 0.28), lower_floor=0.8, dual_clip=3.0),
}
_LOW, _HIGH = PER_TOKEN_DELTA_RANGE


def _nan_case(per_token: bool):
    """(3, 16) inputs: NaN old log-probs at unmasked tokens (and at a masked one), and for a per-token
    radius NaN, 0, negative, +-inf, out-of-range and > 4 (hellinger's cap) entries at unmasked tokens."""
    g = torch.Generator().manual_seed(61)
    old = -torch.rand(3, 16, generator=g) * 4 - 0.01
    log_probs = old + 0.4 * torch.randn(3, 16, generator=g)
    adv = torch.randn(3, 16, generator=g)
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[2, 10:] = False
    old[0, :3] = math.nan
    old[2, 12] = math.nan  # masked
    nan_band = torch.zeros(3, 16, dtype=torch.bool)
    nan_band[0, :3] = True
    delta: float | torch.Tensor = 0.05
    if per_token:
        delta = torch.full((3, 16), 0.05)
        delta[1, :8] = torch.tensor([math.nan, 0.0, -1.0, math.inf, -math.inf, _HIGH * 2, _LOW / 2, 50.0])
        delta[0, 2] = math.nan  # with a nan old log-prob
        delta[2, 11] = math.nan  # masked
        nan_band[1, :5] = True  # out of range only for kl / reverse_kl's solver (the test's reference decides)
    upstream = torch.randn(3, 16, generator=g)
    return log_probs, old, adv, mask, delta, nan_band, upstream


def _loss_and_grad(backend, log_probs, old, adv, mask, delta, upstream, divergence, options):
    lp = log_probs.clone().requires_grad_()
    out = band_token_loss(lp, old, adv, mask, divergence=divergence, delta=delta, backend=backend,
                          return_bounds=True, **options)  # fmt: skip
    (grad,) = torch.autograd.grad(out.loss, lp, grad_outputs=upstream)
    return out, grad


@pytest.mark.parametrize("semantics", ["interpreter", "device"])
@pytest.mark.parametrize("per_token", [False, True], ids=["scalar", "per-token"])
@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_nan_inputs_match_the_reference(request, divergence, options, per_token, semantics):
    if semantics == "device":
        request.getfixturevalue("device_min_max")
    log_probs, old, adv, mask, delta, nan_band, upstream = _nan_case(per_token)
    args = (log_probs, old, adv, mask, delta, upstream, divergence, OPTIONS[options])
    want, want_grad = _loss_and_grad("torch", *args)
    got, got_grad = _loss_and_grad("triton", *args)
    # the case is what it says: these tokens' bounds are NaN in the reference, and a cap would make them 10
    assert want.upper[nan_band].isnan().all() and want.lower[nan_band].isnan().all()
    assert want.loss[nan_band].isnan().all() and (want.loss[~mask] == 0).all()
    for name, g, w, tol in (
        ("lower", got.lower, want.lower, 1e-6),
        ("upper", got.upper, want.upper, 1e-6),
        ("loss", got.loss, want.loss, 2e-5),
        ("grad", got_grad, want_grad, 1e-5),
    ):
        torch.testing.assert_close(g, w, rtol=tol, atol=1e-6, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}")
    for name in ("clipped_upper", "clipped_lower", "dual_clipped", "floor_clipped"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
