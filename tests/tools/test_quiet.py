"""Start-up quiet: the pynvml FutureWarning filter reaches processes this one starts (the demo's spawned
workers import torch before any code of ours runs in them)."""

from __future__ import annotations

import os
import subprocess
import sys

from openrlhf_band.tools.quiet import PYNVML_WARNING_FILTER, quiet_third_party_startup

WARN = "import warnings; warnings.warn('The pynvml package is deprecated. Please install nvidia-ml-py', FutureWarning)"


def _child_stderr(env: dict) -> str:
    return subprocess.run([sys.executable, "-c", WARN], env=env, capture_output=True, text=True, check=True).stderr


def test_a_child_process_inherits_the_filter(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning")
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    assert "pynvml package is deprecated" in _child_stderr(bare)  # the warning is real without the filter
    quiet_third_party_startup()
    quiet_third_party_startup()  # idempotent
    filters = os.environ["PYTHONWARNINGS"].split(",")
    assert filters == ["default::DeprecationWarning", PYNVML_WARNING_FILTER]  # the user's own filter is kept
    assert _child_stderr(dict(os.environ)) == ""


def test_other_warnings_still_show_in_the_child(monkeypatch):
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    quiet_third_party_startup()
    other = "import warnings; warnings.warn('something else', FutureWarning)"
    out = subprocess.run([sys.executable, "-c", other], env=dict(os.environ), capture_output=True, text=True)
    assert "something else" in out.stderr
