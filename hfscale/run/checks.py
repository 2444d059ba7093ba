"""The training flags' values checked before launch, as the libraries would check them in every launched rank: each
optimizer and scheduler value in its range (`check_hyperparameters`) and TrainingArguments' own checks of how its
flags combine (`check_trainer_combinations`), one line naming the flag instead of a traceback per rank."""

import json
import math
from dataclasses import fields
from types import SimpleNamespace

from transformers import TrainingArguments
from transformers.utils import strtobool

from ..errors import HfscaleError
from ..files import load_json


# What torch's AdamW, bitsandbytes' AdamW8bit, transformers' Adafactor and the Trainer's schedulers accept; checked
# before anything is written, for every optimizer (each refuses the same ranges, deep inside a launched run).
_TINY = math.ulp(0.0)  # the smallest positive float: a lower bound that makes a range "must be positive"
HYPERPARAMETER_RANGES = {
    "learning_rate": (0.0, None, "must be >= 0"),
    "adam_beta1": (0.0, 1.0, "must be in [0, 1)"),
    "adam_beta2": (0.0, 1.0, "must be in [0, 1)"),
    "adam_epsilon": (0.0, None, "must be >= 0"),
    "weight_decay": (0.0, None, "must be >= 0"),
    "max_grad_norm": (0.0, None, "must be >= 0 (0 turns clipping off)"),
    "warmup_steps": (0.0, None, "must be >= 0 (a number of steps, or a fraction of them below 1)"),
    "gc_freq": (0, None, "must be >= 0 (optimizer steps between collections; 0: Python's automatic collection)"),
    # the rest would be a traceback in every launched rank, or a silently odd run (a negative peak: a negative MFU)
    "seed": (0, 2**32, "must be in [0, 2**32) (numpy's seed range)"),
    "data_seed": (0, 2**32, "must be in [0, 2**32) (numpy's seed range)"),
    "peak_tflops": (_TINY, None, "must be positive"),
    "perf_warmup_steps": (0, None, "must be >= 0 (0: every step timed)"),
    "logging_steps": (_TINY, None, "must be positive (steps, or a fraction of the run below 1)"),
    "eval_steps": (_TINY, None, "must be positive (steps, or a fraction of the run below 1)"),
    "save_steps": (_TINY, None, "must be positive (steps, or a fraction of the run below 1)"),
    "per_device_eval_batch_size": (1, None, "must be positive"),
    "eval_accumulation_steps": (1, None, "must be positive"),
    "eval_delay": (0, None, "must be >= 0"),
    "dataloader_num_workers": (0, None, "must be >= 0"),
    "dataloader_prefetch_factor": (1, None, "must be positive"),
    "ddp_bucket_cap_mb": (_TINY, None, "must be positive"),
    "ddp_timeout": (1, None, "must be positive (seconds)"),
    "label_smoothing_factor": (0.0, 1.0, "must be in [0, 1)"),
    "neftune_noise_alpha": (0.0, None, "must be >= 0"),
    "torch_empty_cache_steps": (1, None, "must be positive"),
}
INTERVALS = ("logging_steps", "eval_steps", "save_steps")  # steps, or below 1 a fraction of the run


def json_object_flag(kw: dict, name: str) -> dict:
    """A flag TrainingArguments takes as a JSON object (`--lr_scheduler_kwargs '{"min_lr_rate": 0.1}'` on the command
    line, a mapping in a run file) as the dict it parses it into; {} when not given or not an inline object."""
    value = kw.get(name)
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.startswith("{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as err:  # its own message named neither the flag nor the text
            raise HfscaleError(f"--{name} is not a JSON object ({err.msg}, character {err.pos}): {value}") from None
        return parsed if isinstance(parsed, dict) else {}
    return {}


def check_hyperparameters(kw: dict) -> None:
    """Optimizer and scheduler values in their ranges: one line naming the flag, never a traceback from a library."""
    for name, (low, high, rule) in HYPERPARAMETER_RANGES.items():
        value = kw.get(name)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            raise HfscaleError(f"--{name} must be a finite number, got {value}")
        if value < low or (high is not None and value >= high):
            raise HfscaleError(f"--{name} {rule}, got {value}")
        if name in INTERVALS and value > 1 and value != int(value):  # TrainingArguments' own error, in every rank
            raise HfscaleError(f"--{name} must be a whole number of steps (or a fraction of the run below 1), "
                               f"got {value}")
    if kw.get("output_dir") is not None and not str(kw["output_dir"]).strip():  # each rank raised makedirs('')
        raise HfscaleError("--output_dir is empty: give a folder (or leave it out: runs/<run name>)")
    for name in getattr(TrainingArguments, "_VALID_DICT_FIELDS", ()):  # JSON objects TrainingArguments parses, per rank
        json_object_flag(kw, name)
        value = kw.get(name)  # keyword arguments are an object; the configs (accelerator, fsdp, deepspeed) also a path
        if name.endswith("_kwargs") and value is not None and not isinstance(value, dict) and not (
                isinstance(value, str) and value.startswith("{")):  # the scheduler's ** raised in every rank
            raise HfscaleError(f"--{name} must be a JSON object of keyword arguments ('{{\"name\": value}}'), "
                               f"got {value!r}")
    check_settings_objects(kw)
    min_lr = json_object_flag(kw, "lr_scheduler_kwargs").get("min_lr_rate")
    if min_lr is not None and not (isinstance(min_lr, (int, float)) and 0 <= min_lr <= 1):
        raise HfscaleError(f"--lr_scheduler_kwargs min_lr_rate must be in [0, 1], got {min_lr}")
    if kw.get("count_collectives") and kw.get("profile_step"):
        raise HfscaleError("--count_collectives and --profile_step each run torch's profiler, and only one can run at a "
                           "time: pass one of them")
    last = kw.get("max_steps", -1)
    if last == 0 or (last is not None and last < -1):  # 0: the Trainer would run one step of its own making
        raise HfscaleError(f"--max_steps must be positive (or -1: train --num_train_epochs epochs), got {last}")
    epochs = kw.get("num_train_epochs")
    if (last is None or last < 0) and isinstance(epochs, (int, float)) and not epochs > 0:  # an "ok" run of 0 steps
        raise HfscaleError(f"--num_train_epochs must be positive when --max_steps is not set, got {epochs}")
    for flag in ("count_collectives", "profile_step"):
        step = kw.get(flag) or 0
        if step and (step < 2 or (last is not None and last > 0 and step > last)):
            raise HfscaleError(f"--{flag} takes an optimizer step from 2 to --max_steps ({last}) (0: off), got {step}")


def check_settings_objects(kw: dict) -> None:
    """The settings inside the JSON-object flags the libraries read key by key: an unknown accelerate setting was a
    TypeError in every rank, an unknown checkpointing one torch's ValueError at the first forward (or, with
    use_reentrant false, a keyword handed on to every layer); --optim_target_modules is read by no optimizer of
    hfscale's; split_batches would make --per_device_train_batch_size the whole batch, shared by the processes."""
    from transformers.trainer_pt_utils import AcceleratorConfig

    accelerate = json_settings(kw.get("accelerator_config"), "accelerator_config", "accelerate settings")
    known = [f.name for f in fields(AcceleratorConfig)]
    if unknown := [k for k in accelerate if k not in known]:
        raise HfscaleError(f"--accelerator_config: unknown setting {unknown[0]!r}; accelerate's are {', '.join(known)}")
    if accelerate.get("split_batches"):
        raise HfscaleError("--accelerator_config split_batches: each process would take a share of one "
                           "--per_device_train_batch_size batch, where hfscale's plan, estimate and tokens/s count it "
                           "per device; leave split_batches out and set the per-device batch")
    takes = checkpointing_settings()
    for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        if unknown := [k for k in json_object_flag(kw, name) if k not in takes]:
            raise HfscaleError(f"--{name}: unknown setting {unknown[0]!r}; torch's checkpoint and the Trainer take "
                               f"{', '.join(takes)}")
    if kw.get("optim_target_modules") is not None:
        raise HfscaleError("--optim_target_modules: read by the Trainer's low-rank optimizers (GaLore, APOLLO) alone, "
                           "none of hfscale's --optim choices; it would be ignored")


def json_settings(value, flag: str, what: str) -> dict:
    """A flag transformers takes as a JSON object: inline, a mapping (in a run file) or the path of a JSON file."""
    if not value:
        return {}
    if isinstance(value, dict) or str(value).lstrip().startswith("{"):  # text from "{" parses to an object or fails
        return json_object_flag({flag: value if isinstance(value, dict) else str(value).lstrip()}, flag)
    return load_json(value, what)


def checkpointing_settings() -> list[str]:
    """What --activation_checkpointing_kwargs may hold: torch.utils.checkpoint's keyword arguments that JSON can give
    (context_fn is a function), its preserve_rng_state, and the two the Trainer takes out (every_n_layers, offload)."""
    import inspect

    from torch.utils.checkpoint import checkpoint

    keywords = [name for name, p in inspect.signature(checkpoint).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "context_fn"]
    return [*keywords, "preserve_rng_state", "every_n_layers", "offload"]


# What an evaluation reports, the names --metric_for_best_model takes (with or without the Trainer's eval_ prefix):
# run/trainer.py's token_weighted_eval_loss (loss, tokens_evaluated) and HfscaleTrainer.log (perplexity), the
# Trainer's own timings.
EVAL_METRICS = ("loss", "perplexity", "tokens_evaluated", "runtime", "samples_per_second", "steps_per_second")


# What transformers' get_scheduler hands each scheduler beside --lr_scheduler_kwargs (None: not those either - it
# builds the scheduler from the optimizer and these alone); every other scheduler gets the warmup and training steps.
SCHEDULER_GETS = {"constant": None, "constant_with_warmup": None, "reduce_lr_on_plateau": (), "greedy": (),
                  "inverse_sqrt": ("num_warmup_steps",)}
ONE_OF = {"cosine_with_min_lr": ("min_lr", "min_lr_rate"), "cosine_warmup_with_min_lr": ("min_lr", "min_lr_rate")}


def check_scheduler_kwargs(name: str, kwargs: dict) -> None:
    """--lr_scheduler_kwargs that the scheduler takes, and all it needs: a missing or unknown one was a TypeError (a
    ValueError for min_lr and min_lr_rate) in every rank as the Trainer built its scheduler; where transformers passes
    none, they would be ignored without a word."""
    import inspect

    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    gets = SCHEDULER_GETS.get(name, ("num_warmup_steps", "num_training_steps"))
    if gets is None:
        if kwargs:
            raise HfscaleError(f"--lr_scheduler_kwargs: the {name} schedule takes none, and they would be ignored")
        return
    signature = inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(name)])
    takes = [p for p in signature.parameters if p not in ("optimizer", "last_epoch", *gets)]
    try:
        signature.bind(None, **dict.fromkeys(gets, 1), **kwargs)
    except TypeError as err:
        raise HfscaleError(f"--lr_scheduler_kwargs for {name}: {err} (it takes {', '.join(takes) or 'none'})") from None
    either = ONE_OF.get(name, ())
    if either and sum(kwargs.get(k) is not None for k in either) != 1:
        raise HfscaleError(f"--lr_scheduler_kwargs for {name}: give one of {' or '.join(either)}, got "
                           f"{json.dumps(kwargs)}")


def check_trainer_combinations(kw: dict, defaults: dict) -> None:
    """TrainingArguments' own checks of how its flags combine (`_validate_args`: --load_best_model_at_end with another
    save than eval schedule, reduce_lr_on_plateau without evaluation, ...), made here on the flags alone: built into
    TrainingArguments they are made in every launched rank, after its process group started. Its checks read only the
    flags, converted as its __post_init__ converts them; should a later transformers read more, they run in the ranks
    as before (build_training_arguments) rather than refuse a good run here. `defaults`: every flag's default as the
    run's arguments set them (run/args.training_flag_defaults: hfscale's own among them)."""
    from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType

    args = SimpleNamespace(**{**defaults, **kw})
    try:
        args.eval_strategy = IntervalStrategy(args.eval_strategy)
        args.logging_strategy = IntervalStrategy(args.logging_strategy)
        args.save_strategy = SaveStrategy(args.save_strategy)
        args.lr_scheduler_type = SchedulerType(args.lr_scheduler_type)
        check_scheduler_kwargs(args.lr_scheduler_type.value, json_object_flag(kw, "lr_scheduler_kwargs"))
        if args.eval_strategy == IntervalStrategy.STEPS and not args.eval_steps:  # its fallback, as __post_init__'s
            args.eval_steps = args.logging_steps
        TrainingArguments._validate_args(args)
        metric = args.metric_for_best_model or ("loss" if args.load_best_model_at_end or args.lr_scheduler_type in (
            SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY) else None)  # its default metric, as there
        if args.save_strategy == SaveStrategy.BEST and metric is None:  # the Trainer's own check, in every rank
            raise ValueError("--save_strategy best keeps the checkpoint of the best evaluation: name its "
                             "--metric_for_best_model (e.g. loss) and an --eval_strategy")
        if metric is not None and metric.removeprefix("eval_") not in EVAL_METRICS:  # a KeyError at the first eval
            raise HfscaleError(f"unknown --metric_for_best_model '{metric}': an evaluation reports "
                               f"{', '.join(EVAL_METRICS)} (each also as eval_<name>)")
    except ValueError as err:  # what the ranks would each have said
        raise HfscaleError(" ".join(str(err).split())) from None
    except (AttributeError, TypeError):  # a transformers that reads more than the flags: the ranks check it
        pass


# The --optim_args keys transformers reads for the optimizers hfscale's names map to (trainer_optimizer.py): torchao's
# AdamW8bit (adamw_8bit under fsdp*) reads bf16_stochastic_round and block_size; bitsandbytes' AdamW8bit, torch's AdamW
# and Adafactor read none - their settings are the Trainer's own flags (Adafactor takes the learning rate and weight
# decay alone: no betas, no epsilon).
OPTIM_ARGS_READ = {"adamw_torch_8bit": ("bf16_stochastic_round", "block_size")}
OPTIM_ARGS_REFUSED = {"block_size": "the memory estimate models torchao's default 256-element blocks "
                                    "(formulas/memory.TORCHAO_BLOCK)"}
OPTIMIZER_FLAGS = {"adafactor": "--learning_rate and --weight_decay"}
ADAM_FLAGS = "--learning_rate, --adam_beta1, --adam_beta2, --adam_epsilon and --weight_decay"


def ignored_optimizer_flags(optim: str, explicit: set[str]) -> list[str]:
    """The Adam flags a user set for an optimizer that reads none of them: transformers builds Adafactor from the
    learning rate and weight decay alone. Said at start-up, not refused: a sweep of adamw,adafactor shares its flags."""
    if optim not in OPTIMIZER_FLAGS:
        return []
    return [f"--{name}" for name in ("adam_beta1", "adam_beta2", "adam_epsilon") if name in explicit]


def check_optim_args(text: str | None, hf_optim: str, optim: str) -> None:
    """--optim_args ('key=value,key=value') where the optimizer reads them: elsewhere transformers ignores the whole
    string without a word, and a pair without its '=' was its ValueError in every rank."""
    if not text:
        return
    pairs = [pair.split("=") for pair in text.replace(" ", "").split(",")]
    if any(len(pair) != 2 or not pair[0] for pair in pairs):
        raise HfscaleError(f"--optim_args {text!r}: give key=value pairs separated by commas")
    read, flags = OPTIM_ARGS_READ.get(hf_optim, ()), OPTIMIZER_FLAGS.get(optim, ADAM_FLAGS)
    if not read:
        raise HfscaleError(f"--optim_args: {optim} ({hf_optim} here) reads none of them, and they would be ignored; "
                           f"its settings are {flags}")
    for key, value in pairs:
        if key not in read:
            raise HfscaleError(f"--optim_args: {optim} ({hf_optim} here) does not read {key}; it reads "
                               f"{', '.join(read)} (its other settings: {flags})")
        if key in OPTIM_ARGS_REFUSED:
            raise HfscaleError(f"--optim_args {key}: not with hfscale: {OPTIM_ARGS_REFUSED[key]}")
        try:
            strtobool(value)  # transformers' own reading of it, a ValueError in every rank
        except ValueError:
            raise HfscaleError(f"--optim_args {key}={value}: true or false") from None
