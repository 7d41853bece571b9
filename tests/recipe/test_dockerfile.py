"""The Dockerfile's defaults agree with the stack it pins, read from that stack's own metadata: the
CUDA of the default base image is the CUDA torch 2.13.0's Linux wheel is built for (its
`cuda-toolkit==X.Y.*` requirement, from the wheel's METADATA, committed with the command that read
it), and flash-attn, which no release builds cleanly against torch 2.13 yet, is opt-in."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "Dockerfile").read_text()
TORCH = json.loads((REPO / "requirements" / "torch-2.13.0-linux-x86_64-metadata.json").read_text())


def arg_default(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert match, f"the Dockerfile has no default for ARG {name}"
    return match.group(1)


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
    assert "pip install vllm==0.29.0 " in DOCKERFILE  # vLLM 0.29.0 pins torch==2.13.0


def test_the_default_cuda_image_matches_torchs_cuda():
    image = arg_default("CUDA_IMAGE")
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-devel-ubuntu\d+\.\d+", image)
    assert match, image
    assert (int(match.group(1)), int(match.group(2))) == torch_cuda(), (image, torch_cuda())


def test_flash_attn_is_opt_in():
    assert arg_default("FLASH_ATTN") == "none"
    assert 'if [ "${FLASH_ATTN}" != "none" ]' in DOCKERFILE
