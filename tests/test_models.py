"""hfscale/models.py's build_model: transformers' own initialisation, drawn once."""

import json
import math
from dataclasses import replace

import pytest
import torch

from conftest import load_benchmark
from hfscale.models import FAMILIES, PRESETS, build_model

RANDOM_INITS = ("normal_", "uniform_")


def drawn_elements(build) -> tuple[object, int]:
    """What `build()` returns, and how many random numbers its weights took (every normal_/uniform_ on a tensor)."""
    drawn = 0
    originals = {name: getattr(torch.Tensor, name) for name in RANDOM_INITS}

    def counting(name):
        def draw(tensor, *args, **kwargs):
            nonlocal drawn
            drawn += tensor.numel()
            return originals[name](tensor, *args, **kwargs)
        return draw

    try:
        for name in RANDOM_INITS:
            setattr(torch.Tensor, name, counting(name))
        return build(), drawn
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@pytest.mark.parametrize("preset", ["tiny", "tiny-bloom"])
def test_the_weights_are_transformers_initialisation_drawn_once(preset):
    """Against the model class's own constructor (the constructors' draws, then post_init's): every tensor has the
    same distribution (norms and biases exactly, the random ones the same spread: GPT-2's residual projections
    0.02/sqrt(2 n_layer), BLOOM's Linear layers the model's 0.02, not nn.Linear's kaiming_uniform_), tied as before,
    each random weight drawn once (the constructor's way: twice, and the tied head a third time)."""
    shape = PRESETS[preset]
    constructed = load_benchmark("model_build").constructed  # what benchmarks/model_build.py times it against
    built, built_drawn = drawn_elements(lambda: build_model(shape, seed=0))
    reference, reference_drawn = drawn_elements(lambda: constructed(shape, 0))
    random = sum(p.numel() for p in built.parameters() if p.std() > 0)  # the tied head counted once
    # GPT-2's scheme draws each residual projection twice (0.02, then 0.02/sqrt(2 n_layer)): transformers', kept
    redrawn = sum(p.numel() for n, p in built.named_parameters() if n.endswith("c_proj.weight"))
    assert built_drawn == random + redrawn
    assert reference_drawn >= 2 * random + redrawn  # the constructors' draws, then post_init's, the head's too
    assert built.lm_head.weight is built.get_input_embeddings().weight
    mine, theirs = dict(built.named_parameters()), dict(reference.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, ref in theirs.items():
        got = mine[name].detach()
        if ref.std() == 0:  # LayerNorm weights (1) and biases (0)
            assert torch.equal(got, ref.detach()), name
            continue
        assert not torch.equal(got, ref.detach()), name  # other draws, same scheme
        assert got.std().item() == pytest.approx(ref.std().item(), rel=0.1), name
        assert abs(got.mean().item()) < 4 * ref.std().item() / math.sqrt(ref.numel()), name
    if shape.family == "gpt2":
        assert mine["transformer.h.0.mlp.c_proj.weight"].std().item() == pytest.approx(
            0.02 / math.sqrt(2 * shape.n_layer), rel=0.1)


def test_a_model_built_on_the_meta_device_draws_nothing():
    """train.build's ranks without weights build on the meta device: no initialisation runs there."""
    with torch.device("meta"):
        model, drawn = drawn_elements(lambda: build_model(PRESETS["tiny"], seed=0))
    assert drawn == 0 and all(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_each_familys_dropout_keys_are_what_its_config_sets_from_dropout():
    """results.json's model.dropout, and whether the estimate counts dropout's masks, read the family's dropout_keys
    (Family.dropout_of): every key hf_config sets from --dropout, and no other."""
    from hfscale.models.build import hf_config

    for spec in FAMILIES.values():
        shape = next(iter(spec.presets.values()))
        config = hf_config(shape, 0.3)
        assert spec.dropout_keys and all(getattr(config, key) == 0.3 for key in spec.dropout_keys), spec.name
        set_keys = {k for k, v in config.to_dict().items() if v == 0.3}
        assert set_keys == set(spec.dropout_keys), (spec.name, set_keys)
        assert spec.dropout_of(config) == 0.3 and spec.dropout_of(hf_config(shape, 0.0)) == 0.0


def test_every_presets_config_reads_back_as_the_preset(tmp_path):
    """`--model_name_or_path` of a checkpoint saved from a preset plans the preset itself: hf_config and the family's
    shape_from_config are inverses, for every family (a Qwen2 config.json names its own model_type and class). A
    BLOOM config holds no sequence length (ALiBi): it reads as the one BLOOM trained with. A Llama config writes its
    head width out whatever it is; read back, a Llama's is set only where apart from hidden / heads, as the presets'."""
    from hfscale.errors import HfscaleError
    from hfscale.models import hf_config, pretrained_shape

    def sizes(shape):
        positions = 2048 if shape.family == "bloom" else shape.positions
        return (shape.family, shape.n_layer, shape.hidden, shape.n_head, shape.kv_heads, shape.head_size,
                shape.head_dim, shape.ffn_size, shape.vocab, positions, shape.tied_head, shape.rope_theta, shape.window)

    for name, shape in PRESETS.items():
        folder = tmp_path / name
        config = hf_config(shape)
        config.save_pretrained(folder)
        assert sizes(pretrained_shape(str(folder), weights=False)) == sizes(shape), name
        # the windowed layers the estimate counts are those transformers' config derives (a config without layer types,
        # Mistral's and Phi-3's, windows every layer where it sets a window: their models pick the mask so)
        window = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None) or [
            "sliding_attention" if window else "full_attention"] * shape.n_layer
        assert shape.spec.windowed_layers(shape) == types.count("sliding_attention"), name
        assert shape.window == (config.sliding_window if "sliding_attention" in types else None), name
    assert PRESETS["gemma3-1b"].window == 512 and PRESETS["gemma3-1b"].spec.windowed_layers(PRESETS["gemma3-1b"]) == 22
    # Mistral-Nemo-Base-2407's own config.json (transformers 4's keys, model_type mistral): the preset
    nemo = {"architectures": ["MistralForCausalLM"], "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
            "intermediate_size": 14336, "max_position_embeddings": 1024000, "model_type": "mistral",
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 131072}
    (tmp_path / "nemo").mkdir()
    (tmp_path / "nemo" / "config.json").write_text(json.dumps(nemo))
    assert pretrained_shape(str(tmp_path / "nemo"), weights=False) == PRESETS["mistral-nemo-12b"]
    # Llama-3.1-8B's (transformers 4's keys): its llama3 rotary scaling is no parameter and no FLOP - the preset
    llama31 = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
               "hidden_size": 4096,
               "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256}
    (tmp_path / "llama31").mkdir()
    (tmp_path / "llama31" / "config.json").write_text(json.dumps(llama31))
    assert pretrained_shape(str(tmp_path / "llama31"), weights=False) == PRESETS["llama-3.1-8b"]
    # Phi-3-mini-4k's (transformers 4's keys; a 2,047-token window on every layer, its tokenizer's special tokens) and
    # Phi-4's (no window)
    phi3 = {"architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
            "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
            "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
            "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
            "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False, "vocab_size": 32064}
    phi4 = {**phi3, "bos_token_id": 100257, "eos_token_id": 100257, "pad_token_id": 100257, "hidden_size": 5120,
            "intermediate_size": 17920, "max_position_embeddings": 16384, "original_max_position_embeddings": 16384,
            "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 10, "rope_theta": 250000,
            "sliding_window": None, "vocab_size": 100352}
    for name, config in (("phi-3-mini", phi3), ("phi-4", phi4)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        assert pretrained_shape(str(tmp_path / name), weights=False) == PRESETS[name], name
    assert PRESETS["phi-3-mini"].window == 2047 and PRESETS["phi-4"].window is None
    assert hf_config(replace(PRESETS["phi-4"], sliding_window=1024)).sliding_window == 1024  # --sliding_window's
    # Mistral-7B-v0.1's: a 4,096-token window on every layer (MistralForCausalLM's, the class its checkpoint builds)
    v01 = {**nemo, "head_dim": None, "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000,
           "max_position_embeddings": 32768, "rope_theta": 10000.0, "sliding_window": 4096}
    (tmp_path / "v01").mkdir()
    (tmp_path / "v01" / "config.json").write_text(json.dumps(v01))
    mistral = pretrained_shape(str(tmp_path / "v01"), weights=False)
    assert (mistral.family, mistral.window, mistral.spec.windowed_layers(mistral)) == ("llama", 4096, 32)
    # Qwen2's use_sliding_window windows the layers from max_window_layers on: its attention's business, not the shape's
    hf_config(PRESETS["tiny-qwen2"], use_sliding_window=True, max_window_layers=1,
              sliding_window=32).save_pretrained(tmp_path / "qwen2-windowed")
    assert pretrained_shape(str(tmp_path / "qwen2-windowed"), weights=False).window is None
    # SmolLM3-3B's, its NoPE layers listed (1: rotary, 0: none)
    smollm3 = {"architectures": ["SmolLM3ForCausalLM"], "hidden_act": "silu", "hidden_size": 2048,
               "intermediate_size": 11008, "max_position_embeddings": 65536, "model_type": "smollm3",
               "no_rope_layers": [1, 1, 1, 0] * 9, "num_attention_heads": 16, "num_hidden_layers": 36,
               "num_key_value_heads": 4, "rope_theta": 5000000.0, "tie_word_embeddings": True, "vocab_size": 128256}
    (tmp_path / "smollm3").mkdir()
    (tmp_path / "smollm3" / "config.json").write_text(json.dumps(smollm3))
    assert pretrained_shape(str(tmp_path / "smollm3"), weights=False) == PRESETS["smollm3-3b"]
    # Gemma 3 1B's (transformers 4's keys: its global and local rotary bases, a window over 5 layers in 6)
    gemma3 = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attn_logit_softcapping": None,
              "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
              "hidden_size": 1152, "intermediate_size": 6912, "max_position_embeddings": 32768,
              "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
              "query_pre_attn_scalar": 256, "rope_local_base_freq": 10000, "rope_theta": 1000000,
              "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144}
    (tmp_path / "gemma3").mkdir()
    (tmp_path / "gemma3" / "config.json").write_text(json.dumps(gemma3))
    assert pretrained_shape(str(tmp_path / "gemma3"), weights=False) == PRESETS["gemma3-1b"]  # its 512 window too
    # layer types other than the family's pattern: refused, the estimate would count the pattern's
    (tmp_path / "gemma3-global").mkdir()
    global_only = {**gemma3, "layer_types": ["full_attention"] * 26}
    (tmp_path / "gemma3-global" / "config.json").write_text(json.dumps(global_only))
    with pytest.raises(HfscaleError, match=r"in layers \[0, 1, .*, 25\], where Gemma 3's pattern \(one layer in 6\), "
                                           r"which hfscale counts, does in \[5, 11, 17, 23\]"):
        pretrained_shape(str(tmp_path / "gemma3-global"), weights=False)
    # OLMo-2-1124-7B's (transformers 4's keys; its tokenizer's special tokens)
    olmo2 = {"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
             "max_position_embeddings": 4096, "model_type": "olmo2", "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
             "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False, "vocab_size": 100352}
    (tmp_path / "olmo2").mkdir()
    (tmp_path / "olmo2" / "config.json").write_text(json.dumps(olmo2))
    assert pretrained_shape(str(tmp_path / "olmo2"), weights=False) == PRESETS["olmo2-7b"]
    # an OLMo 3 config in the form its checkpoints write (one rotary base at the top, the layer types listed): on
    # OLMo 2 7B's widths, the olmo3-7b preset
    olmo3 = {**olmo2, "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "max_position_embeddings": 65536,
             "sliding_window": 4096, "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 8}
    (tmp_path / "olmo3").mkdir()
    (tmp_path / "olmo3" / "config.json").write_text(json.dumps(olmo3))
    assert pretrained_shape(str(tmp_path / "olmo3"), weights=False) == PRESETS["olmo3-7b"]
    assert replace(PRESETS["olmo3-7b"], family="olmo2", positions=4096) == PRESETS["olmo2-7b"]


def saved_for_backward(model, ids) -> int:
    """Bytes of the distinct storages a training forward keeps for its backward (autograd's saved tensors), parameters
    left out: the activations."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return sum(kept.values())


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_qwen2_and_smollm3_keep_for_their_backward_what_llama_keeps(attention):
    """Why the Qwen2 and SmolLM3 families take the Llama family's measured activation terms (Family.activations_as):
    with the same sizes, their forwards keep the same bytes for the backward - Qwen2's q/k/v biases are added inside
    their matmuls and keep nothing more, SmolLM3's NoPE layers (one in four: layer 4 of these) keep their queries and
    keys unrotated, as many - in fp32 and under bf16 autocast."""
    from hfscale.models import FAMILIES

    assert FAMILIES["llama"].activations_as is None
    sizes = dict(n_layer=4, hidden=96, n_head=6, n_kv_head=2, ffn=256, vocab=512, positions=128, tied=False)
    ids = torch.randint(0, 512, (2, 96), generator=torch.Generator().manual_seed(0))
    for autocast in (False, True):
        kept = {}
        for family in ("llama", "qwen2", "smollm3"):
            assert family == "llama" or FAMILIES[family].activations_as == "llama"
            shape = replace(PRESETS[f"tiny-{family}"], **sizes)
            model = build_model(shape, seed=0, attn_implementation=attention)
            model.train()
            assert family != "smollm3" or [layer.self_attn.use_rope for layer in model.model.layers] == [1, 1, 1, 0]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                kept[family] = saved_for_backward(model, ids)
        assert kept["llama"] > 1e6 and kept["qwen2"] == kept["smollm3"] == kept["llama"], (autocast, kept)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_olmo3_keeps_for_its_backward_what_olmo2_keeps_within_its_window(attention):
    """Why OLMo 3 takes OLMo 2's measured activation terms: with the same sizes and a sequence within its sliding
    window, its forward keeps OLMo 2's bytes but for its second rotary table (the windowed layers' cos and sin, fp32:
    2 x 4 x s x head width), in fp32 and under bf16 autocast. Its windowed layers are real: with the window shorter
    than the sequence the logits move."""
    from hfscale.models import FAMILIES

    assert FAMILIES["olmo3"].activations_as == "olmo2" and FAMILIES["olmo2"].activations_as is None
    sizes = dict(n_layer=4, hidden=96, n_head=6, n_kv_head=2, ffn=256, vocab=512, positions=128)
    seq = 96
    ids = torch.randint(0, 512, (2, seq), generator=torch.Generator().manual_seed(0))
    for autocast in (False, True):
        kept = {}
        for family in ("olmo2", "olmo3"):
            model = build_model(replace(PRESETS[f"tiny-{family}"], **sizes), seed=0, attn_implementation=attention)
            model.train()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                kept[family] = saved_for_backward(model, ids)
        assert kept["olmo2"] > 1e6 and kept["olmo3"] - kept["olmo2"] == 2 * 4 * seq * 96 // 6, (autocast, kept)
    logits = {}
    for window in (None, 16):  # the family's 4,096, and a window the shape sets shorter than the sequence
        model = build_model(replace(PRESETS["tiny-olmo3"], **sizes, sliding_window=window), seed=0,
                            attn_implementation=attention).eval()
        assert model.config.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
        assert model.config.sliding_window == (window or 4096)
        with torch.no_grad():
            logits[window] = model(input_ids=ids).logits
    assert not torch.allclose(logits[16], logits[None])
