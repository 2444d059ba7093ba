"""hfscale's tensor-parallel plan against the unsharded model: 2 gloo processes (a TP mesh of 2) each build the same
tiny GPT-2, tiny BLOOM, tiny Llama (grouped-query attention, an untied head), tiny Qwen2 (Llama's with q/k/v
biases), tiny Qwen3 (per-head q/k norms, a head width of its own), tiny Gemma 3 (Qwen3's attention, four norms a
block, a tied head) and tiny OLMo 2 (q/k norms over all heads, norms after each sublayer) twice, split one copy
(hfscale.parallel.tensor_parallel) and train both for 3 AdamW steps with gradient clipping on the same batches - and
GPT-2 and Llama once more with their blocks' linear layers in float8 (--fp8's conversion, run/float8.convert, before
the split; torchao's emulation). Prints, as JSON, per model: the losses of both, the largest difference of any
gradient (full tensors, the first step) and of any weight after the steps, the clipped norms, each parameter's
placements, the elements rank 0 holds against the whole model, and the largest difference after the split model's
whole state dict (tensor_parallel.full_state_dict) is loaded into a third, differently seeded split model
(load_full_state_dict), as a resume does; in float8, the type of each converted weight's TP shard when converted for
FSDP2's float8 all-gather, as fsdp_tp does. Leaves through os._exit (see powersgd_hooks.py)."""

import json
import os

import torch

from world import spawn_world

TP = 2
PRESET = {"gpt2": "tiny", "bloom": "tiny-bloom", "llama": "tiny-llama", "qwen2": "tiny-qwen2",
          "qwen3": "tiny-qwen3", "gemma3": "tiny-gemma3", "olmo2": "tiny-olmo2"}
FLOAT8 = {"gpt2-fp8": "tiny", "llama-fp8": "tiny-llama"}  # the float8 recipe of a run's --fp8 default


def built(shape, seed: int, float8: bool, mesh=None, all_gather: bool = False):
    """The model as a run builds it: float8 layers converted before any split (run/float8.convert), then split. The
    whole model converts the layers the split one does (those whose TP slices float8 takes), to be compared with it."""
    from hfscale.models import build_model
    from hfscale.parallel.tensor_parallel import apply_tensor_parallel
    from hfscale.run.float8 import convert, linear_projections

    model = build_model(shape, seed, "eager")
    if float8:
        linear_projections(model)
        convert(model, shape.spec, "tensorwise", emulate=True, all_gather=all_gather, tp=TP)
    return apply_tensor_parallel(model, mesh, shape.spec) if mesh is not None else model


def family_run(preset: str, mesh, float8: bool = False) -> dict:
    from torch.distributed.tensor import DTensor

    from hfscale.models import PRESETS
    from hfscale.parallel.tensor_parallel import full_state_dict, load_full_state_dict, tp_placements

    shape = PRESETS[preset]
    whole, split = built(shape, 0, float8), built(shape, 0, float8, mesh)

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
    resumed = built(shape, 1, float8, mesh)
    load_full_state_dict(resumed, full_state_dict(split))
    reloaded = max((full(p.data) - full(q.data)).abs().max().item()
                   for p, q in zip(resumed.parameters(), split.parameters()))
    gathering = None  # fsdp_tp's float8 all-gather: every converted weight's TP shard still torchao's subclass
    if float8:
        from torchao.float8.float8_linear import Float8Linear

        weights = [m.weight.to_local() for m in built(shape, 0, True, mesh, all_gather=True).modules()
                   if isinstance(m, Float8Linear)]
        gathering = [type(w).__name__ for w in weights]
    return {"losses": losses, "norms": norms, "grad_diff": grad_diff, "weight_diff": weight_diff,
            "float8_gathering": gathering,
            "placements": tp_placements(split), "local_numel": local, "reloaded_diff": reloaded,
            "float8_layers": sorted({type(m).__name__ for m in split.modules()} & {"Float8Linear"}),
            "whole_numel": sum(p.numel() for p in whole.parameters())}


def work(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    result = {family: family_run(preset, mesh) for family, preset in PRESET.items()}
    result.update({name: family_run(preset, mesh, float8=True) for name, preset in FLOAT8.items()})
    return result


if __name__ == "__main__":
    print(json.dumps({"ranks": spawn_world(TP, work)}))
    os._exit(0)
