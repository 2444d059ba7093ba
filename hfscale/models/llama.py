"""Llama (transformers' LlamaForCausalLM), the shape most models are trained in today: RMSNorms without biases, a gated
SwiGLU MLP (gate, up and down projections, its own intermediate size), rotary positions (no position table),
grouped-query attention (fewer key/value heads than query heads), no biases anywhere, the head tied to the word
embedding or not, and heads of a width of their own where the config sets one (`head_dim`: Mistral-Nemo's and Mistral
Small's 32 heads of 128 on a 5120-wide model, so their queries are 4096 wide). A Mistral config has the same tensors
and is served (its sliding window is its attention's business); Qwen2's differs by biases on its q/k/v projections and
is a family of its own beside this one (qwen2.py).

The presets are the published shapes (each model's config.json): hidden, layers, heads, key/value heads, the head
width where it is apart from hidden / heads, intermediate size, vocabulary, positions, tied head and rotary base.
Llama 3.1/3.2's rotary scaling for long contexts is left out: hfscale trains from scratch at a few thousand tokens,
where the scaling changes nothing it measures.
"""

from math import ceil

from ..errors import HfscaleError
from .family import UNTIED_HEAD, Family, ModelShape, differing, register

LLAMA3_VOCAB, SMOLLM2_VOCAB, MISTRAL_VOCAB = 128256, 49152, 131072  # Mistral's: its Tekken tokenizer's


def _llama(n_layer, hidden, n_head, n_kv_head, ffn, vocab, positions, tied, rope_theta, head_dim=None):
    return ModelShape("llama", n_layer, hidden, n_head, vocab, positions, ffn, n_kv_head, tied, rope_theta, head_dim)


class Llama(Family):
    name, title = "llama", "Llama"
    model_types = ("llama", "mistral")
    class_name = "LlamaForCausalLM"
    config_class = "LlamaConfig"
    qkv_bias = False  # biases on the query, key and value projections (Qwen2's); none anywhere else
    qk_norm = False  # RMSNorms on the queries and keys (q_norm, k_norm): one head wide, applied to each (Qwen3's) ...
    qk_norm_whole = False  # ... or over all heads at once, as wide as the queries and the keys (OLMo 2's)
    block_norms = ("input_layernorm", "post_attention_layernorm")  # a block's hidden-wide RMSNorms, in their order
    # rope_parameters per layer type, full_attention and sliding_attention (Gemma 3's and OLMo 3's configs), the
    # sliding-window layers' base their own where set (Gemma 3's 10,000), else the shape's
    rope_per_layer_type, sliding_rope_theta = False, None
    tied_default = False
    gated_mlp = True
    own_widths = True
    own_head_width = True  # a config's head_dim apart from hidden / heads (LlamaConfig's and MistralConfig's)
    block_prefix = "model.layers"
    attention_module = "self_attn"
    embedding = "model.embed_tokens.weight"
    final_norm = "model.norm"
    # Megatron's layout, as torchtitan's Llama plan: q/k/v and gate/up by output (whole query and key/value heads per
    # rank), o and down by input. Attention reshapes to (-1, head_dim): a rank runs its own heads with no other change.
    tp_plan = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
               "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
               "mlp.down_proj": "rowwise"}
    presets = {
        # A few-hundred-thousand-parameter Llama for tests and the CPU runs: GQA (2 key/value heads for 4), a gated
        # MLP of its own width, an untied head
        "tiny-llama": _llama(2, 64, 4, 2, 176, 2048, 256, False, 10000.0),
        "smollm2-135m": _llama(30, 576, 9, 3, 1536, SMOLLM2_VOCAB, 8192, True, 100000.0),
        "smollm2-360m": _llama(32, 960, 15, 5, 2560, SMOLLM2_VOCAB, 8192, True, 100000.0),
        "smollm2-1.7b": _llama(24, 2048, 32, 32, 8192, SMOLLM2_VOCAB, 8192, True, 130000.0),
        "tinyllama-1.1b": _llama(22, 2048, 32, 4, 5632, 32000, 2048, False, 10000.0),
        "llama-3.2-1b": _llama(16, 2048, 32, 8, 8192, LLAMA3_VOCAB, 131072, True, 500000.0),
        "llama-3.2-3b": _llama(28, 3072, 24, 8, 8192, LLAMA3_VOCAB, 131072, True, 500000.0),
        "llama-3.1-8b": _llama(32, 4096, 32, 8, 14336, LLAMA3_VOCAB, 131072, False, 500000.0),
        "llama-3.1-70b": _llama(80, 8192, 64, 8, 28672, LLAMA3_VOCAB, 131072, False, 500000.0),
        "llama-3.1-405b": _llama(126, 16384, 128, 8, 53248, LLAMA3_VOCAB, 131072, False, 500000.0),
        # Mistral-7B-v0.3 (no sliding window since v0.2): built as a LlamaForCausalLM, whose tensors are Mistral's
        "mistral-7b": _llama(32, 4096, 32, 8, 14336, 32768, 32768, False, 1000000.0),
        # Mistral-Nemo-Base-2407 and Mistral-Small-24B-Base-2501: 32 heads of 128 on a 5120-wide model
        "mistral-nemo-12b": _llama(40, 5120, 32, 8, 14336, MISTRAL_VOCAB, 1024000, False, 1000000.0, 128),
        "mistral-small-24b": _llama(40, 5120, 32, 8, 32768, MISTRAL_VOCAB, 32768, False, 100000000.0, 128),
    }

    def default_ffn(self, hidden):
        """Llama's sizing rule: 2/3 of a 4h MLP (three matrices for two), rounded up to a multiple of 256."""
        return 256 * ceil(8 * hidden / 3 / 256)

    def tensors(self, shape):
        h, v = shape.hidden, shape.vocab
        block = self.layer_tensors(shape)
        return [(self.embedding, (v, h)),
                *((f"{self.block_prefix}.{i}.{name}", dims) for i in range(shape.n_layer) for name, dims in block),
                ("model.norm.weight", (h,)), *([] if shape.tied_head else [(UNTIED_HEAD, (v, h))])]

    def layer_tensors(self, shape) -> list[tuple[str, tuple[int, ...]]]:
        """One block's tensors, named within it, in `model.parameters()` order."""
        h, f, q, kv = shape.hidden, shape.ffn_size, shape.q_hidden, shape.kv_hidden
        block = []
        for proj, width in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            block.append((f"self_attn.{proj}.weight", (width, h)))
            if self.qkv_bias:  # each bias right after its weight, as the model's parameters come
                block.append((f"self_attn.{proj}.bias", (width,)))
        block.append(("self_attn.o_proj.weight", (h, q)))
        if self.qk_norm:
            q_norm, k_norm = (q, kv) if self.qk_norm_whole else (shape.head_size, shape.head_size)
            block += [("self_attn.q_norm.weight", (q_norm,)), ("self_attn.k_norm.weight", (k_norm,))]
        return block + [("mlp.gate_proj.weight", (f, h)), ("mlp.up_proj.weight", (f, h)),
                        ("mlp.down_proj.weight", (h, f)), *((f"{norm}.weight", (h,)) for norm in self.block_norms)]

    def check(self, shape):
        if shape.kv_heads > shape.n_head or shape.n_head % shape.kv_heads:
            raise HfscaleError(f"{shape.kv_heads} key/value heads do not divide the {shape.n_head} attention heads "
                               f"(grouped-query attention shares each among a whole number of query heads); choose a "
                               f"divisor of {shape.n_head}")
        if shape.head_size % 2:
            raise HfscaleError(f"head width {shape.head_size} is odd: rotary positions rotate pairs of a head's "
                               f"features; choose an even head_dim (or heads that split the hidden size into even "
                               f"widths)")

    # what a config of a served model_type must say for the tensors above (Qwen2's config has no such keys)
    config_needs = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
    dropout_keys = ("attention_dropout",)  # its attention probabilities alone: no dropout_sites
    softmax_fp32 = True
    autocast_fp32_queries = True

    def hf_config(self, shape, dropout=0.0, **extra):
        import transformers

        theta = shape.rope_theta or 10000.0
        config_class = getattr(transformers, self.config_class)
        if shape.head_dim is not None:  # LlamaConfig's default is hidden / heads
            extra = {"head_dim": shape.head_dim, **extra}
        if self.window_in_config:  # a pattern family's config derives the layer types from the same pattern
            extra = {"sliding_window": shape.window, **extra}
        return config_class(num_hidden_layers=shape.n_layer, hidden_size=shape.hidden,
                            num_attention_heads=shape.n_head, num_key_value_heads=shape.kv_heads,
                            intermediate_size=shape.ffn_size, vocab_size=shape.vocab,
                            max_position_embeddings=shape.positions, tie_word_embeddings=shape.tied_head,
                            rope_parameters=self.rope_parameters(theta), attention_dropout=dropout, **extra)

    def windowed_layers(self, shape):
        if self.full_attention_every:
            return shape.n_layer - shape.n_layer // self.full_attention_every
        return shape.n_layer if shape.sliding_window is not None else 0

    def layer_types(self, n_layer: int) -> list[str]:
        """The attention of each layer as transformers' configs list it (layer_types), by the family's pattern."""
        every = self.full_attention_every
        return ["full_attention" if not every or (i + 1) % every == 0 else "sliding_attention" for i in range(n_layer)]

    def window_of(self, config) -> int | None:
        """The shape's sliding_window for a config's: its windowed layers' span where apart from the family's default,
        else None. A pattern family's config must window the layers its pattern does. Elsewhere a window on every layer
        (Mistral's) is recorded; one on some layers only (Qwen's use_sliding_window above max_window_layers) is its
        attention's business, not in the shape (docs/models.md)."""
        window, n_layer = getattr(config, "sliding_window", None), config.num_hidden_layers
        types = list(getattr(config, "layer_types", None) or [])
        if not types and window is not None:  # Mistral's and Phi-3's configs list no layer types: every layer windowed
            types = ["sliding_attention"] * n_layer
        windowed = types.count("sliding_attention")
        if self.full_attention_every:
            if types and types != self.layer_types(n_layer):
                def full(kinds):
                    return [i for i, kind in enumerate(kinds) if kind != "sliding_attention"] or "none"
                raise HfscaleError(f"its layer_types attend over the whole sequence in layers {full(types)}, where "
                                   f"{self.title}'s pattern (one layer in {self.full_attention_every}), which hfscale "
                                   f"counts, does in {full(self.layer_types(n_layer))}")
            return None if window == self.default_window else window
        return window if windowed and windowed == n_layer else None

    def rope_parameters(self, theta: float) -> dict:
        """The config's rope_parameters for a rotary base (transformers 5's form); per layer type where the family's
        config keeps them so (the global layers at the shape's base, the sliding-window ones at their own, if any)."""
        if not self.rope_per_layer_type:
            return {"rope_type": "default", "rope_theta": theta}
        return {"full_attention": {"rope_type": "default", "rope_theta": theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": self.sliding_rope_theta or theta}}

    def shape_from_config(self, config):
        heads, hidden = config.num_attention_heads, config.hidden_size
        refused = differing(config, self.config_needs)
        head_dim, natural = getattr(config, "head_dim", None), hidden // max(heads, 1)
        if not self.own_head_width and head_dim not in (None, natural):
            refused.append(f"head_dim={head_dim} (needs hidden_size / num_attention_heads = {natural})")
        if refused:
            raise HfscaleError(f"its {config.model_type} config differs from the {self.title} shape hfscale trains: "
                               f"{', '.join(refused)}")
        return ModelShape(self.name, config.num_hidden_layers, hidden, heads, config.vocab_size,
                          config.max_position_embeddings, config.intermediate_size,
                          getattr(config, "num_key_value_heads", None) or heads,
                          bool(getattr(config, "tie_word_embeddings", False)), self.rope_theta_of(config),
                          self.recorded_head_dim(head_dim, natural), self.window_of(config))

    def rope_theta_of(self, config) -> float | None:
        """The rotary base a config sets (transformers 5's rope_parameters; the global layers' where it keeps one per
        layer type)."""
        params = getattr(config, "rope_parameters", None) or {}
        return (params.get("full_attention") or {} if self.rope_per_layer_type else params).get("rope_theta")

    def recorded_head_dim(self, head_dim: int | None, natural: int) -> int | None:
        """The shape's head_dim for a config's: set where it is apart from hidden / heads (`natural`), else None - the
        shape of a Llama whose config writes its head_dim out is the preset's."""
        return head_dim if self.own_head_width and head_dim not in (None, natural) else None


LLAMA_FAMILY = register(Llama())
