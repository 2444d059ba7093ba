"""hfscale's tensor parallelism for every family (GPT-2, BLOOM and the Llama-shaped ones) on torch's DTensor: each
family's plan is a table in its module (models/<family>.py, `tp_plan`, which the memory model and the start-up proof
read too); this module applies it.

Megatron's layout: each block's QKV projections and first MLP matmuls split by output columns (whole query and
key/value heads per rank), its attention output projection and last MLP matmul split by input rows (their partial
outputs all-reduced), the word embedding and the LM head (tied to it, or Llama's own) split by vocabulary rows, and
every other parameter (GPT-2's position table, the norms, the row-split layers' biases) replicated. Every parameter
becomes a DTensor on the TP mesh, so the optimizer, gradient clipping and checkpoints see one kind of tensor, and a
DTensor's full tensor is the HF tensor, in HF's shape and order:
- GPT-2's Conv1D stores its weight [in, out] (y = x W + b): its column split is Shard(1), its row split Shard(0) -
  the transpose of nn.Linear's. Its fused c_attn holds [q | k | v] columns, so a plain column split would hand rank 0
  all of q: _StridedShard(1, split_factor=3) splits each of the three instead, giving rank r [q_r | k_r | v_r]. Its
  bias (3h, 1-D) stays whole on every rank, unlike Megatron's: DTensor adds each rank's slice to its columns, and a
  1-D _StridedShard(0) bias sharded once more by FSDP2 over the data-parallel ranks (fsdp_tp) stepped wrong values
  (its weights drifted 0.01 from ddp's in 20 steps while the losses still agreed).
- BLOOM's query_key_value (nn.Linear) is laid out per head already ([head, q/k/v, head_dim] rows): Shard(0) keeps
  whole heads together. Its ALiBi biases, built for every head, are sliced to the rank's heads.
- Llama's q, k and v are separate nn.Linear layers: each splits by output rows, so a rank holds n_head / TP query
  heads and n_kv_head / TP key/value heads (the grouped-query ratio unchanged); its attention reshapes by head size.
- Qwen3's per-head q/k norms stay whole on every rank and take the rank's heads (_per_head): their gradients are
  summed over the group.
- OLMo 2's q/k norms span all heads: each rank holds its heads' slice of the weight and normalises its slice of the
  queries (keys) by the mean square over the whole width, summed over the group (_colwise_norm). transformers' own
  plan gathers the projections whole on every rank instead, and runs every head's attention on each.
Each attention module then runs its own n_head / TP heads (the family's adapt_attention_for_tp). Proven in
tests/test_tensor_parallel.py (2 processes, gloo): the loss, every gradient, the clipped norm and AdamW steps equal
the unsharded model's.

The strategies `tp` (TP alone) and `fsdp_tp` (TP inside a node, FSDP2 across) launch it through the Trainer
(train.py, distributed.tensor_parallel_config, hooks.use_tensor_parallel_state). Both write their checkpoints whole,
every rank taking part (gathering a DTensor is collective, and the Trainer writes a plain model from rank 0 only): the
weights as HF safetensors (export and from_pretrained read them as any run's) and the optimizer states gathered into
one file; on resume each rank takes its slices again. FSDP's sharded checkpoint is no way out for fsdp_tp:
torch.distributed.checkpoint refuses GPT-2's c_attn, whose _StridedShard chunks its save planner reads as overlapping
(torch 2.13).
"""

import types

from ..models.family import ModelShape


def tp_refusal(shape: ModelShape, tp: int) -> str | None:
    """Why hfscale's TP cannot split this model over `tp` ranks (its family's rule: whole heads per rank; a family
    whose modules it does not split), or None."""
    if tp > 1 and shape.spec.tp_unsupported:
        return f"{shape.spec.title}: {shape.spec.tp_unsupported}"
    return shape.spec.tp_refusal(shape, tp)


def _weight_dims(module) -> tuple[int, int]:
    """(output dim, input dim) of a weight: Conv1D stores [in, out], nn.Linear [out, in]."""
    import torch

    return (0, 1) if isinstance(module, torch.nn.Linear) else (1, 0)


def _local(out):
    from torch.distributed.tensor import DTensor

    return out.to_local() if isinstance(out, DTensor) else out


def _distribute(data, mesh, placements):
    """distribute_tensor, keeping a wrapper tensor subclass whose one inner tensor has its shape (torchao's
    float8-gathering weight under --fp8's FSDP2 all-gather): a _StridedShard split goes through ops the subclass does
    not carry over, which hand back plain shards (GPT-2's fused QKV), so the inner tensor is split and each shard
    wrapped again by the subclass's own protocol (__tensor_flatten__ / __tensor_unflatten__)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    split = distribute_tensor(data, mesh, placements)
    flatten = getattr(type(data), "__tensor_flatten__", None)
    if flatten is None or type(split.to_local()) is type(data):
        return split
    names, spec = data.__tensor_flatten__()
    inner = getattr(data, names[0])
    if len(names) != 1 or inner.shape != data.shape:
        return split
    local = distribute_tensor(inner, mesh, placements).to_local()
    wrapped = type(data).__tensor_unflatten__({names[0]: local}, spec, local.shape, local.stride())
    return DTensor.from_local(wrapped, mesh, placements, run_check=False, shape=data.shape, stride=data.stride())


def _colwise(module, mesh, fused: int = 1) -> None:
    """Split by output columns: the input arrives whole (replicated), the output leaves as this rank's columns."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    out_dim, _ = _weight_dims(module)
    weight = _StridedShard(out_dim, split_factor=fused) if fused > 1 else Shard(out_dim)
    bias = Replicate() if fused > 1 else Shard(0)
    module.weight = torch.nn.Parameter(_distribute(module.weight.data, mesh, [weight]))
    if module.bias is not None:  # Llama's projections have none
        module.bias = torch.nn.Parameter(distribute_tensor(module.bias.data, mesh, [bias]))
    module.register_forward_pre_hook(
        lambda m, args: (DTensor.from_local(args[0], mesh, [Replicate()], run_check=False), *args[1:]))
    module.register_forward_hook(lambda m, args, out: _local(out))


def _rowwise(module, mesh) -> None:
    """Split by input rows: the input arrives as this rank's columns, the partial outputs are summed (all-reduce)."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    _, in_dim = _weight_dims(module)
    module.weight = torch.nn.Parameter(_distribute(module.weight.data, mesh, [Shard(in_dim)]))
    if module.bias is not None:
        module.bias = torch.nn.Parameter(distribute_tensor(module.bias.data, mesh, [Replicate()]))
    module.register_forward_pre_hook(
        lambda m, args: (DTensor.from_local(args[0], mesh, [Shard(args[0].dim() - 1)], run_check=False), *args[1:]))
    module.register_forward_hook(lambda m, args, out: out.redistribute(mesh, [Replicate()]).to_local())


def _replicate(module, mesh, converted: dict) -> None:
    """Every rank holds the whole parameter (a Replicate DTensor, the group's first rank's broadcast; tied parameters
    stay one tensor) and computes on whole inputs."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    for name, param in list(module.named_parameters(recurse=False)):
        if id(param) not in converted:
            converted[id(param)] = torch.nn.Parameter(
                distribute_tensor(param.data, mesh, [Replicate()]), requires_grad=param.requires_grad)
        setattr(module, name, converted[id(param)])

    def inputs(m, args):
        return tuple(DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                     if isinstance(a, torch.Tensor) and not isinstance(a, DTensor) else a for a in args)

    module.register_forward_pre_hook(inputs)
    module.register_forward_hook(lambda m, args, out: _local(out))


def _per_head(module, mesh) -> None:
    """A module applied to each head alone (Qwen3's q/k norms, their weights one head wide): its parameters whole on
    every rank (Replicate), its input this rank's heads - a (..., heads, head_dim) view, Shard on the heads dimension.
    The weight's gradient is then a sum over heads that lie on several ranks, which DTensor completes over the group
    (transformers' replicated_with_grad_allreduce); fed as Replicate, each rank would step on its own heads' share."""
    from torch.distributed.tensor import Replicate

    _on_split_input(module, mesh, Replicate(), from_end=2)


def _colwise_norm(module, mesh) -> None:
    """A norm over a column-parallel output (OLMo 2's q/k norms, as wide as the queries and keys): its weight split as
    that output (Shard(0)), its input this rank's columns (Shard on the last dimension). DTensor reduces the mean
    square over the whole width - one all-reduce of b·s values, 1/h of a block's - and its backward likewise."""
    from torch.distributed.tensor import Shard

    _on_split_input(module, mesh, Shard(0), from_end=1)


def _on_split_input(module, mesh, placement, from_end: int) -> None:
    """`module`'s own parameters placed as `placement`, and its input - this rank's local slice - taken as sharded on
    its dimension `from_end` from the last; its output handed on local."""
    import torch
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    for name, param in list(module.named_parameters(recurse=False)):
        setattr(module, name, torch.nn.Parameter(distribute_tensor(param.data, mesh, [placement])))
    module.register_forward_pre_hook(lambda m, args: (
        DTensor.from_local(args[0], mesh, [Shard(args[0].dim() - from_end)], run_check=False), *args[1:]))
    module.register_forward_hook(lambda m, args, out: _local(out))


def _vocab_parallel(model, mesh) -> None:
    """The word embedding and the LM head split by vocabulary rows (Shard(0)) as Megatron splits them - one parameter
    when the head is tied to the embedding, two when not (Llama's): the embedding's partial lookups are summed
    (all-reduce); the head's logits, split by vocabulary, are gathered whole for the Trainer's loss."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    weight = torch.nn.Parameter(distribute_tensor(embedding.weight.data, mesh, [Shard(0)]))
    embedding.weight = weight
    split = [embedding, head] if head is not None else [embedding]
    if tied:
        head.weight = weight
    else:
        if head is not None:
            head.weight = torch.nn.Parameter(distribute_tensor(head.weight.data, mesh, [Shard(0)]))
        # DTensor's embedding backward hands a vocabulary-sharded weight a whole (Replicate) gradient, V x h on every
        # rank (tied to the head, its sum with the head's is sharded): Megatron's lookup instead
        embedding.forward = types.MethodType(_vocab_parallel_lookup, embedding)
        split.remove(embedding)
    for module in split:
        module.register_forward_pre_hook(
            lambda m, args: (DTensor.from_local(args[0], mesh, [Replicate()], run_check=False), *args[1:]))
        module.register_forward_hook(lambda m, args, out: out.redistribute(mesh, [Replicate()]).to_local())


def _vocab_parallel_lookup(embedding, input_ids):
    """Megatron's VocabParallelEmbedding on a Shard(0) weight: each rank looks up the ids among its own rows (the others
    zero), and the partial outputs are summed. Its backward leaves each rank its own rows' gradient, a Shard(0)
    DTensor like the weight."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate

    weight = embedding.weight
    mesh, local = weight.device_mesh, weight.to_local()
    start = mesh.get_local_rank() * -(-weight.shape[0] // mesh.size())  # torch.chunk's rows: ceil(V / TP) a rank
    outside = (input_ids < start) | (input_ids >= start + local.shape[0])
    rows = torch.nn.functional.embedding(torch.where(outside, 0, input_ids - start), local)
    rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
    return DTensor.from_local(rows, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()]).to_local()


def apply_tensor_parallel(model, mesh, spec):
    """Split `model` (a causal LM of family `spec`) over the 1-D TP `mesh` in place, by the family's tp_plan; returns
    it. Every parameter becomes a DTensor on the mesh's device (tp_placements lists them), its values the group's
    first rank's: distribute_tensor scatters (or broadcasts) from there, so the other ranks may hold no weights
    (run/construction.builds_whole), and a model on the host reaches the device one tensor at a time. Its buffers stay
    where they are."""
    tp = mesh.size()
    if model.config.num_attention_heads % tp:
        raise ValueError(f"TP {tp} does not divide the {model.config.num_attention_heads} attention heads")
    for block in model.get_submodule(spec.block_prefix):
        for name, style in spec.tp_plan.items():
            module = block.get_submodule(name)
            if style == "colwise_norm":
                _colwise_norm(module, mesh)
            elif style.startswith("colwise"):
                _colwise(module, mesh, fused=3 if style.endswith("fused3") else 1)
            elif style == "per_head":
                _per_head(module, mesh)
            else:
                _rowwise(module, mesh)
        spec.adapt_attention_for_tp(block.get_submodule(spec.attention_module), tp, mesh.get_local_rank())
    _vocab_parallel(model, mesh)
    converted: dict = {}
    for module in model.modules():
        if any(not _is_dtensor(p) for p in module.parameters(recurse=False)):
            _replicate(module, mesh, converted)
    return model


def _is_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def tp_placements(model) -> dict[str, str]:
    """{parameter name: its DTensor placements} - what the start-up proof compares with the plan ("plain" for a
    parameter that is not a DTensor)."""
    return {name: (str(tuple(p.placements)) if _is_dtensor(p) else "plain") for name, p in model.named_parameters()}


# ---- checkpoints of tp and fsdp_tp -------------------------------------------------------------------------------------

TP_OPTIMIZER_FILE = "optimizer_tp.pt"  # the optimizer's states gathered whole (rank 0 writes it)


def _gathered(tensor):
    """A DTensor whole. Collective. fsdp_tp's 2-D tensors are gathered one mesh dimension at a time, undoing how they
    were made: FSDP2's shards of this rank's TP slice first (it chunked that slice along one dimension), then the TP
    slices by the plan's own placement. DTensor's one-call gather scrambled GPT-2's fused QKV weight under --fp8,
    sharded twice along its dimension 0 (_StridedShard over FSDP2's and TP's, torch 2.13)."""
    from torch.distributed.tensor import DTensor, Shard

    if tensor.device_mesh.ndim != 2:
        return tensor.full_tensor()
    (shard_mesh, tp_mesh), (sharded, split) = _mesh_dims(tensor), tensor.placements
    shape = _tp_slice_shape(tensor)
    tp_slice = DTensor.from_local(tensor.to_local(), shard_mesh, [Shard(sharded.dim)], run_check=False, shape=shape,
                                  stride=_contiguous_stride(shape)).full_tensor()
    return DTensor.from_local(tp_slice, tp_mesh, [split], run_check=False, shape=tensor.shape,
                              stride=tensor.stride()).full_tensor()


def _distributed(full, like):
    """`full` cut into this rank's slices of DTensor `like` (its mesh and placements), the inverse of _gathered."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = full.to(like.device_mesh.device_type)
    if like.device_mesh.ndim != 2:
        return distribute_tensor(full, like.device_mesh, like.placements)
    (shard_mesh, tp_mesh), (sharded, split) = _mesh_dims(like), like.placements
    tp_slice = distribute_tensor(full, tp_mesh, [split]).to_local()
    local = torch.chunk(tp_slice, shard_mesh.size(), dim=sharded.dim)[shard_mesh.get_local_rank()]
    return DTensor.from_local(local.contiguous(), like.device_mesh, like.placements, run_check=False, shape=like.shape,
                              stride=like.stride())


def _mesh_dims(tensor):
    mesh = tensor.device_mesh
    return mesh[mesh.mesh_dim_names[0]], mesh[mesh.mesh_dim_names[1]]


def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.insert(0, step)
        step *= size
    return tuple(stride)


def _tp_slice_shape(tensor) -> tuple[int, ...]:
    shape = list(tensor.shape)
    split, tp = tensor.placements[1], tensor.device_mesh.size(1)
    if getattr(split, "dim", None) is not None:  # Shard or _StridedShard (not a Shard in torch 2.13); not Replicate
        shape[split.dim] //= tp
    return tuple(shape)


def save_optimizer(optimizer, folder, write: bool) -> None:
    """The optimizer's state dict with every DTensor state gathered whole, written by the rank that `write`s.
    Collective. (torch.distributed.checkpoint would write the slices, but refuses GPT-2's c_attn: its _StridedShard
    chunks read as overlapping in torch 2.13's save planner.) A quantized state (torchao's 8-bit AdamW under fsdp_tp:
    blocks of uint8 codes with a scale each) is gathered dequantized - DTensor cannot split it to gather it along a
    TP dimension - and its signedness kept, for load_optimizer to quantize it again."""
    import torch

    saved = optimizer.state_dict()
    whole = {index: {key: _whole(v) for key, v in state.items()} for index, state in saved["state"].items()}
    quantized = {index: {key: bool(v.to_local().signed) for key, v in state.items() if _quantized(v)}
                 for index, state in saved["state"].items()}
    if write:
        torch.save({"state": whole, "param_groups": saved["param_groups"],
                    "quantized": {i: keys for i, keys in quantized.items() if keys}}, f"{folder}/{TP_OPTIMIZER_FILE}")


def _quantized(value) -> bool:
    """A DTensor state whose shards are a quantizing tensor subclass (torchao's OptimState8bit: codes, scales, signed)."""
    import torch

    local = value.to_local() if _is_dtensor(value) else None
    return local is not None and type(local) is not torch.Tensor and hasattr(local, "signed")


def _whole(value):
    from torch.distributed.tensor import DTensor

    if not _is_dtensor(value):
        return value
    if _quantized(value):
        value = DTensor.from_local(value.to_local().dequantize(), value.device_mesh, value.placements, run_check=False,
                                   shape=value.shape, stride=value.stride())
    return _gathered(value)


def load_optimizer(optimizer, folder) -> bool:
    """Reload what save_optimizer wrote, each rank keeping its slices of every state shaped like its parameter; False
    when the checkpoint has none. A quantized state is quantized again into a state the optimizer makes as its step
    does: within the 8-bit rounding, not to the bit - torchao's signed map ends at -0.993, not -1, so a block whose
    largest magnitude is negative comes back with a scale 0.7% smaller (docs/strategies.md). The checkpoint stays
    whole, loadable on any layout."""
    import os

    import torch

    path = f"{folder}/{TP_OPTIMIZER_FILE}"
    if not os.path.isfile(path):
        return False
    saved = torch.load(path, weights_only=True)
    quantized = saved.pop("quantized", {})
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, state in saved["state"].items():
        param = params[index]
        for key, value in state.items():
            if _is_dtensor(param) and value.shape == param.shape:
                state[key] = _distributed(value, param)
                if key in quantized.get(index, {}):  # torchao's low-bit optimizers make each state with _new_buffer
                    state[key] = optimizer._new_buffer(param, quantized[index][key]).copy_(state[key])
    optimizer.load_state_dict(saved)
    return True


def full_state_dict(model) -> dict:
    """The model's state dict with every DTensor gathered whole. Collective: every rank must call it."""
    return {name: (_gathered(t) if _is_dtensor(t) else t).detach().cpu() for name, t in model.state_dict().items()}


def load_full_state_dict(model, state: dict) -> None:
    """Copy whole tensors (an HF checkpoint) into the split model: each rank keeps its own slices of every DTensor.
    Tied weights are one parameter here and may be missing from the file. Through the model's own load_state_dict, so
    its load hooks run: --fp8's GPT-2 keeps nn.Linear weights that its state dict shows in Conv1D's layout
    (run/float8.linear_projections), and each rank's slices are cut in that layout, then transposed into place."""
    slices = {}
    for name, entry in model.state_dict().items():
        if name in state:
            full = state[name].to(entry.dtype)
            slices[name] = _distributed(full, entry) if _is_dtensor(entry) else full
    model.load_state_dict(slices, strict=False)
