"""Building a run's data and model on every rank: the tokenized blocks (once per machine), and the model whole or -
where the engine shards it out from rank 0 - without weights on the other ranks.

torch, transformers and DeepSpeed are imported inside the functions: this module is imported by the training script
before its process group exists (DeepSpeed must not be imported before DS_ACCELERATOR is set on a CPU run).
"""

import contextlib

from ..errors import HfscaleError
from ..models import build_model, load_pretrained, partition_zero3, pretrained_on_meta
from . import data


def load_data(model_args, data_args, args, vocab_size: int, seq_len: int, validation: dict | None):
    """(tokenizer, training blocks, validation blocks or None). The default tokenizer learns from all the text."""
    with args.main_process_first(local=True, desc="tokenize and pack"):
        raw = data.load_raw_text(data_args)
        tokenizer = data.load_tokenizer(data_args, model_args.model_name_or_path, vocab_size, raw,
                                        model_args.trust_remote_code)
        if len(tokenizer) > vocab_size:
            raise HfscaleError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is {vocab_size}; "
                               "pass --vocab_size or another --tokenizer_name")
        train_raw, val_raw = data.split_raw_text(raw, data_args, validation)
        held_out = validation is not None and "percentage" in validation
        blocks = data.packed_dataset(data_args, tokenizer, train_raw, seq_len, {"train": validation} if held_out else None)
        eval_blocks = None if val_raw is None else data.packed_dataset(
            data_args, tokenizer, val_raw, seq_len, {"validation": validation}, what="the validation text")
    return tokenizer, blocks, eval_blocks


def zero3_init(args, strategy) -> bool:
    """ZeRO-3 partitions the model as it is built (deepspeed.zero.Init), unless the accelerate config's
    `zero3_init_flag` (or `accelerate launch --zero3_init_flag false`) turns that off."""
    plugin = getattr(args, "deepspeed_plugin", None)
    return strategy is not None and strategy.zero_stage == 3 and plugin is not None and plugin.is_zero3_init_enabled()


def rank0_builds(args, strategy) -> bool:
    """Only rank 0 builds the whole model; the engine shards it out from there and the other ranks build theirs
    without weights: FSDP with cpu_ram_efficient_loading (hfscale's default; fsdp2_prepare_model broadcasts rank 0's
    weights), ZeRO-3 with zero3_init_flag for models hfscale initialises (models.partition_zero3), and TP, whose split
    scatters each TP group's first rank's slices (builds_whole)."""
    if strategy is None or not strategy.rank0_builds:
        return False
    if strategy.tensor_parallel:
        return True
    if strategy.engine == "fsdp":
        return str((args.fsdp_config or {}).get("cpu_ram_efficient_loading")).lower() == "true"
    return zero3_init(args, strategy)


def builds_whole(args, strategy) -> bool:
    """Whether this rank builds the model with its weights: every rank, or under rank0_builds only the rank the engine
    takes them from - process 0, or under TP each TP group's first rank (a node's first process: the group is the
    node's processes, parallel/distributed.tensor_parallel_config), the source of the split's scatters."""
    if not rank0_builds(args, strategy):
        return True
    return (args.local_process_index if strategy.tensor_parallel else args.process_index) == 0


def share_rank0_buffers(model, device) -> None:
    """Rank 0's non-persistent buffers on every rank. They are in no state dict, so the engine that shards rank 0's
    weights out never sends them, and accelerate's FSDP2 loading keeps each rank's own: uninitialised memory on a rank
    built without weights (Llama's rotary inv_freq; docs/estimate.md). Collective; each through the run's device (NCCL
    sends no host tensor)."""
    import torch.distributed as dist

    for name, buffer in model.named_buffers():
        module, _, leaf = name.rpartition(".")
        if leaf in model.get_submodule(module)._non_persistent_buffers_set:
            shared = buffer.to(device)
            dist.broadcast(shared, src=0)
            buffer.copy_(shared)


@contextlib.contextmanager
def plain_construction(args, strategy):
    """transformers builds under zero.Init whenever the Trainer's DeepSpeed config is ZeRO-3 (from_pretrained,
    from_config); with zero3_init_flag off, hide that config while the model is built."""
    if strategy is None or strategy.zero_stage != 3 or zero3_init(args, strategy):
        yield
        return
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        set_hf_deepspeed_config(args.hf_deepspeed_config)  # TrainingArguments set it (--deepspeed)


def build(model_args, args, shape, tokenizer, strategy=None):
    """The model, on every rank: whole, or (rank0_builds, ranks other than the builder: builds_whole) without weights
    until the engine or TP's split shards the builder's; under ZeRO-3 with zero3_init_flag, partitioned before it
    returns. strategy None: whole everywhere (benchmarks/plain_trainer.py)."""
    import torch

    if model_args.model_name_or_path and strategy is not None and strategy.zero_stage == 3:
        # transformers' own ZeRO-3 loading: every rank builds under zero.Init and streams the checkpoint's tensors
        # into its partitions (rank 0's values broadcast); no RNG involved, so the weights are the checkpoint's
        with plain_construction(args, strategy):
            return load_pretrained(model_args.model_name_or_path, model_args.trust_remote_code,
                                   model_args.attn_implementation, model_args.dropout)[0]
    without_weights = not builds_whole(args, strategy)
    if model_args.model_name_or_path:
        if without_weights:
            model = pretrained_on_meta(model_args.model_name_or_path, model_args.trust_remote_code,
                                       model_args.attn_implementation, model_args.dropout)
        else:
            model, _ = load_pretrained(model_args.model_name_or_path, model_args.trust_remote_code,
                                       model_args.attn_implementation, model_args.dropout)
    else:
        with torch.device("meta" if without_weights else "cpu"):
            model = build_model(shape, args.seed, model_args.attn_implementation, model_args.dropout or 0.0)
        model.config.eos_token_id = model.config.bos_token_id = tokenizer.eos_token_id
    if without_weights:
        # Uninitialised host tensors, not meta ones: their pages are never touched (no resident memory), but each
        # parameter gets an address of its own. accelerate maps the optimizer's parameters to the sharded ones by
        # data_ptr, and on the meta device every data_ptr is 0: rank 1's optimizer stepped one parameter for all
        # (seen: fsdp's losses left ddp's after the first update). to_empty unties shared weights; tie them again.
        model = model.to_empty(device="cpu")
        model.tie_weights()
    if rank0_builds(args, strategy) and not zero3_init(args, strategy):  # partition_zero3 broadcasts every buffer
        share_rank0_buffers(model, args.device)
    if getattr(args, "fp8", False):  # GPT-2's Conv1D projections as nn.Linear, which torchao converts (run/float8.py)
        from .float8 import linear_projections

        linear_projections(model)
    if zero3_init(args, strategy):
        from transformers.integrations.deepspeed import deepspeed_config

        model = partition_zero3(model, deepspeed_config())
    return model
