"""Without a working vLLM the patched OpenRLHF still imports, and its first use of vLLM fails with the import's
own reason: "not installed" only when the module is absent, else the error a broken build raised (a CUDA or ABI
mismatch), chained, so that a GPU user is not told to install what is installed."""

from __future__ import annotations

import builtins

import pytest

from openrlhf_band.integration import compat


def _importing_vllm_raises(monkeypatch, error: BaseException) -> None:
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise error
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_an_absent_vllm_is_not_installed(monkeypatch):
    absent = ModuleNotFoundError("No module named 'vllm'", name="vllm")
    _importing_vllm_raises(monkeypatch, absent)
    with pytest.raises(ImportError, match="vLLM is not installed") as caught:
        _ = compat.missing_vllm.LLM
    assert caught.value.__cause__ is absent


@pytest.mark.parametrize(
    "error",
    [
        ImportError("libcudart.so.13: cannot open shared object file: No such file or directory"),
        ImportError("undefined symbol: _ZN3c1017RegisterOperatorsD1Ev"),
        ModuleNotFoundError("No module named 'vllm._C'", name="vllm._C"),
    ],
)
def test_a_broken_vllm_reports_the_error_it_raised(monkeypatch, error):
    _importing_vllm_raises(monkeypatch, error)
    with pytest.raises(ImportError, match="vLLM is installed but OpenRLHF's imports from it fail") as caught:
        compat.missing_vllm(temperature=1.0)  # as SamplingParams(...)
    assert str(error) in str(caught.value) and type(error).__name__ in str(caught.value)
    assert caught.value.__cause__ is error
    assert "not installed" not in str(caught.value)


def test_a_vllm_that_imports_now_asks_for_a_restart(monkeypatch):
    monkeypatch.setattr(compat, "vllm_import_error", lambda: None)
    with pytest.raises(ImportError, match="restart the process"):
        _ = compat.missing_vllm.SamplingParams
