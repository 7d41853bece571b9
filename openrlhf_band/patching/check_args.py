"""`openrlhf-band check-args -- <train_ppo_ray args>`: run the patched OpenRLHF parser and its
validation on the arguments, without Ray, and print the resolved loss configuration as JSON.

OpenRLHF builds its parser inline under `if __name__ == "__main__":`, so the module is run with
runpy as __main__; `ray.is_initialized` and `get_strategy` are stubbed for that run so `train()`
stops at its first line of real work and hands back the validated arguments.
"""

from __future__ import annotations

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

    Raises SystemExit (status 2, message on stderr) for arguments the parser rejects, and
    AssertionError with OpenRLHF's message for those its validation rejects.
    """
    import openrlhf.utils
    import ray

    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    with (
        mock.patch.object(sys, "argv", ["train_ppo_ray", *argv]),
        mock.patch.object(ray, "is_initialized", return_value=True),
        mock.patch.object(ray, "init", side_effect=AssertionError("check-args must not start Ray")),
        mock.patch.object(openrlhf.utils, "get_strategy", _stop_with_args),
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
        except SystemExit as exit_:
            return int(exit_.code or 0) or 2
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
