"""GPT-2 (transformers' GPT2LMHeadModel): learned positions, LayerNorms with biases, a 4h GELU MLP, Conv1D
projections stored [in, out] with a fused [q | k | v], the head tied to the word embedding. Also the BigScience
experiment shapes, which used this architecture."""

from .family import UNTIED_HEAD, Family, ModelShape, register

VOCAB = 50257


def _gpt2(n_layer, hidden, n_head, positions=1024, vocab=VOCAB):
    return ModelShape("gpt2", n_layer, hidden, n_head, vocab, positions)


class GPT2(Family):
    name, title = "gpt2", "GPT-2"
    model_types = ("gpt2",)
    class_name = "GPT2LMHeadModel"
    conv1d = True
    block_prefix = "transformer.h"
    attention_module = "attn"
    embedding = "transformer.wte.weight"
    final_norm = "transformer.ln_f"
    position_embedding = "transformer.wpe.weight"
    tp_plan = {"attn.c_attn": "colwise_fused3", "attn.c_proj": "rowwise", "mlp.c_fc": "colwise",
               "mlp.c_proj": "rowwise"}
    presets = {
        # A few-hundred-thousand-parameter GPT-2 for tests and the CPU default run.
        "tiny": _gpt2(2, 64, 4, positions=256, vocab=2048),
        # OpenAI GPT-2 sizes.
        "gpt2-124m": _gpt2(12, 768, 12),
        "gpt2-350m": _gpt2(24, 1024, 16),
        "gpt2-774m": _gpt2(36, 1280, 20),
        "gpt2-1.5b": _gpt2(48, 1600, 25),
        # Megatron/BigScience GPT-2 1.3B (the usual MFU benchmark shape).
        "gpt2-1.3b": _gpt2(24, 2048, 16, positions=2048),
        # BigScience experiment shapes (GPT-2 architecture, seq 2048).
        "bigscience-13b": _gpt2(40, 5120, 40, positions=2048),
        "bigscience-104b": _gpt2(32, 16384, 32, positions=2048),
    }

    def tensors(self, shape):
        h, f, v = shape.hidden, shape.ffn_size, shape.vocab
        block = [("ln_1.weight", (h,)), ("ln_1.bias", (h,)), ("attn.c_attn.weight", (h, 3 * h)),
                 ("attn.c_attn.bias", (3 * h,)), ("attn.c_proj.weight", (h, h)), ("attn.c_proj.bias", (h,)),
                 ("ln_2.weight", (h,)), ("ln_2.bias", (h,)), ("mlp.c_fc.weight", (h, f)), ("mlp.c_fc.bias", (f,)),
                 ("mlp.c_proj.weight", (f, h)), ("mlp.c_proj.bias", (h,))]
        return [(self.embedding, (v, h)), (self.position_embedding, (shape.positions, h)),
                *((f"{self.block_prefix}.{i}.{name}", dims) for i in range(shape.n_layer) for name, dims in block),
                ("transformer.ln_f.weight", (h,)), ("transformer.ln_f.bias", (h,)),
                *([] if shape.tied_head else [(UNTIED_HEAD, (v, h))])]

    dropout_keys = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
    dropout_sites = (2, 1)  # resid_dropout after the attention, the MLP's dropout; drop after wte + wpe

    def hf_config(self, shape, dropout=0.0, **extra):
        from transformers import GPT2Config

        extra.setdefault("bos_token_id", shape.vocab - 1)  # GPT-2's <|endoftext|> is the last id
        extra.setdefault("eos_token_id", shape.vocab - 1)
        return GPT2Config(n_layer=shape.n_layer, n_embd=shape.hidden, n_head=shape.n_head, n_inner=shape.ffn,
                          vocab_size=shape.vocab, n_positions=shape.positions, tie_word_embeddings=shape.tied_head,
                          resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, **extra)

    def shape_from_config(self, config):
        return ModelShape("gpt2", config.n_layer, config.n_embd, config.n_head, config.vocab_size, config.n_positions,
                          config.n_inner, tied=bool(getattr(config, "tie_word_embeddings", True)))

    def adapt_attention_for_tp(self, attention, tp, rank):
        attention.num_heads //= tp
        attention.split_size //= tp  # c_attn's output is [q_r | k_r | v_r], h / TP each


GPT2_FAMILY = register(GPT2())
