"""What hfscale knows about models: one module per family (gpt2, bloom, llama, qwen2, qwen3, smollm3, gemma3,
olmo2 with OLMo 3, phi3), each registered by the transformers model_types it serves (family.py); the shape of the
model a user names (resolve.py); building and loading one (build.py, torch and transformers imported inside its
functions). Importing this package imports neither."""

# each registers its family, in the order presets are listed
from . import gpt2, bloom, llama, qwen2, qwen3, smollm3, gemma3, olmo2, phi3  # noqa: F401,I001
from .build import (check_attention, declare_causal_lm_loss, hf_config, load_pretrained, model_class,
                    parameter_count, partition_zero3, pretrained_on_meta, zero3_dtype, build_model)
from .family import FAMILIES, Family, ModelShape, families_where, family, family_for_model_type, served_model_types
from .resolve import (MODEL_OVERRIDES, PRESETS, SHAPE_BOUNDS, WEIGHT_FILES, missing_local_path, model_dropout,
                      model_shape, pretrained_shape, resolve_seq_len, resolve_shape, shape_from_config, validate_shape)

GPT2_VOCAB, BLOOM_VOCAB = gpt2.VOCAB, bloom.VOCAB

__all__ = ["BLOOM_VOCAB", "FAMILIES", "Family", "GPT2_VOCAB", "MODEL_OVERRIDES", "ModelShape", "PRESETS",
           "SHAPE_BOUNDS", "WEIGHT_FILES", "build_model", "check_attention", "declare_causal_lm_loss", "families_where",
           "family", "family_for_model_type", "hf_config", "load_pretrained", "missing_local_path", "model_class",
           "model_dropout", "model_shape", "parameter_count", "partition_zero3", "pretrained_on_meta",
           "pretrained_shape", "resolve_seq_len", "resolve_shape", "served_model_types", "shape_from_config",
           "validate_shape", "zero3_dtype"]
