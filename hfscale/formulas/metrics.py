"""Every number hfscale reports — parameters, FLOPs, throughput, MFU, days — as pure functions.

No torch import: these are tested exactly against independent sources (the model's own parameter count,
torch's FlopCounterMode, the BigScience worked example) and reused by train, report and estimate alike.

Units: FLOPs are floating-point operations (a multiply-add is 2); `_s` seconds; TFLOPs = 1e12 FLOPs/s.
"""

from dataclasses import dataclass
from functools import lru_cache
from math import prod

from ..models.family import ModelShape

SECONDS_PER_DAY = 86_400
GB = 1e9  # bytes; GB as sold and as nccl-tests and the BigScience notes count (not GiB)


@lru_cache(maxsize=256)  # pure; read for every row of an estimate, sweep or projection
def param_count(shape: ModelShape) -> int:
    """Exact trainable parameters: the elements of the family's tensors (models/), the head counted once when it is
    tied to the embedding. For GPT-2 per layer: QKV 3h^2+3h, output projection h^2+h, MLP 2hf+f+h, two LayerNorms 4h
    -> 4h^2 + 2hf + 9h + f (= 12h^2 + 13h when f = 4h); plus word embeddings v*h, a final LayerNorm 2h and the
    position table s*h. Llama per layer: q and o 2h^2, k and v 2h*kv (GQA), the gated MLP 3hf, two RMSNorms 2h; plus
    v*h, the final norm h, and an untied head's v*h."""
    return sum(prod(dims) for _, dims in shape.spec.tensors(shape))


def param_count_bigscience(n_layer: int, hidden: int, seq: int, vocab: int) -> int:
    """The BigScience notes' GPT-2 size formula: l(12h^2 + 13h) + vh + sh + 2h."""
    h = hidden
    return n_layer * (12 * h * h + 13 * h) + vocab * h + seq * h + 2 * h


def size_label(params: float | None) -> str:
    """A model size as people write it: 124M, 1.3B, 176B (1e9, not 2^30: the BigScience notes' mistake)."""
    if not params:
        return "?"
    # three figures of millions that round to a thousand are a billion (Gemma 3 1B's 999.9M: "1B", not "1e+03M")
    return f"{params / 1e9:.3g}B" if float(f"{params / 1e6:.3g}") >= 1000 else f"{params / 1e6:.3g}M"


def tflops_label(tflops: float | None) -> str:
    """TFLOPs as the BigScience tables print them: one decimal always (40.0, not 40). Below 1 TFLOP (a CPU run) two
    significant figures instead, so a real figure never prints as 0.0. The one rule for tables, CSV and summaries."""
    if tflops is None:
        return ""
    return f"{tflops:.1f}" if abs(tflops) >= 1 else f"{tflops:.2g}"


def forward_flops_per_sequence(shape: ModelShape, seq: int) -> dict[str, int]:
    """Matmul FLOPs of one forward pass over one sequence of `seq` tokens, by component.

    Attention scores (QK^T) and context (AV) are counted over the full s x s square, as the kernels compute
    them (and as torch's FlopCounterMode counts them); causal masking does not skip work in eager/SDPA math.
    Grouped-query attention projects keys and values to kv_hidden each, and queries to q_hidden (heads x head
    width: the hidden size unless the model sets its own head_dim, as Qwen3 does), which is also the width the scores,
    the context and the output projection work over; a gated MLP (Llama's SwiGLU) has three h x f matrices, GPT-2's
    and BLOOM's two.
    """
    h, f, s, l, q, kv = shape.hidden, shape.ffn_size, seq, shape.n_layer, shape.q_hidden, shape.kv_hidden
    return {
        "qkv": l * 2 * s * h * (q + 2 * kv),
        "attention_scores": l * 2 * s * s * q,
        "attention_context": l * 2 * s * s * q,
        "attention_output": l * 2 * s * q * h,
        "mlp": l * 2 * mlp_matrices(shape) * s * h * f,
        "lm_head": 2 * s * h * shape.vocab,
    }


def mlp_matrices(shape: ModelShape) -> int:
    """The MLP's h x f matrices: 3 gated (gate, up, down), else 2."""
    return 3 if shape.spec.gated_mlp else 2


def training_flops_per_sequence(shape: ModelShape, seq: int, recompute: bool,
                                full_recompute: bool = False) -> tuple[int, int]:
    """(model FLOPs, hardware FLOPs) of one training step over one sequence.

    Model FLOPs = forward + backward (2 x forward) = 3 x forward: the work the model needs (MFU).
    Hardware FLOPs add what activation checkpointing recomputes (HFU): the forward of the decoder blocks (the LM
    head is outside them) less the MLP's output projection (GPT-2's c_proj, Llama's down_proj) - torch's non-reentrant
    checkpoint, transformers' default, stops recomputing once the last activation the backward needs is rebuilt
    (early stop), and nothing needs that matmul's output - but where a norm follows it (Gemma 3's
    post_feedforward_layernorm: Family.mlp_output_normed), whose backward needs it. `full_recompute`: the reentrant
    checkpoint (use_reentrant=True), which reruns the whole block. Both checked against torch's FlopCounterMode
    (tests/test_metrics.py).
    """
    parts = forward_flops_per_sequence(shape, seq)
    forward = sum(parts.values())
    model = 3 * forward
    whole_block = full_recompute or shape.spec.mlp_output_normed
    recomputed = forward - parts["lm_head"] - (0 if whole_block else parts["mlp"] // mlp_matrices(shape))
    return model, model + (recomputed if recompute else 0)


def bigscience_tflops_per_gpu(
    params: int, seq: int, global_batch: int, s_per_iter: float, gpus: int, checkpointing: bool
) -> float:
    """BigScience convention: params x F x 2 x seq x GBS / (s_per_iter x GPUs x 1e12), F = 4 with checkpointing
    (forward recomputed), 3 without. Ignores attention's s^2 term and the LM head's shape."""
    factor = 4 if checkpointing else 3
    return params * factor * 2 * seq * global_batch / (s_per_iter * gpus * 1e12)


def global_batch_size(per_device_train_batch_size: int, gradient_accumulation_steps: int,
                      data_parallel_size: int) -> int:
    """Samples per optimizer step: MBS x GAS x DP. DP, not the GPU count: the ranks of a tensor-parallel group (and
    the stages of a pipeline) share one batch."""
    return per_device_train_batch_size * gradient_accumulation_steps * data_parallel_size


def tokens_per_step(per_device_train_batch_size: int, gradient_accumulation_steps: int, data_parallel_size: int,
                    seq_len: int) -> int:
    """Tokens per optimizer step: GBS x seq, every block packed full."""
    return global_batch_size(per_device_train_batch_size, gradient_accumulation_steps, data_parallel_size) * seq_len


def tflops_per_gpu(flops_per_step: float, s_per_iter: float, gpus: int) -> float:
    return flops_per_step / (s_per_iter * gpus * 1e12)


def utilization(achieved_tflops: float, peak_tflops: float | None) -> float | None:
    """MFU/HFU as a fraction of the peak; None where no peak is known."""
    return achieved_tflops / peak_tflops if peak_tflops else None


def days_to_train(token_budget: float, tokens_per_s: float, gpus: int) -> tuple[float, float]:
    """(wall-clock days, GPU-days) to process `token_budget` tokens at a global `tokens_per_s`."""
    days = token_budget / tokens_per_s / SECONDS_PER_DAY
    return days, days * gpus


@dataclass(frozen=True)
class StepFigures:
    """Everything derived from one measured seconds-per-iteration (the results file's `perf` block)."""

    s_per_iter: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    samples_per_s: float
    tflops_per_gpu_bigscience: float
    tflops_per_gpu_model: float
    tflops_per_gpu_hardware: float
    mfu: float | None
    hfu: float | None
    days_to_budget: float
    gpu_days_to_budget: float


@dataclass(frozen=True)
class Throughput:
    """What one measured seconds-per-iteration gives without FLOPs: tokens and samples per second, days to a budget."""

    tokens_per_s: float
    tokens_per_s_per_gpu: float
    samples_per_s: float
    days_to_budget: float
    gpu_days_to_budget: float


def throughput(*, s_per_iter: float, global_batch_size: int, seq_len: int, gpus: int,
               token_budget: float) -> Throughput:
    """Throughput of a step of `global_batch_size` samples of `seq_len` tokens on `gpus` GPUs (all of them: data-,
    tensor- and pipeline-parallel ranks alike share the per-GPU figures and the GPU-days)."""
    tokens_per_s = global_batch_size * seq_len / s_per_iter
    days, gpu_days = days_to_train(token_budget, tokens_per_s, gpus)
    return Throughput(tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s / gpus,
                      samples_per_s=global_batch_size / s_per_iter, days_to_budget=days, gpu_days_to_budget=gpu_days)


def step_figures(
    shape: ModelShape,
    *,
    s_per_iter: float,
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    data_parallel_size: int,
    gpus: int,
    seq_len: int,
    activation_checkpointing: bool,
    token_budget: float,
    peak_tflops: float | None,
    full_recompute: bool = False,
) -> StepFigures:
    """Every figure of one step. `data_parallel_size` ranks see different samples (GBS = MBS x GAS x DP); the FLOPs
    and the days are shared over all `gpus` (DP x TP x PP)."""
    global_batch = global_batch_size(per_device_train_batch_size, gradient_accumulation_steps, data_parallel_size)
    rates = throughput(s_per_iter=s_per_iter, global_batch_size=global_batch, seq_len=seq_len, gpus=gpus,
                       token_budget=token_budget)
    model_flops, hardware_flops = training_flops_per_sequence(shape, seq_len, activation_checkpointing, full_recompute)
    model_tflops = tflops_per_gpu(model_flops * global_batch, s_per_iter, gpus)
    hardware_tflops = tflops_per_gpu(hardware_flops * global_batch, s_per_iter, gpus)
    return StepFigures(
        s_per_iter=s_per_iter,
        **rates.__dict__,
        tflops_per_gpu_bigscience=bigscience_tflops_per_gpu(
            param_count(shape), seq_len, global_batch, s_per_iter, gpus, activation_checkpointing
        ),
        tflops_per_gpu_model=model_tflops,
        tflops_per_gpu_hardware=hardware_tflops,
        mfu=utilization(model_tflops, peak_tflops),
        hfu=utilization(hardware_tflops, peak_tflops),
    )
