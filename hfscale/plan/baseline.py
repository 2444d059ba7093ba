"""What a projection starts from (`hfscale project`, tune's 3D projection, the report's days at other GPU counts): a
measured configuration and its speed - a finished run's results file, an imported Megatron log (its FLOPs per GPU
solved by the 3D model), or a per-GPU throughput given as flags."""

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HfscaleError
from ..formulas.comm import Links
from ..formulas.float8 import Float8Step
from ..formulas.metrics import GB, training_flops_per_sequence
from ..formulas.parallel3d import MEGATRON_DROPOUT, grid_step_time
from ..formulas.peaks import device_key, memory_of_device_name
from ..parallel.optimizers import get_optimizer
from ..parallel.strategies import get_strategy
from ..run.results import read_results
from ..runplan import RunPlan
from .grid import GridPlan
from .options import base_plan, optimizers_option, strategies_and_families


@dataclass
class Baseline:
    """What was measured (or given): the run's plan and its speed."""

    plan: RunPlan  # model, strategy, optimizer, per-GPU work, world, nodes, precision: the measured configuration
    s_per_iter: list[float]  # [typical, fastest, slowest]; equal when only one figure is known
    source: str
    powersgd_rank: int | None = None
    overlap: bool = True  # communication hides under compute (GPUs); not on a CPU, where gloo shares the cores
    step_sd_s: float = 0.0  # per-step noise of the step time (the straggler term), from the run's logging intervals
    device_memory_bytes: float | None = None  # memory per GPU the points are judged on (None: not judged)
    device: str | None = None  # the GPU's key in the peak tables (formulas/peaks), None on a CPU or one unknown
    float8: str | None = None  # --fp8 on a run measured without it: the recipe the projected points train with
    float8_step: Float8Step | None = None  # ... and what it does to their compute (formulas/float8)
    float8_left_out: dict[str, str] = field(default_factory=dict)  # strategies not projected with it: the reason
    sync_each_batch: bool | None = None  # the projected points reduce every micro-batch (None: as the measured run)

    @property
    def dropout(self) -> bool:
        """Its layers kept dropout masks (the run's model config; a Megatron log's arguments): the plan's."""
        return self.plan.dropout

    @property
    def compute_factor(self) -> float:
        """The projected recipe's compute per micro-batch over the measured run's."""
        return self.float8_step.compute_factor if self.float8_step else 1.0


def step_noise_s(history: list[dict]) -> float:
    """Per-step standard deviation of the step time, from the logging intervals of a run (`perf_history`): an interval
    of k steps averages k step times, so its mean varies with sd sigma/sqrt(k); sigma^2 is estimated as the k-weighted
    squared deviation of the interval means. The first interval (its start is the end of warm-up, its length unknown)
    is left out; fewer than 3 intervals give 0 (no estimate)."""
    pts = [(float(b["step"] - a["step"]), float(b["s_per_iter"])) for a, b in zip(history, history[1:])
           if b["step"] > a["step"]]
    if len(pts) < 3:
        return 0.0
    mean = sum(k * x for k, x in pts) / sum(k for k, _ in pts)
    return (sum(k * (x - mean) ** 2 for k, x in pts) / (len(pts) - 1)) ** 0.5


def baseline_from_results(path: Path, device_bytes: float | None = None) -> Baseline:
    """The measured plan of a finished run (or of one stopped on SIGUSR1: its steady state is as measured as a finished
    run's); `device_bytes` judges fits, else the run's own GPU (CPU runs: not judged)."""
    data = read_results(path)
    if data.status not in ("ok", "stopped"):
        raise HfscaleError(f"{path}: the run did not finish (status {data.status!r}); project from a run that ended "
                           "`ok` or `stopped`")
    if data.status == "stopped" and not data.perf.s_per_iter:
        raise HfscaleError(f"{path}: the run stopped at step {(data.stopped or {}).get('step')} before a timed step; "
                           "project from a run that timed its steady state")
    cfg, perf, env = data.config, data.perf, data.environment
    try:
        strategy = get_strategy(data.strategy)
        history = [x for x in data.perf_history if x.get("s_per_iter")]
        s = float(perf.s_per_iter)
        spread = [float(x["s_per_iter"]) for x in history]
        world, nodes = cfg.world_size, env.nodes or 1
        plan = RunPlan(strategy, get_optimizer(data.optim), data.model.shape(), cfg.seq_len,
                       per_device_train_batch_size=cfg.per_device_train_batch_size, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                       world_size=world, processes_per_node=max(1, world // nodes), precision=cfg.precision or "fp32",
                       activation_checkpointing=bool(cfg.activation_checkpointing),
                       attention=(data.estimate or {}).get("attention", "sdpa"), torch_compile=bool(cfg.torch_compile),
                       fused_linear_cross_entropy=bool(cfg.fused_linear_cross_entropy), float8=cfg.float8,
                       sync_each_batch=bool(cfg.sync_each_batch), dropout=bool(data.model.dropout),
                       device_type=env.device_type or "cuda",  # a ZeRO run's buckets, as it ran (else the shipped)
                       deepspeed_config=strategy.deepspeed_config_with(cfg.zero_optimization)
                       if strategy.engine == "deepspeed" and isinstance(cfg.zero_optimization, dict) else None)
    except (TypeError, ValueError) as err:
        raise HfscaleError(f"{path}: not an hfscale results file with measured throughput ({err})") from None
    on_cpu = env.device_type == "cpu"
    if device_bytes is None and not on_cpu:
        device_bytes = memory_of_device_name(env.device_name or "")
        device_bytes = device_bytes * GB if device_bytes else None
    return Baseline(plan, [s, min(spread + [s]), max(spread + [s])], str(path), cfg.powersgd_rank,
                    overlap=not on_cpu, step_sd_s=step_noise_s(history), device_memory_bytes=device_bytes,
                    device=None if on_cpu else device_key(env.device_name or ""))


def megatron_log_plan(data, path: Path, gpus_per_node: int) -> GridPlan:
    """The 3D layout an imported Megatron log (`hfscale import-logs`) ran, from what its header stated."""
    cfg = data.config
    try:
        shape = data.model.shape()
    except HfscaleError:
        raise HfscaleError(f"{path}: the log states no GPT-2/BLOOM/Llama model shape (num_layers, hidden_size, "
                           "num_attention_heads in its arguments block), so it cannot be projected") from None
    if not (cfg.tp and cfg.pp and cfg.dp and cfg.per_device_train_batch_size and cfg.global_batch_size and cfg.seq_len):
        raise HfscaleError(f"{path}: the log does not state its TP, PP, DP, micro-batch and global batch")
    if cfg.global_batch_size % (cfg.per_device_train_batch_size * cfg.dp):
        raise HfscaleError(f"{path}: its global batch {cfg.global_batch_size} is not a whole number of micro-batches "
                           f"of {cfg.per_device_train_batch_size} per pipeline over DP {cfg.dp}")
    family = "megatron-deepspeed" if str(data.strategy).startswith("megatron-deepspeed") else "megatron"
    recompute = (cfg.extra.get("recompute") or "full") if cfg.activation_checkpointing else "none"
    dropout = cfg.extra.get("dropout")  # a log that names none ran Megatron's default
    return GridPlan(family, "adamw", shape, cfg.seq_len, tp=cfg.tp, pp=cfg.pp, dp=cfg.dp,
                    per_device_train_batch_size=cfg.per_device_train_batch_size,
                    gradient_accumulation_steps=cfg.global_batch_size // (cfg.per_device_train_batch_size * cfg.dp),
                    processes_per_node=min(cfg.world_size or gpus_per_node, gpus_per_node),
                    precision=cfg.precision or "bf16", recompute=recompute,
                    sequence_parallel=bool(cfg.extra.get("sequence_parallel")),
                    cp=cfg.extra.get("context_parallel") or 1, vp=cfg.extra.get("virtual_pipeline") or 1,
                    flash_attention=bool(cfg.extra.get("flash_attention")),  # a log that names none kept the scores
                    distributed_optimizer=bool(cfg.extra.get("distributed_optimizer")),
                    dropout=(MEGATRON_DROPOUT if dropout is None else dropout) > 0)


def solve_flops_per_s(plan: GridPlan, s_per_iter: float, links: Links, gpus_per_node: int) -> float:
    """The FLOPs per second per GPU at which the 3D model gives `s_per_iter` for this layout (bisection: the step
    time falls as the rate rises)."""
    def total(rate: float) -> float:
        return grid_step_time(plan.run, flops_per_s=rate, links=links, gpus_per_node=gpus_per_node).total_s

    low, high = 1e6, 1e18
    if total(high) >= s_per_iter:
        raise HfscaleError(f"the log's {s_per_iter:.4g} s/it is less than its communication alone takes on these "
                           "links; give the cluster's --intra_bw/--inter_bw")
    for _ in range(200):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if total(mid) > s_per_iter else (low, mid)
    return (low * high) ** 0.5


def baseline_from_megatron_log(path: Path, links, gpus_per_node: int, device_bytes: float | None):
    """A projection from an imported Megatron log: the FLOPs per GPU its layout achieved by the 3D model (solved on
    the typical links), as the compute every strategy and layout runs at; and the log's own layout to project.
    Returns (baseline, the log's plan)."""
    data = read_results(path)
    if data.status != "ok" or not data.perf.s_per_iter:
        raise HfscaleError(f"{path}: the log has no measured iteration (status {data.status!r})")
    plan = megatron_log_plan(data, path, gpus_per_node)
    reason = plan.refusal()
    if reason:
        raise HfscaleError(f"{path}: {reason}")
    rate = solve_flops_per_s(plan, float(data.perf.s_per_iter), links[0], gpus_per_node)
    one = RunPlan(get_strategy("ddp"), get_optimizer("adamw"), plan.shape, plan.seq_len,
                  per_device_train_batch_size=plan.per_device_train_batch_size,
                  gradient_accumulation_steps=plan.gradient_accumulation_steps, precision=plan.precision,
                  activation_checkpointing=plan.recompute != "none",
                  attention="flash_attention_2" if plan.flash_attention else "eager",  # scores kept or not
                  dropout=plan.dropout)
    _, hardware = training_flops_per_sequence(one.shape, one.seq_len, one.activation_checkpointing)
    s = hardware * one.per_device_train_batch_size * one.gradient_accumulation_steps / rate  # one GPU, compute only
    source = (f"{path}: {plan.name} on {plan.world_size} GPUs, {float(data.perf.s_per_iter):.4g} s/it logged -> "
              f"{rate / 1e12:.1f} TFLOPs per GPU of compute by the 3D model")
    return Baseline(one, [s, s, s], source, device_memory_bytes=device_bytes), plan


def baseline_from_flags(opts, device_bytes: float | None) -> Baseline:
    strategies, _ = strategies_and_families(opts.strategy, with_3d=True, timed=True)  # a 3D family alone: measured as ddp
    strategy, optimizer = (strategies or [get_strategy("ddp")])[0], optimizers_option(opts.optim)[0]
    plan = base_plan(opts, strategy, optimizer, world_size=1, processes_per_node=1,
                     per_device_train_batch_size=opts.per_device_train_batch_size,
                     gradient_accumulation_steps=opts.gradient_accumulation_steps,
                     float8=None)  # the speed given is a bf16 run's; --fp8 is what it is projected to
    tokens_per_micro = plan.per_device_train_batch_size * plan.seq_len
    if opts.tokens_per_s_per_gpu is not None:
        micro_s = tokens_per_micro / opts.tokens_per_s_per_gpu
        source = f"--tokens_per_s_per_gpu {opts.tokens_per_s_per_gpu:g}"
    else:
        _, hardware = training_flops_per_sequence(plan.shape, plan.seq_len, plan.activation_checkpointing)
        micro_s = hardware * plan.per_device_train_batch_size / (opts.tflops_per_gpu * 1e12)
        source = f"--tflops_per_gpu {opts.tflops_per_gpu:g} (hardware FLOPs)"
    s = micro_s * plan.gradient_accumulation_steps  # compute only: a one-GPU baseline, no communication
    return Baseline(plan, [s, s, s], source, device_memory_bytes=device_bytes,
                    device=device_key(opts.device) if opts.device else None)
