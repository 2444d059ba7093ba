"""SmolLM3 (transformers' SmolLM3ForCausalLM), Hugging Face's open 3B model: Llama's tensors and shape (RMSNorms, a
SwiGLU MLP of its own width, grouped-query attention, no biases, a tied head) with rotary positions left out of every
fourth layer (NoPE: `no_rope_layers`, one per `no_rope_layer_interval` layers). Rotary positions are no parameter and no
matmul, so the counts, the FLOPs and the TP plan are Llama's; a NoPE layer's attention keeps its queries and keys as the
projections gave them rather than rotated - as many bytes - so the activation terms are Llama's too (`activations_as`,
checked in tests/test_models.py). Built as SmolLM3ForCausalLM, so a preset trains with its NoPE layers.

The preset is SmolLM3-3B's config.json (hidden, layers, heads, key/value heads, intermediate size, vocabulary, 65,536
positions, tied head, rotary base 5,000,000); `tiny-smollm3` has four layers, so that one is NoPE.
"""

from .family import ModelShape, register
from .llama import LLAMA3_VOCAB, Llama


class SmolLM3(Llama):
    name, title = "smollm3", "SmolLM3"
    model_types = ("smollm3",)
    class_name = "SmolLM3ForCausalLM"
    config_class = "SmolLM3Config"
    tied_default = True
    activations_as = "llama"
    presets = {
        "tiny-smollm3": ModelShape("smollm3", 4, 64, 4, 2048, 256, 176, 2, True, 10000.0),
        "smollm3-3b": ModelShape("smollm3", 36, 2048, 16, LLAMA3_VOCAB, 65536, 11008, 4, True, 5000000.0),
    }

    def hf_config(self, shape, dropout=0.0, **extra):
        """SmolLM3Config's special tokens default to its tokenizer's ids (a padding row at 128,004, which an embedding
        of a smaller vocabulary has not): none, as Qwen3Config's, and the run sets end-of-text from its tokenizer."""
        tokens = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
        return super().hf_config(shape, dropout, **{**tokens, **extra})


SMOLLM3_FAMILY = register(SmolLM3())
