"""--fp8: torchao's float8 training on the linear layers of the decoder blocks, with accelerate's fp8 mode on torchao
(its AORecipeKwargs).

What is converted: every nn.Linear inside a decoder block whose two dimensions torch's float8 matmul takes (multiples
of 16; under TP the dimensions of a rank's slice) - GPT-2's Conv1D projections first become nn.Linear ones
(linear_projections), whose state dict keeps Conv1D's layout; the embeddings, the LM head and the norms stay in high
precision, as torchtitan keeps them (the head's logits feed the loss, and its vocabulary-wide matmul is where float8's
rounding costs most). accelerate converts the model as it prepares it; under TP hfscale converts it first (`convert`),
and the split layers' float8 casts take their scales over the whole tensor (torchao reduces a DTensor's amax over the
TP group). Outside the converted matmuls the run computes in bf16: accelerate's fp8 mode is bf16 autocast, so
`--fp8 --bf16` is the same run. The weights stay in their training dtype (a checkpoint and an export load in plain
transformers); only the matmuls' operands are cast, with dynamic scales, every step. Refusals (device, engine,
precision): formulas/precision.py."""

import dataclasses
from functools import partial

from ..errors import HfscaleError
from ..formulas.precision import FLOAT8_DIM_MULTIPLE, tp_local_dims


def linear_projections(model) -> int:
    """Swap every transformers Conv1D (GPT-2's projections, weight [in, out]) for an nn.Linear holding the same weights
    ([out, in]), which torchao converts. The model's state dict keeps Conv1D's layout - each parent's hooks transpose
    the weight as it is saved and loaded - so its checkpoints resume and export as GPT-2's. Returns how many."""
    import torch
    from transformers.pytorch_utils import Conv1D

    swapped = 0
    for parent in list(model.modules()):
        names = [name for name, child in parent.named_children() if isinstance(child, Conv1D)]
        for name in names:
            conv = getattr(parent, name)
            linear = torch.nn.Linear(conv.nx, conv.nf, device=conv.weight.device, dtype=conv.weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(conv.weight.t())
                linear.bias.copy_(conv.bias)
            setattr(parent, name, linear)
        if names:
            parent.register_state_dict_post_hook(partial(_saved_as_conv1d, tuple(names)))
            parent.register_load_state_dict_pre_hook(partial(_loaded_from_conv1d, tuple(names)))
        swapped += len(names)
    return swapped


def _saved_as_conv1d(names, module, state_dict, prefix, local_metadata) -> None:
    for name in names:
        key = f"{prefix}{name}.weight"
        if key in state_dict:
            state_dict[key] = state_dict[key].t().contiguous()


def _loaded_from_conv1d(names, module, state_dict, prefix, *args) -> None:
    for name in names:
        key = f"{prefix}{name}.weight"
        if key in state_dict:
            state_dict[key] = state_dict[key].t().contiguous()


def converts(spec, name: str, module, tp: int = 1) -> bool:
    """Whether `module` (named `name` in the unwrapped model) trains its matmuls in float8: a linear layer of a block
    whose dimensions on one rank of a TP group of `tp` (split by the family's tp_plan) are multiples of 16."""
    import torch

    prefix = spec.block_prefix + "."
    if not (isinstance(module, torch.nn.Linear) and name.startswith(prefix)):
        return False
    in_block = name[len(prefix):].split(".", 1)[-1]  # past the block's index
    k, n = tp_local_dims(module.in_features, module.out_features, spec.tp_plan.get(in_block, ""), tp)
    return k % FLOAT8_DIM_MULTIPLE == 0 and n % FLOAT8_DIM_MULTIPLE == 0


def float8_config(recipe: str, emulate: bool, all_gather: bool = False):
    """torchao's Float8LinearConfig of the recipe; `all_gather`: FSDP2 gathers the converted weights in float8
    (torchao's enable_fsdp_float8_all_gather, tensorwise only)."""
    from torchao.float8 import Float8LinearConfig

    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate,
                               enable_fsdp_float8_all_gather=all_gather)


def convert(model, spec, recipe: str, emulate: bool, all_gather: bool = False, tp: int = 1) -> None:
    """Swap the blocks' linear layers that `converts` picks for torchao's Float8Linear, in place: what a TP run does
    before it splits the model (the hooks TP adds would be lost with a layer swapped after it). The other runs leave
    it to accelerate's prepare, whose FSDP2 route maps the optimizer onto the sharded weights by data_ptr and knows
    torchao's float8-gathering weight (data_ptr 0) only in a model it converted itself."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model, config=float8_config(recipe, emulate, all_gather),
                               module_filter_fn=lambda module, name: converts(spec, name, module, tp))


def recipe_handler(recipe: str, spec, emulate: bool, all_gather: bool = False, tp: int = 1):
    """accelerate's handler: it converts the layers `converts` picks as it prepares the model (none left under TP,
    where `convert` swapped them already), computes the rest under bf16 autocast and, under FSDP2 with `all_gather`,
    precomputes the float8 weights' scales after each optimizer step (precompute_float8_dynamic_scale_for_fsdp)."""
    from accelerate.utils import AORecipeKwargs
    from torchao.float8.float8_linear import Float8Linear

    return AORecipeKwargs(config=float8_config(recipe, emulate, all_gather),
                          module_filter_func=lambda module, name: (not isinstance(module, Float8Linear)
                                                                   and converts(spec, name, module, tp)))


def precompute_scales(model) -> None:
    """Under FSDP2's float8 all-gather: the scales the converted weights are gathered with, as the optimizer's
    post-step hook leaves them (torchao's precompute_float8_dynamic_scale_for_fsdp: each whole weight's amax), made
    before the first step too. Without them a step scales each weight by its amax over the FSDP mesh alone - under
    fsdp_tp a TP slice's, not the weight's - so a fresh run's first step and a resumed run's first step would gather
    differently from every other step, and a resumed run would not end on the uninterrupted run's weights."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def inspect_float8(model, spec, recipe: str, emulate: bool, all_gather: bool = False, tp: int = 1) -> dict:
    """The start-up proof: which linear layers train in float8, and (FSDP2, `all_gather`) that their weights are
    gathered in float8 - torchao's weight subclass under each DTensor shard. Raises when a layer the plan converts was
    not converted (or one it keeps was), or the gather is not the plan's: the run would not be the one its figures
    describe."""
    import torch
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    converted, kept, wrongly_kept, gathered = [], [], [], 0
    for name, module in model.named_modules():
        if isinstance(module, Float8Linear):
            converted.append(name)
            weight = module.weight.to_local() if hasattr(module.weight, "to_local") else module.weight
            gathered += isinstance(weight, WeightWithDynamicFloat8CastTensor)
        elif isinstance(module, torch.nn.Linear):
            kept.append(name)
            if converts(spec, name, module, tp):
                wrongly_kept.append(name)
    if wrongly_kept or not converted:
        raise HfscaleError(f"--fp8: {len(converted)} linear layers train in float8, but {wrongly_kept or 'none'} "
                           "should too: the model was not converted as planned")
    if gathered != (len(converted) if all_gather else 0):
        raise HfscaleError(f"--fp8: {gathered} of {len(converted)} float8 weights are gathered in float8, where the "
                           f"plan {'gathers all' if all_gather else 'gathers none'} so")
    return {"recipe": recipe, "emulated": emulate, "float8_linears": len(converted), "high_precision": kept,
            "first": converted[0], "float8_all_gather": all_gather}
