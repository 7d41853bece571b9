"""The patch tool on copies of the installed openrlhf files: exact apply / revert, refusals that
modify nothing, and released hashes checked against the wheel's own RECORD (outside our code)."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from openrlhf_band.patching import patcher as patching


def _installed_root() -> Path:
    return patching.find_site_packages(None)


def _record_hashes(root: Path) -> dict[str, str]:
    """sha256 (hex) of each file as pip recorded it from the released wheel."""
    (info,) = root.glob("openrlhf-*.dist-info")
    hashes = {}
    for line in (info / "RECORD").read_text().splitlines():
        path, digest, _ = line.rsplit(",", 2)
        if digest.startswith("sha256="):
            raw = base64.urlsafe_b64decode(digest.removeprefix("sha256=") + "==")
            hashes[path] = raw.hex()
    return hashes


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the installed target files and dist-info, reverted to the released bytes."""
    root = _installed_root()
    for fp in patching.load_patch_set():
        target = tmp_path / fp.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / fp.path, target)
    (info,) = root.glob("openrlhf-*.dist-info")
    shutil.copytree(info, tmp_path / info.name)
    patching.run("revert", str(tmp_path))
    return tmp_path


def _snapshot(root: Path) -> dict[str, bytes]:
    return {fp.path: (root / fp.path).read_bytes() for fp in patching.load_patch_set()}


def test_manifest_released_hashes_are_the_wheels():
    record = _record_hashes(_installed_root())
    for fp in patching.load_patch_set():
        assert fp.released_sha256 == record[fp.path], fp.path


def test_revert_restores_released_bytes_and_apply_is_exact_and_idempotent(tree):
    record = _record_hashes(_installed_root())
    for path, data in _snapshot(tree).items():
        assert hashlib.sha256(data).hexdigest() == record[path]
    released = _snapshot(tree)

    report = patching.run("apply", str(tree))
    assert sum("patched " in line for line in report) == len(released)
    patched = _snapshot(tree)
    for fp in patching.load_patch_set():
        assert hashlib.sha256(patched[fp.path]).hexdigest() == fp.patched_sha256
        assert patched[fp.path] != released[fp.path]

    report = patching.run("apply", str(tree))  # idempotent
    assert all("already patched" in line for line in report[1:])
    assert _snapshot(tree) == patched

    patching.run("revert", str(tree))
    assert _snapshot(tree) == released  # byte for byte
    patching.run("revert", str(tree))
    assert _snapshot(tree) == released


def test_patched_files_carry_only_thin_wiring(tree):
    patching.run("apply", str(tree))
    for fp in patching.load_patch_set():
        added = [ln for ln in fp.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        assert 0 < len(added) <= 12, fp.path  # logic lives in openrlhf_band, not in the diffs
    text = (tree / "openrlhf/trainer/ray/ppo_actor.py").read_text()
    assert "band_hooks.loss_class_and_kwargs" in text and "band_hooks.loss_metrics" in text


def test_check_is_a_dry_run(tree):
    before = _snapshot(tree)
    report = patching.run("check", str(tree))
    assert sum("would patch" in line for line in report) == len(before)
    assert _snapshot(tree) == before


def test_tampered_file_is_refused_and_nothing_is_modified(tree):
    victim = tree / "openrlhf/cli/train_ppo_ray.py"
    victim.write_text(victim.read_text() + "# local edit\n")
    before = _snapshot(tree)
    with pytest.raises(patching.PatchError, match=r"train_ppo_ray\.py.*force-reinstall"):
        patching.run("apply", str(tree))
    assert _snapshot(tree) == before  # not even the untouched files were patched


def test_wrong_version_is_refused_and_nothing_is_modified(tree):
    (info,) = tree.glob("openrlhf-*.dist-info")
    metadata = info / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 0.11.2", "Version: 0.11.0"))
    before = _snapshot(tree)
    with pytest.raises(patching.PatchError, match=r"openrlhf 0\.11\.0 is installed.*exactly 0\.11\.2"):
        patching.run("apply", str(tree))
    assert _snapshot(tree) == before


def test_missing_install_is_a_clear_error(tmp_path):
    with pytest.raises(patching.PatchError, match="no openrlhf package"):
        patching.run("status", str(tmp_path))


def test_cli_exit_codes(tree):
    cmd = [sys.executable, "-m", "openrlhf_band.tools.cli", "patch", "status", "--site-packages", str(tree)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0 and "released" in done.stdout
    (tree / "openrlhf/models/ring_attn_utils.py").write_text("tampered\n")
    done = subprocess.run([*cmd[:-3], "apply", "--site-packages", str(tree)], capture_output=True, text=True)
    assert done.returncode == 1 and "ring_attn_utils.py" in done.stderr


def test_unified_diff_engine_round_trip():
    old = "a\nb\nc\nd\ne\n"
    new = "a\nB\nc\nd\ne\nf\n"
    diff = "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n@@ -5 +5,2 @@\n e\n+f\n"
    hunks = patching.parse_unified_diff(diff)
    assert patching.apply_hunks(old, hunks) == new
    assert patching.apply_hunks(new, hunks, reverse=True) == old
    with pytest.raises(patching.PatchError):
        patching.apply_hunks("x\ny\n", hunks)


def test_openrlhf_imports_without_flash_attn_and_vllm():
    # the patched tree imports on this CPU machine where neither package exists
    code = (
        "import importlib.util as u; assert u.find_spec('flash_attn') is None and u.find_spec('vllm') is None\n"
        "import openrlhf.models, openrlhf.trainer.ray, openrlhf.trainer.ppo_utils.samples_generator\n"
        "from openrlhf.trainer.ray.vllm_engine import vllm\n"
        "try:\n    vllm.LLM\nexcept ImportError as e:\n    print('OK', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "OK vLLM is not installed" in done.stdout


def test_a_regular_install_ships_the_patch_set(tmp_path):
    """`pip install .` (the Dockerfile's install) must carry the diffs the patch tool applies."""
    import zipfile

    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path)]
    build = subprocess.run([*command, str(repo)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("openrlhf_band-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"openrlhf_band/patching/patches/{p.parent.name}/{p.name}" for p in patching.PATCH_DIR.iterdir()}
    assert shipped and shipped <= names, sorted(shipped - names)
