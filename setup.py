from setuptools import find_packages, setup

setup(
    name="openrlhf-band",
    version="0.1.0",
    description="BandPO (probability-aware trust-region ratio bounds) for OpenRLHF 0.11.2",
    packages=find_packages(include=["openrlhf_band", "openrlhf_band.*"]),
    # the patch set is data the patch tool reads at run time: it must be in every install, not only -e
    package_data={"openrlhf_band.integration": ["patches/openrlhf-*/*", "patches/regenerate.sh"]},
    python_requires=">=3.10",
    # torch is deliberately unpinned here: GPU images bring their own build. The CPU
    # development environment is pinned in requirements/cpu-lock.txt.
    install_requires=["torch", "numpy"],
    extras_require={"plot": ["matplotlib"], "test": ["pytest", "hypothesis", "mpmath"]},
    entry_points={"console_scripts": ["openrlhf-band=openrlhf_band.tools.cli:main"]},
)
