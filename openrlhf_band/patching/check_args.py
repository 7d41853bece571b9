"""`openrlhf-band check-args -- <train_ppo_ray args>`: run the patched OpenRLHF parser and its
validation on the arguments, without Ray, and print the resolved loss configuration as JSON.

OpenRLHF builds its parser inline under `if __name__ == "__main__":`, so the module is run with
runpy as __main__; `ray.is_initialized` and `get_strategy` are stubbed for that run so `train()`
stops at its first line of real work and hands back the validated arguments.

The attention implementation is resolved as train_ppo_ray resolves it (its default is
flash_attention_2), not as the example scripts choose it (sdpa where flash_attn does not import):
a note on stderr says which it is and why, and whether flash_attn is installed where that matters.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from unittest import mock


class _ArgsValidated(Exception):
    def __init__(self, args):
        super().__init__("validated")
        self.train_args = args


def _stop_with_args(args):
    raise _ArgsValidated(args)


def validate_train_args(argv: Sequence[str]):
    """The hierarchized, validated `args` that `train_ppo_ray` would train with.

    Raises SystemExit (status 2, message on stderr) for arguments the parser rejects: one line and a
    pointer to --help, not argparse's usage dump first (`parser_errors`); and AssertionError with
    OpenRLHF's message for those its validation rejects.
    """
    import argparse

    import openrlhf.utils
    import ray

    from openrlhf_band.integration.parser_errors import one_line_error

    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    with (
        mock.patch.object(sys, "argv", ["train_ppo_ray", *argv]),
        mock.patch.object(ray, "is_initialized", return_value=True),
        mock.patch.object(ray, "init", side_effect=AssertionError("check-args must not start Ray")),
        mock.patch.object(openrlhf.utils, "get_strategy", _stop_with_args),
        mock.patch.object(argparse.ArgumentParser, "error", one_line_error),
    ):
        try:
            runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=False)
        except _ArgsValidated as done:
            return done.train_args
    raise RuntimeError("train_ppo_ray returned without reaching train(); is the patch set applied?")


def _where_in_openrlhf(err: BaseException) -> str:
    """' (at openrlhf/<file>:<line>: <source>)' for the innermost OpenRLHF frame of err's traceback.

    OpenRLHF's validation fails with bare errors on missing options (0.11.2 runs
    `args.reward.model_name_or_path.split(",")` when neither a reward model nor
    `--reward.remote_url` is given: an AttributeError on None); its source line names the option.
    """
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "/openrlhf/" in f.filename.replace("\\", "/")]
    if not frames:
        return ""
    frame = frames[-1]
    where = "openrlhf/" + frame.filename.replace("\\", "/").rsplit("/openrlhf/", 1)[1]
    return f" (at {where}:{frame.lineno}: {(frame.line or '').strip()})"


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def attention_note(argv: Sequence[str], args) -> str:
    """One line for stderr: the attention implementation the arguments resolve to and why; where it is
    flash attention and flash_attn is not installed here, what the example scripts would pass instead."""
    impl, packing = args.ds.attn_implementation, bool(args.ds.packing_samples)
    flag, given, words = "--ds.attn_implementation", None, list(argv)
    for i, word in enumerate(words):  # the last one given wins, as in argparse
        if word == flag and i + 1 < len(words):
            given = words[i + 1]
        elif word.startswith(flag + "="):
            given = word.split("=", 1)[1]
    if given == impl:
        why = flag
    elif given is None:
        why = f"train_ppo_ray's default; {flag} not given"
    else:  # OpenRLHF's validation replaced it: packing runs only on flash attention
        why = f"{flag} {given} replaced by OpenRLHF's validation: --ds.packing_samples needs flash attention"
    note = f"openrlhf-band check-args: attention {impl}, packing {'on' if packing else 'off'} ({why})"
    if "flash_attention" in impl and not flash_attn_installed():
        note += (
            ". flash_attn is not installed here: a run in this environment would fail to load the model. The example "
            "scripts (examples/scripts/common.sh) pass --ds.attn_implementation sdpa without --ds.packing_samples "
            "where flash_attn does not import"
        )
    return note


def main(argv: Sequence[str]) -> int:
    """Exactly one JSON document on stdout (the resolved loss configuration), everything else on
    stderr: what OpenRLHF, DeepSpeed and others print while the parser runs goes there too, since
    stdout's file descriptor points at stderr until the JSON is written."""
    from openrlhf_band.integration.flags import resolved_loss_config

    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        try:
            args = validate_train_args(argv)
            config = resolved_loss_config(args)
            print(attention_note(argv, args), file=sys.stderr)
        except SystemExit as exit_:
            return int(exit_.code or 0) or 2
        except ModuleNotFoundError:  # OpenRLHF or Ray not installed: the CLI says what to install
            raise
        except AssertionError as err:
            print(f"openrlhf-band check-args: invalid arguments: {err}", file=sys.stderr)
            return 2
        except Exception as err:  # OpenRLHF's own validation can fail with other errors on bad combinations
            print(
                f"openrlhf-band check-args: OpenRLHF rejected the arguments: {type(err).__name__}: {err}"
                f"{_where_in_openrlhf(err)}",
                file=sys.stderr,
            )
            return 2
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    print(json.dumps(config, indent=2))
    return 0
