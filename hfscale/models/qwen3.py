"""Qwen3 (transformers' Qwen3ForCausalLM), the shape of the Qwen3 dense models: Llama's (RMSNorms, a SwiGLU MLP of its
own width, rotary positions, grouped-query attention, no biases) with two differences that reach hfscale's figures:
- a head width of its own (head_dim, 128 in every Qwen3), so the query projection is heads x head_dim wide rather than
  the hidden size (Qwen3-0.6B: 2048 for a 1024 model) and the attention output projection takes that width back;
- per-head RMSNorms on the queries and keys (q_norm, k_norm: head_dim weights each, applied to every head), which keep
  tensors of their own for the backward: its activation terms are measured on Qwen3 itself, with a term for the query
  width (formulas/activations.py).
Under tensor parallelism the two norms stay whole on every rank and take the rank's heads, so their gradients are
summed over the TP group (its tp_plan's per_head style: transformers' replicated_with_grad_allreduce).

The presets are the published Qwen3 dense base models (each model's config.json): hidden, layers, heads, key/value
heads, head_dim, intermediate size, vocabulary, positions, tied head and rotary base.
"""

from .family import ModelShape, register
from .llama import Llama
from .qwen2 import QWEN_VOCAB

QWEN3_HEAD_DIM, QWEN3_POSITIONS = 128, 40960


def _qwen3(n_layer, hidden, n_head, ffn, tied):
    return ModelShape("qwen3", n_layer, hidden, n_head, QWEN_VOCAB, QWEN3_POSITIONS, ffn, 8, tied, 1000000.0,
                      QWEN3_HEAD_DIM)


class Qwen3(Llama):
    name, title = "qwen3", "Qwen3"
    model_types = ("qwen3",)
    differs = {"qwen3_moe": "a mixture of experts in place of each block's MLP"}
    class_name = "Qwen3ForCausalLM"
    config_class = "Qwen3Config"
    qk_norm = True
    activations_as = None  # its norms keep more than Llama's blocks do: terms of its own
    config_needs = {"hidden_act": "silu", "attention_bias": False}
    tp_plan = {**Llama.tp_plan, "self_attn.q_norm": "per_head", "self_attn.k_norm": "per_head"}
    presets = {
        # tiny-llama's sizes with Qwen3's norms and a head width of its own (4 heads of 32: queries 128 wide on a
        # 64-wide model), for tests and the CPU runs
        "tiny-qwen3": ModelShape("qwen3", 2, 64, 4, 2048, 256, 176, 2, False, 10000.0, 32),
        "qwen3-0.6b": _qwen3(28, 1024, 16, 3072, True),
        "qwen3-1.7b": _qwen3(28, 2048, 16, 6144, True),
        "qwen3-4b": _qwen3(36, 2560, 32, 9728, True),
        "qwen3-8b": _qwen3(36, 4096, 32, 12288, False),
        "qwen3-14b": _qwen3(40, 5120, 40, 17408, False),
        "qwen3-32b": _qwen3(64, 5120, 64, 25600, False),
    }

    def recorded_head_dim(self, head_dim, natural):
        """Qwen3's shapes always carry their head width, as its configs do (Qwen3Config's default is 128, not
        hidden / heads)."""
        return head_dim or natural

    def hf_config(self, shape, dropout=0.0, **extra):
        return super().hf_config(shape, dropout, head_dim=shape.head_size, **extra)


QWEN3_FAMILY = register(Qwen3())
