"""verl's released DPPO losses (`compute_policy_loss_dppo_tv` / `compute_policy_loss_dppo_kl`), run
from the installed verl 0.9.1 wheel itself, as ground truth for our DPPO rule.

Importing `verl.trainer.ppo.core_algos` needs omegaconf, ray, verl.workers.config and more, none of
which this venv has. So the functions' source is read from the installed files with `ast` (the
FunctionDef nodes, found by name, the `@register_policy_loss(...)` decorator dropped) and `exec`'d in
a namespace holding only the names their bodies use. Nothing of verl's code is copied into this
repository: it is read from `.venv/ground-truth/verl-0.9.1`, which `make venv` creates with

    pip install --no-deps --target .venv/ground-truth/verl-0.9.1 verl==0.9.1

The functions are compiled with `from __future__ import annotations` semantics, so their annotations
(`Optional[ActorConfig]`, ...) are never evaluated and need no stand-ins.
"""

from __future__ import annotations
import __future__

import ast
import functools
import re
import types
from pathlib import Path
from typing import Any, Optional

import torch

VERL_VERSION = "0.9.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
VERL_ROOT = REPO_ROOT / ".venv" / "ground-truth" / f"verl-{VERL_VERSION}"
CORE_ALGOS = Path("verl") / "trainer" / "ppo" / "core_algos.py"
TORCH_FUNCTIONAL = Path("verl") / "utils" / "torch_functional.py"

POLICY_LOSSES = {"tv": "compute_policy_loss_dppo_tv", "kl": "compute_policy_loss_dppo_kl"}
# the only decorator the loaded functions may carry (it registers the loss in verl's registry)
_ALLOWED_DECORATOR = "register_policy_loss"


class VerlGroundTruthMissing(RuntimeError):
    """The installed verl wheel is not where the tests expect it."""


class AlgoConfig:
    """Stand-in for verl.trainer.config.AlgoConfig: the losses assert `not isinstance(config, AlgoConfig)`."""


class DppoConfig:
    """The part of verl's ActorConfig that the DPPO losses read: clip_ratio(_low/_high) (DPPO's
    divergence radii), `get("clip_ratio_c", ...)` (the truncation c) and `global_batch_info`
    (agg_loss's keyword arguments: dp_size, batch_num_tokens, global_batch_size)."""

    def __init__(self, clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c=None, global_batch_info=None):
        self.clip_ratio = clip_ratio
        self.clip_ratio_low = clip_ratio_low
        self.clip_ratio_high = clip_ratio_high
        self._extra = {} if clip_ratio_c is None else {"clip_ratio_c": clip_ratio_c}
        self.global_batch_info = dict(global_batch_info or {})

    def get(self, key, default=None):
        return self._extra.get(key, default)


def installed_version(root: Path = VERL_ROOT) -> str:
    """verl's version from the wheel's dist-info METADATA (the one dist-info under `root`)."""
    infos = sorted(root.glob("verl-*.dist-info"))
    if len(infos) != 1:
        raise VerlGroundTruthMissing(f"expected one verl-*.dist-info under {root}, found {[p.name for p in infos]}")
    match = re.search(r"^Version:\s*(\S+)\s*$", (infos[0] / "METADATA").read_text(), re.MULTILINE)
    if match is None:
        raise VerlGroundTruthMissing(f"no Version: line in {infos[0] / 'METADATA'}")
    return match.group(1)


def _function_defs(path: Path, names: list[str]) -> list[ast.FunctionDef]:
    """The module-level FunctionDef nodes `names` of `path`, decorators removed (only
    `@register_policy_loss(...)` is expected; anything else is refused, not silently dropped)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names}
    missing = [n for n in names if n not in found]
    if missing:
        raise VerlGroundTruthMissing(f"{path} has no module-level function(s) {missing}")
    for node in found.values():
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            if not (isinstance(target, ast.Name) and target.id == _ALLOWED_DECORATOR):
                raise VerlGroundTruthMissing(f"{path}:{node.lineno}: unexpected decorator on {node.name}")
        node.decorator_list = []
    return [found[n] for n in names]


def _exec_functions(path: Path, names: list[str], namespace: dict) -> dict:
    """Compile the functions `names` of `path` (with their original line numbers, so tracebacks point
    into verl's file) and exec them into `namespace`."""
    module = ast.Module(body=_function_defs(path, names), type_ignores=[])
    code = compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return namespace


def checked_version(root: Path = VERL_ROOT) -> str:
    """verl 0.9.1's version at `root`, checked: VerlGroundTruthMissing (saying to run `make venv`) when
    the installed wheel is missing or is not verl 0.9.1."""
    core, tf = root / CORE_ALGOS, root / TORCH_FUNCTIONAL
    if not (core.is_file() and tf.is_file()):
        raise VerlGroundTruthMissing(
            f"verl {VERL_VERSION}'s source is not installed at {root} (looked for {CORE_ALGOS} and "
            f"{TORCH_FUNCTIONAL}): run `make venv`, which installs it with `pip install --no-deps --target "
            f".venv/ground-truth/verl-{VERL_VERSION} verl=={VERL_VERSION}`"
        )
    version = installed_version(root)
    if version != VERL_VERSION:
        raise VerlGroundTruthMissing(f"{root} holds verl {version}, not {VERL_VERSION}: run `make venv`")
    return version


def load_functional(root: Path = VERL_ROOT) -> types.SimpleNamespace:
    """verl's `verl_F` as its losses use it: masked_sum and masked_mean from verl/utils/torch_functional.py."""
    functional = _exec_functions(root / TORCH_FUNCTIONAL, ["masked_sum", "masked_mean"],
                                 {"torch": torch, "Optional": Optional})  # fmt: skip
    return types.SimpleNamespace(masked_sum=functional["masked_sum"], masked_mean=functional["masked_mean"])


@functools.cache
def load(root: Path = VERL_ROOT) -> types.SimpleNamespace:
    """verl 0.9.1's dppo_tv / dppo_kl losses, agg_loss, masked_sum and masked_mean, as callables, from
    the wheel installed at `root`.

    Raises VerlGroundTruthMissing (saying to run `make venv`) when the installed wheel is missing or
    is not verl 0.9.1.
    """
    version = checked_version(root)
    verl_F = load_functional(root)
    namespace = {"torch": torch, "Optional": Optional, "Any": Any, "verl_F": verl_F, "AlgoConfig": AlgoConfig}
    _exec_functions(root / CORE_ALGOS, ["agg_loss", *POLICY_LOSSES.values()], namespace)
    return types.SimpleNamespace(
        version=version,
        root=root,
        dppo={key: namespace[name] for key, name in POLICY_LOSSES.items()},
        agg_loss=namespace["agg_loss"],
        masked_sum=verl_F.masked_sum,
        masked_mean=verl_F.masked_mean,
    )
