"""What a model is to hfscale: its shape (ModelShape) and its family (Family), registered by the transformers
`model_type`s it serves. Pure: no torch or transformers at import.

A family owns everything hfscale knows about one transformers architecture - its presets, the mapping to and from the
transformers config, its trainable tensors by name and shape (so the exact parameter count, FLOPs and the memory model
follow from them), its tensor-parallel plan (the one table the run applies and the memory model reads), and whether its
head is tied. The rest of hfscale asks `shape.spec`; adding a family is one module beside gpt2.py, bloom.py and llama.py
(docs/models.md).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

from ..errors import HfscaleError, one_of


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only language model: all the architecture the formulas need, with its family's name."""

    family: str  # a registered family's name (FAMILIES): gpt2, bloom, llama, ...
    n_layer: int
    hidden: int
    n_head: int
    vocab: int
    positions: int  # the longest sequence the model takes (GPT-2: its position table's rows)
    ffn: int | None = None  # MLP inner size; None: the family's default (4 x hidden; Llama's 8/3 x hidden rule)
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None: one per query head
    tied: bool | None = None  # the LM head is the word embedding; None: the family's default
    rope_theta: float | None = None  # rotary base of a family with rotary positions; None: the family's default
    head_dim: int | None = None  # width of one attention head; None: hidden / heads (Qwen3's, Mistral-Nemo's: own)
    # tokens a sliding-window layer attends over where the model sets its own (Gemma 3 1B's 512); None: its family's
    # config default (Gemma 3's and OLMo 3's 4,096), or no windowed layers (Family.windowed_layers)
    sliding_window: int | None = None

    @property
    def spec(self) -> "Family":
        return family(self.family)

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else self.spec.default_ffn(self.hidden)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def head_size(self) -> int:
        """One attention head's width: head_dim where the model sets its own, else hidden / heads."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.n_head

    @property
    def q_hidden(self) -> int:
        """Width of the query projection (and of the attention output): heads x head size - the hidden size unless
        the model sets a head_dim of its own."""
        return self.n_head * self.head_size

    @property
    def kv_hidden(self) -> int:
        """Width of the key (and of the value) projection: key/value heads x head size."""
        return self.kv_heads * self.head_size

    @property
    def tied_head(self) -> bool:
        return self.spec.tied_default if self.tied is None else self.tied

    @property
    def window(self) -> int | None:
        """Tokens each windowed layer attends over, or None where no layer attends over a window."""
        if not self.spec.windowed_layers(self):
            return None
        return self.sliding_window if self.sliding_window is not None else self.spec.default_window

    def window_shorter_than(self, seq: int) -> bool:
        """Whether windowed layers see less than a sequence of `seq` tokens: there transformers hands SDPA an explicit
        mask instead of its causal flag, which the activation terms were not measured with (docs/models.md)."""
        return self.window is not None and self.window < seq


UNTIED_HEAD = "lm_head.weight"  # transformers' name of a causal LM's own head weight (tied: the embedding's)


class Family(ABC):
    """One transformers architecture. Subclasses set the class attributes and define the abstract methods."""

    name: str
    title: str  # as people write it: GPT-2, BLOOM, Llama
    model_types: tuple[str, ...]  # the transformers model_types served (config.json's "model_type")
    differs: dict[str, str] = {}  # model_types of a near shape it does not serve -> what differs
    class_name: str  # its transformers causal-LM class
    presets: dict[str, ModelShape]
    tied_default: bool = True
    conv1d: bool = False  # weights stored [in, out] (GPT-2's Conv1D) rather than nn.Linear's [out, in]
    gated_mlp: bool = False  # SwiGLU: gate and up projections, then down (three matrices)
    mlp_output_normed: bool = False  # a norm takes the MLP's output (Gemma 3's sandwich norms): recomputation reruns it
    block_prefix: str  # the blocks' module path: block i is f"{block_prefix}.{i}"
    attention_module: str  # the attention module inside a block
    embedding: str  # the word embedding's parameter name
    position_embedding: str | None = None  # a learned position table's (an nn.Embedding too: GPT-2's wpe)
    final_norm: str  # the norm after the last block (a module path)
    sdpa: bool = True  # transformers' class has SDPA attention (BLOOM's has eager only)
    # the family whose measured activation terms it takes (formulas/activations.py's tables are keyed by family): one
    # whose forward keeps the same tensors for the backward - Qwen2's q/k/v biases are added inside their matmuls
    activations_as: str | None = None
    own_widths: bool = False  # MLP and key/value widths apart from the hidden size: activation terms of their own
    own_head_width: bool = False  # heads of a width of their own (the config's head_dim), so queries heads x head_dim
    # wide apart from h: the shape's head_dim, the --head_dim override
    # one layer in this many attends over the whole sequence, the others over a sliding window (Gemma 3's 6, OLMo 3's
    # 4: the layer types their configs derive; --sliding_window sets its span); 0: no such pattern - Llama's family
    # records a Mistral config's window on every layer
    full_attention_every: int = 0
    default_window: int | None = None  # its config's sliding window where it has windowed layers (the shape's default)
    window_in_config = False  # hf_config builds the shape's window (--sliding_window applies): Gemma 3, OLMo 3, Phi-3
    dropout_keys: tuple[str, ...] = ()  # the config's dropout probabilities (what hf_config sets from --dropout)
    # where those drop, in the activation terms: (dropouts a block applies to its b·s·h outputs, dropouts of the
    # embeddings' b·s·h sum); every family drops its attention probabilities too (activations.counted_dropout)
    dropout_sites: tuple[int, int] = (0, 0)
    softmax_fp32: bool = False  # eager attention's softmax runs in fp32 and casts its output to the queries' dtype
    autocast_fp32_queries: bool = False  # under autocast its queries are fp32 (RoPE's fp32 cos and sin), and so are
    # the probabilities its attention dropout meets: the values' matmul casts them after it
    # module inside a block -> how tensor parallelism splits it (parallel/tensor_parallel.py applies it): colwise (by
    # output), rowwise (by input), colwise_fused3 (GPT-2's fused [q | k | v] projection, each of the three split),
    # per_head: a module applied to each head alone (Qwen3's q/k norms), whole on every rank and fed the rank's heads,
    # so its gradient is summed over the TP group (transformers' replicated_with_grad_allreduce), or colwise_norm: a
    # norm over a column-parallel output (OLMo 2's q/k norms), its weight split as that output
    tp_plan: dict[str, str]
    # why hfscale's own TP (tp, fsdp_tp) cannot split this family's modules, or None; Megatron's layouts still plan it
    tp_unsupported: str | None = None

    # ---- for each family to define ----------------------------------------------------------------------------------
    def default_ffn(self, hidden: int) -> int:
        return 4 * hidden

    @abstractmethod
    def tensors(self, shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every trainable tensor of the transformers model, in `model.parameters()` order."""

    @abstractmethod
    def hf_config(self, shape: ModelShape, dropout: float = 0.0, **extra):
        """The transformers config of a shape (imports transformers)."""

    @abstractmethod
    def shape_from_config(self, config) -> ModelShape:
        """The shape of a transformers config of a served model_type, or HfscaleError naming what hfscale cannot
        train of it."""

    def check(self, shape: ModelShape) -> None:
        """Family-specific refusals of a shape (HfscaleError); the common ones are models.resolve.validate_shape's."""

    def windowed_layers(self, shape: ModelShape) -> int:
        """How many of the shape's layers attend over a sliding window rather than the whole sequence."""
        return 0

    def adapt_attention_for_tp(self, attention, tp: int, rank: int) -> None:
        """Make a block's attention module run its 1/TP of the heads once its projections are split."""

    # ---- derived from the above -------------------------------------------------------------------------------------
    def block_tensors(self, shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
        """Block 0's tensors, named within the block."""
        prefix = f"{self.block_prefix}.0."
        return [(name[len(prefix):], dims) for name, dims in self.tensors(replace(shape, n_layer=1))
                if name.startswith(prefix)]

    @property
    def embeddings(self) -> tuple[str, ...]:
        """The parameters of nn.Embedding modules (bitsandbytes keeps 32-bit optimizer states for them)."""
        return (self.embedding, *([self.position_embedding] if self.position_embedding else []))

    def dropout_of(self, config) -> float:
        """The largest dropout probability a config of this family sets (its dropout_keys): whether its layers keep
        dropout masks (transformers' GPT-2 config: 0.1)."""
        return float(max((getattr(config, key, 0.0) or 0.0 for key in self.dropout_keys), default=0.0))

    def is_block(self, name: str) -> bool:
        return name.startswith(self.block_prefix + ".")

    def _module_style(self, name: str) -> tuple[str | None, str]:
        """(the split style - colwise* or rowwise - of the block module `name` (a parameter) belongs to, or None: a
        module the plan keeps whole; "weight" | "bias")."""
        module, _, kind = name.rpartition(".")
        for planned, style in self.tp_plan.items():
            if module.endswith("." + planned):
                return (style if style.startswith(("colwise", "rowwise")) else None), kind
        return None, kind

    def tp_split_dim(self, name: str, conv1d: bool | None = None) -> int | None:
        """The dimension parameter `name` splits over under hfscale's TP plan, or None: replicated. Column-parallel
        weights by output and their biases by row (GPT-2's fused QKV bias stays whole: tensor_parallel.py says why),
        row-parallel weights by input; the word embedding and an untied head by vocabulary rows. `conv1d`: whether the
        weight is stored [in, out] (None: as the family stores it; --fp8 swaps GPT-2's Conv1D for nn.Linear)."""
        if any(name == vocab or name.endswith("." + vocab) for vocab in (self.embedding, UNTIED_HEAD)):
            return 0
        style, kind = self._module_style(name)
        if style is None:
            return None
        out_dim, in_dim = (1, 0) if (self.conv1d if conv1d is None else conv1d) else (0, 1)
        if kind == "bias":
            return 0 if style == "colwise" else None
        return out_dim if style.startswith("colwise") else in_dim

    def megatron_split(self, name: str) -> bool:
        """Whether Megatron's TP splits `name` (a block parameter): the planned modules' weights and column-parallel
        biases; LayerNorms and row-parallel biases stay whole (formulas/parallel3d.py)."""
        style, kind = self._module_style(name)
        return style is not None and (kind == "weight" or style.startswith("colwise"))

    def tp_refusal(self, shape: ModelShape, tp: int) -> str | None:
        """Why this model cannot be split over `tp` ranks (whole query and key/value heads per rank, an even MLP
        split), or None."""
        if tp < 1:
            return f"TP must be at least 1, got {tp}"
        if shape.n_head % tp or shape.ffn_size % tp:
            return f"TP {tp} does not divide the {shape.n_head} attention heads and the MLP ({shape.ffn_size})"
        if shape.kv_heads % tp:
            return (f"TP {tp} does not divide the {shape.kv_heads} key/value heads (grouped-query attention: each rank "
                    f"needs whole key/value heads); use a TP dividing {shape.kv_heads}")
        return None


FAMILIES: dict[str, Family] = {}


def register(spec: Family) -> Family:
    FAMILIES[spec.name] = spec
    return spec


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise one_of("model family", name, FAMILIES)
    return FAMILIES[name]


def family_for_model_type(model_type: str) -> Family:
    """The family serving a transformers model_type, or HfscaleError naming the ones served."""
    for spec in FAMILIES.values():
        if model_type in spec.model_types:
            return spec
        if model_type in spec.differs:
            raise HfscaleError(f"model type {model_type!r} is not served: {spec.differs[model_type]}")
    raise HfscaleError(f"model type {model_type!r} is not supported; hfscale knows: {', '.join(served_model_types())}")


def served_model_types() -> list[str]:
    """Every transformers model_type a registered family serves, in registration order."""
    return [t for spec in FAMILIES.values() for t in spec.model_types]


def families_where(attribute: str) -> str:
    """The families with presets whose Family sets `attribute`, as a sentence lists them: "Gemma 3 or OLMo 3"."""
    *others, last = dict.fromkeys(s.spec.title for s in all_presets().values() if getattr(s.spec, attribute))
    return f"{', '.join(others)} or {last}" if others else last


def all_presets() -> dict[str, ModelShape]:
    return {name: shape for spec in FAMILIES.values() for name, shape in spec.presets.items()}


def differing(config, expected: dict) -> list[str]:
    """`key=value (hfscale's family needs X)` for each config attribute that is not what the family builds."""
    return [f"{key}={getattr(config, key, None)!r} (needs {want!r})" for key, want in expected.items()
            if getattr(config, key, want) != want]
