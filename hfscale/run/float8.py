"""--fp8: torchao's float8 training through accelerate (its AORecipeKwargs), on the linear layers of the decoder blocks.

What is converted: every nn.Linear inside a decoder block whose two dimensions torch's float8 matmul takes (multiples
of 16) - GPT-2's Conv1D projections first become nn.Linear ones (linear_projections), whose state dict keeps Conv1D's
layout; the embeddings, the LM head and the norms stay in high precision, as torchtitan keeps them (the head's logits
feed the loss, and its vocabulary-wide matmul is where float8's rounding costs most). Outside the converted matmuls
the run computes in bf16: accelerate's fp8 mode is bf16 autocast, so `--fp8 --bf16` is the same run. The weights stay
in their training dtype (a checkpoint and an export load in plain transformers); only the matmuls' operands are cast,
with dynamic scales, every step. Refusals (device, engine, precision): formulas/precision.py."""

import dataclasses
from functools import partial

from ..errors import HfscaleError
from ..formulas.precision import FLOAT8_DIM_MULTIPLE


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


def converts(spec, name: str, module) -> bool:
    """Whether `module` (named `name` in the unwrapped model) trains its matmuls in float8."""
    import torch

    return (isinstance(module, torch.nn.Linear) and name.startswith(spec.block_prefix + ".")
            and module.in_features % FLOAT8_DIM_MULTIPLE == 0 and module.out_features % FLOAT8_DIM_MULTIPLE == 0)


def recipe_handler(recipe: str, spec, emulate: bool, all_gather: bool = False):
    """accelerate's handler that converts the model as it prepares it (convert_model_to_fp8_ao); `all_gather`: FSDP2
    gathers the converted weights in float8 (torchao's enable_fsdp_float8_all_gather, tensorwise only)."""
    from accelerate.utils import AORecipeKwargs
    from torchao.float8 import Float8LinearConfig

    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate,
                                 enable_fsdp_float8_all_gather=all_gather)
    return AORecipeKwargs(config=config, module_filter_func=lambda module, name: converts(spec, name, module))


def inspect_float8(model, spec, recipe: str, emulate: bool, all_gather: bool = False) -> dict:
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
            if converts(spec, name, module):
                wrongly_kept.append(name)
    if wrongly_kept or not converted:
        raise HfscaleError(f"--fp8: {len(converted)} linear layers train in float8, but {wrongly_kept or 'none'} "
                           "should too: the model was not converted as planned")
    if gathered != (len(converted) if all_gather else 0):
        raise HfscaleError(f"--fp8: {gathered} of {len(converted)} float8 weights are gathered in float8, where the "
                           f"plan {'gathers all' if all_gather else 'gathers none'} so")
    return {"recipe": recipe, "emulated": emulate, "float8_linears": len(converted), "high_precision": kept,
            "first": converted[0], "float8_all_gather": all_gather}
