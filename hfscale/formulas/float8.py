"""What float8 training (--fp8: torchao's Float8Linear, run/float8.py) buys per linear layer and per step, as a roofline.

One linear layer of a training step runs three matmuls over M tokens (input K, output N wide): the output (M x K @
K x N), the input's gradient (M x N @ N x K) and the weight's (K x M @ M x N). Each takes the longer of its FLOPs at
the dtype's achieved rate and its bytes at the achieved memory bandwidth. In float8 the matmuls read one byte per
operand, and the layer first casts its input, its weight and its output's gradient to float8 - memory-bound kernels
whose traffic depends on the recipe, counted kernel by kernel as torchao's own roofline counts them
(torchao/testing/training/roofline_utils.py; tests/test_float8_model.py checks this module against it). What no
roofline sees - the scale computations' launches and syncs, the transposed copies the compiler does not fuse - is one
cost per converted layer, fitted, with the achieved matmul rates, to the layer timings of an H200
(benchmarks/fit_float8.py over benchmarks/results/h200_2026-11-28/fp8_matmul.json). docs/project.md ("Float8") has
the fit. Pure: no torch."""

from dataclasses import dataclass

from .metrics import ModelShape, training_flops_per_sequence
from .peaks import MEMORY_BW_GB_S, PEAK_TFLOPS
from .precision import FLOAT8_RECIPES, block_linears, float8_block_elements

BF16, FP8 = 2, 1  # bytes per element

# Bytes each cast kernel moves per element of the tensor it casts, by recipe and the tensor's role, one entry per
# kernel (0: a kernel whose traffic is negligible, which still pays a launch): tensorwise reads the tensor for its
# amax, then casts it (the weight twice, once per layout; the input and the output's gradient once, written in both);
# rowwise also writes a transposed bf16 copy to scale along the other dimension; rowwise_with_gw_hp casts the input
# and the output's gradient once (its weight-gradient matmul stays in bf16).
CAST_KERNEL_BYTES = {
    "tensorwise": {"input": (BF16, 0, BF16 + 2 * FP8), "weight": (BF16, 0, BF16 + FP8, BF16 + FP8),
                   "grad_output": (BF16, 0, BF16 + 2 * FP8)},
    "rowwise": {"input": (BF16 + FP8 + BF16, BF16 + FP8), "weight": (BF16 + FP8, 2 * BF16, BF16 + FP8),
                "grad_output": (BF16 + FP8 + BF16, BF16 + FP8)},
    "rowwise_with_gw_hp": {"input": (BF16 + FP8,), "weight": (BF16 + FP8, 0, BF16 + FP8),
                           "grad_output": (BF16 + FP8,)},
}
assert set(CAST_KERNEL_BYTES) == set(FLOAT8_RECIPES)


@dataclass(frozen=True)
class Roofline:
    """What one GPU achieves: dense peaks (TFLOPs), memory bandwidth (GB/s), the share of each a kernel reaches, the
    least time a kernel takes, and the per-layer cost of float8 no roofline sees."""

    bf16_tflops: float
    fp8_tflops: float
    memory_gb_s: float
    bf16_efficiency: float  # of the bf16 dense peak, by a large matmul
    fp8_efficiency: float  # of the fp8 dense peak, by a large scaled matmul
    memory_efficiency: float  # of the memory bandwidth, by a large elementwise kernel
    kernel_s: float = 2e-6  # a launch: the least time any kernel takes
    float8_layer_s: float = 0.0  # per converted layer, forward and backward


# The shares of the dense peaks large bf16 and float8 matmuls reach, and a converted layer's cost beyond its casts:
# fitted by benchmarks/fit_float8.py to the committed H200 layer timings (docs/project.md, "Float8"; a test holds them
# to the fit). The memory share is torchao's roofline's. A GPU without timings of its own takes these shares of its
# datasheet figures.
ACHIEVED = {"bf16": 0.71, "fp8": 0.62, "memory": 0.92, "float8_layer_s": 130e-6}


def device_roofline(device: str | None) -> Roofline | None:
    """The roofline of a GPU of the peak table (formulas/peaks), or None where it has no float8 peak or no known
    memory bandwidth: no float8 tensor cores, or nothing to time them with."""
    peaks = PEAK_TFLOPS.get(device or "", {})
    if not peaks.get("fp8") or device not in MEMORY_BW_GB_S:
        return None
    return Roofline(peaks["bf16"], peaks["fp8"], MEMORY_BW_GB_S[device], ACHIEVED["bf16"], ACHIEVED["fp8"],
                    ACHIEVED["memory"], float8_layer_s=ACHIEVED["float8_layer_s"])


FLOAT8_DEVICES = tuple(d for d in PEAK_TFLOPS if device_roofline(d))


def matmul_s(m: int, k: int, n: int, float8: bool, gpu: Roofline) -> float:
    """One (m x k) @ (k x n) matmul with a bf16 output: the longer of its FLOPs and its bytes, at least a launch."""
    tflops, efficiency, operand = ((gpu.fp8_tflops, gpu.fp8_efficiency, FP8) if float8
                                   else (gpu.bf16_tflops, gpu.bf16_efficiency, BF16))
    compute = 2 * m * k * n / (tflops * 1e12 * efficiency)
    memory = (operand * (m * k + k * n) + BF16 * m * n) / (gpu.memory_gb_s * 1e9 * gpu.memory_efficiency)
    return max(compute, memory, gpu.kernel_s)


def cast_s(recipe: str, role: str, elements: int, gpu: Roofline) -> float:
    """The float8 cast kernels of one tensor (`role`: input | weight | grad_output) in a forward and backward."""
    bandwidth = gpu.memory_gb_s * 1e9 * gpu.memory_efficiency
    return sum(max(b * elements / bandwidth, gpu.kernel_s) for b in CAST_KERNEL_BYTES[recipe][role])


def linear_s(tokens: int, k: int, n: int, recipe: str | None, gpu: Roofline) -> float:
    """Seconds of one linear layer (k in, n out) over `tokens` rows, forward and backward: its three matmuls, in bf16
    (recipe None) or in float8 with the recipe's casts and the per-layer cost."""
    m = tokens
    if recipe is None:
        return matmul_s(m, k, n, False, gpu) + matmul_s(m, n, k, False, gpu) + matmul_s(k, m, n, False, gpu)
    if recipe not in CAST_KERNEL_BYTES:
        raise ValueError(f"float8 recipe {recipe!r}; one of {', '.join(CAST_KERNEL_BYTES)}")
    matmuls = (matmul_s(m, k, n, True, gpu) + matmul_s(m, n, k, True, gpu)
               + matmul_s(k, m, n, recipe != "rowwise_with_gw_hp", gpu))
    casts = cast_s(recipe, "input", m * k, gpu) + cast_s(recipe, "weight", k * n, gpu) \
        + cast_s(recipe, "grad_output", m * n, gpu)
    return matmuls + casts + gpu.float8_layer_s


@dataclass(frozen=True)
class Float8Step:
    """What --fp8 does to a step's compute: the converted layers' speedup (bf16 time over float8 time, >1: faster),
    their share of the step's FLOPs, and the step's compute in float8 over its compute in bf16 (<1: it pays)."""

    layer_speedup: float
    linear_share: float
    compute_factor: float

    @property
    def pays(self) -> bool:
        return self.compute_factor < 1.0


def float8_step(shape: ModelShape, seq_len: int, micro_batch: int, recipe: str, gpu: Roofline) -> Float8Step:
    """--fp8 against bf16 for one micro-batch: the blocks' converted layers timed both ways (linear_s); the rest of the
    step (attention's scores, the head, norms and elementwise work) keeps its FLOPs' share of the bf16 compute. Under
    activation checkpointing the recomputed forward is made of the same parts, so the factor holds."""
    tokens = micro_batch * seq_len
    layers = block_linears(shape)
    bf16 = sum(c * linear_s(tokens, k, n, None, gpu) for k, n, c in layers)
    fp8 = sum(c * linear_s(tokens, k, n, recipe, gpu) for k, n, c in layers)
    model, _ = training_flops_per_sequence(shape, seq_len, False)
    share = shape.n_layer * 6 * seq_len * float8_block_elements(shape) / model if layers else 0.0
    speedup = bf16 / fp8 if layers else 1.0
    return Float8Step(speedup, share, 1.0 - share + share / speedup)
