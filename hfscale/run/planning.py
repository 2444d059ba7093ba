"""Deciding a run from its parsed flags (run/args.py): the checks that need the launcher's world and the strategy's
files, the strategy's defaults on the TrainingArguments keywords, the CPU/GPU route's own settings, and the run's
RunPlan (hfscale/runplan.py) - every fact about the run, decided here once. Pure: it reads the launcher's environment
and the strategy/DeepSpeed files and changes nothing; `build_training_arguments` (run/args.py) builds what it decided,
after `parallel.distributed.setup_processes`."""

import importlib.util
import os
from contextlib import contextmanager

import psutil

from ..errors import HfscaleError, one_of
from ..formulas.metrics import GB, ModelShape
from ..formulas.precision import FLOAT8_NOT_FP16, float8_device_refusal
from ..parallel.distributed import device_capability, on_accelerator
from ..parallel.hooks import PowerSGDConfig
from ..parallel.launch_env import (check_launcher_mesh, launcher_processes_per_node, launcher_world_size,
                                   read_launcher_deepspeed_json, resolve_strategy)
from ..parallel.optimizers import get_optimizer
from ..parallel.strategies import Strategy, check_pair, get_strategy, load_deepspeed_config
from ..runplan import RunPlan, accumulation_steps, compute_precision, rank0_builds
from .args import require_finite
from .checks import check_optim_args, json_object_flag, json_settings

# torch.compile by default where it was measured to pay on a GPU (docs/strategies.md, "CPU and GPU routes");
# --torch_compile false turns it off; the other strategies compile when asked, until a GPU has measured them.
COMPILE_BY_DEFAULT_ON_GPUS = ("ddp",)
# Steps left untimed on a GPU, whose first steps after the warm-up still pay one-off costs that a CPU run does not
# (docs/strategies.md, "CPU and GPU routes"). Halved for runs too short to spare them; --perf_warmup_steps wins.
GPU_PERF_WARMUP_STEPS = 5


def gpu_perf_warmup_steps(max_steps: int) -> int:
    """The GPU route's default --perf_warmup_steps for a run of `max_steps` (<= 0: set by epochs)."""
    return GPU_PERF_WARMUP_STEPS if max_steps <= 0 else min(GPU_PERF_WARMUP_STEPS, max(2, max_steps // 2))


FP16_NEEDS_GPU = ("--fp16 needs a GPU: on CPU accelerate silently trains in fp32 and DeepSpeed's CPU accelerator has "
                  "no fp16; use --bf16 (or no precision flag for fp32)")


def check_flash_attention(attention: str | None) -> None:
    """--attn_implementation flash_attention_N needs its package and a CUDA GPU (transformers' is_flash_attn_N_available
    checks both); without them every rank raised transformers' ImportError as it built the model."""
    if attention and attention.startswith("flash_attention_"):
        import transformers.utils

        version = attention.removeprefix("flash_attention_")
        available = getattr(transformers.utils, f"is_flash_attn_{version}_available", None)
        if available is not None and not available():
            raise HfscaleError(f"--attn_implementation {attention} needs a CUDA GPU and the FlashAttention {version} "
                               "package, which this machine lacks: use sdpa (PyTorch's fused attention, with its own "
                               "flash kernel on GPUs)")


def resolve_checkpointing(kw: dict) -> bool:
    """Whether the run recomputes activations, as TrainingArguments decides it: --gradient_checkpointing is its
    deprecated alias of --activation_checkpointing, read only when the new name is not given. Both given and
    disagreeing is refused: the Trainer followed the new name where hfscale's plan (its estimate, HFU and run name)
    had read either as on."""
    new, old = kw.get("activation_checkpointing"), kw.get("gradient_checkpointing")
    if new is not None and old is not None and bool(new) != bool(old):
        raise HfscaleError(f"--activation_checkpointing {str(bool(new)).lower()} and --gradient_checkpointing "
                           f"{str(bool(old)).lower()} disagree: --gradient_checkpointing is the Trainer's deprecated "
                           "name of --activation_checkpointing; give that one alone")
    on = bool(new if new is not None else old)
    name = "activation_checkpointing_kwargs" if kw.get("activation_checkpointing_kwargs") is not None else \
        "gradient_checkpointing_kwargs"
    options = json_object_flag(kw, name)
    if on and options.get("every_n_layers", 1) != 1:  # transformers 5.24's Trainer: some layers keep everything
        raise HfscaleError(f"--{name} every_n_layers {options['every_n_layers']}: hfscale's plan does not model "
                           "checkpointing only some layers (its memory estimate and HFU would count every layer as "
                           "recomputed); leave every_n_layers at 1")
    if on and options.get("offload"):
        raise HfscaleError(f"--{name} offload: hfscale's plan does not model the checkpointed inputs held in host "
                           "memory (its estimate would count them on the device); leave offload out")
    return on


def plan_training(training: dict, shape: ModelShape, seq_len: int, attention: str | None = None,
                  explicit: set[str] = frozenset(), fused_linear_cross_entropy: bool = False,
                  launched: tuple[int, int] | None = None, dropout: float = 0.0) -> tuple[dict, RunPlan, bool]:
    """The hfscale checks and strategy defaults on the TrainingArguments keywords, and the run's plan, without building
    the arguments. Returns (the keywords to build the TrainingArguments with, the RunPlan, whether hfscale writes
    TensorBoard). Pure: reads the launcher's environment (or `launched`: the processes, and those per node, of a run
    about to be launched - a sweep's or tune's trial) and the strategy/DeepSpeed files, changes nothing. `dropout`: the
    model's (ModelArguments.dropout_probability), whose masks the estimate counts."""
    kw = dict(training)
    require_finite(kw)
    optimizer = get_optimizer(kw["optim"])
    launcher_json_path, launcher_json = read_launcher_deepspeed_json()
    strategy = get_strategy(resolve_strategy(kw["strategy"], launcher_json))
    kw["strategy"] = strategy.name
    check_pair(strategy.name, optimizer.name)
    gpu = on_accelerator(kw["use_cpu"])  # the route: a visible GPU and no --use_cpu
    kw["optim"] = optimizer.hf_name(gpu, strategy.engine)
    check_optim_args(kw.get("optim_args"), kw["optim"], optimizer.name)
    world, per_node = launched or (launcher_world_size(), None)
    recipe = _float8(kw, gpu)  # before the strategy's settings: an fsdp run in float8 builds on every rank
    deepspeed_config = _apply_strategy(kw, strategy, launcher_json_path, world, float8=recipe)
    _apply_batch_sizes(kw, world)
    tensorboard, kw["report_to"] = _split_tensorboard(kw["report_to"])
    check_compile_mode(kw.get("torch_compile_mode"))
    check_compile_backend(kw.get("torch_compile_backend"))
    _compile_named(kw, explicit)
    _check_route(kw, gpu, attention)
    checkpointing = resolve_checkpointing(kw)
    _route_defaults(kw, strategy, explicit, gpu)
    if "eval_steps" in explicit and "eval_strategy" not in explicit:  # the Trainer's default "no" would ignore them
        kw["eval_strategy"] = "steps"  # --eval_steps N alone: evaluate every N steps, as the flag says
    plan = RunPlan(strategy, optimizer, shape, seq_len, per_device_train_batch_size=kw["per_device_train_batch_size"],
                   gradient_accumulation_steps=kw["gradient_accumulation_steps"], world_size=world,
                   processes_per_node=per_node or launcher_processes_per_node(world),
                   # the flags' precision; train.run() reads back what torch really computes in (TF32) once built
                   precision=compute_precision(kw["bf16"], kw["fp16"], os.environ.get("ACCELERATE_MIXED_PRECISION"),
                                               kw["tf32"]),
                   activation_checkpointing=checkpointing,
                   attention=attention, deepspeed_config=deepspeed_config, torch_compile=bool(kw["torch_compile"]),
                   device_type="cuda" if gpu else "cpu", max_grad_norm=kw.get("max_grad_norm", 1.0),
                   fused_linear_cross_entropy=fused_linear_cross_entropy, float8=recipe,
                   sync_each_batch=sync_each_batch(kw), dropout=dropout > 0)
    if strategy.tensor_parallel or recipe:  # TP: a node of 2+ processes, TP dividing the heads; float8's engines
        reason = plan.refusal()
        if reason:
            raise HfscaleError(reason)
    check_launcher_mesh(plan.parallel_sizes)  # HSDP, TP: the mesh from the job's nodes, as the launcher's config says
    check_host_memory(plan, psutil.virtual_memory().total)
    return kw, plan, tensorboard


def sync_each_batch(kw: dict) -> bool:
    """accelerate's gradient_accumulation_kwargs.sync_each_batch in --accelerator_config: the Trainer then reduces
    every micro-batch's gradients (no no_sync), as the plan's memory and communication count them."""
    settings = json_settings(kw.get("accelerator_config"), "accelerator_config", "accelerate settings")
    return bool((settings.get("gradient_accumulation_kwargs") or {}).get("sync_each_batch"))


def _check_route(kw: dict, gpu: bool, attention: str | None) -> None:
    """What the route (a GPU, or this CPU) or the installed packages cannot run, refused before launch."""
    if kw["fp16"] and not gpu:
        raise HfscaleError(FP16_NEEDS_GPU)
    if kw.get("tf32") and not gpu:  # TrainingArguments refuses it in every rank, after the process group started
        raise HfscaleError("--tf32 is a GPU's matmul mode (Ampere or newer): a CPU run has none; leave it out")
    if kw.get("use_liger_kernel") and importlib.util.find_spec("liger_kernel") is None:  # the Trainer's ImportError
        raise HfscaleError("--use_liger_kernel needs the liger-kernel package, which is not installed here "
                           "(pip install liger-kernel)")
    check_flash_attention(attention)


def _float8(kw: dict, gpu: bool) -> str | None:
    """--fp8's recipe (None without it), refused where this device has no float8 matmuls; --fp8 computes the rest in
    bf16, so it sets --bf16 (and refuses --fp16, as the plan does)."""
    if not kw.get("fp8"):
        if kw.get("fp8_emulate"):
            raise HfscaleError("--fp8_emulate is read only with --fp8")
        return None
    if kw["fp16"]:
        raise HfscaleError(FLOAT8_NOT_FP16)
    capability, name = device_capability() if gpu else (None, "cpu")
    reason = float8_device_refusal(gpu, capability, name, bool(kw.get("fp8_emulate")))
    if reason:
        raise HfscaleError(reason)
    kw["bf16"] = True
    return kw.get("fp8_recipe") or "tensorwise"


def _route_defaults(kw: dict, strategy: Strategy, explicit: set[str], gpu: bool) -> None:
    """hfscale's defaults that differ by route, where the user set nothing: use_cpu on a CPU; on a GPU torch.compile
    for the strategies that gain from it and a longer untimed warm-up; the Trainer's host syncs off on both."""
    if not gpu:
        kw["use_cpu"] = True  # see parallel/distributed.py: without it a CPU run is neither sharded nor wrapped
    else:
        if strategy.name in COMPILE_BY_DEFAULT_ON_GPUS and "torch_compile" not in explicit:
            kw["torch_compile"] = True
        if "perf_warmup_steps" not in explicit:
            kw["perf_warmup_steps"] = gpu_perf_warmup_steps(kw["max_steps"])
    if strategy.comm_hook == "powersgd" and "perf_warmup_steps" not in explicit:
        # the hook all-reduces uncompressed until its start step: time PowerSGD's steps, not DDP's (a run timed
        # across the switch reports neither; docs/metrics.md)
        start = PowerSGDConfig(kw["powersgd_rank"], kw["powersgd_warmup_steps"]).start_iter
        kw["perf_warmup_steps"] = max(kw["perf_warmup_steps"], start)
    _no_host_syncs(kw, explicit, gpu)


# the CPU route's measured step peaks against the estimate's: within 15% (tests/test_memory.py, docs/estimate.md)
STEP_PEAK_ERROR = 0.15


def check_host_memory(plan: RunPlan, host_bytes: int) -> None:
    """Refuse a run that cannot fit this node's RAM: it could only end minutes later in the kernel's OOM killer,
    without a word (bigscience-176b with ddp on a 24 GB host; a tiny model at micro-batch 100,000 on a CPU). Counted:
    the model states (RunPlan.host_states_per_node), which the estimate holds to the byte, and on the CPU route each
    process's step peak (host_step_peaks_per_node) less the estimate's error, so that only a run that cannot fit even
    if the estimate were that much too high is refused. Construction is the estimate's to judge."""
    mem = plan.memory()
    states = plan.host_states_per_node(mem)
    where = "in host memory" if plan.on_cuda else "on this CPU node"
    if states > host_bytes:
        raise HfscaleError(f"the model states alone need {states / GB:,.1f} GB {where} ({plan.processes_per_node} "
                           f"process(es); `hfscale estimate` breaks it down), and this host has {host_bytes / GB:,.1f} "
                           f"GB: choose a smaller model, or spread a sharding strategy over more nodes")
    least = states + plan.host_step_peaks_per_node(mem) / (1 + STEP_PEAK_ERROR)
    if least > host_bytes:
        raise HfscaleError(f"the model states and the steps' activations need at least {least / GB:,.1f} GB {where} "
                           f"({plan.processes_per_node} process(es); the estimate less its {STEP_PEAK_ERROR:.0%} "
                           f"error, `hfscale estimate` breaks it down), and this host has {host_bytes / GB:,.1f} GB: "
                           "lower --per_device_train_batch_size (more --gradient_accumulation_steps keep the global "
                           "batch) or turn on --activation_checkpointing")


def _compile_named(kw: dict, explicit: set[str]) -> None:
    """transformers compiles the model whenever --torch_compile_mode or --torch_compile_backend is named, whatever
    --torch_compile says: the plan (estimate, summary, results) says so too, and an explicit --torch_compile false
    beside them is a contradiction."""
    named = next((f for f in ("torch_compile_mode", "torch_compile_backend") if kw.get(f) is not None), None)
    if named is None:
        return
    if "torch_compile" in explicit and not kw["torch_compile"]:
        raise HfscaleError(f"--{named} {kw[named]} compiles the model (transformers turns --torch_compile on for it); "
                           f"drop --{named} or --torch_compile false")
    kw["torch_compile"] = True


def _no_host_syncs(kw: dict, explicit: set[str], gpu: bool) -> None:
    """Two Trainer defaults stop the host at every micro-batch on a GPU (hfscale/run/host_syncs.py), so that the host's
    per-step work shows as idle device time; hfscale changes both, and the user's flags win.
    - logging_nan_inf_filter reads every micro-batch's loss to keep a NaN/inf out of the logged average: its default
      is false in HfscaleTrainingArguments (the loss is logged as it is; a NaN shows as NaN), on both routes.
    - accelerator_config: accelerate copies each batch to the device with a blocking copy, which torch makes with a
      stream synchronize; on the GPU route non-blocking, from pinned memory (the Trainer's dataloader_pin_memory
      default), as accelerate's docs pair them. The CPU route copies nothing between devices and pins nothing (the
      Trainer turns pinning off under use_cpu, and would warn at every run that non_blocking lacks it): untouched.
      An inline --accelerator_config of other settings keeps the non-blocking copies (a file of them is the user's
      whole config, as written)."""
    if not gpu:
        return
    given = kw.get("accelerator_config") if "accelerator_config" in explicit else None
    if given is None or isinstance(given, dict) or (isinstance(given, str) and given.startswith("{")):
        kw["accelerator_config"] = {"non_blocking": True, **json_object_flag(kw, "accelerator_config")}


def _apply_strategy(kw: dict, strategy: Strategy, launcher_json_path: str | None, world: int,
                    float8: str | None = None) -> dict | None:
    """The strategy's defaults on the keywords; returns the run's DeepSpeed JSON (zero*), read and checked once."""
    deepspeed_config = None
    if strategy.engine == "deepspeed":
        path = kw["deepspeed"] or launcher_json_path or strategy.deepspeed_settings()  # the strategy's, not a copy
        if isinstance(path, dict):
            deepspeed_config = path
        else:
            deepspeed_config = load_deepspeed_config(path, strategy)
            path = str(path)
        kw["deepspeed"] = path
    elif kw["deepspeed"]:
        raise HfscaleError(f"--deepspeed is for the zero* strategies; {strategy.name!r} is {strategy.engine}")
    if strategy.engine == "fsdp":  # transformers' current form: fsdp=True, everything in fsdp_config
        offload = {"cpu_offload": True} if "offload" in strategy.fsdp.split() else {}
        kw["fsdp"] = True
        # cpu_ram_efficient_loading: only rank 0 builds (or loads) the whole model; the others build on the meta device
        # and accelerate broadcasts rank 0's weights into their shards (train.build, accelerate fsdp2_prepare_model)
        # (not in float8: runplan.rank0_builds; nor under TP, whose split has already scattered each node's builder's
        # slices, the same on every node)
        loading = rank0_builds(strategy, float8) and not strategy.tensor_parallel
        kw["fsdp_config"] = {"version": 2, "reshard_after_forward": True, "state_dict_type": "SHARDED_STATE_DICT",
                             "cpu_ram_efficient_loading": loading, **offload,
                             **json_settings(kw["fsdp_config"], "fsdp_config", "FSDP config")}
    elif kw["fsdp"] or kw.get("fsdp_config"):  # the Trainer would ignore them without a word
        flag = "--fsdp" if kw["fsdp"] else "--fsdp_config"
        raise HfscaleError(f"{flag} is for the fsdp strategies; {strategy.name!r} is {strategy.engine}")
    if kw.get("ddp_bucket_cap_mb") is not None and strategy.engine != "ddp":
        where = " (its buckets: reduce_bucket_size in the DeepSpeed JSON)" if strategy.engine == "deepspeed" else ""
        raise HfscaleError(f"--ddp_bucket_cap_mb is read by DDP only; {strategy.name!r} is {strategy.engine}{where}")
    if kw["ddp_find_unused_parameters"] is None:
        kw["ddp_find_unused_parameters"] = strategy.comm_hook == "powersgd"
    if strategy.comm_hook == "powersgd":
        kw["powersgd_rank"] = kw["powersgd_rank"] or strategy.powersgd["rank"]
        if kw["powersgd_warmup_steps"] is None:
            kw["powersgd_warmup_steps"] = strategy.powersgd["warmup_steps"]
        if kw["powersgd_rank"] <= 0 or kw["powersgd_warmup_steps"] < 0:
            raise HfscaleError("--powersgd_rank must be positive and --powersgd_warmup_steps non-negative")
        if world < 2:
            raise HfscaleError("ddp_powersgd compresses the gradient all-reduce between ranks; launch 2 or more processes")
    elif (given := next((f for f in ("powersgd_rank", "powersgd_warmup_steps") if kw[f] is not None), None)):
        raise HfscaleError(f"--{given} is for ddp_powersgd; {strategy.name!r} compresses nothing")
    return deepspeed_config


def _apply_batch_sizes(kw: dict, world: int) -> None:
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if kw[name] <= 0:
            raise HfscaleError(f"--{name} must be positive, got {kw[name]}")
    if kw["global_batch_size"] is not None:
        kw["gradient_accumulation_steps"] = accumulation_steps(kw["global_batch_size"],
                                                               kw["per_device_train_batch_size"], world)
    if kw["token_budget"] <= 0:
        raise HfscaleError(f"--token_budget must be positive, got {kw['token_budget']}")


@contextmanager
def _environment_kept():
    """Parsing changes nothing: a library imported only to read a list of names may set variables as it loads."""
    before = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def check_compile_mode(mode: str | None) -> None:
    """torch.compile's modes, known before launch (inductor raises only at the first compiled step of every rank)."""
    if mode is None:
        return
    with _environment_kept():  # importing inductor sets TORCHINDUCTOR_CACHE_DIR
        import torch._inductor

    modes = list(torch._inductor.list_mode_options())
    if mode not in modes:
        raise one_of("--torch_compile_mode", mode, modes)


def check_compile_backend(backend: str | None) -> None:
    """accelerate's torch.compile backends (its DynamoBackend, which each rank's Trainer builds from the name)."""
    if backend is None:
        return
    from accelerate.utils import DynamoBackend

    names = [b.value.lower() for b in DynamoBackend]
    if backend.lower() not in names:
        raise one_of("--torch_compile_backend", backend, names)


def check_integrations(backends: list[str]) -> None:
    """--report_to names transformers knows; the Trainer would raise an unknown one in every launched rank. Its list
    lives in a module whose imports take seconds (and set TORCHINDUCTOR_CACHE_DIR through torchao), so it is read only
    for a name beyond hfscale's own, with the environment kept as it was (parsing changes nothing)."""
    if all(b in ("none", "tensorboard") for b in backends):
        return
    with _environment_kept():
        from transformers.integrations.integration_utils import (INTEGRATION_TO_CALLBACK,
                                                                 get_available_reporting_integrations)
    known = ["all", "none", *INTEGRATION_TO_CALLBACK]
    unknown = next((b for b in backends if b not in known), None)
    if unknown:
        raise one_of("--report_to integration", unknown, known)
    installed = get_available_reporting_integrations()  # a named one missing: a traceback from its callback, per rank
    missing = next((b for b in backends if b not in ("all", "none", "tensorboard") and b not in installed), None)
    if missing:
        raise HfscaleError(f"--report_to {missing}: its package is not installed here (installed: "
                           f"{', '.join(installed) or 'none'}); install it or leave it out")


def _split_tensorboard(report_to) -> tuple[bool, list[str] | str]:
    """hfscale writes TensorBoard itself (clean scalar names, one event stream per run directory)."""
    backends = [report_to] if isinstance(report_to, str) else list(report_to or [])
    backends = [b for part in backends for b in part.split(",") if b]
    check_integrations(backends)
    tensorboard = "tensorboard" in backends or "all" in backends
    others = [b for b in backends if b not in ("tensorboard", "none")]
    return tensorboard, others or "none"
