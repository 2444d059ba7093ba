"""Model presets (GPT-2, BLOOM and BigScience experiment shapes), the shape of a model a user names, and building a
model from one. Below both a run and the planners: `hfscale train`, `estimate`, `project` and `tune` name models with
the same flags and resolve them here.

A preset is only a ModelShape; the model is built from a transformers config so every Trainer feature works.
torch and transformers are imported inside the functions that build models: the planners import this module without
paying for them.
"""

from dataclasses import replace
from pathlib import Path

from .errors import HfscaleError, one_of
from .formulas.metrics import ModelShape

GPT2_VOCAB, BLOOM_VOCAB = 50257, 250880


def _gpt2(n_layer, hidden, n_head, positions=1024, vocab=GPT2_VOCAB):
    return ModelShape("gpt2", n_layer, hidden, n_head, vocab, positions)


def _bloom(n_layer, hidden, n_head):
    # BLOOM uses ALiBi (no position table); 2048 is the sequence length it was trained with.
    return ModelShape("bloom", n_layer, hidden, n_head, BLOOM_VOCAB, 2048)


PRESETS: dict[str, ModelShape] = {
    # A few-hundred-thousand-parameter GPT-2 for tests and the CPU default run.
    "tiny": _gpt2(2, 64, 4, positions=256, vocab=2048),
    "tiny-bloom": ModelShape("bloom", 2, 64, 4, 2048, 256),
    # OpenAI GPT-2 sizes.
    "gpt2-124m": _gpt2(12, 768, 12),
    "gpt2-350m": _gpt2(24, 1024, 16),
    "gpt2-774m": _gpt2(36, 1280, 20),
    "gpt2-1.5b": _gpt2(48, 1600, 25),
    # Megatron/BigScience GPT-2 1.3B (the usual MFU benchmark shape).
    "gpt2-1.3b": _gpt2(24, 2048, 16, positions=2048),
    # BLOOM family shapes.
    "bloom-560m": _bloom(24, 1024, 16),
    "bloom-1b1": _bloom(24, 1536, 16),
    "bloom-1b7": _bloom(24, 2048, 16),
    "bloom-3b": _bloom(30, 2560, 32),
    "bloom-7b1": _bloom(30, 4096, 32),
    # BigScience experiment shapes (GPT-2 architecture, seq 2048).
    "bigscience-13b": _gpt2(40, 5120, 40, positions=2048),
    "bigscience-104b": _gpt2(32, 16384, 32, positions=2048),
    "bigscience-176b": ModelShape("bloom", 70, 14336, 112, BLOOM_VOCAB, 2048),
}


def resolve_shape(
    preset: str,
    n_layer: int | None = None,
    hidden: int | None = None,
    n_head: int | None = None,
    ffn: int | None = None,
    vocab: int | None = None,
    positions: int | None = None,
) -> ModelShape:
    """A preset with explicit overrides applied, validated."""
    if preset not in PRESETS:
        raise one_of("model preset", preset, PRESETS)
    overrides = dict(n_layer=n_layer, hidden=hidden, n_head=n_head, ffn=ffn, vocab=vocab, positions=positions)
    shape = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    validate_shape(shape)
    return shape


# The shape overrides every model flag set takes (hfscale train's ModelArguments and the planners' options).
MODEL_OVERRIDES = ("n_layer", "hidden_size", "n_head", "ffn_hidden_size", "vocab_size")


def model_shape(model: str = "tiny", model_name_or_path: str | None = None, trust_remote_code: bool = False,
                n_layer: int | None = None, hidden_size: int | None = None, n_head: int | None = None,
                ffn_hidden_size: int | None = None, vocab_size: int | None = None, weights: bool = True) -> ModelShape:
    """The shape of the model these flags name: a pretrained checkpoint's config (read, not its weights), else the
    preset with the overrides applied. The one place `--model`, `--model_name_or_path` and the overrides resolve.
    `weights`: a local checkpoint must hold its weights (a run loads them; a plan reads the config alone)."""
    if model_name_or_path:
        return pretrained_shape(model_name_or_path, trust_remote_code, weights)
    return resolve_shape(model, n_layer, hidden_size, n_head, ffn_hidden_size, vocab_size)


# Far beyond any model trained (the deepest ~1,000 layers, the widest hidden ~25k, vocabularies ~1M, contexts ~1M
# tokens), and what the formulas can walk: memory, FLOPs and communication go over the model tensor by tensor, so a
# billion layers would take every byte of the host before answering
SHAPE_BOUNDS = {"n_layer": 4096, "hidden": 2**20, "n_head": 2**20, "vocab": 2**24, "positions": 2**24,
                "ffn_size": 2**22}


def validate_shape(shape: ModelShape) -> None:
    for name in ("n_layer", "hidden", "n_head", "vocab", "positions", "ffn_size"):
        if getattr(shape, name) <= 0:
            raise HfscaleError(f"model {name} must be positive, got {getattr(shape, name)}")
        if getattr(shape, name) > SHAPE_BOUNDS[name]:
            raise HfscaleError(f"model {name} {getattr(shape, name):,} is beyond what hfscale plans (at most "
                               f"{SHAPE_BOUNDS[name]:,}, far beyond any model trained)")
    if shape.hidden % shape.n_head:
        raise HfscaleError(f"heads ({shape.n_head}) must divide hidden size ({shape.hidden})")
    if shape.family == "bloom" and shape.ffn is not None and shape.ffn != 4 * shape.hidden:
        raise HfscaleError(f"BLOOM's MLP is fixed at 4 x hidden ({4 * shape.hidden}); --ffn_hidden_size is GPT-2 only")


def resolve_seq_len(shape: ModelShape, requested: int | None) -> int:
    """Tokens per sample: as asked, else the model's positions up to 1024; never longer than the model's positions."""
    if requested is not None and requested <= 0:
        raise HfscaleError(f"--seq_len must be positive, got {requested}")
    seq_len = requested or min(shape.positions, 1024)
    if seq_len > shape.positions:
        raise HfscaleError(f"--seq_len {seq_len} is longer than the model's {shape.positions} positions")
    return seq_len


def hf_config(shape: ModelShape, dropout: float = 0.0, **extra):
    """The transformers config of a shape (imports transformers lazily: this module stays cheap to import).

    Dropout defaults to 0, as in BLOOM's pretraining: it also keeps runs with different numbers of processes
    comparable (each rank would draw its own dropout masks).
    """
    from transformers import BloomConfig, GPT2Config

    if shape.family == "gpt2":
        extra.setdefault("bos_token_id", shape.vocab - 1)  # GPT-2's <|endoftext|> is the last id
        extra.setdefault("eos_token_id", shape.vocab - 1)
        return GPT2Config(
            n_layer=shape.n_layer, n_embd=shape.hidden, n_head=shape.n_head, n_inner=shape.ffn,
            vocab_size=shape.vocab, n_positions=shape.positions,
            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, **extra,
        )
    return BloomConfig(n_layer=shape.n_layer, hidden_size=shape.hidden, n_head=shape.n_head, vocab_size=shape.vocab,
                       hidden_dropout=dropout, attention_dropout=dropout, **extra)


def shape_from_config(config) -> ModelShape:
    """The shape of a pretrained model's config (gpt2 and bloom only: the formulas know these two)."""
    if config.model_type == "gpt2":
        return ModelShape("gpt2", config.n_layer, config.n_embd, config.n_head, config.vocab_size,
                          config.n_positions, config.n_inner)
    if config.model_type == "bloom":
        return ModelShape("bloom", config.n_layer, config.hidden_size, config.n_head, config.vocab_size, 2048)
    raise HfscaleError(f"model type {config.model_type!r} is not supported; hfscale knows: gpt2, bloom")


def build_model(shape: ModelShape, seed: int, attn_implementation: str | None = None, dropout: float = 0.0):
    """A freshly initialised causal LM. Seeded here so every strategy and world size starts from the same weights.

    Built directly, not through from_config: under ZeRO-3, transformers would build it inside zero.Init and initialise
    it module by module on rank 0, drawing the random numbers in another order (10 of tiny's 28 tensors differ).
    hfscale partitions it afterwards instead (partition_zero3), so every strategy starts from these weights.
    """
    import torch
    from transformers.initialization import no_init_weights

    torch.manual_seed(seed)
    config = hf_config(shape, dropout)
    if attn_implementation:
        config._attn_implementation = attn_implementation
    model_cls = model_class(shape.family)
    # Each layer's constructor draws its weights (Conv1D normal_, Linear kaiming_uniform_, Embedding normal_) and
    # post_init then draws every one again with the model's own scheme, the head too before tying it to the embedding
    # (a second vocabulary x hidden draw). Constructed without the first, the head left out of the second (as
    # from_pretrained leaves it), then initialised by transformers and tied (tests/test_models.py).
    with no_init_weights():
        model = model_cls(config)
    for tied in model.all_tied_weights_keys:  # replaced by the weight it is tied to
        model.get_parameter(tied)._is_hf_initialized = True
    model.init_weights()  # skipped on the meta device (train.build's ranks without weights), as post_init's was
    return declare_causal_lm_loss(model)


def model_class(family: str):
    """transformers' causal-LM class of a family."""
    from transformers import BloomForCausalLM, GPT2LMHeadModel

    return GPT2LMHeadModel if family == "gpt2" else BloomForCausalLM


def _class_supports(cls, attention: str) -> bool:
    """transformers' own rule (PreTrainedModel._check_and_adjust_attn_implementation) for a registered name."""
    attention = attention.removeprefix("paged|")
    if attention == "eager":
        return True
    if attention == "sdpa":
        return cls._supports_sdpa
    if attention.startswith("flash_attention"):
        return cls._supports_flash_attn
    if attention == "flex_attention":
        return cls._supports_flex_attn
    return getattr(cls, "_supports_attention_backend", False)


def check_attention(family: str, attention: str | None) -> None:
    """--attn_implementation against the attention functions transformers registers and those this family's class
    supports (BLOOM: eager only), before any process starts: transformers raises only as each rank builds its model.
    A Hub kernel (`org/repo`) is left to transformers, for a class that takes attention backends."""
    if attention is None:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cls = model_class(family)
    registered = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    supported = [name for name in registered if _class_supports(cls, name)]
    hub_kernel = "/" in attention
    if attention not in registered and not hub_kernel:
        raise one_of("attention implementation", attention, supported)
    if attention not in supported and not (hub_kernel and _class_supports(cls, attention)):
        raise HfscaleError(f"{cls.__name__} has no {attention!r} attention in transformers; choose one of: "
                           f"{', '.join(supported)}")


def zero3_dtype(ds_config: dict):
    """The dtype ZeRO-3 stores parameters in: bf16 or fp16 when the DeepSpeed config enables it, else fp32 (what
    zero.Init reads from the same config; the engine does not cast a model zero.Init has partitioned)."""
    import torch

    def enabled(key: str) -> bool:
        return str((ds_config.get(key) or {}).get("enabled")).lower() == "true"

    return torch.bfloat16 if enabled("bf16") else torch.float16 if enabled("fp16") else torch.float32


def partition_zero3(model, ds_config: dict):
    """Partition a built model the way `deepspeed.zero.Init` partitions one built inside it: parameter by parameter,
    rank 0's values broadcast, each rank keeping 1/N. The model may be whole on rank 0 and uninitialised host tensors
    elsewhere (train.build): no rank ever holds more than its partitions plus one whole parameter beyond what it
    started with. Parameters are cast to the config's dtype first, one at a time, as the engine would have."""
    import deepspeed
    import torch.distributed as dist

    dtype = zero3_dtype(ds_config)
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    for b in model.buffers():  # DeepSpeed broadcasts buffers only for models it partitions itself
        dist.broadcast(b.data, src=0)
    # mem_efficient_linear would replace torch.nn.functional.linear for the whole process
    deepspeed.zero.Init(module=model, config_dict_or_path=ds_config, dtype=dtype, mem_efficient_linear=False)
    return model


def parameter_count(model, trainable_only: bool = False) -> int:
    """Elements of the whole model, also when ZeRO-3 has partitioned it (a partitioned parameter is an empty
    placeholder; ds_numel is its whole size)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad or not trainable_only)


def declare_causal_lm_loss(model):
    """Name the loss the model really computes. transformers derives `loss_type` from the class name, which finds
    nothing in "GPT2LMHeadModel" (BloomForCausalLM is found); the model still uses ForCausalLMLoss, but the Trainer
    then counts every label as a prediction target (`_loss_shifts_labels` is false), one per row too many: train
    and eval losses (and gradients) come out scaled by (seq-1)/seq. Found by tests/test_eval.py."""
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"
    return model


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def missing_local_path(name_or_path: str) -> bool:
    """A path (`/`, `.` or `~` first: never a Hub id) that does not exist; transformers would take it for a Hub id
    and answer with its repo-id rules."""
    return name_or_path.startswith(("/", ".", "~")) and not Path(name_or_path).expanduser().exists()


def pretrained_shape(name_or_path: str, trust_remote_code: bool = False, weights: bool = True) -> ModelShape:
    """The shape of a pretrained checkpoint, read from its config alone; `weights`: a local directory must hold them
    too (checked here, before a run starts, where loading them would fail in every rank)."""
    from transformers import AutoConfig

    if missing_local_path(name_or_path):
        raise HfscaleError(f"cannot load model {name_or_path!r}: no such directory")
    local = Path(name_or_path).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():  # transformers: "Should have a `model_type` key"
        hint = (" (a run's folder: `hfscale export RUN OUT` makes a model of its checkpoint)"
                if list(local.glob("checkpoint-*")) or (local / "hfscale_checkpoint.json").is_file() else "")
        raise HfscaleError(f"cannot load model {name_or_path!r}: no config.json in it{hint}")
    from huggingface_hub.errors import StrictDataclassError

    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:  # missing, unreachable, or a config.json of no known model type
        raise HfscaleError(f"cannot load model {name_or_path!r}: {str(err).splitlines()[0]}") from None
    except StrictDataclassError as err:  # a value of the wrong kind in config.json ("n_layer": "abc")
        raise HfscaleError(f"cannot load model {name_or_path!r}: its config.json: "
                           f"{' '.join(str(err).split())}") from None
    try:
        shape = shape_from_config(config)
        validate_shape(shape)
    except HfscaleError as err:  # transformers reads such a config without complaint and fails building the model
        raise HfscaleError(f"cannot load model {name_or_path!r}: its config's {err}") from None
    if weights and local.is_dir() and not any((local / f).is_file() for f in WEIGHT_FILES):
        raise HfscaleError(f"cannot load model {name_or_path!r}: the directory has a config but no weights "
                           f"({' or '.join(WEIGHT_FILES)})")
    return shape


def pretrained_on_meta(name_or_path: str, trust_remote_code: bool = False, attn_implementation: str | None = None):
    """A pretrained checkpoint's architecture on the meta device, no weights read (its shards come from rank 0)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import torch

    pretrained_shape(name_or_path, trust_remote_code)  # the same checks as the rank that loads it
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, dtype=torch.float32,
                                                 **kwargs)
    return declare_causal_lm_loss(model)


def load_pretrained(name_or_path: str, trust_remote_code: bool = False, attn_implementation: str | None = None):
    """A pretrained checkpoint (local directory or Hub name) and its shape."""
    from transformers import AutoModelForCausalLM

    import torch

    shape = pretrained_shape(name_or_path, trust_remote_code)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    # fp32 master weights whatever the checkpoint stores: transformers 5 loads in the stored dtype by default
    # (dtype="auto"), and a bf16 checkpoint would then train in pure bf16 under DDP while --bf16 means autocast
    model = AutoModelForCausalLM.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                                 dtype=torch.float32, **kwargs)
    return declare_causal_lm_loss(model), shape
