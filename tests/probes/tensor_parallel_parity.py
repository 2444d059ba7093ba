"""hfscale's tensor-parallel plan against the unsharded model: 2 gloo processes (a TP mesh of 2) each build the same
tiny GPT-2, tiny BLOOM and tiny Llama (grouped-query attention, an untied head) twice, split one copy
(hfscale.parallel.tensor_parallel) and train both for 3 AdamW steps with gradient clipping on the same batches.
Prints, as JSON, per family: the losses of both, the largest difference of
any gradient (full tensors) and of any weight after the steps, the clipped norms, each parameter's placements and
the elements rank 0 holds against the whole model. Leaves through os._exit (see powersgd_hooks.py)."""

import json
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TP = 2
PRESET = {"gpt2": "tiny", "bloom": "tiny-bloom", "llama": "tiny-llama"}


def family_run(family: str, mesh) -> dict:
    from torch.distributed.tensor import DTensor

    from hfscale.models import PRESETS, build_model
    from hfscale.parallel.tensor_parallel import apply_tensor_parallel, tp_placements

    shape = PRESETS[PRESET[family]]
    whole, split = build_model(shape, 0, "eager"), build_model(shape, 0, "eager")
    apply_tensor_parallel(split, mesh, shape.spec)

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    # eps 1e-3, not 1e-8: Adam divides each gradient by its own size, so at eps 1e-8 a rounding difference in a gradient
    # near zero can move that weight by up to 2 lr (seen: 2e-4 for tiny's wte, from gradients 8e-8 apart). With eps
    # 1e-3 an update moves at most lr/eps per unit of gradient difference: the weights may differ by about
    # steps x lr x grad_diff / eps (3e-6 here), while a shard stepped wrongly still moves by about lr.
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-3) for m in (whole, split)]
    torch.manual_seed(1)
    losses, norms, grad_diff = [[], []], [[], []], 0.0
    for step in range(3):
        ids = torch.randint(0, shape.vocab, (2, 32))
        for i, (model, opt) in enumerate(zip((whole, split), optimizers)):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            losses[i].append(loss.item())
        if step == 0:
            grad_diff = max((full(p.grad) - q.grad).abs().max().item()
                            for p, q in zip(split.parameters(), whole.parameters()))
        for i, (model, opt) in enumerate(zip((whole, split), optimizers)):
            norms[i].append(float(full(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))))
            opt.step()
            opt.zero_grad()
    weight_diff = max((full(p.data) - q.data).abs().max().item() for p, q in zip(split.parameters(), whole.parameters()))
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in split.parameters())
    return {"losses": losses, "norms": norms, "grad_diff": grad_diff, "weight_diff": weight_diff,
            "placements": tp_placements(split), "local_numel": local,
            "whole_numel": sum(p.numel() for p in whole.parameters())}


def worker(rank: int, port: int, out: str) -> None:
    # a client of the parent's store, bound before any worker started: no port to pick, none another process can take
    store = dist.TCPStore("127.0.0.1", port, TP + 1, False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=TP)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    result = {family: family_run(family, mesh) for family in PRESET}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    # the rendezvous store, served here on the port given (0: one the kernel picks as it binds) for the workers' lives
    store = dist.TCPStore("127.0.0.1", int(sys.argv[-1]), TP + 1, True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    with tempfile.TemporaryDirectory(prefix="hfscale-tp-parity-") as folder:
        out = os.path.join(folder, "rank")
        mp.spawn(worker, args=(store.port, out), nprocs=TP)
        ranks = []
        for rank in range(TP):
            with open(f"{out}.{rank}") as f:
                ranks.append(json.load(f))
    print(json.dumps({"ranks": ranks}))
    os._exit(0)
