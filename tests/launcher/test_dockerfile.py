"""The Dockerfile's defaults agree with the stack it pins (requirements/gpu-lock.txt; tests/launcher/test_locks.py
checks that it installs that lock), read from that stack's own metadata: the CUDA of the default base image is the
CUDA torch 2.13.0's Linux wheel is built for (its `cuda-toolkit==X.Y.*` requirement, from the wheel's METADATA,
committed with the command that read it), that wheel is one the lock admits, and flash-attn, which no release
builds cleanly against torch 2.13 yet, is opt-in."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "Dockerfile").read_text()
TORCH = json.loads((REPO / "requirements" / "torch-2.13.0-linux-x86_64-metadata.json").read_text())
GPU_LOCK = (REPO / "requirements" / "gpu-lock.txt").read_text()


def arg_default(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert match, f"the Dockerfile has no default for ARG {name}"
    return match.group(1)


def locked(name: str) -> tuple[str, list[str]]:
    """The version and sha256 hashes requirements/gpu-lock.txt pins for one package."""
    match = re.search(rf"^{re.escape(name)}==(\S+)((?: \\\n +--hash=sha256:[0-9a-f]{{64}})*)", GPU_LOCK, re.MULTILINE)
    assert match, f"requirements/gpu-lock.txt does not pin {name}"
    return match.group(1), re.findall(r"sha256:([0-9a-f]{64})", match.group(2))


def torch_cuda() -> tuple[int, int]:
    for requirement in TORCH["requires_dist"]:
        match = re.match(r"cuda-toolkit(\[[^\]]*\])?==(\d+)\.(\d+)\.", requirement)
        if match:
            return int(match.group(2)), int(match.group(3))
    raise AssertionError("torch's metadata names no cuda-toolkit pin")


def test_the_metadata_is_that_of_the_torch_vllm_pins():
    assert (TORCH["name"], TORCH["version"]) == ("torch", "2.13.0")
    assert TORCH["wheel"].startswith("torch-2.13.0-") and TORCH["wheel"].endswith("manylinux_2_28_x86_64.whl")
    assert re.fullmatch(r"[0-9a-f]{64}", TORCH["sha256"])
    assert locked("vllm")[0] == "0.29.0"  # vLLM 0.29.0 pins torch==2.13.0
    version, hashes = locked("torch")
    assert version == TORCH["version"]
    assert TORCH["sha256"] in hashes  # the image's torch is this very wheel (cp312, manylinux_2_28 x86_64)


def test_the_locked_cuda_toolkit_is_the_one_torch_requires():
    assert locked("cuda-toolkit")[0].startswith("{}.{}.".format(*torch_cuda()))


def test_the_default_cuda_image_matches_torchs_cuda():
    image = arg_default("CUDA_IMAGE")
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-devel-ubuntu\d+\.\d+", image)
    assert match, image
    assert (int(match.group(1)), int(match.group(2))) == torch_cuda(), (image, torch_cuda())


def test_flash_attn_is_opt_in():
    assert arg_default("FLASH_ATTN") == "none"
    assert 'elif [ "${FLASH_ATTN}" != "none" ]; then' in DOCKERFILE
    # the prebuilt wheel (a URL or a file in the build context) is opt-in too, and checked against its sha256
    assert re.search(r"^ARG FLASH_ATTN_WHEEL=$", DOCKERFILE, re.MULTILINE)
    assert 'if [ -n "${FLASH_ATTN_WHEEL}" ]; then' in DOCKERFILE
    assert '--hash=sha256:${FLASH_ATTN_WHEEL_SHA256}" > /tmp/build/flash-attn-lock.txt' in DOCKERFILE
    assert "pip install --no-deps --require-hashes -r /tmp/build/flash-attn-lock.txt" in DOCKERFILE
