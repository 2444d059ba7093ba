"""The HF model's trainable tensors, tensor by tensor, as formulas: their shapes in `model.parameters()` order, what
each tensor-parallel rank holds of them (hfscale's TP plan), and which of them ZeRO-3 gathers. Pure, no torch; the
memory, communication and projection formulas walk them, and tests/ check them against the real models' tensors.
"""

from dataclasses import dataclass
from functools import lru_cache
from math import ceil, prod

from .metrics import ModelShape


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    is_embedding: bool = False  # an nn.Embedding's weight (bitsandbytes keeps its states 32-bit)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def decays(self) -> bool:
        """The Trainer's weight-decay group: matrices (biases and norm weights are excluded)."""
        return len(self.shape) >= 2


@lru_cache(maxsize=64)  # pure, and walked by every formula of every row of an estimate, tune or projection
def parameter_tensors(shape: ModelShape) -> tuple[Tensor, ...]:
    """The trainable tensors of the HF model, in `model.parameters()` order, as its family lists them (models/): a
    tied head is the embedding, an untied one its own tensor."""
    spec = shape.spec
    return tuple(Tensor(name, dims, name in spec.embeddings) for name, dims in spec.tensors(shape))


def tp_split_dim(shape: ModelShape, name: str) -> int | None:
    """The dimension `name` (a parameter of the HF model) splits over under hfscale's TP plan (the family's tp_plan,
    the one table parallel/tensor_parallel.py applies and parallel/verify.py checks), or None: replicated."""
    return shape.spec.tp_split_dim(name)


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
        dim = tp_split_dim(shape, t.name)
        dims = t.shape if dim is None else tuple(tp_chunk(d, tp, rank) if i == dim else d for i, d in enumerate(t.shape))
        out.append(Tensor(t.name, dims, t.is_embedding))
    return tuple(out)


@lru_cache(maxsize=64)  # asked once per layer by zero3_gathers, and by every row's memory and communication model
def block_numel(shape: ModelShape) -> int:
    """Elements of one transformer block (an FSDP unit, a ZeRO-3 gathering unit)."""
    return sum(prod(dims) for _, dims in shape.spec.block_tensors(shape))


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
    block_persistent = sum(t.numel for t in tensors if shape.spec.is_block(t.name)
                           and t.numel <= persistence_threshold) // layers
    head = shape.vocab * shape.hidden
    released = sum(1 for i in range(1, layers + 1) if 2 * (layers - i) * block_numel(shape) + 2 * head >= max_reuse_distance)
    return persistent, released * (block_numel(shape) - block_persistent)
