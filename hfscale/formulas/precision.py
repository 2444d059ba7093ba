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
