"""README's GPU quick start runs as written inside the image, and what it writes lands on the mounts the
Dockerfile documents. Without Docker: a temporary tree is laid out as the Dockerfile lays the image out
(its final WORKDIR, where `COPY . .` puts the repository, the links its RUN makes, its ENV), with the
`-v` mounts of its header as folders, and README's quick-start commands run there verbatim (scripts with
DRY_RUN=1; the commands that would download or need runs are checked for where their paths resolve)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "Dockerfile").read_text()
README = (REPO / "README.md").read_text()


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final build stage, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in dockerfile.splitlines():
        if not pending and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        pending += raw.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        lines.append(pending)
        pending = ""
    parsed = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "") for line in lines]
    last_from = max(i for i, (op, _) in enumerate(parsed) if op == "FROM")
    return parsed[last_from + 1 :]


def image_layout() -> dict:
    """What the image looks like where the quick start runs, read from the Dockerfile: the final working
    directory, the folder `COPY . .` fills, the links created there (name -> target) and the ENV."""
    workdir = PurePosixPath("/")
    copy_dest = None
    links: dict[str, str] = {}
    env: dict[str, str] = {}
    for op, args in instructions(DOCKERFILE):
        if op == "WORKDIR":
            workdir = workdir / args.strip()
        elif op == "COPY" and args.split() == [".", "."]:
            copy_dest = workdir
        elif op == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", args):
                env[key] = value
        elif op == "RUN":
            loop = re.search(r'for (\w+) in ([\w ]+); do .*?ln -s -T "([^"]*)\$\{\1\}" "\$\{\1\}"', args)
            if loop:
                for name in loop.group(2).split():
                    links[str(workdir / name)] = loop.group(3) + name  # made in the RUN's working directory
    assert copy_dest is not None, "the Dockerfile has no `COPY . .` in its final stage"
    return {"workdir": workdir, "repository": copy_dest, "links": links, "env": env}


def docker_run_mounts(text: str, where: str) -> dict[str, str]:
    """The `-v "HOST:CONTAINER"` mounts of the `docker run ... openrlhf-band` command in `text` (its line
    continuations already joined), as container path -> host path."""
    run = re.search(r"docker run (.*?openrlhf-band)\n", text, re.DOTALL)
    assert run, f"{where} shows no `docker run ... openrlhf-band`"
    return {container: host for host, container in re.findall(r'-v "([^":]+):([^"]+)"', run.group(1))}


def documented_mounts() -> dict[str, str]:
    """The mounts of the Dockerfile header's `docker run` (container path -> host)."""
    header = "\n".join(line for line in DOCKERFILE.splitlines() if line.startswith("#"))
    return docker_run_mounts(header.replace("\\\n#", " "), "the Dockerfile's header")


QUICK_START = README.split("## GPU quick start", 1)[1].split("\n## ", 1)[0]


def quick_start_commands() -> list[str]:
    """The commands README's GPU quick start runs in the container (its first unindented bash block)."""
    block = re.search(r"^```bash\n(.*?)^```", QUICK_START, re.DOTALL | re.MULTILINE)
    assert block, "README's GPU quick start has no bash block"
    return [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readmes_docker_run_mounts_what_the_dockerfile_documents():
    mounts = docker_run_mounts(QUICK_START.replace("\\\n", " "), "README's GPU quick start")
    assert mounts == documented_mounts() and len(mounts) == 3


def test_the_dockerfile_is_read_as_the_image_is_laid_out():
    layout = image_layout()
    assert layout["workdir"] == layout["repository"], "the container must start in the repository"
    assert set(layout["links"]) == {str(layout["workdir"] / name) for name in ("data", "runs", "results")}
    assert set(layout["links"].values()) == set(documented_mounts()), "every link must point at a documented mount"


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory) -> dict:
    """The image's files under a temporary root: the repository where COPY puts it (the tracked files, as
    the build context sends them), the links its RUN makes, the mounts as empty folders."""
    root = tmp_path_factory.mktemp("image")
    layout = image_layout()

    def host(path: str | PurePosixPath) -> Path:
        return root / str(path).lstrip("/")

    repository = host(layout["repository"])
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (REPO / name).is_file():
            (repository / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repository / name)
    for container_path in documented_mounts():
        host(container_path).mkdir(parents=True, exist_ok=True)
    for link, target in layout["links"].items():
        host(link).symlink_to(host(target), target_is_directory=True)
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ}
    for key, value in layout["env"].items():  # the image's venv is this test's interpreter's
        env[key] = value.replace("/opt/venv/bin", venv_bin).replace("/opt/venv", sys.prefix).replace(
            "$PATH", os.environ.get("PATH", "")
        )
    env["PATH"] = f"{venv_bin}{os.pathsep}{env['PATH']}"
    for name in ("DATA_DIR", "OUTPUT_ROOT", "MODEL", "TASK", "EXTRA_ARGS", "RAY_ADDRESS", "SEED"):
        env.pop(name, None)  # the quick start runs on the image's defaults
    mounts = {host(container): container for container in documented_mounts()}
    return {"cwd": host(layout["workdir"]), "env": env, "mounts": mounts}


def on_a_mount(path: Path, mounts: dict[Path, str]) -> bool:
    return any(path.resolve() == m.resolve() or m.resolve() in path.resolve().parents for m in mounts)


def test_the_quick_start_runs_as_written_and_writes_to_the_mounts(image_tree):
    commands = quick_start_commands()
    scripts = [c for c in commands if c.startswith("bash ")]
    assert scripts, commands
    cwd, mounts = image_tree["cwd"], image_tree["mounts"]
    for command in commands:
        words = shlex.split(command)
        settings = {}  # leading NAME=value words: the script's environment, as the shell reads them
        while re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", words[0]):
            name, value = words.pop(0).split("=", 1)
            settings[name] = value
        if words[0] == "bash":
            assert (cwd / words[1]).is_file(), f"{words[1]} is not in the image's working directory"
            done = subprocess.run(
                words, cwd=cwd, env={**image_tree["env"], **settings, "DRY_RUN": "1", "PYTHONWARNINGS": "ignore"},
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert done.returncode == 0, command + "\n" + done.stderr[-3000:]
            where = re.search(r"\] data: (\S+); outputs: (\S+) ", done.stderr)
            assert where, done.stderr
            data, outputs = Path(where.group(1)), Path(where.group(2))
            assert on_a_mount(data, mounts) and on_a_mount(outputs, mounts), (command, data, outputs, mounts)
            assert '"policy_loss_type"' in done.stdout and done.stdout.lstrip().startswith("{")  # JSON alone
        else:
            assert words[0] == "openrlhf-band" and not settings, command
            subcommand = subprocess.run(
                [*words[:2], "--help"], cwd=cwd, env=image_tree["env"], capture_output=True, text=True, timeout=300
            )
            assert subcommand.returncode == 0, subcommand.stderr
            # every relative path it names (--out DIR, a glob of runs) resolves onto a mount
            paths = [w for w in words[2:] if not w.startswith("-") and not w.startswith("/")]
            assert paths, command
            for path in paths:
                first = Path(path).parts[0]
                assert on_a_mount(cwd / first, mounts), (command, path)


def test_a_path_off_the_mounts_is_caught(image_tree):
    """The check above can fail: a run's outputs in the container's own filesystem are not on a mount."""
    cwd, mounts = image_tree["cwd"], image_tree["mounts"]
    assert not on_a_mount(cwd / "elsewhere", mounts)
    assert on_a_mount(cwd / "runs" / "bandpo-kl-seed42", mounts)
