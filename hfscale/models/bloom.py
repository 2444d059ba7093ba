"""BLOOM (transformers' BloomForCausalLM): ALiBi instead of positions, a LayerNorm after the word embeddings, a 4h GELU
MLP, nn.Linear projections with the fused query_key_value laid out per head, the head tied to the word embedding; eager
attention only in transformers."""

from ..errors import HfscaleError
from .family import UNTIED_HEAD, Family, ModelShape, register

VOCAB = 250880
TRAINED_SEQ = 2048  # ALiBi has no position table: the sequence length BLOOM was trained with


def _bloom(n_layer, hidden, n_head):
    return ModelShape("bloom", n_layer, hidden, n_head, VOCAB, TRAINED_SEQ)


class Bloom(Family):
    name, title = "bloom", "BLOOM"
    model_types = ("bloom",)
    class_name = "BloomForCausalLM"
    block_prefix = "transformer.h"
    attention_module = "self_attention"
    embedding = "transformer.word_embeddings.weight"
    final_norm = "transformer.ln_f"
    sdpa = False
    tp_plan = {"self_attention.query_key_value": "colwise", "self_attention.dense": "rowwise",
               "mlp.dense_h_to_4h": "colwise", "mlp.dense_4h_to_h": "rowwise"}
    presets = {
        "tiny-bloom": ModelShape("bloom", 2, 64, 4, 2048, 256),
        "bloom-560m": _bloom(24, 1024, 16),
        "bloom-1b1": _bloom(24, 1536, 16),
        "bloom-1b7": _bloom(24, 2048, 16),
        "bloom-3b": _bloom(30, 2560, 32),
        "bloom-7b1": _bloom(30, 4096, 32),
        "bigscience-176b": _bloom(70, 14336, 112),
    }

    def tensors(self, shape):
        h, f, v = shape.hidden, shape.ffn_size, shape.vocab
        block = [("input_layernorm.weight", (h,)), ("input_layernorm.bias", (h,)),
                 ("self_attention.query_key_value.weight", (3 * h, h)),
                 ("self_attention.query_key_value.bias", (3 * h,)),
                 ("self_attention.dense.weight", (h, h)), ("self_attention.dense.bias", (h,)),
                 ("post_attention_layernorm.weight", (h,)), ("post_attention_layernorm.bias", (h,)),
                 ("mlp.dense_h_to_4h.weight", (f, h)), ("mlp.dense_h_to_4h.bias", (f,)),
                 ("mlp.dense_4h_to_h.weight", (h, f)), ("mlp.dense_4h_to_h.bias", (h,))]
        return [(self.embedding, (v, h)), ("transformer.word_embeddings_layernorm.weight", (h,)),
                ("transformer.word_embeddings_layernorm.bias", (h,)),
                *((f"{self.block_prefix}.{i}.{name}", dims) for i in range(shape.n_layer) for name, dims in block),
                ("transformer.ln_f.weight", (h,)), ("transformer.ln_f.bias", (h,)),
                *([] if shape.tied_head else [(UNTIED_HEAD, (v, h))])]

    def check(self, shape):
        if shape.ffn is not None and shape.ffn != 4 * shape.hidden:
            raise HfscaleError(f"BLOOM's MLP is fixed at 4 x hidden ({4 * shape.hidden}); --ffn_hidden_size is for "
                               "GPT-2 and Llama")
        if shape.n_kv_head not in (None, shape.n_head):
            raise HfscaleError(f"BLOOM has one key/value head per query head ({shape.n_head}); --num_key_value_heads "
                               "is for Llama")

    dropout_keys = ("hidden_dropout", "attention_dropout")
    dropout_sites = (2, 0)  # dropout_add after the attention and after the MLP; none on the embeddings
    softmax_fp32 = True

    def hf_config(self, shape, dropout=0.0, **extra):
        from transformers import BloomConfig

        return BloomConfig(n_layer=shape.n_layer, hidden_size=shape.hidden, n_head=shape.n_head,
                           vocab_size=shape.vocab, tie_word_embeddings=shape.tied_head, hidden_dropout=dropout,
                           attention_dropout=dropout, **extra)

    def shape_from_config(self, config):
        return ModelShape("bloom", config.n_layer, config.hidden_size, config.n_head, config.vocab_size, TRAINED_SEQ,
                          tied=bool(getattr(config, "tie_word_embeddings", True)))

    def adapt_attention_for_tp(self, attention, tp, rank):
        attention.num_heads //= tp
        attention.register_forward_pre_hook(_slice_alibi(rank, tp), with_kwargs=True)


def _slice_alibi(rank: int, tp: int):
    """BLOOM builds ALiBi biases for all heads, [batch x heads, 1, seq]: a rank's attention needs its own heads'."""
    def hook(module, args, kwargs):
        alibi = kwargs.get("alibi")
        if alibi is not None:
            heads = module.num_heads  # already this rank's
            batch = alibi.shape[0] // (heads * tp)
            mine = alibi.view(batch, heads * tp, *alibi.shape[1:])[:, rank * heads:(rank + 1) * heads]
            kwargs["alibi"] = mine.reshape(batch * heads, *alibi.shape[1:])
        return args, kwargs
    return hook


BLOOM_FAMILY = register(Bloom())
