"""What a run's precision (fp32 | tf32 | bf16 | fp16, RunPlan.precision) means for its tensors: the one place that says
TF32 is stored as fp32, and which dtype each engine holds, computes in and reduces. Pure: no torch at import."""

from dataclasses import dataclass

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
_STORED_AS = {"tf32": "fp32"}  # TF32 is a matmul mode on fp32 tensors, not a dtype of its own
_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def storage_dtype(precision: str) -> str:
    """The dtype of the tensors a computation in `precision` reads and writes (fp32 | bf16 | fp16)."""
    return _STORED_AS.get(precision, precision)


def torch_dtype_name(precision: str) -> str:
    """torch's name of that dtype (float32 | bfloat16 | float16), as the start-up proofs read it off the engines."""
    return _TORCH_NAMES[storage_dtype(precision)]


@dataclass(frozen=True)
class Dtypes:
    """What a run holds, computes in and reduces, by its precision and its engine (RunPlan.dtypes)."""

    parameters: str  # the weights the engine trains (fp32 masters under DDP's autocast)
    compute: str  # what the matmuls read and write
    gradients: str  # what the gradient reductions move


def engine_dtypes(precision: str, engine: str, communication_dtype: str | None = None) -> Dtypes:
    """DDP (and TP, which keeps torch's own states) trains fp32 weights under autocast and reduces fp32 gradients;
    DeepSpeed and FSDP2 train a copy in the compute dtype (fp32 masters in the optimizer) and reduce in it, unless
    DeepSpeed's JSON names a communication_data_type."""
    compute = storage_dtype(precision)
    if engine == "ddp":
        return Dtypes("fp32", compute, "fp32")
    return Dtypes(compute, compute, communication_dtype or compute)


# ---- float8 training (--fp8): torchao's Float8Linear through accelerate's AORecipeKwargs --------------------------
FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")  # torchao's names (Float8LinearConfig.from_recipe_name)
FLOAT8_MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (sm_89) and Hopper (sm_90) on
FLOAT8_DIM_MULTIPLE = 16  # torch._scaled_mm takes float8 matrices whose dimensions are multiples of 16
FLOAT8_NOT_FP16 = "--fp8 computes outside its float8 matmuls in bf16 (accelerate's fp8 autocast): drop --fp16"


def float8_refusal(recipe: str, precision: str, engine: str) -> str | None:
    """Why a run cannot train with float8 matmuls (--fp8, `recipe`), or None. Outside the converted matmuls it
    computes in bf16 (accelerate's fp8 mode is bf16 autocast), so fp16 is refused; so are the engines accelerate
    serves no maintained float8 route for. Tensor parallelism splits the converted layers (run/float8.convert)."""
    if recipe not in FLOAT8_RECIPES:
        return f"--fp8_recipe {recipe!r}; choose one of: {', '.join(FLOAT8_RECIPES)}"
    if precision == "fp16":
        return FLOAT8_NOT_FP16
    if engine == "deepspeed":
        return ("--fp8 under DeepSpeed: accelerate runs FP8 with DeepSpeed only through Transformer Engine or MS-AMP "
                "(neither installed; MS-AMP is no longer maintained), not torchao's float8; use ddp, fsdp or tp")
    return None


def float8_device_refusal(on_cuda: bool, capability: tuple[int, int] | None, device_name: str,
                          emulate: bool) -> str | None:
    """Why this device cannot run float8 matmuls, or None: a GPU before Ada/Hopper has no float8 tensor cores, and a
    CPU none at all - unless `emulate` (torchao's emulation: the float8 casts and scales in high precision, no speedup;
    the code path, for tests)."""
    if emulate:
        return None
    if not on_cuda:
        return ("--fp8 needs a GPU with float8 tensor cores (Ada or Hopper, compute capability 8.9+); this run is on "
                "the CPU (--fp8_emulate runs the code path without them, for tests)")
    if capability is None or tuple(capability) < FLOAT8_MIN_CAPABILITY:
        shown = ".".join(map(str, capability)) if capability else "unknown"
        return (f"--fp8 needs float8 tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell); {device_name} "
                f"has {shown}")
    return None


COLUMNS, ROWS = "colwise", "rowwise"  # the tp_plan styles' prefixes: split by output columns, by input rows


def block_linears(shape, tp: int = 1) -> list[tuple[int, int, int]]:
    """(in, out, count) of each distinct linear layer of one decoder block that float8 converts, as one rank of a TP
    group of `tp` multiplies by it: Llama's q (h x q, the query width: h unless the model sets its own head width),
    o (q x h), k, v (h x kv), gate, up (h x f) and down (f x h); GPT-2's and BLOOM's fused QKV (h x 3h), output
    (h x h), MLP in (h x f) and out. Under TP the layers split as the families'
    tp_plan splits them (Megatron's): QKV and the first MLP layers by output columns, the attention output and the
    last MLP layer by input rows. A layer converts when both its dimensions on a rank are multiples of 16 (what
    torch._scaled_mm takes), as run/float8.converts decides on the built model."""
    h, f, q, kv = shape.hidden, shape.ffn_size, shape.q_hidden, shape.kv_hidden
    if shape.spec.gated_mlp:
        layers = [(h, q, 1, COLUMNS), (q, h, 1, ROWS), (h, kv, 2, COLUMNS), (h, f, 2, COLUMNS), (f, h, 1, ROWS)]
    else:
        layers = [(h, 3 * h, 1, COLUMNS), (h, h, 1, ROWS), (h, f, 1, COLUMNS), (f, h, 1, ROWS)]
    merged: dict[tuple[int, int], int] = {}
    for k, n, count, split in layers:
        k, n = tp_local_dims(k, n, split, tp)
        if k % FLOAT8_DIM_MULTIPLE == 0 and n % FLOAT8_DIM_MULTIPLE == 0:
            merged[(k, n)] = merged.get((k, n), 0) + count
    return [(k, n, c) for (k, n), c in merged.items()]


def tp_local_dims(k: int, n: int, split: str, tp: int) -> tuple[int, int]:
    """(in, out) of a k-in, n-out linear layer on one rank of a TP group of `tp`, split by its tp_plan style (a
    colwise* style splits the outputs, rowwise the inputs, anything else stays whole)."""
    if split.startswith(COLUMNS):
        return k, n // tp
    return (k // tp, n) if split == ROWS else (k, n)


def float8_block_elements(shape, tp: int = 1) -> int:
    """The elements of one block's weights that float8 converts, on one rank of a TP group of `tp` (block_linears)."""
    return sum(c * k * n for k, n, c in block_linears(shape, tp))


def float8_operand_bytes(tokens: int, layers: list[tuple[int, int, int]]) -> int:
    """The most float8 copies one converted layer holds at once (block_linears' `layers`, `tokens` rows): in its
    forward the input in both layouts and the weight, in its backward the output's gradient in both layouts, the
    input and the weight cast again - one byte an element; freed as the layer ends."""
    m = tokens
    return max((max(2 * m * k + k * n, m * k + 2 * m * n + k * n) for k, n, _ in layers), default=0)
