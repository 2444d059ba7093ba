"""Bytes per rank of a training step, before launch: weights, gradients, optimizer states, fp32 masters,
activations, communication buffers and a runtime allowance on the device; offloaded states and model construction
in host RAM. Pure functions, no torch at import (the memory check in tests/ compares them with what the engines
really hold; docs/estimate.md has the table).

Conventions: N = data-parallel ranks; a "partition" is what one rank stores of a sharded tensor or group. Every
per-rank figure is for the rank that stores the most (rank 0 where partitions are uneven), since that rank runs
out of memory first. Bytes, not GiB; GB = 1e9.
"""

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from math import ceil, log2

from .metrics import GB, ModelShape
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

# ---- activations --------------------------------------------------------------------------------------------------
# Bytes per element of six features (see activation_features), fitted per device to what autograd keeps after the
# forward in HF's GPT-2/BLOOM (transformers 5.23) by benchmarks/calibrate_activations.py; mode =
# family/attention/precision/checkpointing. A CPU and a GPU keep different tensors (on CUDA, SDPA's flash kernel keeps
# no s x s matrix and autocast keeps other copies), so each device has its own table:
# - cpu: 7 shapes per mode measured on the 2-core CI machine with hfscale's training forward (no KV cache; torch 2.13,
#   benchmarks/results/activations_2026-11-25.json);
# - cuda: 8 shapes per mode measured on one H100 with hfscale's training forward (torch 2.11; 2026-11-26, two leases,
#   all 18 modes) and with the KV cache (2026-11-23, 6 modes; memory.kv_cache_bytes taken off each row before the fit),
#   benchmarks/results/h100_2026-11-2{3,6,6b}/cuda_activations.jsonl: worst fit 0.1%, leave-one-out 0.9%, except
#   checkpointing with autocast (2% / 4-16%). Two rows disagreed with the rest of their mode and were set aside by the
#   fit's rule (calibrate_activations.fit_mode; docs/estimate.md). A mode with no CUDA measurement yet falls back to the
#   CPU fit and says so (RankMemory.activation_calibration); benchmarks/gpu_suite.py measures the rest.
ACTIVATION_FEATURES = ("per layer b·s·h", "per layer b·a·s²", "b·s·V logits", "b·s·h", "b·s² mask",
                       "weight matrices (autocast saves their bf16 copies)")
ACTIVATION_COEFFICIENTS: dict[str, dict[str, tuple[float, ...]]] = {
    "cpu": {
    'gpt2/eager/fp32/0': (112.228, 3.993, 3.997, 7.447, 0.379, -0.006),
    'gpt2/eager/fp32/1': (4.046, -0.001, 4.0, 7.887, 4.054, -0.001),
    'gpt2/eager/autocast_bf16/0': (60.389, 5.979, 3.982, 4.867, 1.018, 2.016),
    'gpt2/eager/autocast_bf16/1': (3.332, -0.008, 4.18, 6.297, 4.49, 0.48),
    'gpt2/eager/bf16/0': (56.295, 1.991, 3.992, 4.149, 0.491, -0.048),
    'gpt2/eager/bf16/1': (2.13, -0.011, 4.0, 3.886, 2.25, -0.003),
    'gpt2/sdpa/fp32/0': (112.256, -0.007, 3.996, 7.195, 0.382, 0.001),
    'gpt2/sdpa/fp32/1': (4.034, -0.001, 4.0, 7.977, 0.051, -0.004),
    'gpt2/sdpa/autocast_bf16/0': (60.167, -0.003, 3.99, 5.245, 0.465, 2.04),
    'gpt2/sdpa/autocast_bf16/1': (3.356, -0.016, 4.184, 6.351, 0.43, 0.485),
    'gpt2/sdpa/bf16/0': (56.217, -0.005, 3.993, 3.932, 0.535, -0.032),
    'gpt2/sdpa/bf16/1': (2.157, -0.007, 3.995, 4.307, 0.166, -0.037),
    'bloom/eager/fp32/0': (64.137, 3.995, 3.998, 11.805, 0.285, -0.008),
    'bloom/eager/fp32/1': (4.038, -0.001, 4.0, 11.967, 4.042, -0.003),
    'bloom/eager/autocast_bf16/0': (36.151, 5.994, 3.991, 9.198, 0.596, 2.041),
    'bloom/eager/autocast_bf16/1': (3.423, -0.022, 4.171, 10.446, 4.92, 0.463),
    'bloom/eager/bf16/0': (32.314, 5.98, 3.999, 5.613, 0.524, -0.011),
    'bloom/eager/bf16/1': (2.154, -0.015, 3.991, 6.271, 2.322, -0.02),
},
    "cuda": {  # the H100 grids, no KV cache (the 2026-11-23 rows with theirs taken off), SDPA without a b·a·s² term
        'gpt2/sdpa/fp32/0': (112.074, 0.0, 4.005, 7.765, -0.005, 0.004),
        'gpt2/sdpa/fp32/1': (4.008, 0.0, 4.002, 7.843, -0.012, 0.005),
        'gpt2/sdpa/autocast_bf16/0': (84.046, 0.0, 4.004, 5.955, 0.012, 2.004),
        'gpt2/sdpa/autocast_bf16/1': (1.5, 0.0, 4.267, 5.075, 0.111, 0.857),
        'gpt2/sdpa/bf16/0': (56.075, 0.0, 4.006, 3.808, -0.021, 0.003),
        'gpt2/sdpa/bf16/1': (2.019, 0.0, 4.006, 4.252, -0.263, -0.007),
        'gpt2/eager/fp32/0': (112.002, 4.002, 4.001, 7.975, -0.124, 0.004),
        'gpt2/eager/fp32/1': (3.983, 0.002, 4.002, 7.933, 3.894, 0.006),
        'gpt2/eager/autocast_bf16/0': (83.961, 6.002, 4.001, 6.118, -0.142, 2.005),
        'gpt2/eager/autocast_bf16/1': (1.224, 0.028, 4.257, 7.024, 2.457, 0.813),
        'gpt2/eager/bf16/0': (55.982, 2.001, 4.001, 4.037, -0.065, 0.005),
        'gpt2/eager/bf16/1': (1.985, 0.002, 4.001, 3.971, 1.885, 0.005),
        'bloom/eager/fp32/0': (64.0, 4.002, 4.002, 11.937, -0.114, 0.005),
        'bloom/eager/fp32/1': (3.973, 0.003, 4.001, 12.103, 3.808, 0.004),
        'bloom/eager/autocast_bf16/0': (36.005, 6.0, 4.0, 10.049, 0.009, 2.004),
        'bloom/eager/autocast_bf16/1': (1.212, 0.029, 4.257, 11.156, 2.38, 0.812),
        'bloom/eager/bf16/0': (32.003, 6.002, 4.001, 5.981, -0.126, 0.004),
        'bloom/eager/bf16/1': (1.964, 0.001, 4.002, 6.144, 1.882, 0.004),
    },
}
# Under activation checkpointing the backward recomputes one block at a time: the step's peak is then the larger of
# the logits' gradients and one block's full activations plus what its backward holds beside them,
# RECOMPUTE_GRADIENT_BYTES per b·s·h element and per b·a·s² element (eager attention's score gradients; SDPA keeps no
# score matrix: 0) - per mode on CUDA, the pair that misses the mode's measured H100 peaks by the least at worst
# (calibrate_activations.recompute_term: SDPA and GPT-2 eager bf16 within 1%, the other eager modes within 5.5-8.2%,
# where a b·s·h term alone missed by 9.5-10.6%); a mode without CUDA rows takes the first fit's 34.1. The CPU
# calibration had no such row.
RECOMPUTE_GRADIENT_BYTES = {"cpu": {}, "cuda": {
    "bloom/eager/autocast_bf16/1": (22.0, 5.75), "bloom/eager/bf16/1": (9.8, 6.0), "bloom/eager/fp32/1": (26.3, 6.5),
    "gpt2/eager/autocast_bf16/1": (1.8, 3.75), "gpt2/eager/bf16/1": (34.7, 0.0), "gpt2/eager/fp32/1": (2.6, 4.75),
    "gpt2/sdpa/autocast_bf16/1": (40.1, 0.0), "gpt2/sdpa/bf16/1": (7.9, 0.0), "gpt2/sdpa/fp32/1": (28.2, 0.0)}}
RECOMPUTE_GRADIENT_DEFAULT = {"cpu": (0.0, 0.0), "cuda": (34.1, 0.0)}
# torch.compile keeps fewer tensors (inductor fuses the cross-entropy and elementwise chains): what a compiled step
# keeps, as a factor on the eager estimate, per mode - calibrate_activations.fit_compiled over the CUDA grid's compiled
# rows (GPT-2 SDPA, 3 shapes each, one H200: benchmarks/results/h200_2026-11-2{5,6}/; every row within 7%). A mode with
# no compiled row takes the factor of the two compiled whole runs (ddp gpt2-350m 0.52, gpt2-1.3b 0.50;
# benchmarks/results/h100_2026-11-23/runs.json). No compiled CPU step was measured: there the eager estimate stands.
COMPILED_ACTIVATION_FACTOR = {"cuda": {
    "gpt2/sdpa/autocast_bf16/0": 0.497, "gpt2/sdpa/bf16/0": 0.554, "gpt2/sdpa/fp32/0": 0.696}}
COMPILED_FACTOR_FALLBACK = {"cuda": 0.51}
# ... and adds, at the start of the backward, bytes per b·s·V logit element, by the bytes of the logits the model
# returned (2: autocast and bf16; 4: fp32 - their gradient is one of the tensors there) and by whether the vocabulary's
# rows are a multiple of inductor's 128-byte stride alignment (64 bf16 elements), where eager adds two fp32 copies
# (LOGITS_PEAK_COPIES). Ragged: GPT-2's 50257 rows, fit_compiled over the same rows (6.01-6.02 and 8.00-8.01); 5.7-6.2
# in the whole 350M and 1.3B runs. Aligned: padded to 50304, 1.1 (one 1.3B run, bf16 logits, whose step peak fell
# 1.44 GB with 47 more rows); fp32 logits on aligned rows were not measured and take the ragged figure. Scaling the eager
# peak by the factor instead put the grid rows' peaks 16% and 10% under, where the logits weigh most.
# Every one of these steps returned its logits. hfscale's training forward returns the loss alone since 2026-11-26
# (run/forward.py): on CPU that took a compiled step's peak above what it keeps from 4.0 to 0.25 bytes per logit
# (autocast) and from 8.0 to 0.34 (fp32); on CUDA it is not measured yet, and these figures stand as its upper bound.
COMPILED_LOGITS_PEAK_BYTES = {"cuda": {"ragged": {2: 6.0, 4: 8.0}, "aligned": {2: 1.1}}}
COMPILED_ALIGNMENT_ELEMENTS = 64  # inductor pads strides to 128 bytes: 64 two-byte elements
LOGITS_PEAK_COPIES = 2  # at the start of the backward: the logits' gradient and log-softmax's, both fp32
# transformers' GPT-2 and BLOOM build a KV cache in every forward unless passed use_cache=False, training included.
# With SDPA its copies of every layer's keys and values are kept beside the ones SDPA saves for the backward: 2 x the
# compute dtype's bytes per layer b·s·h (measured on CPU, the fits with and without it: gpt2/sdpa fp32 7.95,
# autocast_bf16 4.08); eager attention's matmuls copy the keys and values anyway (no difference, 0.04), and under
# checkpointing transformers turns the cache off. hfscale trains without it (run/forward.py) since 2026-11-25. The
# devices whose table was fitted on steps that kept it have it taken off (and a step that keeps it, kv_cache=True, has it
# added). None since the CUDA refit of 2026-11-26: the rows measured with it had it taken off before the fit, and the
# fit then predicted the rows measured without it (1.00 in every unfolded mode).
FITTED_WITH_KV_CACHE: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def is_embedding(self) -> bool:
        return self.name.endswith(("wte.weight", "wpe.weight", "word_embeddings.weight"))

    @property
    def decays(self) -> bool:
        """The Trainer's weight-decay group: matrices (biases and LayerNorm weights are excluded)."""
        return len(self.shape) >= 2


@lru_cache(maxsize=64)  # pure, and walked by every formula of every row of an estimate, tune or projection
def parameter_tensors(shape: ModelShape) -> tuple[Tensor, ...]:
    """The trainable tensors of the HF model, in `model.parameters()` order (the LM head is tied to the embedding)."""
    h, f, v = shape.hidden, shape.ffn_size, shape.vocab
    if shape.family == "gpt2":  # Conv1D weights are stored [in, out]
        head = [Tensor("transformer.wte.weight", (v, h)), Tensor("transformer.wpe.weight", (shape.positions, h))]
        block = [("ln_1.weight", (h,)), ("ln_1.bias", (h,)), ("attn.c_attn.weight", (h, 3 * h)),
                 ("attn.c_attn.bias", (3 * h,)), ("attn.c_proj.weight", (h, h)), ("attn.c_proj.bias", (h,)),
                 ("ln_2.weight", (h,)), ("ln_2.bias", (h,)), ("mlp.c_fc.weight", (h, f)), ("mlp.c_fc.bias", (f,)),
                 ("mlp.c_proj.weight", (f, h)), ("mlp.c_proj.bias", (h,))]
        prefix, tail = "transformer.h", [Tensor("transformer.ln_f.weight", (h,)), Tensor("transformer.ln_f.bias", (h,))]
    else:  # bloom: nn.Linear weights are stored [out, in]
        head = [Tensor("transformer.word_embeddings.weight", (v, h)),
                Tensor("transformer.word_embeddings_layernorm.weight", (h,)),
                Tensor("transformer.word_embeddings_layernorm.bias", (h,))]
        block = [("input_layernorm.weight", (h,)), ("input_layernorm.bias", (h,)),
                 ("self_attention.query_key_value.weight", (3 * h, h)), ("self_attention.query_key_value.bias", (3 * h,)),
                 ("self_attention.dense.weight", (h, h)), ("self_attention.dense.bias", (h,)),
                 ("post_attention_layernorm.weight", (h,)), ("post_attention_layernorm.bias", (h,)),
                 ("mlp.dense_h_to_4h.weight", (f, h)), ("mlp.dense_h_to_4h.bias", (f,)),
                 ("mlp.dense_4h_to_h.weight", (h, f)), ("mlp.dense_4h_to_h.bias", (h,))]
        prefix, tail = "transformer.h", [Tensor("transformer.ln_f.weight", (h,)), Tensor("transformer.ln_f.bias", (h,))]
    layers = [Tensor(f"{prefix}.{i}.{name}", dims) for i in range(shape.n_layer) for name, dims in block]
    return tuple(head + layers + tail)


# hfscale's tensor-parallel plan (parallel/tensor_parallel.py), tensor by tensor: the dimension each splits over the TP
# ranks (Megatron's column-parallel weights and biases by output, row-parallel weights by input; the word embedding
# and its tied head by vocabulary rows). Every other tensor is replicated. The start-up proof checks a running model's
# DTensor placements against this table (parallel/verify.py), and the memory model reads each rank's shapes from it.
TP_SPLITS = {
    "gpt2": {"wte.weight": 0, "attn.c_attn.weight": 1, "attn.c_proj.weight": 0,  # c_attn.bias: replicated
             "mlp.c_fc.weight": 1, "mlp.c_fc.bias": 0, "mlp.c_proj.weight": 0},
    "bloom": {"word_embeddings.weight": 0, "self_attention.query_key_value.weight": 0,
              "self_attention.query_key_value.bias": 0, "self_attention.dense.weight": 1,
              "mlp.dense_h_to_4h.weight": 0, "mlp.dense_h_to_4h.bias": 0, "mlp.dense_4h_to_h.weight": 1},
}


def tp_split_dim(family: str, name: str) -> int | None:
    """The dimension `name` (a parameter of the HF model) splits over under TP, or None: replicated."""
    for suffix, dim in TP_SPLITS[family].items():
        if name.endswith("." + suffix):
            return dim
    return None


def tp_chunk(size: int, tp: int, rank: int = 0) -> int:
    """What TP rank `rank` holds of a dimension of `size` split over `tp` (DTensor's Shard, like torch.chunk: chunks of
    ceil(size/TP), the last ones shorter or empty when TP does not divide it)."""
    chunk = ceil(size / tp)
    return max(0, min(chunk, size - rank * chunk))


@lru_cache(maxsize=64)
def tp_local_tensors(shape: ModelShape, tp: int = 1, rank: int = 0) -> tuple[Tensor, ...]:
    """The model's tensors as TP rank `rank` holds them (tp_chunk along each split dimension). Rank 0 holds the most:
    only the vocabulary may not divide, and hfscale does not pad it as Megatron does. TP 1: parameter_tensors."""
    tensors = parameter_tensors(shape)
    if tp == 1:
        return tensors
    out = []
    for t in tensors:
        dim = tp_split_dim(shape.family, t.name)
        dims = t.shape if dim is None else tuple(tp_chunk(d, tp, rank) if i == dim else d for i, d in enumerate(t.shape))
        out.append(Tensor(t.name, dims))
    return tuple(out)


def tp_activation_scales(tp: int, checkpointing: bool) -> tuple[float, float]:
    """What a TP rank keeps of the per-layer activation features (the blocks' b·s·h terms, their b·a·s² attention
    terms) against the whole model's, by Korthikanti et al. (2022, Table 2; formulas/parallel3d.py) without sequence
    parallelism: of the 34·sbh a layer keeps, the 24·sbh of the matmul inputs split over TP and the LayerNorms' and
    dropouts' 10·sbh stay whole; the attention scores, softmax and dropout (5·as²b) split. The logits, the embedding
    output and the masks stay whole (hfscale gathers the vocabulary-parallel logits for the loss). Under activation
    checkpointing a block keeps its input alone, whole on every rank."""
    if tp == 1 or checkpointing:
        return 1.0, 1.0
    return (10 + 24 / tp) / 34, 1 / tp


def block_numel(shape: ModelShape) -> int:
    """Elements of one transformer block (an FSDP unit, a ZeRO-3 gathering unit)."""
    h, f = shape.hidden, shape.ffn_size
    return 4 * h * h + 2 * h * f + 9 * h + f


def zero3_gathers(shape: ModelShape, persistence_threshold: int, max_reuse_distance: int) -> tuple[int, int]:
    """(persistent elements, elements gathered again for the backward) of a ZeRO-3 model, per micro-batch.

    DeepSpeed keeps every parameter of at most `persistence_threshold` elements whole on every rank (ds_persist), so
    it is never gathered for compute. After a module's forward it releases a gathered parameter unless the rest of
    the step's module trace uses it again within `max_reuse_distance` elements (PartitionedParamCoordinator
    .__params_to_release): block i of L is next used in its backward, after the L - i blocks after it twice (forward,
    then backward) and the tied head twice - 2(L - i) blocks + 2 heads of elements away. Blocks farther than that are
    gathered again for the backward; the rest stay gathered (and held: the memory model's live parameters)."""
    tensors = parameter_tensors(shape)
    persistent = sum(t.numel for t in tensors if t.numel <= persistence_threshold)
    layers = shape.n_layer
    block_persistent = sum(t.numel for t in tensors if t.name.startswith("transformer.h.")
                           and t.numel <= persistence_threshold) // layers
    head = shape.vocab * shape.hidden
    released = sum(1 for i in range(1, layers + 1) if 2 * (layers - i) * block_numel(shape) + 2 * head >= max_reuse_distance)
    return persistent, released * (block_numel(shape) - block_persistent)


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
    accumulation (grad_accum > 1) FSDP2 keeps unsharded gradients between micro-batches (accelerate's no_sync). Under
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


def comm_buffer_bytes(shape: ModelShape, layout: Layout, precision: str, on_cuda: bool = False, ranks: int = 2) -> int:
    """Buffers the engine allocates to communicate (the largest moment, not their sum over the step)."""
    train = DTYPE_BYTES[precision]
    P = sum(t.numel for t in parameter_tensors(shape))
    if layout.engine == "ddp":  # one process is not wrapped in DDP (accelerate): no buckets
        return DDP_BUCKET_COPIES * 4 * P if ranks > 1 else 0
    if layout.engine == "fsdp":  # the root unit (embeddings) stays gathered; blocks are gathered one ahead
        root = P - shape.n_layer * block_numel(shape)
        return train * (root + FSDP_PREFETCH_UNITS * block_numel(shape)) + 4 * block_numel(shape)
    # ZeRO-1/2 allocate their whole reduce bucket (reduce_bucket_size elements, x2 with overlap_comm) at the first
    # gradient of every micro-step (stage_1_and_2.setup_buckets): on CUDA the allocator counts all of it - 2 GB for
    # DeepSpeed's default 5e8 fp32 elements, whatever the model (seen: the README's tiny zero1 run held 2.04 GB above
    # its states on an H100). On a CPU only the touched pages become resident: at most the model's size.
    bucket = layout.reduce_bucket if on_cuda and layout.zero_stage in (1, 2) else min(layout.reduce_bucket, P)
    reduce = bucket * (ZERO_BUCKETS_IN_FLIGHT if layout.overlap_comm else 1)
    gather = min(layout.prefetch_bucket, P) + block_numel(shape) if layout.zero_stage == 3 else 0
    return train * (reduce + gather)


# ---- activations -------------------------------------------------------------------------------------------------

def activation_features(n_layer: int, hidden: int, heads: int, vocab: int, seq: int, micro_batch: int,
                        ffn: int | None = None) -> list[int]:
    """The element counts ACTIVATION_COEFFICIENTS multiply (bytes per element), in ACTIVATION_FEATURES order."""
    b, s, h, f = micro_batch, seq, hidden, ffn or 4 * hidden
    return [n_layer * b * s * h, n_layer * b * heads * s * s, b * s * vocab, b * s * h, b * s * s,
            n_layer * (4 * h * h + 2 * h * f) + vocab * h]


def chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """The fused linear cross-entropy's tokens per chunk (run/forward.py): a chunk's logits about the size of the whole
    micro-batch's hidden states (vocab/hidden chunks, as Liger-Kernel sizes them), a power of two."""
    chunks = max(1, ceil(vocab / hidden))
    return 1 << max(0, ceil(log2(max(1, ceil(tokens / chunks)))))


def fused_loss_bytes(shape: ModelShape, seq: int, micro_batch: int, mode: str) -> tuple[int, int]:
    """(kept from the forward to the backward, the most above that while it runs) of the fused linear cross-entropy
    (run/forward.py) in an activation mode. Kept: the hidden states' gradient (b·s·h, compute dtype) and the head's
    (V·h, fp32). In its forward: one chunk's logits in fp32; computing in bf16, also their bf16 matmul output, the
    gradient's bf16 copy and the head's chunk gradient with its fp32 promotion before the sum (V·h x (2 + 4); in fp32
    it is summed in place); under autocast the head's bf16 copy (V·h). In its backward: the two gradients scaled, the
    head's in fp32 then in the weights' dtype."""
    v, h, bsh = shape.vocab, shape.hidden, micro_batch * seq * shape.hidden
    compute = mode.split("/")[2]
    compute_bytes, weight_bytes = (4, 4) if compute == "fp32" else (2, 2) if compute == "bf16" else (2, 4)
    chunk = min(chunk_tokens(micro_batch * seq, v, h), micro_batch * seq)
    kept = compute_bytes * bsh + 4 * v * h
    forward = chunk * v * 4 + (2 * compute_bytes * chunk * v + (compute_bytes + 4) * v * h if compute != "fp32" else 0)
    forward += 2 * v * h if compute.startswith("autocast") else 0
    backward = compute_bytes * bsh + (4 + (weight_bytes if weight_bytes < 4 else 0)) * v * h
    return kept, max(forward, backward)


def activation_mode(family: str, attention: str, compute: str, checkpointing: bool) -> str:
    """`compute`: fp32 | autocast_bf16 (DDP's autocast over fp32 weights) | bf16 (DeepSpeed's and FSDP2's bf16 module).
    flash_attention_2 keeps no s x s matrix, like SDPA; BLOOM has only eager attention in transformers."""
    attn = "eager" if family == "bloom" or attention in (None, "", "eager") else "sdpa"
    compute = "bf16" if compute == "fp16" else "autocast_bf16" if compute == "autocast_fp16" else compute
    return f"{family}/{attn}/{compute}/{int(checkpointing)}"


def kv_cache_bytes(shape: ModelShape, seq: int, micro_batch: int, mode: str) -> int:
    """What transformers' KV cache adds to a training step's kept tensors in `mode` (FITTED_WITH_KV_CACHE)."""
    _, attention, compute, checkpointing = mode.split("/")
    if attention != "sdpa" or checkpointing == "1":
        return 0
    return 2 * (4 if compute == "fp32" else 2) * shape.n_layer * micro_batch * seq * shape.hidden


@dataclass(frozen=True)
class Activations:
    kept: int  # after the forward
    peak: int  # at the start of the backward
    backward_end: int  # under checkpointing: alive beside every gradient when the last block is recomputed (else 0)
    calibration: str


def logits_bytes(mode: str) -> int:
    """The bytes of one logit element the model returns in `mode` (family/attention/precision/...): 4 where it computes
    in fp32, else 2 (bf16 weights, or autocast's bf16 head)."""
    return 4 if mode.split("/")[2] == "fp32" else 2


def activations(shape: ModelShape, seq: int, micro_batch: int, mode: str, device: str = "cpu", compiled: bool = False,
                tp: int = 1, fused_loss: bool = False, kv_cache: bool = False) -> Activations:
    """What one micro-batch on `device` keeps after the forward, the step's peak, and (under checkpointing) what the
    backward holds at its end, on one rank of a TP group of `tp` (tp_activation_scales), with which calibration gave
    them. `fused_loss`: the fused linear cross-entropy replaces the logits' terms (fused_loss_bytes). `kv_cache`: the
    step keeps transformers' KV cache (hfscale's runs never do since run/forward.py; runs measured before did).

    The end of a checkpointed backward: the last block recomputed, with its backward's gradients, and what the forward
    kept but the loss's share (the logits, or the fused loss's buffers - its head gradient is by then a parameter's
    gradient), while all the parameters' gradients exist. Measured on CPU with the fused loss, where no logits hide
    it: 0.96-1.07 of the step's peak (4 probe rows and a whole run)."""
    table, calibration = ACTIVATION_COEFFICIENTS.get(device, {}), device
    if mode not in table:  # no measurement of this mode on this device (yet): the CPU fit, and say so
        table, calibration = ACTIVATION_COEFFICIENTS["cpu"], f"cpu (no {device} measurement of {mode})"
    if mode not in table:
        raise ValueError(f"no activation calibration for {mode!r}; known: {', '.join(table)}")
    cache_in_fit = calibration == device and device in FITTED_WITH_KV_CACHE
    feats = activation_features(shape.n_layer, shape.hidden, shape.n_head, shape.vocab, seq, micro_batch, shape.ffn_size)
    linear, attention = tp_activation_scales(tp, mode.endswith("/1"))
    feats[0], feats[1] = feats[0] * linear, feats[1] * attention
    if tp > 1:
        calibration += f", per-layer terms x {linear:.3f} / x {attention:.3f} under TP {tp} (Korthikanti et al. 2022)"
    kept = sum(c * x for c, x in zip(table[mode], feats))
    cache = kv_cache_bytes(shape, seq, micro_batch, mode) / tp  # the keys and values split over a TP group's ranks
    if kv_cache != cache_in_fit and cache:
        kept += cache if kv_cache else -cache
        calibration += ", with the KV cache" if kv_cache else ", the KV cache of the fit's steps taken off"
    peak_extra = LOGITS_PEAK_COPIES * 4 * micro_batch * seq * shape.vocab
    loss_share = table[mode][2] * feats[2]  # the fp32 logits
    if fused_loss:
        loss_kept, loss_running = fused_loss_bytes(shape, seq, micro_batch, mode)
        # the logits' terms out, and the head's share of the weight copies autocast keeps (the loss casts its own)
        kept += loss_kept - loss_share - table[mode][5] * shape.vocab * shape.hidden
        peak_extra, loss_share = loss_running, loss_kept
        calibration += ", fused loss: the logits' terms replaced by its own (fused_loss_bytes)"
    backward_end = 0.0
    if mode.endswith("/1"):  # the backward recomputes one block's full activations at a time, with its gradients
        full = table.get(mode[:-1] + "0") or ACTIVATION_COEFFICIENTS["cpu"][mode[:-1] + "0"]
        bsh = micro_batch * seq * shape.hidden
        per_bsh, per_scores = RECOMPUTE_GRADIENT_BYTES.get(device, {}).get(
            mode, RECOMPUTE_GRADIENT_DEFAULT.get(device, (0.0, 0.0)))
        one_block = (full[0] + per_bsh) * bsh + (full[1] + per_scores) * micro_batch * shape.n_head * seq * seq
        peak_extra = max(peak_extra, one_block)
        backward_end = kept - loss_share + one_block
    factor = 1.0
    if compiled and device in COMPILED_ACTIVATION_FACTOR:
        factor = COMPILED_ACTIVATION_FACTOR[device].get(mode)
        if factor is None:
            factor = COMPILED_FACTOR_FALLBACK[device]
            calibration += f", x {factor:g} compiled (two whole runs' factor: no compiled row of {mode})"
        else:
            calibration += f", x {factor:g} compiled"
        peak_extra *= factor
        if not fused_loss and device in COMPILED_LOGITS_PEAK_BYTES:  # the larger of the logits' and a block's share
            by_rows = COMPILED_LOGITS_PEAK_BYTES[device]
            itemsize = logits_bytes(mode)
            rows = "aligned" if shape.vocab % COMPILED_ALIGNMENT_ELEMENTS == 0 else "ragged"
            per_logit = by_rows[rows].get(itemsize, by_rows["ragged"][itemsize])
            logits = per_logit * micro_batch * seq * shape.vocab
            peak_extra = max(logits, peak_extra if mode.endswith("/1") else 0.0)
    return Activations(int(kept * factor), int(kept * factor + peak_extra), int(backward_end * factor), calibration)


# ---- one rank, all together ----------------------------------------------------------------------------------------

def rank_memory(plan) -> RankMemory:
    """Bytes per rank of one training step of `plan` (a hfscale.runplan.RunPlan: everything here is read from it), for
    the rank that holds the most. On the CUDA route the caching allocator's fragmentation and the runtime allowance
    (CUDA context, cuBLAS/NCCL workspaces) are added to the device total; a CPU run has neither."""
    layout, precision = plan.memory_layout, "fp32" if plan.precision == "tf32" else plan.precision
    mem = model_state_bytes(plan.shape, layout, plan.optimizer_memory_rule, precision, plan.shard_ranks,
                            plan.gradient_accumulation_steps, plan.tp)
    compute = precision if layout.engine != "ddp" or precision == "fp32" else f"autocast_{precision}"
    acts = activations(plan.shape, plan.seq_len, plan.per_device_train_batch_size,
                       activation_mode(plan.shape.family, plan.attention, compute, plan.activation_checkpointing),
                       plan.device_type, plan.torch_compile, plan.tp, plan.fused_linear_cross_entropy, plan.kv_cache)
    mem.activations, mem.activation_peak, mem.activation_calibration = acts.kept, acts.peak, acts.calibration
    mem.backward_end = acts.backward_end
    mem.comm_buffers = comm_buffer_bytes(plan.shape, layout, precision, plan.on_cuda, plan.world_size)
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


def construction_host_bytes(shape: ModelShape, processes_per_node: int, rank0_builds: bool, shard_ranks: int) -> int:
    """Host RAM of the busiest node while the model is built and sharded: a full fp32 copy per process, or - when
    only rank 0 builds it and the engine shards it out from there (fsdp* with accelerate's cpu_ram_efficient_loading,
    zero3* under zero.Init) - one full copy on rank 0 and a 1/shard_ranks shard on each other process of its node."""
    P = sum(t.numel for t in parameter_tensors(shape))
    if not rank0_builds:
        return processes_per_node * 4 * P
    return 4 * P + (processes_per_node - 1) * 4 * ceil(P / shard_ranks)


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
