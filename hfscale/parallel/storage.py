"""The bytes a rank's live engine holds - parameters, gradients (FSDP2's unsharded accumulators and DeepSpeed ZeRO's
partitions included), fp32 masters, optimizer states - each storage counted once: the independent side of the memory
estimate's checks (parallel/verify.py reads the same objects for the start-up proof)."""


def local_part(t):
    """The part of a tensor this rank stores: DTensor shards and DeepSpeed ZeRO-3 partitions included."""
    if hasattr(t, "ds_tensor"):  # ZeRO-3 parameter: t is an empty placeholder, ds_tensor the partition
        return t.ds_tensor
    return t.to_local() if hasattr(t, "to_local") else t


def stored_tensors(t) -> list:
    """The plain tensors behind a local tensor: itself, or the inner tensors of a tensor subclass, whose own dtype
    and storage are only an appearance (torchao's OptimState8bit: uint8 codes, fp32 block scales and its map; the
    float8 all-gather's WeightWithDynamicFloat8CastTensor: the high-precision weight)."""
    if type(t).__name__ != "Tensor" and hasattr(t, "__tensor_flatten__") and not hasattr(t, "to_local"):
        names, _ = t.__tensor_flatten__()
        return [inner for name in names for inner in stored_tensors(getattr(t, name))]
    return [t]


def base_optimizer(optimizer):
    """The torch optimizer holding the states, under accelerate's and DeepSpeed's wrappers."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def _tensors(obj, depth: int = 0):
    """Every tensor in obj (a tensor, or lists/tuples/dicts of them, a few levels deep)."""
    if hasattr(obj, "untyped_storage"):
        yield obj
    elif isinstance(obj, (list, tuple)) and depth < 3:
        for x in obj:
            yield from _tensors(x, depth + 1)
    elif isinstance(obj, dict) and depth < 3:
        for x in obj.values():
            yield from _tensors(x, depth + 1)


def storage_bytes(tensors, seen: set | None = None) -> int:
    """Bytes of the distinct storages behind these tensors (views and shared tensors counted once; DTensors and
    ZeRO-3 parameters by their local part). `seen` carries storages already counted elsewhere."""
    seen = set() if seen is None else seen
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        for t in stored_tensors(local_part(tensor)):
            if not hasattr(t, "untyped_storage") or t.numel() == 0:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


# DeepSpeed ZeRO optimizer attributes that hold gradients (stage 1/2: per-partition views, and the partition's
# accumulators between micro-batches; stage 3: a flat buffer) and fp32 master partitions (stage_1_and_2.py, stage3.py
# of DeepSpeed 0.19).
_ZERO_GRADIENTS = ("averaged_gradients", "all_grad_tensors", "grad_partitions_flat_buffer",
                   "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition")
_ZERO_MASTERS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")


def _fsdp_unsharded_gradients(module):
    """FSDP2 keeps the gradients it has not reduce-scattered yet (accumulation under no_sync) on its unsharded
    parameters, or in their accumulators when the reduce dtype differs (torch's _fsdp_param.py)."""
    for sub in module.modules():
        state = sub._get_fsdp_state() if hasattr(sub, "_get_fsdp_state") else None
        for group in getattr(state, "_fsdp_param_groups", None) or []:
            for fsdp_param in group.fsdp_params:
                yield fsdp_param.unsharded_accumulated_grad
                unsharded = getattr(fsdp_param, "_unsharded_param", None)
                yield None if unsharded is None else unsharded.grad


def measure_gradients(model_wrapped) -> int:
    """Bytes of gradients this rank holds (right before its optimizer step, or between accumulated micro-batches):
    the parameters' .grad (their local shard), FSDP2's unsharded gradients not yet reduce-scattered, and under
    DeepSpeed ZeRO the optimizer's gradient partitions and the fp32 masters' .grad."""
    seen: set = set()
    module = getattr(model_wrapped, "module", model_wrapped)
    total = storage_bytes((p.grad for p in module.parameters()), seen)
    total += storage_bytes(_fsdp_unsharded_gradients(module), seen)
    zero = getattr(model_wrapped, "optimizer", None) if hasattr(model_wrapped, "zero_optimization_stage") else None
    if zero is not None:
        for name in _ZERO_GRADIENTS:
            total += storage_bytes(_tensors(getattr(zero, name, None)), seen)
        masters = [m for name in _ZERO_MASTERS for m in _tensors(getattr(zero, name, None))]
        total += storage_bytes((m.grad for m in masters), seen)
    return total


def measure_model_states(model_wrapped, optimizer) -> dict:
    """Bytes of parameters, fp32 master weights and optimizer states this rank holds, wherever they live (each storage
    once): the independent side of the memory estimate's check."""
    seen: set = set()
    module = getattr(model_wrapped, "module", model_wrapped)
    out = {"parameters": storage_bytes(module.parameters(), seen)}
    zero = getattr(model_wrapped, "optimizer", None) if hasattr(model_wrapped, "zero_optimization_stage") else None
    out["master_weights"] = sum(storage_bytes(_tensors(getattr(zero, n, None)), seen) for n in _ZERO_MASTERS) if zero else 0
    base = base_optimizer(optimizer)
    out["optimizer_states"] = storage_bytes(
        (v for state in base.state.values() for v in state.values() if hasattr(v, "numel") and v.numel() > 1), seen)
    return out
