"""OLMo 2 (transformers' Olmo2ForCausalLM), AllenAI's fully open models: Llama's tensors (a SwiGLU MLP of its own
width, rotary positions, no biases, an untied head) with its norms moved and widened:
- no norm before the attention or the MLP; one after each instead, on its output before the residual add
  (post_attention_layernorm, post_feedforward_layernorm: "reordered norms");
- RMSNorms on the queries and keys over all heads at once (q_norm as wide as the queries, k_norm as the keys), not one
  head's width as Qwen3's.
Its counts follow from those tensors; the FLOPs are Llama's, but under checkpointing the MLP's output projection is
rerun, as a norm takes its output (Family.mlp_output_normed); its forward keeps other tensors than Llama's, so its
activation terms are measured on OLMo 2 itself (formulas/activations.py). Under tensor parallelism a rank holds its
heads' slice of each q/k norm's weight and the norm's mean square is summed over the group (the colwise_norm style,
parallel/tensor_parallel.py) - transformers' own plan gathers the queries and keys whole on every rank instead.

OLMo 3 (Olmo3 below) is OLMo 2's tensors with sliding-window layers.

The presets are the published OLMo 2 base models' config.json (OLMo-2-0425-1B, OLMo-2-1124-7B and -13B,
OLMo-2-0325-32B): hidden, layers, heads, key/value heads, intermediate size, the embedding's 100,352 rows (the dolma2
tokenizer's 100,278 padded), 4,096 positions, rotary base 500,000.
"""

from dataclasses import replace

from .family import ModelShape, register
from .llama import Llama

OLMO2_VOCAB, OLMO2_POSITIONS = 100352, 4096
OLMO3_POSITIONS = 65536  # its released checkpoints' context: 8,192 pretrained, extended 8x (YaRN)


def _olmo2(n_layer, hidden, n_head, n_kv_head, ffn):
    return ModelShape("olmo2", n_layer, hidden, n_head, OLMO2_VOCAB, OLMO2_POSITIONS, ffn, n_kv_head, False, 500000.0)


class Olmo2(Llama):
    name, title = "olmo2", "OLMo 2"
    model_types = ("olmo2",)
    differs = {"olmoe": "a mixture of experts in place of each block's MLP",
               "olmo": "the first OLMo's non-parametric LayerNorms before each sublayer (no weights)"}
    class_name = "Olmo2ForCausalLM"
    config_class = "Olmo2Config"
    qk_norm, qk_norm_whole = True, True
    own_head_width = False  # Olmo2Config has no head_dim: its heads are hidden / heads wide
    block_norms = ("post_attention_layernorm", "post_feedforward_layernorm")
    mlp_output_normed = True
    autocast_fp32_queries = False  # its RoPE casts the rotated queries back to their dtype (bf16 under autocast)
    activations_as = None  # its norms keep other tensors than Llama's blocks do: terms of its own
    config_needs = {"hidden_act": "silu", "attention_bias": False}
    tp_plan = {**Llama.tp_plan, "self_attn.q_norm": "colwise_norm", "self_attn.k_norm": "colwise_norm"}
    presets = {
        # tiny-llama's sizes with OLMo 2's norms (grouped-query attention, so k_norm is narrower than q_norm)
        "tiny-olmo2": ModelShape("olmo2", 2, 64, 4, 2048, 256, 176, 2, False, 10000.0),
        "olmo2-1b": _olmo2(16, 2048, 16, 16, 8192),
        "olmo2-7b": _olmo2(32, 4096, 32, 32, 11008),
        "olmo2-13b": _olmo2(40, 5120, 40, 40, 13824),
        "olmo2-32b": _olmo2(64, 5120, 40, 8, 27648),
    }

    def hf_config(self, shape, dropout=0.0, **extra):
        """Olmo2Config's special tokens default to GPT-NeoX's ids (padding at 1, which nn.Embedding then never trains):
        none, as Qwen3Config's, and the run sets end-of-text from its tokenizer. Its norms' epsilon is the
        checkpoints' 1e-6."""
        tokens = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None, "rms_norm_eps": 1e-6}
        return super().hf_config(shape, dropout, **{**tokens, **extra})


OLMO2_FAMILY = register(Olmo2())


class Olmo3(Olmo2):
    """OLMo 3 (transformers' Olmo3ForCausalLM): OLMo 2's tensors, with three layers in four attending over a sliding
    window (4,096 tokens) and the rotary parameters kept per layer type. The window is a mask: no parameter, and no
    FLOP fewer under SDPA's and eager attention's full score matrices, which the counts take. Where the sequence lies
    within the window its forward keeps what OLMo 2's does (tests/test_models.py), so it takes OLMo 2's activation
    terms; beyond it, not measured (docs/models.md). Its presets are OLMo-core's olmo3_7B and olmo3_32B."""

    name, title = "olmo3", "OLMo 3"
    model_types = ("olmo3",)
    differs = {}
    class_name = "Olmo3ForCausalLM"
    config_class = "Olmo3Config"
    rope_per_layer_type = True
    full_attention_every, default_window = 4, 4096  # Olmo3Config's
    window_in_config = True
    activations_as = "olmo2"
    presets = {
        # tiny-olmo2's sizes on 4 layers, so that one attends globally (layer_types' default: every fourth)
        "tiny-olmo3": ModelShape("olmo3", 4, 64, 4, 2048, 256, 176, 2, False, 10000.0),
        # OLMo-core's olmo3_7B and olmo3_32B: OLMo 2 7B's and 32B's with the window pattern (4,096 x 3, then global)
        **{f"olmo3-{size}": replace(Olmo2.presets[f"olmo2-{size}"], family="olmo3", positions=OLMO3_POSITIONS)
           for size in ("7b", "32b")},
    }


OLMO3_FAMILY = register(Olmo3())
