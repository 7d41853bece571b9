"""`openrlhf-band patch apply|check|revert|status`: the thin patch set against openrlhf==0.11.2.

The patches live in `openrlhf_band/patching/patches/openrlhf-<version>/` (also `patches/` at the
repository root): one unified diff per file, generated with `diff -u` from real edits of the
released files (see `patches/regenerate.sh`), and `manifest.json` with the sha256 of each file as
released and as patched. Before touching anything the tool checks that the installed openrlhf is
exactly the pinned version and that every target file is byte-identical to either its released
or its patched form; any mismatch stops it with a message naming the file, and nothing is
written. Apply and revert are idempotent and exact (the result is verified against the manifest
hash before it replaces the file, and each file is replaced atomically).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PINNED_VERSION = "0.11.2"
PATCH_DIR = Path(__file__).resolve().parent / "patches" / f"openrlhf-{PINNED_VERSION}"


class PatchError(RuntimeError):
    """A patch cannot be applied, checked or reverted; the message says what to do."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# unified diffs: a strict applier (context must match exactly; hashes are verified around it)
# ---------------------------------------------------------------------------------------------
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Hunk:
    old_start: int
    new_start: int
    old_lines: list[str]
    new_lines: list[str]


def parse_unified_diff(text: str) -> list[Hunk]:
    lines = text.splitlines(keepends=True)
    hunks: list[Hunk] = []
    i = 0
    while i < len(lines) and not lines[i].startswith("@@"):
        i += 1
    while i < len(lines):
        match = _HUNK.match(lines[i])
        if not match:
            raise PatchError(f"malformed unified diff near line {i + 1}: {lines[i]!r}")
        old_count = int(match.group(2) or 1)
        new_count = int(match.group(4) or 1)
        hunk = Hunk(int(match.group(1)), int(match.group(3)), [], [])
        i += 1
        while i < len(lines) and (len(hunk.old_lines) < old_count or len(hunk.new_lines) < new_count):
            line = lines[i]
            tag, body = line[:1], line[1:]
            if line.startswith("\\"):  # "\ No newline at end of file": strip the previous newline
                i += 1
                continue
            if tag in (" ", ""):
                hunk.old_lines.append(body if tag else "\n")
                hunk.new_lines.append(body if tag else "\n")
            elif tag == "-":
                hunk.old_lines.append(body)
            elif tag == "+":
                hunk.new_lines.append(body)
            else:
                raise PatchError(f"malformed unified diff line {i + 1}: {line!r}")
            i += 1
        hunks.append(hunk)
    return hunks


def apply_hunks(source: str, hunks: list[Hunk], reverse: bool = False) -> str:
    """Apply hunks at their exact positions (or undo them with reverse=True)."""
    lines = source.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    for hunk in hunks:
        before, after = (hunk.new_lines, hunk.old_lines) if reverse else (hunk.old_lines, hunk.new_lines)
        start = (hunk.new_start if reverse else hunk.old_start) - 1
        if not before:  # pure insertion: the start line names the line after which to insert
            start += 1
        if lines[start : start + len(before)] != before:
            raise PatchError(f"hunk at line {start + 1} does not match")
        out.extend(lines[cursor:start])
        out.extend(after)
        cursor = start + len(before)
    out.extend(lines[cursor:])
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# the patch set
# ---------------------------------------------------------------------------------------------
@dataclass
class FilePatch:
    path: str  # relative to site-packages, e.g. "openrlhf/cli/train_ppo_ray.py"
    released_sha256: str
    patched_sha256: str
    diff: str


def load_patch_set(patch_dir: Path = PATCH_DIR) -> list[FilePatch]:
    manifest = json.loads((patch_dir / "manifest.json").read_text())
    if manifest["openrlhf_version"] != PINNED_VERSION:
        raise PatchError(f"{patch_dir}/manifest.json is for openrlhf {manifest['openrlhf_version']}")
    return [
        FilePatch(path, entry["released_sha256"], entry["patched_sha256"], (patch_dir / entry["patch"]).read_text())
        for path, entry in manifest["files"].items()
    ]


def find_site_packages(site_packages: str | None) -> Path:
    if site_packages:
        root = Path(site_packages)
        if not (root / "openrlhf").is_dir():
            raise PatchError(f"no openrlhf package in {root}; pass the site-packages directory that holds it")
        return root
    spec = importlib.util.find_spec("openrlhf")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(f"openrlhf is not installed: pip install --no-deps openrlhf=={PINNED_VERSION}")
    return Path(next(iter(spec.submodule_search_locations))).parent


def installed_version(root: Path) -> str:
    infos = sorted(root.glob("openrlhf-*.dist-info"))
    if len(infos) != 1:
        raise PatchError(
            f"expected exactly one openrlhf-*.dist-info in {root}, found {len(infos)}: "
            f"reinstall with pip install --force-reinstall --no-deps openrlhf=={PINNED_VERSION}"
        )
    for line in (infos[0] / "METADATA").read_text().splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise PatchError(f"{infos[0]}/METADATA has no Version field")


@dataclass
class FileState:
    patch: FilePatch
    state: str  # "released", "patched", or "modified"
    content: bytes


def inspect(root: Path, patches: list[FilePatch]) -> list[FileState]:
    version = installed_version(root)
    if version != PINNED_VERSION:
        raise PatchError(
            f"openrlhf {version} is installed in {root}, but this patch set is for exactly {PINNED_VERSION}: "
            f"pip install --no-deps openrlhf=={PINNED_VERSION}"
        )
    states = []
    for patch in patches:
        target = root / patch.path
        if not target.is_file():
            raise PatchError(f"{target} is missing: reinstall openrlhf=={PINNED_VERSION}")
        content = target.read_bytes()
        digest = sha256_bytes(content)
        state = {patch.released_sha256: "released", patch.patched_sha256: "patched"}.get(digest, "modified")
        states.append(FileState(patch, state, content))
    return states


def _require_known(states: list[FileState], root: Path) -> None:
    modified = [s.patch.path for s in states if s.state == "modified"]
    if modified:
        raise PatchError(
            "these files are neither the released nor the patched version, so nothing was changed: "
            + ", ".join(str(root / p) for p in modified)
            + f". Restore them with pip install --force-reinstall --no-deps openrlhf=={PINNED_VERSION}, "
            "then apply again."
        )


def _transform(state: FileState, reverse: bool) -> bytes:
    result = apply_hunks(state.content.decode(), parse_unified_diff(state.patch.diff), reverse=reverse).encode()
    expected = state.patch.released_sha256 if reverse else state.patch.patched_sha256
    if sha256_bytes(result) != expected:
        raise PatchError(f"patching {state.patch.path} produced unexpected content; nothing was changed")
    return result


def _write_atomically(target: Path, data: bytes) -> None:
    mode = target.stat().st_mode
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(action: str, site_packages: str | None = None, patch_dir: Path = PATCH_DIR) -> list[str]:
    """Perform `action`; returns report lines. Raises PatchError, having modified nothing.

    apply: patch every released file (patched ones are left alone); check: the same as a dry run;
    revert: restore every patched file to the released bytes; status: report each file's state.
    """
    root = find_site_packages(site_packages)
    patches = load_patch_set(patch_dir)
    states = inspect(root, patches)
    report = [f"openrlhf {PINNED_VERSION} at {root}"]
    if action == "status":
        report += [f"  {s.state:<9} {s.patch.path}" for s in states]
        return report
    _require_known(states, root)
    reverse = action == "revert"
    todo_state = "patched" if reverse else "released"
    # compute every result before writing anything: a failure leaves the tree untouched
    results = {s.patch.path: _transform(s, reverse) for s in states if s.state == todo_state}
    verb = {"apply": "patched", "check": "would patch", "revert": "reverted"}[action]
    for s in states:
        if s.patch.path in results:
            if action != "check":
                _write_atomically(root / s.patch.path, results[s.patch.path])
            report.append(f"  {verb:<12} {s.patch.path}")
        else:
            report.append(f"  {'unchanged':<12} {s.patch.path} (already {s.state})")
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["apply", "check", "revert", "status"])
    parser.add_argument(
        "--site-packages", default=None, help="directory holding openrlhf/ (default: the importable one)"
    )


def main(args: argparse.Namespace) -> int:
    try:
        for line in run(args.action, args.site_packages):
            print(line)
    except PatchError as err:
        print(f"openrlhf-band patch {args.action}: error: {err}", file=sys.stderr)
        return 1
    return 0


def regenerate(released_root: Path, edited_root: Path, files: list[str], patch_dir: Path = PATCH_DIR) -> None:
    """Write one `diff -u` per file (released -> edited) and the manifest of both hashes.

    Developer tool behind patches/regenerate.sh; `files` are paths relative to site-packages.
    """
    import subprocess

    patch_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"openrlhf_version": PINNED_VERSION, "files": {}}
    for path in files:
        released, edited = released_root / path, edited_root / path
        diff = subprocess.run(
            ["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}", str(released), str(edited)],
            capture_output=True,
            text=True,
        )
        if diff.returncode != 1:
            raise PatchError(f"diff -u {released} {edited} gave no difference or failed: {diff.stderr}")
        name = path.removeprefix("openrlhf/").replace("/", "__") + ".patch"
        (patch_dir / name).write_text(diff.stdout)
        manifest["files"][path] = {
            "patch": name,
            "released_sha256": sha256_bytes(released.read_bytes()),
            "patched_sha256": sha256_bytes(edited.read_bytes()),
        }
    (patch_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":  # python -m openrlhf_band.patching.patcher regenerate RELEASED_ROOT EDITED_ROOT FILE...
    if len(sys.argv) < 5 or sys.argv[1] != "regenerate":
        sys.exit("usage: python -m openrlhf_band.patching.patcher regenerate RELEASED_ROOT EDITED_ROOT FILE...")
    regenerate(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
