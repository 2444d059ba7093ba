"""What a run's precision (fp32 | tf32 | bf16 | fp16, RunPlan.precision) means for its tensors: the one place that says
TF32 is stored as fp32. Pure: no torch at import."""

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
_STORED_AS = {"tf32": "fp32"}  # TF32 is a matmul mode on fp32 tensors, not a dtype of its own
_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def storage_dtype(precision: str) -> str:
    """The dtype of the tensors a computation in `precision` reads and writes (fp32 | bf16 | fp16)."""
    return _STORED_AS.get(precision, precision)


def torch_dtype_name(precision: str) -> str:
    """torch's name of that dtype (float32 | bfloat16 | float16), as the start-up proofs read it off the engines."""
    return _TORCH_NAMES[storage_dtype(precision)]
