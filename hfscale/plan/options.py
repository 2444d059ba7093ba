"""What `hfscale estimate`, `project` and `tune` share: their model and run flags, named as the training flags are,
and the RunPlan a set of those flags describes (hfscale/runplan.py) - the same plan a launched run builds from its
training arguments, so the planners and the run can never disagree on what a configuration is."""


from ..errors import ArgumentParser, HfscaleError, one_of
from ..flags import ALL, at_most_gpus, comma_list
from ..formulas.metrics import GB, ModelShape
from ..formulas.precision import FLOAT8_NOT_FP16, FLOAT8_RECIPES
from ..formulas.peaks import DEVICES, device_memory_gb
from ..models import MODEL_OVERRIDES, PRESETS, model_dropout, model_shape, resolve_seq_len
from ..parallel.optimizers import OPTIMIZERS, get_optimizer
from ..parallel.strategies import all_strategies, get_strategy
from ..runplan import RunPlan, compute_precision, fit  # noqa: F401 - fit: the planners' one verdict
from .grid import FAMILIES, GridOptions, GridPlan, split_strategy_names

ATTENTION = ("eager", "sdpa", "flash_attention_2")


def add_model_flags(p: ArgumentParser) -> None:
    """The model flags, named as the training flags are."""
    p.add_argument("--model", default="tiny", help=f"preset: {', '.join(PRESETS)}")
    p.add_argument("--model_name_or_path", help="a local model directory (its config.json is read)")
    for flag in MODEL_OVERRIDES:
        p.add_argument(f"--{flag}", type=int, help="override the preset's")


SYNC_EACH_BATCH_HELP = ("with gradient accumulation, reduce the gradients every micro-batch (accelerate's "
                        "gradient_accumulation_kwargs.sync_each_batch; train takes it as --accelerator_config "
                        "'{\"gradient_accumulation_kwargs\": {\"sync_each_batch\": true}}'): fsdp* keep their "
                        "gradients sharded between micro-batches, for a reduce-scatter each; ddp all-reduces each")


def add_precision_flags(p: ArgumentParser) -> None:
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (autocast under ddp)")
    p.add_argument("--fp16", action="store_true", help="fp16 mixed precision (GPUs only)")
    add_float8_flags(p)
    p.add_argument("--torch_compile", action="store_true", help="the run is compiled (torch.compile)")
    p.add_argument("--fused_linear_cross_entropy", action="store_true",
                   help="the run computes its loss with the fused linear cross-entropy (no b x s x vocab logits)")


def add_float8_flags(p: ArgumentParser) -> None:
    p.add_argument("--fp8", action="store_true", help="float8 matmuls in the decoder blocks' linear layers (torchao), "
                   "bf16 elsewhere, as the training flag: GPUs with float8 tensor cores, ddp, fsdp* and tp* (docs/strategies.md)")
    p.add_argument("--fp8_recipe", default="tensorwise", help=f"torchao's recipe: {', '.join(FLOAT8_RECIPES)}")


def check_float8_recipe(recipe: str) -> str:
    if recipe not in FLOAT8_RECIPES:
        raise one_of("float8 recipe (--fp8_recipe)", recipe, FLOAT8_RECIPES)
    return recipe


def float8_of(opts) -> str | None:
    """--fp8's recipe, None without it (a recipe alone would be silently ignored)."""
    recipe = check_float8_recipe(getattr(opts, "fp8_recipe", "tensorwise"))
    if getattr(opts, "fp8", False) is not True:
        if recipe != "tensorwise":
            raise HfscaleError(f"--fp8_recipe {recipe} is read only with --fp8")
        return None
    return recipe


def model_flags(opts) -> list[str]:
    """The same model as training flags (for the runs hfscale tune launches)."""
    if opts.model_name_or_path:
        return ["--model_name_or_path", opts.model_name_or_path]
    out = ["--model", opts.model]
    for flag in MODEL_OVERRIDES:
        if getattr(opts, flag) is not None:
            out += [f"--{flag}", str(getattr(opts, flag))]
    return out


def shape_from_options(opts) -> ModelShape:
    """The model a planning command weighs: a local --model_name_or_path's config.json is enough (a run checks its
    weights, as tune's trials do through their training flags)."""
    return model_shape(opts.model, opts.model_name_or_path, weights=False,
                       **{flag: getattr(opts, flag) for flag in MODEL_OVERRIDES})


def precision_from_options(opts) -> str:
    """What the options compute in: --fp8 computes outside its float8 matmuls in bf16, as a run does."""
    if opts.bf16 and opts.fp16:
        raise HfscaleError("--bf16 and --fp16 are exclusive")
    fp8 = getattr(opts, "fp8", False) is True  # tune's --fp8 is an axis of its own (fp8_axis)
    if fp8 and opts.fp16:
        raise HfscaleError(FLOAT8_NOT_FP16)
    return compute_precision(opts.bf16 or fp8, opts.fp16)


def check_attention(attention: str) -> None:
    if attention not in ATTENTION:
        raise one_of("attention implementation", attention, ATTENTION)


def device_memory_bytes(device: str, memory_gb: float | None) -> float:
    """Memory per GPU: --device_memory_gb, else the --device name's."""
    if memory_gb is not None:
        if not 0 < memory_gb < float("inf"):
            raise HfscaleError(f"--device_memory_gb must be positive, got {memory_gb}")
        return memory_gb * GB
    try:
        return device_memory_gb(device) * GB
    except KeyError:
        raise one_of("device", device, DEVICES) from None


def check_whole_nodes(gpus: list[int], gpus_per_node: int, flag: str = "--gpus") -> None:
    """A GPU count beyond one node must fill whole nodes (estimate, project and report --days_at_gpus)."""
    at_most_gpus(flag, *gpus)
    at_most_gpus("--gpus_per_node", gpus_per_node)
    bad = [n for n in gpus if n > gpus_per_node and n % gpus_per_node]
    if bad:
        raise HfscaleError(f"{flag} {bad[0]} is not a multiple of --gpus_per_node {gpus_per_node}")


NOT_TIMED_TP = ("{name} is not timed from a data-parallel run (the step model has no TP all-reduces for a runnable "
                "strategy): measure a {name} run and `hfscale project` it, project TP's costs with the megatron "
                "families' layouts (--strategy megatron --tp N), or estimate its memory with `hfscale estimate "
                "--strategy {name}`")


def strategies_and_families(text: str, with_3d: bool, timed: bool = False) -> tuple[list, list[str]]:
    """--strategy of a planner that also weighs 3D layouts: (the data-parallel strategies, the 3D families named).
    `all` is every strategy, and every 3D family when `with_3d` (the user gave a TP/PP layout to weigh). A planner
    that times steps from a data-parallel run (`timed`: tune, a projection from flags) leaves out the runnable TP
    strategies, whose step it does not model (NOT_TIMED_TP); named, they are refused. (`project` of a measured run
    decides by the run: plan/projection.tp_projection_refusal.)"""
    if text == ALL:
        strategies = [s for s in all_strategies().values() if not (timed and s.tensor_parallel)]
        return strategies, list(FAMILIES) if with_3d else []
    names = comma_list(text, "--strategy", valid=[*all_strategies(), *FAMILIES], what="strategy")
    strategies, families = split_strategy_names(names)
    strategies = [get_strategy(n) for n in strategies]
    untimed = [s.name for s in strategies if timed and s.tensor_parallel]
    if untimed:
        raise HfscaleError(NOT_TIMED_TP.format(name=untimed[0]))
    return strategies, families


def add_grid_flags(p: ArgumentParser) -> None:
    """The 3D layout flags (TP x PP x DP), named as Megatron's are, for the megatron* families of --strategy; and
    --dropout, which every strategy's activations count."""
    p.add_argument("--tp", help="tensor-parallel sizes for the megatron* layouts, comma-separated (TP inside a node)")
    p.add_argument("--pp", help="pipeline-parallel sizes for the megatron* layouts, comma-separated")
    p.add_argument("--cp", help="context-parallel sizes for the megatron layouts, comma-separated: each sequence split "
                                "over CP GPUs (Megatron-Core's --context-parallel-size)")
    p.add_argument("--vp", type=int, default=1, help="megatron layouts: model chunks per GPU, Megatron's interleaved "
                                                     "pipeline schedule (--virtual-pipeline-model-parallel-size); "
                                                     "needs PP > 1 and L/PP divisible by it (default 1: plain 1F1B)")
    p.add_argument("--sequence_parallel", action="store_true", help="megatron* layouts: sequence parallelism over TP")
    p.add_argument("--use_distributed_optimizer", action="store_true",
                   help="megatron layouts: Megatron's distributed optimizer (--use-distributed-optimizer, NeMo's "
                        "default): fp32 masters and Adam sharded over DP x CP, gradients reduce-scattered and the "
                        "weights all-gathered (ZeRO-1; megatron-deepspeed always runs it)")
    p.add_argument("--dropout", type=float, default=None,
                   help="the model's hidden and attention dropout (Megatron's --hidden-dropout, --attention-dropout), "
                        "whose masks its layers keep for the backward (default: a checkpoint's config's - "
                        "transformers' GPT-2 sets 0.1 - or the measured run's or Megatron log's, else 0: the presets', "
                        "as BLOOM and Llama pretrain; Megatron-LM's is 0.1)")
    p.add_argument("--recompute_granularity", default="full", choices=("full", "selective"),
                   help="megatron* layouts with --activation_checkpointing: recompute whole layers (full, default) "
                        "or only the attention (selective)")


def check_grid_flags(opts, families: list[str], checkpointing: bool) -> None:
    """The 3D layout flags describe the megatron* layouts: refused where none is weighed (--sequence_parallel and
    --recompute_granularity were ignored without a word), and a granularity without activation checkpointing (there
    is nothing to recompute)."""
    given = [flag for flag, on in (("--tp/--pp", opts.tp or opts.pp), ("--cp", opts.cp), ("--vp", opts.vp != 1),
                                   ("--sequence_parallel", opts.sequence_parallel),
                                   ("--use_distributed_optimizer", opts.use_distributed_optimizer),
                                   ("--recompute_granularity", opts.recompute_granularity != "full")) if on]
    if given and not families:
        raise HfscaleError(f"{given[0]} describe{'' if given[0] == '--tp/--pp' else 's'} the 3D layouts: add megatron "
                           "or megatron-deepspeed to --strategy")
    if opts.vp < 1:
        raise HfscaleError(f"--vp must be at least 1 (model chunks per GPU), got {opts.vp}")
    if opts.dropout is not None and not 0 <= opts.dropout < 1:
        raise HfscaleError(f"--dropout must be in [0, 1), got {opts.dropout}")
    if (opts.cp or opts.vp != 1) and "megatron" not in families:  # Megatron-DeepSpeed has neither
        raise HfscaleError(f"{'--cp' if opts.cp else '--vp'} describes Megatron-LM layouts (Megatron-DeepSpeed's "
                           "pipeline engine has no interleaved schedule or context parallelism): add megatron to "
                           "--strategy")
    if opts.recompute_granularity != "full" and not checkpointing:
        raise HfscaleError(f"--recompute_granularity {opts.recompute_granularity} is what --activation_checkpointing "
                           "recomputes: turn that on, or leave the granularity out")


def dropout_of(opts) -> bool:
    """Whether the options' model keeps dropout masks: --dropout (planners that have it), else a checkpoint's config's
    dropout, else none (models.model_dropout)."""
    return model_dropout(getattr(opts, "dropout", None), opts.model_name_or_path,
                         getattr(opts, "trust_remote_code", False)) > 0


def grid_options(opts, checkpointing: bool) -> GridOptions:
    """What the 3D layout flags (add_grid_flags) say, for a run with or without activation checkpointing: Megatron
    recomputes nothing without it."""
    return GridOptions(opts.tp, opts.pp, opts.recompute_granularity if checkpointing else "none",
                       opts.sequence_parallel, opts.cp, opts.vp, opts.use_distributed_optimizer, opts.dropout)


def grid_plan(opts, family: str, optimizer: str, *, tp: int, pp: int, gpus: int, gpus_per_node: int,
              per_device_train_batch_size: int, gradient_accumulation_steps: int,
              shape: ModelShape | None = None, cp: int = 1) -> GridPlan:
    """The 3D layout the options describe on `gpus` GPUs (DP = GPUs / (TP x PP x CP), which the caller has checked)."""
    shape = shape or shape_from_options(opts)
    return grid_options(opts, opts.activation_checkpointing).plan(
        family, optimizer, shape, resolve_seq_len(shape, opts.seq_len), tp=tp, pp=pp, cp=cp,
        dp=max(1, gpus // (tp * pp * cp)), micro_batch=per_device_train_batch_size,
        micro_batches=gradient_accumulation_steps, processes_per_node=gpus_per_node,
        precision=precision_from_options(opts), flash_attention=getattr(opts, "attn_implementation", "sdpa") != "eager",
        dropout=dropout_of(opts))


def optimizers_option(text: str) -> list:
    return [get_optimizer(n) for n in comma_list(text, "--optim", valid=OPTIMIZERS, what="optimizer")]


def base_plan(opts, strategy, optimizer, *, world_size: int, processes_per_node: int, device_type: str = "cuda",
              per_device_train_batch_size: int = 1, gradient_accumulation_steps: int = 1,
              activation_checkpointing: bool | None = None, shape: ModelShape | None = None,
              float8: str | None | bool = True) -> RunPlan:
    """The plan the options describe for one strategy x optimizer on `world_size` ranks; `float8`: True - the
    options' --fp8 recipe - or the recipe (None: without float8)."""
    shape = shape or shape_from_options(opts)
    recipe = float8_of(opts) if float8 is True else float8
    precision = precision_from_options(opts)
    if recipe and precision != "fp16":  # float8 computes the rest in bf16; with fp16 the plan refuses it
        precision = "bf16"
    return RunPlan(strategy, optimizer, shape, resolve_seq_len(shape, opts.seq_len), dropout=dropout_of(opts),
                   per_device_train_batch_size=per_device_train_batch_size,
                   gradient_accumulation_steps=gradient_accumulation_steps, world_size=world_size,
                   processes_per_node=processes_per_node, precision=precision,
                   activation_checkpointing=(opts.activation_checkpointing if activation_checkpointing is None
                                             else activation_checkpointing),
                   attention=getattr(opts, "attn_implementation", "sdpa"),
                   torch_compile=getattr(opts, "torch_compile", False), device_type=device_type,
                   fused_linear_cross_entropy=getattr(opts, "fused_linear_cross_entropy", False),
                   float8=recipe, sync_each_batch=getattr(opts, "sync_each_batch", False))


