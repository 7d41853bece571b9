# GPU image for BandPO on OpenRLHF 0.11.2's Ray + vLLM + DeepSpeed hybrid engine.
#
#   docker build -t openrlhf-band .
#   mkdir -p data runs results ~/.cache/huggingface
#   docker run --gpus all --ipc=host -it -v "$PWD/data:/workspace/data" -v "$PWD/runs:/workspace/runs" \
#     -v "$PWD/results:/workspace/results" -v "$HOME/.cache/huggingface:/workspace/huggingface" \
#     -e HF_HOME=/workspace/huggingface -e HF_TOKEN openrlhf-band
#
# The container starts in the repository, /workspace/openrlhf-band, so README's GPU quick start runs as
# written; its data, runs and results are links to /workspace/data, /workspace/runs and /workspace/results,
# three of the mounts above (the fourth keeps the Hugging Face cache on the host), so prepared data, every
# run's outputs (train.log, TensorBoard, checkpoints, the model) and the results table outlive the container
# (tests/launcher/test_image_quick_start.py lays a tree out from this file and runs the quick start in it).
# --ipc=host: Ray's object store and NCCL use /dev/shm; Docker's 64 MB default breaks them (or
# --shm-size=32g instead). Non-root: docker build --build-arg USER_UID=1000 ... runs as user "rl".
#
# Every Python package is locked: requirements/gpu-lock.txt (make locks: requirements/gpu.txt resolved for Linux
# x86_64 / CPython 3.12, at the CPU tests' versions wherever the CUDA stack allows) pins every one of them with
# the sha256 of their files, and pip installs it whole with --require-hashes --no-deps, so two builds get the
# same files. Outside the lock: the distribution packages below, flash-attn (opt-in, below) and this project.
#
# Versions agree with each other: vllm==0.29.0 pins torch==2.13.0, whose Linux wheel is a CUDA 13.0
# build (it requires cuda-toolkit==13.0.3; requirements/torch-2.13.0-linux-x86_64-metadata.json,
# which tests/launcher/test_dockerfile.py holds this default against). The base image only supplies
# nvcc and the CUDA headers for compiling flash-attn; torch brings its own CUDA runtime.
#
# flash-attn is off by default: every flash-attn release up to 2.8.3.post2 compiles with -std=c++17, while
# torch 2.13's headers use C++20 features (flash-attention PRs #2879 and #2899 select C++20 for torch >= 2.13;
# neither is in a release), and building 2.8.3 against CUDA 13.0 has an open failure report (flash-attention
# issue #2064). Without it the example scripts train with `--ds.attn_implementation sdpa` and no
# `--ds.packing_samples` (examples/scripts/common.sh detects which). Two ways to add it, neither verified here
# (no Docker engine, no GPU, and no release wheel built for torch 2.13 could be fetched on the machine that
# wrote this):
#   --build-arg FLASH_ATTN=2.8.3     builds that release from source against the locked torch (its build tools,
#                                    ninja / packaging / psutil / setuptools / wheel, come from the lock; the
#                                    flash-attn sdist itself is fetched by version, not by hash)
#   --build-arg FLASH_ATTN_WHEEL=... --build-arg FLASH_ATTN_WHEEL_SHA256=<sha256 of the file>
#                                    installs a prebuilt wheel, as OpenRLHF's own Dockerfile does: an https URL, or
#                                    the name of a flash_attn*.whl placed in the build context's root. It must be
#                                    built for torch 2.13 / CUDA 13 / cp312 (a wheel for another torch fails its
#                                    import check below with an undefined symbol).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG FLASH_ATTN=none
ARG FLASH_ATTN_WHEEL=
ARG FLASH_ATTN_WHEEL_SHA256=
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
# break the build; the Python stack below is what is pinned. util-linux (setpriv) and libseccomp2 are what the
# code sandbox uses (openrlhf_band/sandbox/): on the base image already, named so that they stay; build-essential
# is the compiler the lock's C sdist (pycosat) needs, whatever the base image carries
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev git ca-certificates \
       util-linux libseccomp2 build-essential \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/venv

# The locked stack. The lock is complete (vLLM with torch 2.13.0 and its CUDA libraries, DeepSpeed, Ray,
# transformers, openrlhf and its requirements), so --no-deps: pip installs exactly its files, each checked against
# its sha256. setuptools and wheel go first, from the lock, because the five packages the lock holds only as sdists
# (cellpylib, pycosat, zss, deepspeed, transformers-stream-generator; pycosat a C extension, whose compiler
# build-essential above guarantees) are built with them (--no-build-isolation: no unhashed build tools;
# torch is not installed yet while they build, as in an isolated build). pip check then admits one gap only:
# openrlhf's flash-attn, which the next step adds or leaves out. The flash_attn*.whl glob copies a wheel for
# FLASH_ATTN_WHEEL when the context has one, and nothing otherwise.
COPY requirements/gpu-lock.txt flash_attn*.whl /tmp/build/
RUN awk '/^(setuptools|wheel)==/ {p = 1} p {print} p && !/\\$/ {p = 0}' /tmp/build/gpu-lock.txt > /tmp/build/build-tools-lock.txt \
    && test "$(grep -c -E '^(setuptools|wheel)==' /tmp/build/build-tools-lock.txt)" = 2 \
    && pip install --no-deps --require-hashes -r /tmp/build/build-tools-lock.txt \
    && pip install --no-deps --require-hashes --no-build-isolation -r /tmp/build/gpu-lock.txt \
    && { pip check > /tmp/build/pip-check || true; } \
    && if grep -v -x -F -e "openrlhf 0.11.2 requires flash-attn, which is not installed." \
         -e "No broken requirements found." /tmp/build/pip-check | grep .; then \
         echo "the locked set is not consistent (pip check above)" >&2; exit 1; \
       fi \
    && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# flash-attn (opt-in, see the top): fail early if nvcc and torch disagree on CUDA
RUN torch_cuda="$(python -c 'import torch; print(".".join(torch.version.cuda.split(".")[:2]))')" \
    && nvcc_cuda="$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p')" \
    && if [ "${torch_cuda%%.*}" != "${nvcc_cuda%%.*}" ]; then \
         echo "torch is built for CUDA $torch_cuda but the image's nvcc is CUDA $nvcc_cuda: rebuild with --build-arg CUDA_IMAGE=nvidia/cuda:${torch_cuda}.x-cudnn-devel-ubuntu24.04" >&2; exit 1; \
       fi \
    && if [ "${FLASH_ATTN}" != "none" ] && [ -n "${FLASH_ATTN_WHEEL}" ]; then \
         echo "set FLASH_ATTN (a source build) or FLASH_ATTN_WHEEL (a prebuilt wheel), not both" >&2; exit 1; \
       fi \
    && if [ -n "${FLASH_ATTN_WHEEL}" ]; then \
         if [ -z "${FLASH_ATTN_WHEEL_SHA256}" ]; then \
           echo "FLASH_ATTN_WHEEL needs --build-arg FLASH_ATTN_WHEEL_SHA256=<sha256sum of the wheel>" >&2; exit 1; \
         fi \
         && case "${FLASH_ATTN_WHEEL}" in \
              http://*|https://*) wheel="${FLASH_ATTN_WHEEL}" ;; \
              *) wheel="file:///tmp/build/${FLASH_ATTN_WHEEL##*/}" ;; \
            esac \
         && echo "flash-attn @ ${wheel} --hash=sha256:${FLASH_ATTN_WHEEL_SHA256}" > /tmp/build/flash-attn-lock.txt \
         && pip install --no-deps --require-hashes -r /tmp/build/flash-attn-lock.txt; \
       elif [ "${FLASH_ATTN}" != "none" ]; then \
         MAX_JOBS=${MAX_JOBS} pip install --no-deps --no-build-isolation "flash-attn==${FLASH_ATTN}"; \
       fi \
    && if [ -n "${FLASH_ATTN_WHEEL}" ] || [ "${FLASH_ATTN}" != "none" ]; then \
         python -c "import flash_attn; print('flash-attn', flash_attn.__version__)" 2> /tmp/build/flash-attn-import \
         || { cat /tmp/build/flash-attn-import >&2; ! grep -q "undefined symbol" /tmp/build/flash-attn-import \
              && echo "warning: flash_attn does not import at build time (no GPU driver here?); not an ABI mismatch" >&2; }; \
       fi \
    && rm -rf /tmp/build

# this package (its requirements, torch and numpy, are in the lock) and the patch set onto the locked openrlhf
WORKDIR /workspace/openrlhf-band
COPY . .
RUN pip install --no-deps --no-build-isolation . \
    && openrlhf-band patch apply \
    && openrlhf-band patch status | tee /tmp/patch-status \
    && ! grep -E "^  (released|modified) " /tmp/patch-status \
    && DRY_RUN=1 MODEL=/nonexistent DATA_DIR=/workspace/data bash examples/scripts/bandpo_kl.sh

# the repository's data, runs and results are the mount points (the header); .dockerignore keeps a local
# data/, runs/ or results/ out of the context, so ln -T never meets one
RUN for dir in data runs results; do \
      mkdir -p "/workspace/${dir}" && ln -s -T "/workspace/${dir}" "${dir}" || exit 1; \
    done \
    && if [ "${USER_UID}" != "0" ]; then \
      useradd --create-home --uid "${USER_UID}" rl && chown -R rl /workspace; \
    fi
USER ${USER_UID}
CMD ["bash"]
