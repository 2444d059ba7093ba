"""Phi-3 and Phi-4 (transformers' Phi3ForCausalLM, the `phi3` model): Llama's block - RMSNorms, rotary positions, a
SwiGLU MLP, grouped-query attention, no biases, an untied head - with its projections fused: q, k and v are one
`qkv_proj` ([q | k | v] rows), gate and up one `gate_up_proj` ([gate | up] rows). The matmuls are Llama's, so are
the counts and the FLOPs; the forward slices q/k/v out of one output and chunks gate/up out of another, which keeps
other tensors for the backward than Llama's separate projections do (views of one storage; under SDPA their
contiguous copies): activation terms of its own (formulas/activations.py). Its dropout is on each sublayer's output
before the residual add (resid_pdrop) and on the attention probabilities; embd_pdrop is read by no module.

Under hfscale's TP a fused matrix would have to split per part (each rank its heads' q, k and v rows: unequal widths
under grouped-query attention) and the attention slice its local output at its own query width: not built, so tp and
fsdp_tp refuse it (Family.tp_unsupported). Megatron's layouts, whose fused QKV splits by heads, still plan it.

The presets are Phi-3-mini-4k's and Phi-4's config.json: hidden, layers, heads, key/value heads, intermediate size,
vocabulary (32,064; 100,352), positions (4,096; 16,384), rotary base (10,000; 250,000) and Phi-3-mini's 2,047-token
window on every layer (Phi-4 has none).
"""

from ..errors import HfscaleError
from .family import ModelShape, register
from .llama import Llama


class Phi3(Llama):
    name, title = "phi3", "Phi-3"
    model_types = ("phi3",)
    differs = {}
    class_name = "Phi3ForCausalLM"
    config_class = "Phi3Config"
    own_head_width = False  # Phi3Config has no head_dim: its heads are hidden / heads wide
    activations_as = None  # its fused projections keep other tensors than Llama's: terms of its own
    config_needs = {"hidden_act": "silu"}
    window_in_config = True  # a window on every layer where the shape sets one (Phi-3-mini's 2,047)
    dropout_keys = ("resid_pdrop", "attention_dropout")
    dropout_sites = (2, 0)  # resid_attn_dropout and resid_mlp_dropout on a block's b·s·h outputs; none on embeddings
    # the sizes Megatron's TP gives each rank (its fused QKV splits by heads, gate/up by columns): formulas/tensors.py
    tp_plan = {"self_attn.qkv_proj": "colwise", "self_attn.o_proj": "rowwise", "mlp.gate_up_proj": "colwise",
               "mlp.down_proj": "rowwise"}
    tp_unsupported = ("its fused qkv_proj and gate_up_proj would split per part (each rank its heads' q, k and v "
                      "rows), which hfscale's TP does not build; use fsdp or zero3")
    presets = {
        # tiny-llama's sizes in Phi-3's block
        "tiny-phi3": ModelShape("phi3", 2, 64, 4, 2048, 256, 176, 2, False, 10000.0),
        "phi-3-mini": ModelShape("phi3", 32, 3072, 32, 32064, 4096, 8192, 32, False, 10000.0, None, 2047),
        "phi-4": ModelShape("phi3", 40, 5120, 40, 100352, 16384, 17920, 10, False, 250000.0),
    }

    def layer_tensors(self, shape):
        h, f, q, kv = shape.hidden, shape.ffn_size, shape.q_hidden, shape.kv_hidden
        return [("self_attn.o_proj.weight", (h, q)), ("self_attn.qkv_proj.weight", (q + 2 * kv, h)),
                ("mlp.gate_up_proj.weight", (2 * f, h)), ("mlp.down_proj.weight", (h, f)),
                *((f"{norm}.weight", (h,)) for norm in self.block_norms)]

    def hf_config(self, shape, dropout=0.0, **extra):
        """Phi3Config's special tokens default to Phi-3's tokenizer's ids (padding at 32,000, beyond a smaller
        vocabulary): none, as Qwen3Config's, and the run sets end-of-text from its tokenizer. Its window is the
        shape's, on every layer (Phi-3-mini's 2,047; none by default)."""
        tokens = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None, "resid_pdrop": dropout,
                  "embd_pdrop": 0.0}
        return super().hf_config(shape, dropout, **{**tokens, **extra})

    def shape_from_config(self, config):
        partial = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
        if partial != 1.0:
            raise HfscaleError(f"its phi3 config differs from the Phi-3 shape hfscale trains: partial_rotary_factor="
                               f"{partial} (needs 1.0: rotary positions over whole heads)")
        return super().shape_from_config(config)


PHI3_FAMILY = register(Phi3())
