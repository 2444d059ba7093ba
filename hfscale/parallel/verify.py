"""Prove that the strategy running is the one asked for: ranks, wrapper, what is sharded, where it lives.

`inspect_*` read facts off the live objects; `check_*` compare them with the strategy file and raise
StrategyMismatch (a one-line error) when the run is not what the user asked for.
"""

from ..errors import HfscaleError
from ..formulas.precision import Dtypes, torch_dtype_name
from .storage import base_optimizer, local_part, stored_tensors
from .strategies import Strategy

# A shard may be a little larger than total/N (padding, uneven splits); anything near a full copy is not sharded.
SHARD_TOLERANCE = 0.1


class StrategyMismatch(HfscaleError):
    pass


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def inspect_parameters(model) -> dict:
    tensors = [local_part(p) for p in model.parameters()]
    dtensors = [p for p in model.parameters() if hasattr(p, "placements")]
    return {
        "elements_local": sum(t.numel() for t in tensors),
        "devices": sorted({str(t.device) for t in tensors}),
        "dtypes": sorted({_dtype_name(t.dtype) for t in tensors}),
        "dtensor": bool(dtensors),
        # how DTensor parameters are laid out: FSDP2 [Shard(0)] on a 1-D mesh, HSDP [Replicate(), Shard(0)] on 2-D
        "placements": sorted({str(list(p.placements)) for p in dtensors}),
        "mesh_shapes": sorted({str(list(p.device_mesh.shape)) for p in dtensors}),
    }


def inspect_weight_decay(optimizer) -> list[list]:
    """[[weight_decay, elements this rank steps with it], ...] over the optimizer's parameter groups, by weight decay.
    ZeRO-3 hands each fp32 partition to the optimizer only while it steps it (DeepSpeed's stage3.py): its partitions
    are counted from the ZeRO optimizer, by the group each belongs to."""
    base = base_optimizer(optimizer)
    tensors = [list(group["params"]) for group in base.param_groups]
    zero3 = optimizer
    while zero3 is not None and not hasattr(zero3, "sub_group_to_group_id"):
        zero3 = getattr(zero3, "optimizer", None)
    if zero3 is not None:
        tensors = [[] for _ in base.param_groups]
        for sub_group, flat in enumerate(zero3.fp32_partitioned_groups_flat):
            tensors[zero3.sub_group_to_group_id[sub_group]].append(flat)
    elements: dict[float, int] = {}
    for group, group_tensors in zip(base.param_groups, tensors):
        decay = float(group.get("weight_decay", 0.0))
        elements[decay] = elements.get(decay, 0) + sum(local_part(t).numel() for t in group_tensors)
    return [[decay, n] for decay, n in sorted(elements.items())]


def inspect_optimizer_states(optimizer) -> dict:
    """Elements, bytes, dtypes and devices of every state tensor this rank keeps (scalar step counters aside)."""
    base = base_optimizer(optimizer)
    elements = nbytes = 0
    dtypes, devices, keys = set(), set(), set()
    for state in base.state.values():
        for key, value in state.items():
            if not hasattr(value, "numel") or value.numel() <= 1:
                continue
            parts = stored_tensors(local_part(value))
            elements += parts[0].numel()  # a quantized state's codes: one per element
            for part in parts:
                nbytes += part.numel() * part.element_size()
                dtypes.add(_dtype_name(part.dtype))
                devices.add(str(part.device))
            keys.add(key)
    return {
        "optimizer": f"{type(base).__module__}.{type(base).__qualname__}",
        "elements_local": elements,
        "bytes_local": nbytes,
        "dtypes": sorted(dtypes),
        "devices": sorted(devices),
        "keys": sorted(keys),
        "factored": any(k.endswith("_row") for k in keys),
    }


def uncompiled(model_wrapped):
    """The module under torch.compile's wrapper where that wrapper is the outermost layer: accelerate compiles a DDP
    model after wrapping it (OptimizedModule(DDP(model))). FSDP2 shards the compiled module itself (its class becomes
    FSDPOptimizedModule), and DeepSpeed compiles inside its engine: both are returned as they are."""
    from torch._dynamo.eval_frame import OptimizedModule
    return model_wrapped._orig_mod if type(model_wrapped) is OptimizedModule else model_wrapped


def is_compiled(model_wrapped) -> bool:
    """torch.compile anywhere in the model: around it (accelerate; under FSDP2 inside the sharded module), around its
    blocks (accelerate's regional compilation) or in place (nn.Module.compile(): DeepSpeed's engine.compile(), and
    regional compilation under DeepSpeed)."""
    from torch._dynamo.eval_frame import OptimizedModule
    return getattr(model_wrapped, "is_compiled", None) is True or any(
        isinstance(m, OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None
        for m in model_wrapped.modules())


def inspect_wrapper(model_wrapped) -> dict:
    """The data-parallel wrapper, its engine settings, and whether the model is compiled."""
    compiled = is_compiled(model_wrapped)
    model_wrapped = uncompiled(model_wrapped)
    facts = {"wrapper": type(model_wrapped).__name__, "compiled": compiled}
    if hasattr(model_wrapped, "zero_optimization_stage"):  # DeepSpeedEngine
        facts["zero_stage"] = model_wrapped.zero_optimization_stage()
        facts["offload_optimizer"] = bool(model_wrapped.zero_offload_optimizer())
        facts["offload_param"] = bool(model_wrapped.zero_offload_param())
    if hasattr(model_wrapped, "_get_fsdp_state"):  # FSDP2 root module
        dtype = model_wrapped._get_fsdp_state()._mp_policy.param_dtype
        facts["fsdp_param_dtype"] = _dtype_name(dtype) if dtype is not None else "float32"
        # the offload policy each fully_shard unit was built with (OffloadPolicy: none; CPUOffloadPolicy: host)
        groups = [m._get_fsdp_state()._fsdp_param_group for m in model_wrapped.modules() if hasattr(m, "_get_fsdp_state")]
        facts["fsdp_offload_policy"] = sorted({type(g.offload_policy).__name__ for g in groups if g is not None})
    return facts


def _placement_dim(placement) -> int | None:
    """The tensor dimension a DTensor placement splits (Shard, _StridedShard), None for Replicate."""
    return getattr(placement, "dim", None)


def inspect_tensor_parallel(model, shape, tp: int) -> dict:
    """Every parameter's placements against the TP plan (its family's tp_plan, ModelSpec.tp_split_dim): on the mesh's
    "tp" dimension a split parameter must be sharded on its split dimension and every other one replicated; on a
    data-parallel dimension (fsdp_tp's "dp_shard") FSDP2 shards dim 0. (The elements this rank holds are compared with
    the plan's count by the caller, from inspect_parameters.)"""
    from transformers.pytorch_utils import Conv1D

    mismatches, checked = [], 0
    for name, p in model.named_parameters():
        owner = model.get_submodule(name.rpartition(".")[0])
        mesh = getattr(p, "device_mesh", None)
        names = tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()
        if "tp" not in names:
            mismatches.append(f"{name}: not a DTensor on a mesh with a tp dimension")
            continue
        placements = dict(zip(names, p.placements))
        want = shape.spec.tp_split_dim(name, conv1d=isinstance(owner, Conv1D))  # --fp8 made GPT-2's nn.Linear
        got = _placement_dim(placements["tp"])
        if got != want or mesh["tp"].size() != tp:
            mismatches.append(f"{name}: {placements['tp']} over tp {mesh['tp'].size()}, the plan says "
                              f"{'Replicate' if want is None else f'Shard({want})'} over tp {tp}")
        for dim, placement in placements.items():
            if dim != "tp" and _placement_dim(placement) != 0:
                mismatches.append(f"{name}: {placement} on {dim}, not FSDP2's Shard(0)")
        checked += 1
    return {"checked": checked, "mismatches": mismatches[:5], "mesh_dims": sorted(
        {str(tuple(p.device_mesh.mesh_dim_names)) for p in model.parameters() if hasattr(p, "device_mesh")})}


def check_batches_follow_the_mesh(digests: list, tp: int, strategy: Strategy) -> None:
    """Every data-parallel rank must train on its own samples (the DeepSpeed-on-CPU trap gives all the same), and
    under TP the ranks of one TP group (tp consecutive ranks: tp is the mesh's innermost dimension) on the same ones."""
    groups = [digests[i:i + tp] for i in range(0, len(digests), tp)]
    split = [g for g in groups if len({tuple(d) for d in g}) > 1]
    require(not split, f"the ranks of one TP group trained on different first batches {split[0] if split else ''}",
            strategy)
    firsts = [tuple(g[0]) for g in groups]
    require(len(set(firsts)) == len(firsts), f"every data-parallel rank trained on the same first batch "
            f"{list(firsts[0])}: the data is not sharded", strategy)


def require(ok: bool, what: str, strategy: Strategy) -> None:
    if not ok:
        raise StrategyMismatch(f"strategy {strategy.name!r} is not what is running: {what}")


def check_world(facts: dict, strategy: Strategy) -> None:
    sizes = {facts["world_size_launcher"], facts["world_size_accelerate"], facts["world_size_torch"]}
    require(len(sizes) == 1, f"world sizes disagree (launcher {facts['world_size_launcher']}, accelerate "
             f"{facts['world_size_accelerate']}, torch.distributed {facts['world_size_torch']})", strategy)


def check_wrapper(facts: dict, strategy: Strategy, world_size: int) -> None:
    wrapper = facts["wrapper"]
    require(wrapper != "DataParallel", "the model is in nn.DataParallel (one process driving several GPUs); launch "
            "one process per GPU", strategy)
    expected_type = {"deepspeed": "DEEPSPEED", "fsdp": "FSDP"}.get(strategy.engine)
    if expected_type:  # accelerate's own view, which decides its save, clipping and accumulation paths
        require(facts["distributed_type"] == expected_type,
                 f"accelerate runs as {facts['distributed_type']}, not {expected_type}", strategy)
    if strategy.engine == "deepspeed":
        require(wrapper == "DeepSpeedEngine", f"model is wrapped in {wrapper}, not DeepSpeedEngine", strategy)
        require(facts["zero_stage"] == strategy.zero_stage, f"ZeRO stage is {facts['zero_stage']}", strategy)
        require(facts["offload_optimizer"] == strategy.offloads_state("optimizer_states"),
                 f"optimizer offload is {facts['offload_optimizer']}", strategy)
        require(facts["offload_param"] == strategy.offloads_state("parameters"),
                 f"parameter offload is {facts['offload_param']}", strategy)
    elif strategy.engine == "fsdp":
        params = facts["parameters"]
        require(params["dtensor"], f"parameters are not FSDP2 DTensors (wrapper {wrapper})", strategy)
        if not strategy.tensor_parallel:  # fsdp_tp's placements are checked parameter by parameter below
            mesh = facts.get("mesh") or [world_size]
            want = ["[Replicate(), Shard(dim=0)]"] if strategy.hybrid else ["[Shard(dim=0)]"]
            require(params["placements"] == want and params["mesh_shapes"] == [str(list(mesh))],
                    f"parameters are laid out {params['placements']} on meshes {params['mesh_shapes']}, not {want} on "
                    f"{list(mesh)}", strategy)
        want = ["CPUOffloadPolicy"] if strategy.offloads_state("parameters") else ["OffloadPolicy"]
        require(facts.get("fsdp_offload_policy") == want,
                f"FSDP2 units were built with {facts.get('fsdp_offload_policy')}, not {want}", strategy)
    elif strategy.tensor_parallel:  # tp: one TP group, no data-parallel wrapper at all
        require(wrapper != "DistributedDataParallel", "the TP model is wrapped in DDP", strategy)
    elif world_size > 1:
        require(wrapper == "DistributedDataParallel", f"model is wrapped in {wrapper}, not DDP", strategy)
    if strategy.tensor_parallel:
        mismatches = facts["tensor_parallel"]["mismatches"]
        require(not mismatches, f"{len(mismatches)} parameter(s) are not laid out as the TP plan says, e.g. "
                f"{mismatches[0] if mismatches else ''}", strategy)


def check_compiled(facts: dict, strategy: Strategy, torch_compile: bool) -> None:
    """--torch_compile (on by default for ddp on GPUs) must reach the model, and only then."""
    require(facts["compiled"] == torch_compile, f"torch_compile is {torch_compile} but the model is "
            f"{'compiled' if facts['compiled'] else 'not compiled'}", strategy)


def check_precision(facts: dict, strategy: Strategy, dtypes: Dtypes) -> None:
    """The plan's dtypes (RunPlan.dtypes: --bf16/--fp16 on the strategy's engine) must be the engine's: DDP keeps fp32
    master weights under autocast, DeepSpeed trains a copy in the compute dtype (fp32 masters in its optimizer), FSDP2
    has no autocast and computes in its mixed-precision policy's param_dtype."""
    want = torch_dtype_name(dtypes.parameters)
    if strategy.engine == "ddp":
        got = facts["parameters"]["dtypes"]
        require(got == [want], f"DDP trains {got} weights, not {dtypes.parameters} masters (under autocast)", strategy)
    elif strategy.engine == "deepspeed":
        got = facts["parameters"]["dtypes"]
        require(got == [want], f"DeepSpeed trains {got} weights, not {want}", strategy)
    elif strategy.engine == "fsdp":
        got, want = facts.get("fsdp_param_dtype"), torch_dtype_name(dtypes.compute)
        require(got == want, f"FSDP computes in {got}, not {want}", strategy)


def check_sharded(kind: str, local: int, total: int, shard_ranks: int, strategy: Strategy) -> None:
    """Per-rank elements must be ~total/N where the strategy shards `kind` over N ranks (the world, or a node's
    processes under HSDP), and ~total where it does not."""
    if total == 0:  # a model sharded while it was built still counts its whole size (models.parameter_count)
        raise StrategyMismatch(f"{kind}: no elements counted for the whole model; the sharding check cannot run")
    if shard_ranks == 1:
        return
    fraction = local / total
    if strategy.shards_state(kind):
        ok = fraction <= 1 / shard_ranks + SHARD_TOLERANCE
        what = f"{kind} are not sharded: this rank holds {fraction:.0%} of them ({local:,} of {total:,})"
    else:
        ok = fraction >= 1 - SHARD_TOLERANCE
        what = f"{kind} are unexpectedly sharded: this rank holds {fraction:.0%} ({local:,} of {total:,})"
    require(ok, what, strategy)


CPU_ADAM = "DeepSpeedCPUAdam"


def check_optimizer_engine(optimizer_class: str, strategy: Strategy) -> None:
    """ZeRO-Offload steps on the host in DeepSpeed's CPU Adam; the other DeepSpeed strategies must not."""
    if strategy.engine != "deepspeed":
        return
    on_host = optimizer_class.endswith(CPU_ADAM)
    if strategy.offloads_state("optimizer_states"):
        require(on_host, f"the optimizer step runs in {optimizer_class}, not DeepSpeed's {CPU_ADAM}", strategy)
    else:
        require(not on_host, f"the optimizer step runs in {optimizer_class} on the host", strategy)


def check_placement(kind: str, devices: list[str], strategy: Strategy, on_accelerator: bool) -> None:
    """Offloaded states must live on the CPU (on a CPU-only machine everything does, so that proves nothing more)."""
    if strategy.offloads_state(kind):
        require(devices == ["cpu"], f"{kind} should be offloaded to CPU but live on {devices}", strategy)
    elif on_accelerator and devices:
        require("cpu" not in devices, f"{kind} should be on the device but live on {devices}", strategy)


