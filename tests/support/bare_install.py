"""Run the CLI and the API as a bare `pip install -e .` has them: only torch, numpy, what torch
itself requires, and the standard library import; every other top-level module raises
ModuleNotFoundError as if it were not installed (a meta-path finder placed before all others).

`python bare_install.py ALLOW JSON_OUT < COMMANDS` runs each argv of the JSON list COMMANDS (or
"python-api": band_bounds and band_token_loss) and writes {"results": [{"argv", "rc", "stderr"}],
"refused": [modules]} to JSON_OUT; ALLOW is a comma-separated list of distributions to let through
with their requirements (an extra's, e.g. "matplotlib"), or "-" for none.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import json
import sys


def installed_with(*roots: str) -> set[str]:
    """The top-level import names of the distributions `roots` and everything they require (their
    markers evaluated here, no extras): what `pip install -e .` brings besides the package."""
    from importlib import metadata

    from packaging.requirements import Requirement

    names, seen, todo = set(), set(), list(roots)
    while todo:
        dist_name = todo.pop().lower().replace("_", "-")
        if dist_name in seen:
            continue
        seen.add(dist_name)
        dist = metadata.distribution(dist_name)
        for file in dist.files or ():
            top = file.parts[0]
            if top.endswith((".dist-info", ".data")) or top in ("..", "bin") or file.suffix not in (".py", ".so", ""):
                continue
            names.add(top.removesuffix(".py").split(".")[0])
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return names


OURS = {"openrlhf_band", "bare_install"}


class NotInstalled(importlib.abc.MetaPathFinder):
    def __init__(self, allowed: set[str]):
        self.allowed = allowed
        self.refused: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top in self.allowed or top in sys.stdlib_module_names or top.startswith("_"):
            return None  # the normal finders decide
        self.refused.add(top)
        raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


def install(extra: set[str]) -> NotInstalled:
    finder = NotInstalled(installed_with("torch", "numpy", *extra) | OURS)
    sys.meta_path.insert(0, finder)
    return finder


def run_cli(argv: list[str]) -> tuple[int, str]:
    from openrlhf_band.tools.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as exit_:
            rc = int(exit_.code or 0)
        except Exception as exc:  # a traceback is what the test forbids: record it as one
            rc, err = -1, io.StringIO(f"{type(exc).__name__}: {exc}")
    return rc, err.getvalue()


if __name__ == "__main__":
    allow, out = sys.argv[1], sys.argv[2]
    finder = install(set() if allow == "-" else set(allow.split(",")))
    commands = json.loads(sys.stdin.read())
    results = []
    for argv in commands:
        if argv and argv[0] == "python-api":
            import torch

            from openrlhf_band import band_bounds, band_token_loss

            old = torch.log(torch.tensor([[0.001, 0.5, 0.9]]))
            low, up = band_bounds(old, divergence="kl", delta=0.05)
            loss = band_token_loss(old + 0.1, old, torch.ones(1, 3), torch.ones(1, 3), divergence="kl", delta=0.05)
            ok = bool((low < 1).all() and (up > 1).all() and torch.isfinite(loss.loss).all())
            results.append({"argv": argv, "rc": 0 if ok else 1, "stderr": ""})
            continue
        rc, stderr = run_cli(argv)
        results.append({"argv": argv, "rc": rc, "stderr": stderr})
    with open(out, "w") as f:
        json.dump({"results": results, "refused": sorted(finder.refused)}, f)
