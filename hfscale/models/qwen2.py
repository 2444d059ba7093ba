"""Qwen2 (transformers' Qwen2ForCausalLM), the shape of Qwen2 and Qwen2.5: Llama's (RMSNorms, a SwiGLU MLP of its own
width, rotary positions, grouped-query attention) with biases on the query, key and value projections, and none
elsewhere (not on the output projection either). Everything else hfscale knows is the Llama family's: the TP plan (a
bias split with its column-parallel weight's rows), the dropout keys, and the activation terms measured on Llama, as
the biases are added inside their projections' matmuls and keep nothing more for the backward (tests/test_models.py
compares what the two keep). Its sliding window, like Mistral's, is its attention's business (off in every Qwen2.5
config).

The presets are the published Qwen2.5 base models (each model's config.json): hidden, layers, heads, key/value heads,
intermediate size, vocabulary, positions, tied head and rotary base.
"""

from .family import ModelShape, register
from .llama import Llama

QWEN_VOCAB, QWEN_VOCAB_LARGE = 151936, 152064  # the larger models pad their vocabulary further


def _qwen2(n_layer, hidden, n_head, n_kv_head, ffn, vocab, positions, tied):
    return ModelShape("qwen2", n_layer, hidden, n_head, vocab, positions, ffn, n_kv_head, tied, 1000000.0)


class Qwen2(Llama):
    name, title = "qwen2", "Qwen2"
    model_types = ("qwen2",)
    class_name = "Qwen2ForCausalLM"
    config_class = "Qwen2Config"
    qkv_bias = True
    own_head_width = False  # Qwen2Config has no head_dim: its heads are hidden / heads wide
    config_needs = {"hidden_act": "silu"}
    activations_as = "llama"
    presets = {
        # tiny-llama's shape with Qwen2's biases, for tests and the CPU runs
        "tiny-qwen2": ModelShape("qwen2", 2, 64, 4, 2048, 256, 176, 2, False, 10000.0),
        "qwen2.5-0.5b": _qwen2(24, 896, 14, 2, 4864, QWEN_VOCAB, 32768, True),
        "qwen2.5-1.5b": _qwen2(28, 1536, 12, 2, 8960, QWEN_VOCAB, 131072, True),
        "qwen2.5-3b": _qwen2(36, 2048, 16, 2, 11008, QWEN_VOCAB, 32768, True),
        "qwen2.5-7b": _qwen2(28, 3584, 28, 4, 18944, QWEN_VOCAB_LARGE, 131072, False),
        "qwen2.5-14b": _qwen2(48, 5120, 40, 8, 13824, QWEN_VOCAB_LARGE, 131072, False),
        "qwen2.5-32b": _qwen2(64, 5120, 40, 8, 27648, QWEN_VOCAB_LARGE, 131072, False),
        "qwen2.5-72b": _qwen2(80, 8192, 64, 8, 29568, QWEN_VOCAB_LARGE, 131072, False),
    }


QWEN2_FAMILY = register(Qwen2())
