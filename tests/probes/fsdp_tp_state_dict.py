"""fsdp_tp's whole state dict (tensor_parallel.full_state_dict, load_full_state_dict) on a real 2 x 2 mesh (4 gloo
processes: FSDP2 over "dp_shard", hfscale's TP over "tp"), for GPT-2 in float8 (--fp8's conversion, the Conv1D
projections as nn.Linear): its fused QKV weight is sharded twice along dimension 0 (_StridedShard over both mesh
dimensions), the case DTensor's one-call gather scrambled. Prints, as JSON: the largest difference between the
gathered state dict and the same model built unsharded, and between the split model and a differently seeded one
loaded from that state dict (gathered again), with the QKV weight's placements. Leaves through os._exit (world.py)."""

import json
import os

from world import spawn_world

WORLD = 4


def built(seed: int, mesh=None):
    from torch.distributed.fsdp import fully_shard

    from hfscale.models import PRESETS, build_model
    from hfscale.parallel.tensor_parallel import apply_tensor_parallel
    from hfscale.run.float8 import convert, linear_projections

    shape = PRESETS["tiny"]
    model = build_model(shape, seed, "eager")
    linear_projections(model)
    convert(model, shape.spec, "tensorwise", emulate=True, tp=2)
    if mesh is None:
        return model
    apply_tensor_parallel(model, mesh["tp"], shape.spec)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    return model


def work(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from hfscale.parallel.tensor_parallel import full_state_dict, load_full_state_dict

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    split, other = built(0, mesh), built(1, mesh)
    saved, whole = full_state_dict(split), built(0).state_dict()
    load_full_state_dict(other, saved)
    reloaded = full_state_dict(other)
    return {"saved_diff": max((saved[k] - whole[k]).abs().max().item() for k in whole),
            "reloaded_diff": max((reloaded[k] - saved[k]).abs().max().item() for k in saved),
            "qkv_placements": str(dict(split.named_parameters())["transformer.h.0.attn.c_attn.weight"].placements)}


if __name__ == "__main__":
    print(json.dumps(spawn_world(WORLD, work)[0]))
    os._exit(0)
