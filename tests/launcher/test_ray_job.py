"""The runtime environment examples/scripts/common.sh hands `ray job submit`: the working directory is
uploaded without data, runs, environments or .git, wherever the run's data and outputs are inside it;
checked against Ray's own packaging (the files it would zip), not only against our pattern list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from openrlhf_band.launcher.ray_job import ALWAYS_EXCLUDED, excluded_paths, runtime_env


def test_paths_inside_the_working_directory_are_anchored(tmp_path):
    (tmp_path / "shared" / "runs").mkdir(parents=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    patterns = excluded_paths(tmp_path, [Path("shared/runs"), tmp_path / "link", Path("/elsewhere/data")])
    # a link counts by its own name and by where it points; a path outside uploads nothing to exclude
    assert patterns == ["/shared/runs", "/link", "/mine"]


def test_none_uploads_nothing_and_a_missing_folder_is_refused(tmp_path):
    assert runtime_env("none", [str(tmp_path)]) == {}
    with pytest.raises(ValueError, match="is not a directory"):
        runtime_env(str(tmp_path / "missing"), [])


def test_the_cli_prints_the_json_for_ray_job_submit(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "openrlhf_band.launcher.ray_job", "runtime-env", "--exclude-path", "big"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    env = json.loads(done.stdout)
    assert env["working_dir"] == "." and env["excludes"] == [*ALWAYS_EXCLUDED, "/big"]


def ray_would_upload(working_dir: Path, excludes: list[str]) -> set[str]:
    """The files Ray's packaging zips for a working_dir with these excludes (its own traversal)."""
    packaging = pytest.importorskip("ray._private.runtime_env.packaging")
    files: set[str] = set()

    def handler(path: Path) -> None:
        if path.is_file():
            files.add(path.relative_to(working_dir).as_posix())

    excluded = [packaging._get_excludes(working_dir, excludes)]
    packaging._dir_travel(working_dir, excluded, handler, include_gitignore=True)
    return files


def test_ray_uploads_the_users_files_and_nothing_else(tmp_path):
    for name in ("my_reward.py", "conf/settings.yaml", "data/train.jsonl", "runs/m-seed1/ckpt/x.pt", ".git/HEAD",
                 ".venv/bin/python", "pkg/__pycache__/a.pyc", "store/d/train.jsonl", "results/table.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "dataset").symlink_to(tmp_path / "store" / "d")  # DATA_DIR=dataset, a link into store/
    env = runtime_env(str(tmp_path), ["dataset", "runs"])
    assert ray_would_upload(tmp_path, env["excludes"]) == {"my_reward.py", "conf/settings.yaml"}
    # without the excludes Ray would take everything, the link's target twice
    assert "dataset/train.jsonl" in ray_would_upload(tmp_path, [])
