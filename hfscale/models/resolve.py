"""The shape of the model a user names - a preset with overrides, or a checkpoint's config.json - checked. Below both a
run and the planners: `hfscale train`, `estimate`, `project` and `tune` name models with the same flags and resolve
them here. transformers is imported only to read a checkpoint's config."""

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from ..errors import HfscaleError, one_of
from .family import ModelShape, all_presets, families_where, family_for_model_type

PRESETS: dict[str, ModelShape] = all_presets()

# The shape overrides every model flag set takes (hfscale train's ModelArguments and the planners' options).
MODEL_OVERRIDES = ("n_layer", "hidden_size", "n_head", "num_key_value_heads", "head_dim", "ffn_hidden_size",
                   "vocab_size", "sliding_window")


def resolve_shape(preset: str, n_layer: int | None = None, hidden: int | None = None, n_head: int | None = None,
                  ffn: int | None = None, vocab: int | None = None, positions: int | None = None,
                  n_kv_head: int | None = None, head_dim: int | None = None,
                  sliding_window: int | None = None) -> ModelShape:
    """A preset with explicit overrides applied, validated."""
    if preset not in PRESETS:
        raise one_of("model preset", preset, PRESETS)
    spec = PRESETS[preset].spec
    if sliding_window is not None and not spec.window_in_config:
        raise HfscaleError(f"--sliding_window: {spec.title}'s layers attend over the whole sequence; a window is set "
                           f"on a {families_where('window_in_config')} preset")
    if head_dim is not None and not spec.own_head_width:
        raise HfscaleError(f"--head_dim: {spec.title}'s heads are hidden / heads wide; a head width of its own is set "
                           f"on a {families_where('own_head_width')} preset")
    overrides = dict(n_layer=n_layer, hidden=hidden, n_head=n_head, ffn=ffn, vocab=vocab, positions=positions,
                     n_kv_head=n_kv_head, head_dim=head_dim, sliding_window=sliding_window)
    shape = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    validate_shape(shape)
    return shape


def model_shape(model: str = "tiny", model_name_or_path: str | None = None, trust_remote_code: bool = False,
                n_layer: int | None = None, hidden_size: int | None = None, n_head: int | None = None,
                ffn_hidden_size: int | None = None, vocab_size: int | None = None,
                num_key_value_heads: int | None = None, weights: bool = True,
                head_dim: int | None = None, sliding_window: int | None = None) -> ModelShape:
    """The shape of the model these flags name: a pretrained checkpoint's config (read, not its weights), else the
    preset with the overrides applied. The one place `--model`, `--model_name_or_path` and the overrides resolve.
    `weights`: a local checkpoint must hold its weights (a run loads them; a plan reads the config alone)."""
    if model_name_or_path:
        overrides = dict(n_layer=n_layer, hidden_size=hidden_size, n_head=n_head, ffn_hidden_size=ffn_hidden_size,
                         vocab_size=vocab_size, num_key_value_heads=num_key_value_heads, head_dim=head_dim,
                         sliding_window=sliding_window)
        given = next((flag for flag, value in overrides.items() if value is not None), None)
        if given:  # a checkpoint's weights have its config's sizes: the override was ignored without a word
            raise HfscaleError(f"--{given} overrides a preset's shape; {model_name_or_path!r} brings its own "
                               f"config: drop --{given}")
        return pretrained_shape(model_name_or_path, trust_remote_code, weights)
    return resolve_shape(model, n_layer, hidden_size, n_head, ffn_hidden_size, vocab_size,
                         n_kv_head=num_key_value_heads, head_dim=head_dim, sliding_window=sliding_window)


# Far beyond any model trained (the deepest ~1,000 layers, the widest hidden ~25k, vocabularies ~1M, contexts ~1M
# tokens), and what the formulas can walk: memory, FLOPs and communication go over the model tensor by tensor, so a
# billion layers would take every byte of the host before answering
SHAPE_BOUNDS = {"n_layer": 4096, "hidden": 2**20, "n_head": 2**20, "vocab": 2**24, "positions": 2**24,
                "ffn_size": 2**22, "kv_heads": 2**20}
HEAD_DIM_BOUND = 2**16  # a head width set apart from hidden / heads (Qwen3's and Mistral-Nemo's 128)


def validate_shape(shape: ModelShape) -> None:
    """The refusals every family shares (sizes positive and within SHAPE_BOUNDS, heads dividing the hidden size), then
    the family's own."""
    for name in SHAPE_BOUNDS:
        if getattr(shape, name) <= 0:
            raise HfscaleError(f"model {name} must be positive, got {getattr(shape, name)}")
        if getattr(shape, name) > SHAPE_BOUNDS[name]:
            raise HfscaleError(f"model {name} {getattr(shape, name):,} is beyond what hfscale plans (at most "
                               f"{SHAPE_BOUNDS[name]:,}, far beyond any model trained)")
    if shape.head_dim is None and shape.hidden % shape.n_head:  # a head is hidden / heads wide unless set apart
        raise HfscaleError(f"heads ({shape.n_head}) must divide hidden size ({shape.hidden})")
    if shape.head_dim is not None and not 0 < shape.head_dim <= HEAD_DIM_BOUND:
        raise HfscaleError(f"model head_dim must be between 1 and {HEAD_DIM_BOUND:,}, got {shape.head_dim}")
    if shape.sliding_window is not None and not 0 < shape.sliding_window <= SHAPE_BOUNDS["positions"]:
        raise HfscaleError(f"model sliding_window must be between 1 and {SHAPE_BOUNDS['positions']:,} tokens, got "
                           f"{shape.sliding_window}")
    shape.spec.check(shape)


def resolve_seq_len(shape: ModelShape, requested: int | None) -> int:
    """Tokens per sample: as asked, else the model's positions up to 1024; never longer than the model's positions."""
    if requested is not None and requested <= 0:
        raise HfscaleError(f"--seq_len must be positive, got {requested}")
    seq_len = requested or min(shape.positions, 1024)
    if seq_len > shape.positions:
        raise HfscaleError(f"--seq_len {seq_len} is longer than the model's {shape.positions} positions; choose at "
                           f"most {shape.positions}")
    return seq_len


def shape_from_config(config) -> ModelShape:
    """The shape of a transformers config, through the family serving its model_type."""
    return family_for_model_type(config.model_type).shape_from_config(config)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def missing_local_path(name_or_path: str) -> bool:
    """A path (`/`, `.` or `~` first: never a Hub id) that does not exist; transformers would take it for a Hub id
    and answer with its repo-id rules."""
    return name_or_path.startswith(("/", ".", "~")) and not Path(name_or_path).expanduser().exists()


def pretrained_config(name_or_path: str, trust_remote_code: bool = False):
    """A pretrained checkpoint's transformers config (its config.json alone), or one line saying why it cannot be
    read."""
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
    return config


def pretrained_shape(name_or_path: str, trust_remote_code: bool = False, weights: bool = True) -> ModelShape:
    """The shape of a pretrained checkpoint, read from its config alone; `weights`: a local directory must hold them
    too (checked here, before a run starts, where loading them would fail in every rank)."""
    config = pretrained_config(name_or_path, trust_remote_code)
    local = Path(name_or_path).expanduser()
    try:
        shape = shape_from_config(config)
        validate_shape(shape)
        check_dropout(config, shape.spec)
    except HfscaleError as err:  # transformers reads such a config without complaint and fails building the model
        raise HfscaleError(f"cannot load model {name_or_path!r}: its config's {err}") from None
    if weights and local.is_dir() and not any((local / f).is_file() for f in WEIGHT_FILES):
        raise HfscaleError(f"cannot load model {name_or_path!r}: the directory has a config but no weights "
                           f"({' or '.join(WEIGHT_FILES)})")
    return shape


def check_dropout(config, spec) -> None:
    """A config's dropout probabilities are probabilities: torch's nn.Dropout refuses another in every rank."""
    for key in spec.dropout_keys:
        value = getattr(config, key, None) or 0.0
        if not 0 <= value <= 1:
            raise HfscaleError(f"{key} {value} is not a dropout probability (0 to 1)")


def model_dropout(dropout: float | None, model_name_or_path: str | None = None,
                  trust_remote_code: bool = False) -> float:
    """The dropout probability of the model these flags name, whose masks its layers keep: `dropout` where given,
    else a checkpoint's config's (its family's dropout_keys; transformers' GPT-2 config sets 0.1), else 0 - the
    presets', as hfscale, BLOOM and Llama pretrain."""
    if dropout is not None:
        return dropout
    return checkpoint_dropout(model_name_or_path, trust_remote_code) if model_name_or_path else 0.0


@lru_cache(maxsize=8)  # the planners weigh every strategy x optimizer of one model: its config read once
def checkpoint_dropout(name_or_path: str, trust_remote_code: bool = False) -> float:
    """A checkpoint's dropout, as its config sets it (Family.dropout_of)."""
    config = pretrained_config(name_or_path, trust_remote_code)
    return family_for_model_type(config.model_type).dropout_of(config)
