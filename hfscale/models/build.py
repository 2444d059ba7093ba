"""Building a model of a shape, loading a pretrained one, and what the engines need of it (ZeRO-3's partitioning, the
whole parameter count). torch and transformers are imported inside the functions: the planners import this package
without paying for them.

A preset is only a ModelShape; the model is built from its family's transformers config so every Trainer feature
works.
"""

from ..errors import HfscaleError, one_of
from .family import ModelShape, family
from .resolve import pretrained_shape


def hf_config(shape: ModelShape, dropout: float = 0.0, **extra):
    """The transformers config of a shape (its family's).

    Dropout defaults to 0, as in BLOOM's and Llama's pretraining: it also keeps runs with different numbers of processes
    comparable (each rank would draw its own dropout masks).
    """
    return shape.spec.hf_config(shape, dropout, **extra)


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


def model_class(name: str):
    """transformers' causal-LM class of a family."""
    import transformers

    return getattr(transformers, family(name).class_name)


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


def check_attention(family_name: str, attention: str | None) -> None:
    """--attn_implementation against the attention functions transformers registers and those this family's class
    supports (BLOOM: eager only), before any process starts: transformers raises only as each rank builds its model.
    A Hub kernel (`org/repo`) is left to transformers, for a class that takes attention backends."""
    if attention is None:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cls = model_class(family_name)
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


def dropout_settings(family_name: str, dropout: float | None) -> dict:
    """The config keys that set a family's dropout to `dropout` ({} for None: the checkpoint's own)."""
    return {} if dropout is None else {key: dropout for key in family(family_name).dropout_keys}


def pretrained_on_meta(name_or_path: str, trust_remote_code: bool = False, attn_implementation: str | None = None,
                       dropout: float | None = None):
    """A pretrained checkpoint's architecture on the meta device, no weights read (its shards come from rank 0);
    `dropout`: its config's dropout replaced (None: kept)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import torch

    shape = pretrained_shape(name_or_path, trust_remote_code)  # the same checks as the rank that loads it
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                        **dropout_settings(shape.family, dropout))
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, dtype=torch.float32,
                                                 **kwargs)
    return declare_causal_lm_loss(model)


def load_pretrained(name_or_path: str, trust_remote_code: bool = False, attn_implementation: str | None = None,
                    dropout: float | None = None):
    """A pretrained checkpoint (local directory or Hub name) and its shape; `dropout`: its config's dropout replaced
    (None: kept)."""
    from transformers import AutoModelForCausalLM

    import torch

    shape = pretrained_shape(name_or_path, trust_remote_code)
    kwargs = {**({"attn_implementation": attn_implementation} if attn_implementation else {}),
              **dropout_settings(shape.family, dropout)}  # config keys among from_pretrained's keywords set the config
    # fp32 master weights whatever the checkpoint stores: transformers 5 loads in the stored dtype by default
    # (dtype="auto"), and a bf16 checkpoint would then train in pure bf16 under DDP while --bf16 means autocast
    model = AutoModelForCausalLM.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                                 dtype=torch.float32, **kwargs)
    return declare_causal_lm_loss(model), shape
