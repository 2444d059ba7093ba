"""torch's PowerSGD hook on a one-process gloo group, the way hfscale registers it. Prints the facts as JSON.

It runs in its own process because torch deadlocks tearing it down in a long-lived one: the DDP Reducer keeps the
gloo group alive after destroy_process_group, and when the garbage collector later frees it (holding the GIL), the
group's destructor joins worker threads that need the GIL to drop the hook's tensors. This process leaves through
os._exit, so nothing is torn down.

  counts: elements the hook all-reduces per step (total_numel_after_compression) on the tiny model, rank 2.
  ordered: hfscale's apply_powersgd registers hook_in_order with its state and steps past the warm-up.
  compiled: the same under torch.compile, as accelerate wraps it (OptimizedModule(DDP(model))), with what the
    start-up proof reads of that wrapper.
"""

import json
import os
import sys

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[-1], RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def counts() -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from hfscale.models import PRESETS, build_model

    shape = PRESETS["tiny"]
    model = torch.nn.parallel.DistributedDataParallel(build_model(shape, seed=0))
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    ids = torch.randint(0, shape.vocab, (2, 16))
    out = []
    for _ in range(4):
        before = state.total_numel_after_compression
        model(input_ids=ids, labels=ids).loss.backward()
        out.append(state.total_numel_after_compression - before)
    return {"counts": out}


def ordered(compile_backend: str | None = None) -> dict:
    from hfscale.parallel import verify
    from hfscale.parallel.hooks import PowerSGDConfig, apply_powersgd

    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    # the backend that only traces: the wrappers are the real ones, without generating code
    model = torch.compile(ddp, backend=compile_backend) if compile_backend else ddp
    state = apply_powersgd(verify.uncompiled(model), PowerSGDConfig(rank=1, warmup_steps=2))
    hook, registered_state = ddp._comm_hooks[0]
    for _ in range(4):  # past the warm-up: compressing, through the wrapper
        model(torch.randn(4, 8)).sum().backward()
    return {"hook": hook.__name__, "state_registered": registered_state is state, "iter": state.iter,
            "compressed": bool(state.p_memory_dict), **verify.inspect_wrapper(model)}


dist.init_process_group("gloo")
modes = {"counts": counts, "ordered": ordered, "compiled": lambda: ordered(compile_backend="eager")}
print(json.dumps(modes[sys.argv[1]]()), flush=True)
os._exit(0)
