"""Gemma 3 (transformers' Gemma3ForCausalLM, the `gemma3_text` model): Qwen3's attention - per-head RMSNorms on the
queries and keys, heads of a width of their own (256 on Gemma 3 1B's 1152-wide model: queries 1024 wide) - in a block
with four RMSNorms, not two: the attention's and the MLP's outputs are normalised too before the residual adds
("sandwich" norms: pre_feedforward_layernorm and post_feedforward_layernorm beside Llama's two). Its MLP is gated with
tanh-approximated GELU (GeGLU: Llama's three matrices), its embedding output scaled by sqrt(h), its head tied, and five
layers in six attend over a sliding window with their own rotary base (10,000; the global layers' 1,000,000). The
window is a mask: no parameter, and no FLOP fewer under SDPA's and eager attention's full score matrices, which the
counts take; gemma3-1b keeps Gemma 3 1B's own window (512 tokens), tiny-gemma3 Gemma3TextConfig's (4,096). Its
forward keeps tensors Llama's does not (the two more norms, the GELU's input, the scaled embedding): activation terms
of its own, measured on Gemma 3 shapes (formulas/activations.py). Under TP the q/k norms stay whole and take the rank's
heads, as Qwen3's.

The image-text Gemma 3 checkpoints (4B-27B, model_type gemma3) hold a vision tower beside this text model: refused.
The presets are Gemma 3 1B's config.json (tiny-gemma3: tiny-qwen3's sizes with Gemma's block).
"""

from ..errors import HfscaleError
from .family import ModelShape, register
from .qwen3 import Qwen3

GEMMA3_VOCAB, LOCAL_ROPE_THETA = 262144, 10000.0


class Gemma3(Qwen3):
    name, title = "gemma3", "Gemma 3"
    model_types = ("gemma3_text",)
    differs = {"gemma3": "Gemma 3's image-text checkpoint (a vision tower beside the text model; its text_config is "
                         "the gemma3_text model hfscale trains)"}
    class_name = "Gemma3ForCausalLM"
    config_class = "Gemma3TextConfig"
    tied_default = True
    mlp_output_normed = True
    rope_per_layer_type, sliding_rope_theta = True, LOCAL_ROPE_THETA
    full_attention_every, default_window = 6, 4096  # Gemma3TextConfig's; Gemma 3 1B's own window is 512
    window_in_config = True
    block_norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                   "post_feedforward_layernorm")
    config_needs = {"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
                    "final_logit_softcapping": None, "attn_logit_softcapping": None,
                    "use_bidirectional_attention": False}
    presets = {
        "tiny-gemma3": ModelShape("gemma3", 2, 64, 4, 2048, 256, 176, 2, True, 1000000.0, 32),
        "gemma3-1b": ModelShape("gemma3", 26, 1152, 4, GEMMA3_VOCAB, 32768, 6912, 1, True, 1000000.0, 256, 512),
    }

    def check(self, shape):
        super().check(shape)
        if shape.hidden % shape.n_head:  # Gemma3TextConfig's own rule, whatever the head width
            raise HfscaleError(f"heads ({shape.n_head}) must divide hidden size ({shape.hidden}): Gemma 3's config "
                               f"requires it, its heads' own width apart")


GEMMA3_FAMILY = register(Gemma3())
