"""Fixtures shared by the tasks' tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def prepare(monkeypatch, capsys):
    """`openrlhf-band prepare-data ARGS` in this process: (exit status, stdout, stderr)."""
    from openrlhf_band.tools import cli

    monkeypatch.setenv("PYTHONWARNINGS", os.environ.get("PYTHONWARNINGS", ""))  # cli.main extends it

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = cli.main(["prepare-data", *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run
