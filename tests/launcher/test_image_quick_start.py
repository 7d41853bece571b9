"""README's GPU quick start runs as written inside the image, and what it writes lands on the mounts the
Dockerfile documents. Without Docker: a temporary tree is laid out as the Dockerfile lays the image out
(its final WORKDIR, where `COPY . .` puts the repository, the links its RUN makes, its ENV), with the
`-v` mounts of its header as folders, and README's quick-start commands run there verbatim (scripts with
DRY_RUN=1; the commands that would download or need runs are checked for where their paths resolve).
Every `docker run` of the image in README and docs/recipe.md also mounts a host folder where the image's
Hugging Face cache is (HF_HOME, else the user's home) and passes HF_TOKEN, and the `--security-opt` flags
they name for the code task are the ones docs/tasks.md's sandbox names."""

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
    user = "0"
    for op, args in instructions(DOCKERFILE):
        if op == "WORKDIR":
            workdir = workdir / args.strip()
        elif op == "COPY" and args.split() == [".", "."]:
            copy_dest = workdir
        elif op == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", args):
                env[key] = value
        elif op == "USER":
            user = args.strip()
        elif op == "RUN":
            loop = re.search(r'for (\w+) in ([\w ]+); do .*?ln -s -T "([^"]*)\$\{\1\}" "\$\{\1\}"', args)
            if loop:
                for name in loop.group(2).split():
                    links[str(workdir / name)] = loop.group(3) + name  # made in the RUN's working directory
    assert copy_dest is not None, "the Dockerfile has no `COPY . .` in its final stage"
    user = re.sub(r"\$\{?(\w+)\}?", lambda m: args_default(m.group(1)), user)
    return {"workdir": workdir, "repository": copy_dest, "links": links, "env": env, "user": user}


def args_default(name: str) -> str:
    """The default of the Dockerfile's `ARG NAME=default` (what a plain `docker build` uses)."""
    found = re.search(rf"^ARG {name}=(\S*)", DOCKERFILE, re.MULTILINE)
    assert found, f"no ARG {name}= in the Dockerfile"
    return found.group(1)


def docker_runs(text: str) -> list[list[str]]:
    """The words of every `docker run ... openrlhf-band` in `text` (line continuations joined, a comment's `#`
    after one too), from after `run` to the image's name."""
    joined = re.sub(r"\\\n#?", " ", text)
    runs = []
    for match in re.finditer(r"docker run ([^\n]*?\bopenrlhf-band)\b", joined):
        runs.append(shlex.split(match.group(1)))
    return runs


def docker_run(words: list[str]) -> dict:
    """A `docker run`'s mounts (container path -> host path, `-v HOST:CONTAINER`) and environment (`-e NAME=VALUE`
    -> VALUE, a bare `-e NAME` -> None: the host's value passed through)."""
    mounts: dict[str, str] = {}
    env: dict[str, str | None] = {}
    for flag, value in zip(words, words[1:]):
        if flag == "-v":
            host, container = value.split(":")[:2]
            mounts[container] = host
        elif flag == "-e":
            name, sep, setting = value.partition("=")
            env[name] = setting if sep else None
    return {"mounts": mounts, "env": env}


def header_run() -> dict:
    """The Dockerfile header's `docker run`."""
    header = "\n".join(line for line in DOCKERFILE.splitlines() if line.startswith("#"))
    runs = docker_runs(header)
    assert runs, "the Dockerfile's header shows no `docker run ... openrlhf-band`"
    return docker_run(runs[0])


def hf_cache(run: dict) -> str:
    """Where the hub libraries look in the container this `docker run` starts: its HF_HOME, else the image's
    ENV HF_HOME, else ~/.cache/huggingface of the user the image runs as (root: /root; USER_UID: /home/rl)."""
    if run["env"].get("HF_HOME"):
        return run["env"]["HF_HOME"]
    layout = image_layout()
    if "HF_HOME" in layout["env"]:
        return layout["env"]["HF_HOME"]
    return ("/root" if layout["user"] in ("0", "root") else "/home/rl") + "/.cache/huggingface"


def hf_problems(run: dict) -> list[str]:
    problems = []
    if "HF_TOKEN" not in run["env"]:
        problems.append("no -e HF_TOKEN")
    cache = hf_cache(run)
    if cache not in run["mounts"]:
        problems.append(f"no host folder mounted at the container's Hugging Face cache {cache}")
    return problems


def documented_mounts() -> dict[str, str]:
    """The folders the Dockerfile header mounts for the repository's data, runs and results (container path ->
    host): its `docker run`'s mounts other than the Hugging Face cache."""
    run = header_run()
    return {c: h for c, h in run["mounts"].items() if c != hf_cache(run)}


QUICK_START = README.split("## GPU quick start", 1)[1].split("\n## ", 1)[0]
RECIPE = (REPO / "docs" / "recipe.md").read_text()
TASKS = (REPO / "docs" / "tasks.md").read_text()


def quick_start_commands() -> list[str]:
    """The commands README's GPU quick start runs in the container (its first unindented bash block)."""
    block = re.search(r"^```bash\n(.*?)^```", QUICK_START, re.DOTALL | re.MULTILINE)
    assert block, "README's GPU quick start has no bash block"
    return [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readmes_docker_run_mounts_what_the_dockerfile_documents():
    runs = docker_runs(QUICK_START)
    assert runs, "README's GPU quick start shows no `docker run ... openrlhf-band`"
    run = docker_run(runs[0])
    mounts = {c: h for c, h in run["mounts"].items() if c != hf_cache(run)}
    assert mounts == documented_mounts() and len(mounts) == 3
    header = header_run()
    if hf_cache(header) in header["mounts"]:  # once the header shows the cache, the two agree on it as well
        assert (hf_cache(run), run["mounts"][hf_cache(run)]) == (hf_cache(header), header["mounts"][hf_cache(header)])
        assert run["env"] == header["env"]


def image_docker_runs() -> dict[str, list[str]]:
    """Every `docker run` of the image that README and docs/recipe.md show, by where it is."""
    runs = {f"README #{i}": words for i, words in enumerate(docker_runs(README))}
    runs.update({f"docs/recipe.md #{i}": words for i, words in enumerate(docker_runs(RECIPE))})
    return runs


def test_every_docker_run_mounts_the_hugging_face_cache_and_passes_the_token():
    runs = image_docker_runs()
    assert len(runs) >= 3, runs  # README's quick start, recipe's image and its multi-node container
    assert {where: hf_problems(docker_run(words)) for where, words in runs.items()} == {where: [] for where in runs}
    # the host side is the host's own cache, not a folder the run would fill from scratch
    assert all(docker_run(w)["mounts"][hf_cache(docker_run(w))].endswith(".cache/huggingface") for w in runs.values())
    # the recipe's image command is README's
    assert docker_runs(RECIPE)[0] == docker_runs(QUICK_START)[0]


def without_env(words: list[str], name: str) -> list[str]:
    """`words` without the `-e NAME` / `-e NAME=...` pair."""
    at = next(i for i, w in enumerate(words) if words[i - 1] == "-e" and w.partition("=")[0] == name)
    return words[: at - 1] + words[at + 1 :]


def test_the_hugging_face_check_can_fail():
    words = docker_runs(QUICK_START)[0]
    assert hf_problems(docker_run(words)) == []
    assert hf_problems(docker_run(without_env(words, "HF_TOKEN"))) == ["no -e HF_TOKEN"]
    elsewhere = [w.replace(":/workspace/huggingface", ":/root/.cache/huggingface") for w in words]
    assert hf_problems(docker_run(elsewhere)) == [
        "no host folder mounted at the container's Hugging Face cache /workspace/huggingface"
    ]
    # without HF_HOME the image's default applies, root's home, where README mounts nothing
    assert hf_problems(docker_run(without_env(words, "HF_HOME"))) == [
        "no host folder mounted at the container's Hugging Face cache /root/.cache/huggingface"
    ]


def security_opts(text: str) -> set[str]:
    return set(re.findall(r"--security-opt (\w+=\w+)", text))


def test_the_code_tasks_docker_flags_are_the_sandboxs():
    """What README and the recipe tell a user to add to `docker run` for TASK=code is what docs/tasks.md's sandbox
    needs, and both name the Ubuntu 24.04 host setting."""
    needed = security_opts(TASKS.split("**Refusing to start.**", 1)[1].split("\n\n", 1)[0])
    assert needed == {"seccomp=unconfined", "systempaths=unconfined", "apparmor=unconfined"}
    assert security_opts(QUICK_START) == needed
    assert security_opts(RECIPE.split("## Image", 1)[1].split("\n## ", 1)[0]) == needed
    assert security_opts(QUICK_START.replace("apparmor=unconfined", "apparmor")) != needed  # it can fail
    setting = "kernel.apparmor_restrict_unprivileged_userns=0"
    assert setting in TASKS and setting in " ".join(QUICK_START.split()) and setting in " ".join(RECIPE.split())


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
