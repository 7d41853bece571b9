"""What examples/scripts/common.sh hands `ray job submit`: the job's runtime environment.

A job submitted with `ray job submit --runtime-env-json '{"working_dir": "."}'` gets the submitting
directory zipped, uploaded to the cluster and unpacked on every node as the job's and its actors' working
directory. That is how a user's own files (a reward file named by a relative path in EXTRA_ARGS) reach
every node. It is also how a dataset, a venv or last week's checkpoints get uploaded with each job: Ray
reads .gitignore and .rayignore, follows symbolic links and sees everything else. So the launcher passes
`excludes` (gitignore patterns, anchored at the working directory) for what a job never needs from it:

- version control, environments and caches (`.git`, `.venv*`, `__pycache__`, `*.egg-info`, `build`, `out`);
- the recipe's own data and output folders by their default names (`data`, `runs`, `results`), which the
  launcher passes to OpenRLHF as absolute paths anyway;
- the run's actual data folder and output root, wherever they are inside the working directory (a
  symbolic link counts by its own name and by where it points).

    python -m openrlhf_band.launcher.ray_job runtime-env --working-dir . --exclude-path DATA --exclude-path RUNS

prints the JSON for `--runtime-env-json`. `--working-dir none` uploads nothing: the job then runs in the
cluster's own directory and every path it is given must be absolute.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

#: never part of a job's code: version control, environments, caches, build outputs, and the recipe's own
#: data and outputs by their default names (the launcher passes those as absolute paths)
ALWAYS_EXCLUDED = (
    ".git",
    ".venv*",
    "**/__pycache__",
    "*.egg-info",
    "/build",
    "/out",
    "/data",
    "/runs",
    "/results",
)


def _inside(path: Path, root: Path) -> str | None:
    """`path` relative to `root` as a POSIX string when it lies inside root (and is not root), else None."""
    try:
        rel = path.relative_to(root)
    except ValueError:
        return None
    return rel.as_posix() if rel.parts else None


def excluded_paths(working_dir: Path, paths: list[Path]) -> list[str]:
    """Anchored gitignore patterns for each of `paths` that lies inside `working_dir`: by the path as given
    (relative to the working directory, symbolic links kept) and by where it resolves to."""
    root_literal = Path(os.path.abspath(working_dir))
    root_resolved = working_dir.resolve()
    patterns: list[str] = []
    for path in paths:
        literal = Path(os.path.abspath(path if path.is_absolute() else root_literal / path))
        for rel in (_inside(literal, root_literal), _inside(literal.resolve(), root_resolved)):
            if rel is not None and f"/{rel}" not in patterns:
                patterns.append(f"/{rel}")
    return patterns


def runtime_env(working_dir: str, exclude_paths: list[str]) -> dict:
    """The runtime environment for `ray job submit --runtime-env-json`: {} for working_dir "none", else
    {"working_dir": ..., "excludes": [...]} with ALWAYS_EXCLUDED and the anchored `exclude_paths`."""
    if working_dir == "none":
        return {}
    root = Path(working_dir)
    if not root.is_dir():
        raise ValueError(f"the job's working directory {working_dir!r} is not a directory")
    extra = excluded_paths(root, [Path(p) for p in exclude_paths])
    return {"working_dir": working_dir, "excludes": [*ALWAYS_EXCLUDED, *(p for p in extra if p not in ALWAYS_EXCLUDED)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m openrlhf_band.launcher.ray_job", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("runtime-env", help="print the JSON for `ray job submit --runtime-env-json`")
    env.add_argument("--working-dir", default=".", help="the folder uploaded as the job's working directory, or none")
    env.add_argument("--exclude-path", action="append", default=[], help="a folder never uploaded (repeatable)")
    args = parser.parse_args(argv)
    try:
        print(json.dumps(runtime_env(args.working_dir, args.exclude_path)))
    except ValueError as err:
        print(f"ray_job: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
