# GPU image for BandPO on OpenRLHF 0.11.2's Ray + vLLM + DeepSpeed hybrid engine.
#
#   docker build -t openrlhf-band .
#   docker run --gpus all --shm-size=32g --ipc=host -it -v "$PWD/data:/workspace/data" openrlhf-band
#
# --shm-size: Ray's object store and NCCL use /dev/shm; Docker's 64 MB default breaks them
# (32 GB or --ipc=host). Non-root: docker build --build-arg USER_UID=1000 ... runs as user "rl".
#
# Versions agree with each other: vllm==0.29.0 pins torch==2.13.0, whose Linux wheel is a CUDA 13.0
# build (it requires cuda-toolkit==13.0.3; requirements/torch-2.13.0-linux-x86_64-metadata.json,
# which tests/recipe/test_dockerfile.py holds this default against). The base image only supplies
# nvcc and the CUDA headers for compiling flash-attn; torch brings its own CUDA runtime.
#
# flash-attn is off by default (FLASH_ATTN=none): every flash-attn release up to 2.8.3.post2 compiles
# with -std=c++17, while torch 2.13's headers use C++20 features (flash-attention PRs #2879 and #2899
# select C++20 for torch >= 2.13; neither is in a release), and building 2.8.3 against CUDA 13.0 has
# an open failure report (flash-attention issue #2064). Without it the example scripts train with
# `--ds.attn_implementation sdpa` and no `--ds.packing_samples` (examples/scripts/common.sh detects
# which). --build-arg FLASH_ATTN=2.8.3 tries the build anyway (not verified here: no Docker engine).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG FLASH_ATTN=none
ARG USER_UID=0
ARG MAX_JOBS=8
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# distribution packages are left unpinned on purpose: Ubuntu withdraws old versions, which would
# break the build; the Python stack below is what is pinned
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev git ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/venv

# the GPU stack, pinned: vLLM brings torch==2.13.0 and the CUDA libraries it was built with
RUN pip install vllm==0.29.0 deepspeed==0.19.6 transformers==5.15.0 "ray[default]==2.55.0" \
    && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# flash-attn (opt-in) from source against that torch; fail early if nvcc and torch disagree on CUDA
RUN torch_cuda="$(python -c 'import torch; print(".".join(torch.version.cuda.split(".")[:2]))')" \
    && nvcc_cuda="$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p')" \
    && if [ "${torch_cuda%%.*}" != "${nvcc_cuda%%.*}" ]; then \
         echo "torch is built for CUDA $torch_cuda but the image's nvcc is CUDA $nvcc_cuda: rebuild with --build-arg CUDA_IMAGE=nvidia/cuda:${torch_cuda}.x-cudnn-devel-ubuntu24.04" >&2; exit 1; \
       fi \
    && if [ "${FLASH_ATTN}" != "none" ]; then \
         pip install ninja==1.13.2 packaging==26.4 wheel==0.48.0 \
         && MAX_JOBS=${MAX_JOBS} pip install --no-build-isolation "flash-attn==${FLASH_ATTN}"; \
       fi

# OpenRLHF itself without its dependency resolution (its requirements are satisfied above and by
# the pinned list below), then this package and the patch set
COPY requirements/gpu.txt /tmp/requirements-gpu.txt
RUN pip install --no-deps openrlhf==0.11.2 && pip install -r /tmp/requirements-gpu.txt

WORKDIR /workspace/openrlhf-band
COPY . .
RUN pip install --no-deps . \
    && openrlhf-band patch apply \
    && openrlhf-band patch status | tee /tmp/patch-status \
    && ! grep -E "^  (released|modified) " /tmp/patch-status \
    && DRY_RUN=1 MODEL=/nonexistent DATA_DIR=/workspace/data bash examples/scripts/bandpo_kl.sh

RUN if [ "${USER_UID}" != "0" ]; then \
      useradd --create-home --uid "${USER_UID}" rl && chown -R rl /workspace; \
    fi
USER ${USER_UID}
WORKDIR /workspace
CMD ["bash"]
