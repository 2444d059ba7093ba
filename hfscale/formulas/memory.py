"""Bytes per rank of a training step, before launch: weights, gradients, optimizer states, fp32 masters,
activations, communication buffers and a runtime allowance on the device; offloaded states and model construction
in host RAM (the activations' model: formulas/activations.py). Pure functions, no torch at import (the memory check in
tests/ compares them with what the engines really hold; docs/estimate.md has the table).

Conventions: N = data-parallel ranks; a "partition" is what one rank stores of a sharded tensor or group. Every
per-rank figure is for the rank that stores the most (rank 0 where partitions are uneven), since that rank runs
out of memory first. Bytes, not GiB; GB = 1e9.
"""

from dataclasses import asdict, dataclass, field
from math import ceil

from .activations import activation_mode, activations
from .metrics import GB, ModelShape
from .precision import float8_block_elements, storage_dtype
from .tensors import Tensor, block_numel, parameter_tensors, tp_local_tensors

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# ---- optimizer states (per element of the tensor the optimizer steps) ------------------------------------------
ADAMW_STATE_BYTES = 8  # torch AdamW: exp_avg + exp_avg_sq in fp32 (the step counter is a scalar)
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer2State: tensors with fewer elements keep two fp32 states
BNB_BLOCK = 256  # bitsandbytes blockwise quantization: one fp32 absmax per 256 elements, for each of the 2 states
BNB_QMAP_BYTES = 2 * 256 * 4  # the two 256-entry fp32 quantization maps, shared by every tensor on a device
BNB_EMBEDDINGS_32BIT = True  # transformers' Trainer registers 32-bit states for nn.Embedding weights with every
# bitsandbytes optimizer (trainer.py: manager.register_module_override(module, "weight", {"optim_bits": 32})); it
# cannot reach DeepSpeed's flat partitions, which stay 8-bit.
TORCHAO_MIN_8BIT_SIZE = 4096  # torchao AdamW8bit (fsdp*): a tensor (shard) is quantized when it has >= 4096
TORCHAO_BLOCK = 256  # elements and a whole number of 256-element blocks; otherwise its two states are fp32. Each
TORCHAO_QMAP_BYTES = 256 * 4  # quantized state keeps its own 256-entry fp32 map beside 1 B codes and a 4 B scale/block
ADAFACTOR_STATE_BYTES = 4  # transformers Adafactor: fp32 row/col statistics (>= 2-D) or one per element (1-D);
# the Trainer passes no beta1, so there is no first moment.

# ---- the optimizer step: device bytes read and written per element it steps (one step, each kernel's passes) -------
# torch's fused AdamW and DeepSpeed's FusedAdam: one pass reading the fp32 weight, gradient, exp_avg and exp_avg_sq
# and writing weight and both states; bitsandbytes' 8-bit kernel and torchao's compiled AdamW8bit the same pass over
# 1-byte states (their per-block scales are 1/64 of that); transformers' Adafactor is elementwise torch ops over a
# matrix: the weight's RMS, grad**2 + eps (two), the row and column means, their outer product, its product with the
# gradient, the update's RMS, the clip division, the lr scaling, the negation and the weight update. Counted op by op
# on the real optimizers: tests/test_memory.py.
OPTIMIZER_STEP_BYTES = {"adamw": 28, "bnb_8bit": 16, "torchao_8bit": 16, "adafactor": 84}

# ---- engines ---------------------------------------------------------------------------------------------------
MASTER_BYTES = 4  # DeepSpeed ZeRO keeps an fp32 partition of the weights for the optimizer, in fp32 runs too
# (stage_1_and_2.py single_partition_of_fp32_groups, stage3.py fp32_partitioned_groups_flat).
DDP_BUCKET_COPIES = 1  # torch DDP copies every gradient into flat bucket buffers (gradient_as_bucket_view=False,
# accelerate's default): one more full gradient.
FSDP_PREFETCH_UNITS = 2  # FSDP2 all-gathers the next block while computing the current one
ZERO_BUCKETS_IN_FLIGHT = 2  # DeepSpeed overlap_comm double-buffers its reduce bucket (1 without overlap_comm)

# ---- what torch's allocator does not count, stated as such ---------------------------------------------------------
RUNTIME_ALLOWANCE_BYTES = 1.0 * GB  # CUDA context, cuBLAS/NCCL workspaces: outside the allocator's statistics
FRAGMENTATION = 0.05  # reserved-but-unallocated memory of the caching allocator, as a fraction of the total


# ---- optimizer states -----------------------------------------------------------------------------------------------

OPTIMIZER_RULES = ("adamw", "adafactor", "bnb_8bit", "torchao_8bit")


def optimizer_state_bytes(rule: str, tensor_shapes: list[tuple[int, ...]], full_precision: list[bool] | None = None) -> int:
    """State bytes of an optimizer stepping these tensors (each as the optimizer sees it: whole, a DTensor shard, or one
    of DeepSpeed's flat 1-D partitions), by its memory rule (each optimizer's rule per engine: parallel/optimizers.py):
    adamw (torch AdamW), adafactor (transformers' Adafactor), bnb_8bit (bitsandbytes' AdamW8bit; `full_precision[i]`:
    it keeps 32-bit states for tensor i; its shared quantization maps are not included, BNB_QMAP_BYTES), torchao_8bit
    (torchao's AdamW8bit)."""
    if rule not in OPTIMIZER_RULES:
        raise ValueError(f"unknown optimizer memory rule {rule!r}; known: {', '.join(OPTIMIZER_RULES)}")
    total = 0
    for i, dims in enumerate(tensor_shapes):
        n = 1
        for d in dims:
            n *= d
        if n == 0:
            continue
        if rule == "adamw":
            total += ADAMW_STATE_BYTES * n
        elif rule == "torchao_8bit":
            quantized = n >= TORCHAO_MIN_8BIT_SIZE and n % TORCHAO_BLOCK == 0
            total += 2 * (n + 4 * (n // TORCHAO_BLOCK) + TORCHAO_QMAP_BYTES) if quantized else 2 * 4 * n
        elif rule == "bnb_8bit":
            fp32 = n < BNB_MIN_8BIT_SIZE or (full_precision is not None and full_precision[i])
            total += 2 * 4 * n if fp32 else 2 * n + 2 * 4 * ceil(n / BNB_BLOCK)
        elif len(dims) >= 2:  # adafactor: a row and a column statistic per matrix
            total += ADAFACTOR_STATE_BYTES * (n // dims[-1] + n // dims[-2])
        else:
            total += ADAFACTOR_STATE_BYTES * n
    return total


# ---- how a strategy lays the model out --------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """What the memory model needs to know about a strategy (hfscale.plan maps strategies/*.yaml onto this)."""

    engine: str  # ddp | fsdp | deepspeed
    zero_stage: int | None = None
    offload_optimizer: bool = False  # optimizer states (and DeepSpeed's fp32 masters and fp32 gradients) on the host
    offload_params: bool = False  # parameter partitions on the host
    reduce_bucket: int = 0  # DeepSpeed reduce_bucket_size, elements
    allgather_bucket: int = 0  # DeepSpeed allgather_bucket_size (ZeRO-1/2), elements
    prefetch_bucket: int = 0  # DeepSpeed stage3_prefetch_bucket_size, elements
    overlap_comm: bool = False  # DeepSpeed double-buffers its reduce bucket to overlap reduction with the backward
    # what the communication model reads (formulas/comm.py): ZeRO-1/2 all-reduce whole gradient buckets
    # (use_multi_rank_bucket_allreduce, or reduce_scatter off) rather than reduce each slice to its owner; ZeRO-3
    # keeps parameters of at most persistence_threshold elements whole, and keeps a gathered parameter from the forward
    # into the backward when it is used again within max_reuse_distance elements
    bucket_all_reduce: bool = True
    persistence_threshold: int = 0  # stage3_param_persistence_threshold, elements
    max_reuse_distance: int = 0  # stage3_max_reuse_distance, elements
    communication_dtype: str | None = None  # DeepSpeed's communication_data_type (None: the training dtype)


def zero_groups(tensors: list[Tensor]) -> list[int]:
    """Elements of the Trainer's two parameter groups (decay, no decay): DeepSpeed flattens each into one tensor."""
    decay = sum(t.numel for t in tensors if t.decays)
    return [n for n in (decay, sum(t.numel for t in tensors) - decay) if n]


def zero_gradient_buffer(tensors: list[Tensor], ranks: int) -> int:
    """Elements of the ZeRO-2 gradient buffer of the rank that holds the most (DeepSpeed 0.19 stage_1_and_2.py,
    contiguous_gradients): each parameter group is flattened and cut into N slices (the group padded to a multiple
    of 2N), and a rank keeps the *whole* gradient of every tensor that starts in its slice or straddles into it
    (get_partition_info) - 1/N of the model plus the tensors cut by its slice's edges. A rank whose slice cuts a large
    embedding holds much more than 1/N on a small model."""
    held = [0] * ranks
    for decays in (True, False):
        group = [t.numel for t in tensors if t.decays == decays]
        if not group:
            continue
        size = ceil(sum(group) / (2 * ranks)) * 2  # the aligned group over N ranks
        start = 0
        for numel in group:
            for rank in range(start // size, min((start + numel - 1) // size, ranks - 1) + 1):
                held[rank] += numel
            start += numel
    return max(held)


def shard_rows(dims: tuple[int, ...], ranks: int) -> tuple[int, ...]:
    """FSDP2 shards dim 0 in chunks of ceil(d0/N) rows; rank 0 holds a full chunk."""
    return (min(dims[0], ceil(dims[0] / ranks)), *dims[1:])


@dataclass
class RankMemory:
    """Bytes on one rank's device (and its share of host RAM) for one micro-batch size."""

    parameters: int = 0
    gradients: int = 0
    master_weights: int = 0
    optimizer_states: int = 0
    activations: int = 0  # what autograd keeps after the forward
    activation_peak: int = 0  # activations + what the backward's start adds (the step's transient peak)
    comm_buffers: int = 0
    host: dict = field(default_factory=dict)  # per rank, in host RAM: the offloaded part of each component
    activation_calibration: str = ""  # which measurements the activation figures come from (activations)
    # bytes (of the gradients and comm buffers above) that exist only after the activation peak: created in the
    # backward as the activations are freed, and freed again by the step (see rank_memory)
    after_peak: int = 0
    # under checkpointing, the activations alive at the end of the backward beside those gradients (Activations)
    backward_end: int = 0
    # what the allocator does not count, on CUDA only (a CPU run has neither: rank_memory sets them by the route)
    fragmentation: float = FRAGMENTATION
    runtime_allowance: int = int(RUNTIME_ALLOWANCE_BYTES)

    @property
    def host_offload(self) -> int:
        return sum(self.host.values())

    def component(self, name: str) -> int:
        """A model-state component wherever it lives (device + host): what the engine holds of it in all."""
        return getattr(self, name) + self.host.get(name, 0)

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.master_weights + self.optimizer_states

    @property
    def step_peak(self) -> int:
        """What a step adds above the states and buffers that outlive it: the larger of the activation peak (the start
        of the backward) and the gradients that only exist after it, with - under checkpointing - the last recomputed
        block and the checkpoints beside them."""
        return max(self.activation_peak, self.after_peak + self.backward_end)

    @property
    def allocated(self) -> int:
        """What torch's allocator would report as the step's peak: the model states and buffers, and the step's own."""
        return self.model_states + self.comm_buffers - self.after_peak + self.step_peak

    @property
    def device_total(self) -> int:
        """allocated + fragmentation + the runtime allowance: compare with the device's memory."""
        return int(self.allocated * (1 + self.fragmentation) + self.runtime_allowance)

    def as_dict(self) -> dict:
        return {**asdict(self), "model_states": self.model_states, "step_peak": self.step_peak, "allocated": self.allocated,
                "device_total": self.device_total, "host_offload": self.host_offload}


def _offload(mem: RankMemory, *names: str) -> None:
    for name in names:
        mem.host[name] = mem.host.get(name, 0) + getattr(mem, name)
        setattr(mem, name, 0)


def model_state_bytes(shape: ModelShape, layout: Layout, optimizer_rule: str, precision: str, ranks: int,
                      grad_accum: int = 1, tp: int = 1) -> RankMemory:
    """Parameters, gradients, fp32 masters and optimizer states per rank (rank 0), and where they live. With gradient
    accumulation under accelerate's no_sync (grad_accum > 1: the micro-batches accumulated before the reduction,
    RunPlan.unreduced_micro_batches) FSDP2 keeps unsharded gradients between micro-batches. Under
    TP (tp > 1) each rank starts from its TP slices (tp_local_tensors), which FSDP shards further over `ranks`."""
    tensors = tp_local_tensors(shape, tp)
    P = sum(t.numel for t in tensors)
    train = DTYPE_BYTES[precision]
    embeddings_32bit = [BNB_EMBEDDINGS_32BIT and t.is_embedding for t in tensors]
    mem = RankMemory()
    if layout.engine == "ddp":  # fp32 weights (autocast casts on the fly), fp32 gradients, full optimizer states
        mem.parameters, mem.gradients = 4 * P, 4 * P
        mem.optimizer_states = optimizer_state_bytes(optimizer_rule, [t.shape for t in tensors], embeddings_32bit)
    elif layout.engine == "fsdp":  # fp32 DTensor shards of parameters, gradients and states
        shards = [shard_rows(t.shape, ranks) for t in tensors]
        local = sum(Tensor("", s).numel for s in shards)
        mem.parameters, mem.gradients = 4 * local, 4 * local
        mem.optimizer_states = optimizer_state_bytes(optimizer_rule, shards)
        if layout.offload_params:  # FSDP2 CPUOffloadPolicy: shards, gradients and the optimizer step on the host
            _offload(mem, "parameters", "gradients", "optimizer_states")
        if grad_accum > 1:  # no_sync: whole gradients in the compute dtype on the device until the last micro-batch
            mem.gradients = train * P  # reduce-scatters them (then freed), measured: tests/test_gradient_partitions.py
    else:  # DeepSpeed: the module in the training dtype, fp32 master partitions, the optimizer on flat partitions
        groups = [ceil(n / ranks) for n in zero_groups(tensors)]
        partition = sum(groups)
        if layout.zero_stage == 3:
            mem.parameters = train * sum(ceil(t.numel / ranks) for t in tensors)
            mem.gradients = train * partition
        else:
            mem.parameters = train * P
            # ZeRO-1 keeps every full gradient through the backward (and between accumulated micro-batches); ZeRO-2
            # reduces them as they come and keeps its slice's tensors (measured: tests/test_gradient_partitions.py)
            mem.gradients = train * (P if layout.zero_stage == 1 else zero_gradient_buffer(tensors, ranks))
        mem.master_weights = MASTER_BYTES * partition
        mem.optimizer_states = optimizer_state_bytes(optimizer_rule, [(g,) for g in groups])
        if layout.offload_optimizer:  # DeepSpeed's CPU Adam steps the fp32 masters with an fp32 gradient on the host
            _offload(mem, "master_weights", "optimizer_states")
            mem.host["gradients"] = MASTER_BYTES * partition
            if layout.zero_stage != 3:  # ZeRO-1/2 reduce straight into the host buffer
                mem.gradients = 0
        if layout.offload_params and layout.zero_stage == 3:
            _offload(mem, "parameters")
    if optimizer_rule == "bnb_8bit":
        mem.optimizer_states += BNB_QMAP_BYTES
    return mem


def optimizer_step_bytes(mem: RankMemory, engine: str, optimizer_rule: str, precision: str) -> int:
    """Device bytes one optimizer step reads and writes on a rank (OPTIMIZER_STEP_BYTES per element it steps): DDP's
    whole fp32 model, FSDP's fp32 shards, DeepSpeed's fp32 master partition - which it then casts back into the module's
    training dtype. What an engine steps on the host (ZeRO-Offload's CPU Adam, FSDP's CPU offload) reads none."""
    if engine == "deepspeed":
        stepped = mem.master_weights // MASTER_BYTES
        return stepped * (OPTIMIZER_STEP_BYTES[optimizer_rule] + DTYPE_BYTES[precision])
    return mem.parameters // 4 * OPTIMIZER_STEP_BYTES[optimizer_rule]


def comm_buffer_bytes(shape: ModelShape, layout: Layout, precision: str, on_cuda: bool = False, replicas: int = 2,
                      tp: int = 1, float8_block: int = 0) -> int:
    """Buffers the engine allocates to communicate (the largest moment, not their sum over the step), on a rank that
    holds its TP slices of the model (tp_local_tensors) among `replicas` data-parallel ones. `float8_block`: the
    elements of a block FSDP2 gathers in float8 (--fp8's all-gather: one byte each)."""
    train = DTYPE_BYTES[precision]
    tensors = tp_local_tensors(shape, tp)
    P = sum(t.numel for t in tensors)
    block = sum(t.numel for t in tensors if t.name.startswith(f"{shape.spec.block_prefix}.0."))
    if layout.engine == "ddp":  # one replica (one process, or tp's one TP group) is not wrapped in DDP: no buckets
        return DDP_BUCKET_COPIES * 4 * P if replicas > 1 else 0
    if layout.engine == "fsdp":  # the root unit (embeddings) stays gathered; blocks are gathered one ahead
        root = P - shape.n_layer * block
        gathered = train * block - (train - 1) * float8_block
        return train * root + FSDP_PREFETCH_UNITS * gathered + 4 * block
    # ZeRO-1/2 allocate their whole reduce bucket (reduce_bucket_size elements, x2 with overlap_comm) at the first
    # gradient of every micro-step (stage_1_and_2.setup_buckets): on CUDA the allocator counts all of it - 2 GB for
    # DeepSpeed's default 5e8 fp32 elements, whatever the model (seen: the README's tiny zero1 run held 2.04 GB above
    # its states on an H100). On a CPU only the touched pages become resident: at most the model's size.
    bucket = layout.reduce_bucket if on_cuda and layout.zero_stage in (1, 2) else min(layout.reduce_bucket, P)
    reduce = bucket * (ZERO_BUCKETS_IN_FLIGHT if layout.overlap_comm else 1)
    gather = min(layout.prefetch_bucket, P) + block_numel(shape) if layout.zero_stage == 3 else 0
    return train * (reduce + gather)


# ---- one rank, all together ----------------------------------------------------------------------------------------

def rank_memory(plan) -> RankMemory:
    """Bytes per rank of one training step of `plan` (a hfscale.runplan.RunPlan: everything here is read from it), for
    the rank that holds the most. On the CUDA route the caching allocator's fragmentation and the runtime allowance
    (CUDA context, cuBLAS/NCCL workspaces) are added to the device total; a CPU run has neither."""
    layout, precision = plan.memory_layout, storage_dtype(plan.precision)
    mem = model_state_bytes(plan.shape, layout, plan.optimizer_memory_rule, precision, plan.shard_ranks,
                            plan.unreduced_micro_batches, plan.tp)
    compute = precision if layout.engine != "ddp" or precision == "fp32" else f"autocast_{precision}"
    acts = activations(plan.shape, plan.seq_len, plan.per_device_train_batch_size,
                       activation_mode(plan.shape.family, plan.attention, compute, plan.activation_checkpointing),
                       plan.device_type, plan.torch_compile, plan.tp, plan.fused_linear_cross_entropy, plan.kv_cache,
                       plan.logits_output, bool(plan.float8), plan.dropout)
    mem.activations, mem.activation_peak, mem.activation_calibration = acts.kept, acts.peak, acts.calibration
    mem.backward_end = acts.backward_end
    float8_block = float8_block_elements(plan.shape, plan.tp) if plan.float8_all_gather else 0  # a rank's TP slices
    mem.comm_buffers = comm_buffer_bytes(plan.shape, layout, precision, plan.on_cuda, plan.data_parallel_size, plan.tp,
                                         float8_block)
    # What the backward allocates after the activation peak (its start), as the activations are freed: without
    # accumulation, the gradients of ddp, fsdp and ZeRO-1/2 (torch's .grad and ZeRO-2's partition buffer, created in the
    # backward and dropped at the step; ZeRO-3's flat gradient buffer lives from the start); on CUDA, ZeRO-1/2's reduce
    # bucket (allocated at the first gradient of every micro-step). Checked against whole H100 runs
    # (tests/test_memory.py: the allocator's peak within 10%).
    if plan.gradient_accumulation_steps == 1 and (layout.engine in ("ddp", "fsdp") or layout.zero_stage in (1, 2)):
        mem.after_peak += mem.gradients
    if plan.on_cuda and layout.zero_stage in (1, 2):
        mem.after_peak += mem.comm_buffers
    if not plan.on_cuda:
        mem.fragmentation, mem.runtime_allowance = 0.0, 0
    return mem


def construction_host_bytes(shape: ModelShape, processes_per_node: int, rank0_builds: bool, shard_ranks: int,
                            shards_on_host: bool = True) -> int:
    """Host RAM of the busiest node while the model is built and sharded: a full fp32 copy per process, or - when
    only rank 0 builds it and the engine shards it out from there (fsdp* with accelerate's cpu_ram_efficient_loading,
    zero3* under zero.Init; under TP each node's first process, whose split scatters the TP slices) - one full copy
    on it and a 1/shard_ranks shard on each other process of its node, where those shards are kept on the host
    (`shards_on_host`: not a GPU run's TP slices, which the split sends to the GPU)."""
    P = sum(t.numel for t in parameter_tensors(shape))
    if not rank0_builds:
        return processes_per_node * 4 * P
    return 4 * P + (processes_per_node - 1) * 4 * ceil(P / shard_ranks) * shards_on_host


def max_micro_batch(fits, limit: int = 1 << 16) -> int:
    """The largest micro-batch b for which fits(b) holds (0 when even 1 does not); fits must be monotone."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
