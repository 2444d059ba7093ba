"""Each strategy x optimizer pair hfscale refuses, tried directly in the library that would run it (one process, gloo),
beside a pair of the same engine that hfscale allows. Prints {"strategy x optim": error or null} as JSON.

fsdp*: FSDP2 (fully_shard) parameters are DTensors; the optimizer steps them.
zero*_offload: DeepSpeed ZeRO-Offload with the optimizer the Trainer would hand it (a client optimizer).
tp: hfscale's tensor-parallel plan (a 1-rank TP mesh: every parameter a DTensor, as on any TP size); the optimizer the
Trainer would build for tp steps them (bitsandbytes' for adamw_8bit, as under every ddp-engine strategy).
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[-1], RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def optimizer(name, params):
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False)
    if name == "adamw_8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=1e-3)
    if name == "deepspeed_cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=1e-3)
    return torch.optim.AdamW(params, lr=1e-3)


def fsdp_step(optim: str) -> None:
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    fully_shard(model)
    opt = optimizer(optim, model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()


def zero_offload_step(optim: str) -> None:
    import deepspeed

    from hfscale.parallel.distributed import skip_deepspeed_shm_kernel

    skip_deepspeed_shm_kernel()  # as hfscale's CPU route does: no ~35 s build of an inference-only kernel

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer(optim, model.parameters()), config=config)
    engine.backward(engine(torch.randn(1, 64)).sum())
    engine.step()


def tp_step(optim: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from hfscale.models import PRESETS, build_model
    from hfscale.parallel.tensor_parallel import apply_tensor_parallel

    model = apply_tensor_parallel(build_model(PRESETS["tiny"], 0, "eager"), init_device_mesh("cpu", (1,)),
                                  PRESETS["tiny"].spec)
    opt = optimizer(optim, model.parameters())
    ids = torch.randint(0, PRESETS["tiny"].vocab, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()


PROBES = {("tp", "adafactor"): (tp_step, "adafactor"), ("tp", "adamw_8bit"): (tp_step, "adamw_8bit"),
          ("tp", "adamw"): (tp_step, "adamw"),("fsdp", "adafactor"): (fsdp_step, "adafactor"), ("fsdp", "adamw"): (fsdp_step, "adamw"),
          ("zero2_offload", "adafactor"): (zero_offload_step, "adafactor"),
          ("zero2_offload", "adamw_8bit"): (zero_offload_step, "adamw_8bit"),
          ("zero2_offload", "adamw"): (zero_offload_step, "deepspeed_cpu_adam")}  # what the Trainer hands it for adamw

dist.init_process_group("gloo")
out = {}
for (strategy, optim), (probe, name) in PROBES.items():
    try:
        probe(name)
        out[f"{strategy} x {optim}"] = None
    except Exception as err:  # the library's own refusal is the finding
        out[f"{strategy} x {optim}"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
dist.destroy_process_group()
print(json.dumps(out))
