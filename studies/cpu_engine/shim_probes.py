"""Shows that each patch of studies/cpu_engine/cpu_shim is needed: the unpatched OpenRLHF call fails on this
machine, and the patched one works. Run in .venv-e2e (it needs vLLM) by test_cpu_shim.py:

    .venv-e2e/bin/python studies/cpu_engine/shim_probes.py      # prints one JSON object: patch -> findings
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import socket
import sys
import types
from pathlib import Path

SHIM = Path(__file__).resolve().parent / "cpu_shim" / "sitecustomize.py"


def load_shim():
    spec = importlib.util.spec_from_file_location("e2e_cpu_shim_under_test", SHIM)
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)  # E2E_CPU_SHIM is unset here: nothing is installed, only defined
    return shim


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fails(call) -> str | None:
    """The error the call raises, or None when it succeeds."""
    try:
        call()
    except Exception as err:  # the point is to record what breaks
        return f"{type(err).__name__}: {err}"[:300]
    return None


def fresh(name: str):
    """A freshly imported, unpatched copy of an OpenRLHF module."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def probe_cuda_on_cpu(shim) -> dict:
    from openrlhf.trainer.ppo_utils import replay_buffer

    make = lambda: replay_buffer.NaiveReplayBuffer(2, 0, False, False, False)  # noqa: E731
    unpatched = fails(make)
    shim._cuda_on_cpu(replay_buffer)
    patched = fails(make) or str(make().target_device)
    # every module the patch is applied to calls torch.cuda.* at module level code paths
    modules = [m for m, patches in shim.PATCHES.items() if ("cuda_on_cpu", shim._cuda_on_cpu) in patches]
    calls = {m: inspect.getsource(importlib.import_module(m)).count("torch.cuda.") for m in modules}
    return {"unpatched_error": unpatched, "patched": patched, "torch.cuda calls per module": calls}


def probe_device_mesh_on_cpu(shim) -> dict:
    import os

    from openrlhf.utils.deepspeed import deepspeed as ds_module

    os.environ["LOCAL_RANK"] = "0"  # as in the DeepSpeed actor that Ray starts (DeviceMesh then sets the device)

    mesh = lambda: ds_module.init_device_mesh("cuda", (1, 1, 1), mesh_dim_names=("dp", "sp", "tp"))  # noqa: E731
    unpatched = fails(mesh)
    shim._device_mesh_on_cpu(ds_module)
    return {"unpatched_error": unpatched, "patched": fails(mesh) or str(mesh().device_type)}


def probe_barrier_without_cuda_sync(shim) -> dict:
    util = fresh("openrlhf.utils.distributed_util")
    unpatched = fails(util.torch_dist_barrier_and_cuda_sync)
    shim._barrier_without_cuda_sync(util)
    return {"unpatched_error": unpatched, "patched": fails(util.torch_dist_barrier_and_cuda_sync) or "barrier ok"}


def broadcast_between_two_ranks(init_group) -> list[float]:
    """Rank 0 sends [0, 1, 2, 3] through `init_group(address, port, rank, world_size, device)`; what
    rank 1 holds afterwards (it starts from zeros). Two threads: the group is a TCP store + a backend."""
    import threading

    import torch

    port, received, errors = free_port(), [], []

    def rank(r: int) -> None:
        try:
            group = init_group("127.0.0.1", port, r, 2, "cpu")
            tensor = torch.arange(4, dtype=torch.bfloat16) if r == 0 else torch.zeros(4, dtype=torch.bfloat16)
            group.broadcast(tensor, src=0, stream=None)
            if r == 1:
                received.extend(tensor.tolist())
        except Exception as err:
            errors.append(f"rank {r}: {type(err).__name__}: {err}"[:300])

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise RuntimeError("; ".join(errors))
    return received


def probe_gloo_weight_sync(shim) -> dict:
    util = fresh("openrlhf.utils.distributed_util")
    # vLLM's PyNcclCommunicator finds no NCCL library here and disables itself: its broadcast returns
    # without sending, so the engine would keep whatever memory torch.empty gave it
    unpatched = fails(lambda: broadcast_between_two_ranks(util.stateless_init_process_group)) or (
        f"no error, but rank 1 received {broadcast_between_two_ranks(util.stateless_init_process_group)}"
    )
    shim._gloo_weight_sync_group(util)
    received = broadcast_between_two_ranks(util.stateless_init_process_group)
    return {"unpatched_error": unpatched, "patched": f"rank 1 received {received}", "received": received}


def probe_cpu_weight_reload(shim) -> dict:
    import torch

    wrap = fresh("openrlhf.trainer.ray.vllm_worker_wrap")
    worker = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=torch.bfloat16))
    unpatched = fails(lambda: wrap.WorkerWrap.update_weight(worker, "w", torch.bfloat16, (2, 2)))
    # patched: proven end to end (test_weights_reach_vllm_after_every_step reads the engine's weights)
    return {"unpatched_error": unpatched, "patched": "see the end-to-end sync check"}


def probe_float32_on_cpu(shim) -> dict:
    """OpenRLHF has no float32 setting to fail or succeed: its parser refuses one, and vLLM's engine
    dtype is a literal. Unpatched: the refusal and the literal; patched: float32 at all three places."""
    import torch
    from openrlhf.cli import train_ppo_ray

    source = inspect.getsource(train_ppo_ray)
    choices = source[source.index('"--ds.param_dtype"') :].split("choices=", 1)[1].split("]", 1)[0] + "]"
    engine_source = inspect.getsource(importlib.import_module("openrlhf.trainer.ray.vllm_engine"))
    unpatched = (
        f"--ds.param_dtype choices={choices}; vllm_engine: "
        + ('"dtype": "bfloat16"' if '"dtype": "bfloat16"' in engine_source else "no fixed dtype")
    )
    utils = fresh("openrlhf.utils.utils")
    ds = fresh("openrlhf.utils.deepspeed.deepspeed")
    engine = fresh("openrlhf.trainer.ray.vllm_engine")
    before = (utils.convert_to_torch_dtype("bf16"), ds.get_train_ds_config(False, stage=3)["bf16"]["enabled"])
    for module in (utils, ds, engine):
        shim._float32_on_cpu(module)
    args = engine.vllm.AsyncEngineArgs(model="unused", dtype="bfloat16")
    bf16_on = ds.get_train_ds_config(False, stage=3)["bf16"]["enabled"]
    after = (utils.convert_to_torch_dtype("bf16"), bf16_on, args.dtype)
    for name in ("openrlhf.utils.utils", "openrlhf.utils.deepspeed.deepspeed", "openrlhf.trainer.ray.vllm_engine"):
        sys.modules.pop(name, None)  # the other probes get unpatched copies
    ok = before == (torch.bfloat16, True) and after == (torch.float32, False, "float32")
    return {"unpatched_error": unpatched, "patched": f"{after}" if ok else f"Error: {before} -> {after}"}


def main() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    shim = load_shim()
    probes = {name.removeprefix("probe_"): fn for name, fn in globals().items() if name.startswith("probe_")}
    findings = {name: probe(shim) for name, probe in probes.items()}
    print("\n" + json.dumps(findings))  # the last line of stdout; libraries print before it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
