"""The HF model's trainable tensors, tensor by tensor, as formulas: their shapes in `model.parameters()` order, what
each tensor-parallel rank holds of them (hfscale's TP plan), and which of them ZeRO-3 gathers. Pure, no torch; the
memory, communication and projection formulas walk them, and tests/ check them against the real models' tensors.
"""

from dataclasses import dataclass
from functools import lru_cache
from math import ceil

from .metrics import ModelShape


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
