"""`hfscale project`: wall-days and GPU-days to a token budget against the number of GPUs, per strategy, from a
measured run (or a given per-GPU throughput) and a communication model (hfscale/formulas/comm.py).

    hfscale project runs/zero1-run/results.json --gpus 8,16,32,64,128 --gpus_per_node 8 \\
        --intra_bw 150 --inter_bw 12.5:25 --strategy zero1,zero3,ddp --out runs/projection
    hfscale project --model bloom-7b1 --tflops_per_gpu 120 --seq_len 2048 --per_device_train_batch_size 2 \\
        --gradient_accumulation_steps 16 --bf16 --device A100-80GB ...

Compute per micro-batch comes from the measurement with the run's own exposed communication taken out (at the
run's GPU count and links); each projected point adds back what the strategy moves at that GPU count. By default
each GPU keeps the measured micro-batch and accumulation (the global batch grows with the GPUs);
`--global_batch_size` holds the global batch instead (accumulation shrinks as GPUs are added). Every point is also a
RunPlan the memory estimate judges on the device (`--device`, `--device_memory_gb`, or the run's own GPU): a point that
cannot fit is marked, and is never the knee or the recommendation. docs/project.md.
"""

import csv
import io
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError
from ..files import atomic_path, atomic_write_text, check_writable_dir
from ..flags import comma_list, positive, refuse_renamed
from ..formulas.comm import Links, bucket_pieces, comm_pattern, powersgd_elements, step_time
from ..formulas.memory import DTYPE_BYTES, block_numel, parameter_tensors, zero3_gathers
from ..formulas.metrics import GB, SECONDS_PER_DAY, param_count, training_flops_per_sequence
from ..formulas.parallel3d import grid_step_time
from ..formulas.peaks import DEVICES, memory_of_device_name
from ..models import MODEL_OVERRIDES
from ..parallel.optimizers import get_optimizer
from ..parallel.strategies import get_strategy
from ..run.results import read_results
from ..runplan import RunPlan, accumulation_steps
from .bandwidth import read_bandwidth_file
from .grid import FAMILIES, GRID_MODEL_ERROR, GridOptions, GridPlan, grid_layouts
from .options import (add_grid_flags, add_model_flags, add_precision_flags, base_plan, check_whole_nodes,
                      device_memory_bytes, fit, optimizers_option, strategies_and_families)

DEFAULT_GPUS = "8,16,32,64,128,256,512,1024"
DEFAULT_INTRA_GB_S, DEFAULT_INTER_GB_S = 150.0, 12.5  # assumed bus bandwidths per GPU when none is measured or given


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


@dataclass
class Point:
    strategy: str
    gpus: int
    nodes: int
    grad_accum: int
    global_batch: int
    s_per_iter: float
    tokens_per_s: float
    days: float
    gpu_days: float
    days_low: float
    days_high: float
    exposed_comm_s: float
    straggler_s: float  # waiting for the slowest rank per iteration
    comm_bytes_per_gpu: float
    efficiency: float  # tokens/s per GPU relative to the measured point's
    fits: bool | None = None  # the memory estimate's verdict on the device (None: no device memory known)
    total_per_gpu: int | None = None  # bytes per GPU the estimate gives this point
    fit_reason: str | None = None
    layout: str = ""  # a 3D family's grid at this point (tp4-pp8-dp16); empty for the data-parallel strategies


DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb: the gradient all-reduce is issued in buckets this size


def pattern_of(plan: RunPlan, powersgd_rank: int | None = None):
    """What a plan moves per step (formulas.comm.comm_pattern), in the dtype each engine communicates, with the
    pieces it issues them in and the engine's settings (the run's DeepSpeed JSON) that change what moves."""
    strategy, P, shape = plan.strategy, param_count(plan.shape), plan.shape
    t = DTYPE_BYTES["fp32" if plan.precision == "tf32" else plan.precision]
    backward_order = [tp.numel for tp in reversed(parameter_tensors(shape))]
    if strategy.engine == "ddp":  # fp32 weights and fp32 gradients under autocast
        psgd = None
        if strategy.comm_hook == "powersgd":
            rank = powersgd_rank or strategy.powersgd["rank"]
            psgd = 4 * powersgd_elements([tp.shape for tp in parameter_tensors(shape)], rank)
        return comm_pattern("ddp", None, param_bytes=4 * P, grad_bytes=4 * P, ranks=plan.world_size,
                            powersgd_bytes=psgd,
                            reduce_buckets=bucket_pieces([4 * n for n in backward_order], DDP_BUCKET_BYTES))
    common = dict(param_bytes=t * P, grad_bytes=t * P, ranks=plan.world_size,
                  offload_optimizer=strategy.offloads_state("optimizer_states"),
                  offload_params=strategy.offloads_state("parameters"))
    if strategy.engine == "fsdp":
        root = P - shape.n_layer * block_numel(shape)  # outside the blocks: FSDP2's root unit
        tail = ("transformer.ln_f.", "transformer.wte.", "transformer.word_embeddings.weight")
        leftover = sum(tp.numel for tp in parameter_tensors(shape)
                       if not tp.name.startswith(("transformer.h.", *tail)))  # the model's own unit
        return comm_pattern("fsdp", None, **common, shard_ranks=plan.shard_ranks if strategy.hybrid else None,
                            root_param_bytes=t * root, root_leftover_bytes=t * leftover, units=shape.n_layer,
                            norm_tensors=len(backward_order) if plan.clips_gradients else 0)
    layout = plan.memory_layout
    if layout.communication_dtype:  # the JSON's communication_data_type: what DeepSpeed reduces gradients in
        common["grad_bytes"] = DTYPE_BYTES[layout.communication_dtype] * P
    # ZeRO-2/3 reduce as the backward fills their buckets (overlap_comm); ZeRO-1 at the boundary, in one piece
    buckets = bucket_pieces(backward_order, layout.reduce_bucket, flush_before_overflow=True) \
        if strategy.zero_stage > 1 and layout.reduce_bucket else 1
    persistent, regathered = (zero3_gathers(shape, layout.persistence_threshold, layout.max_reuse_distance)
                              if strategy.zero_stage == 3 else (0, None))
    fetched = sum(1 for n in backward_order if n > layout.persistence_threshold)  # ZeRO-3 gathers per parameter
    return comm_pattern("deepspeed", strategy.zero_stage, **common, units=max(1, fetched),
                        reduce_buckets=buckets if layout.overlap_comm else 1,
                        bucket_all_reduce=layout.bucket_all_reduce, persistent_param_bytes=t * persistent,
                        regathered_param_bytes=None if regathered is None else t * regathered)


def step_of(plan: RunPlan, base: Baseline, micro_compute: float, links: Links, pattern):
    """pattern: the plan's pattern_of, computed once by the caller (it walks the model's tensors)."""
    return step_time(pattern, micro_compute_s=micro_compute,
                     grad_accum=plan.gradient_accumulation_steps, ranks=plan.world_size,
                     gpus_per_node=plan.processes_per_node, links=links, overlap=base.overlap,
                     step_sd_s=base.step_sd_s)


def micro_compute_s(plan: RunPlan, base: Baseline, s_per_iter: float, links: Links) -> float:
    """Compute seconds per micro-batch: the measured step less the exposed communication the model gives the measured
    configuration itself (solved by fixed-point iteration: the exposed part depends on the compute that hides it)."""
    compute = s_per_iter / plan.gradient_accumulation_steps
    pattern = pattern_of(plan, base.powersgd_rank)  # what moves does not depend on the compute that hides it
    for _ in range(50):
        st = step_of(plan, base, compute, links, pattern)
        compute = max(s_per_iter - st.exposed_s - st.straggler_s, 1e-3 * s_per_iter) / plan.gradient_accumulation_steps
    return compute


def plan_at(base: Baseline, strategy, gpus: int, gpus_per_node: int, global_batch: int | None) -> RunPlan | None:
    """The measured configuration under `strategy` on `gpus` GPUs (None: the global batch does not split there)."""
    gas = base.plan.gradient_accumulation_steps
    if global_batch is not None:
        try:
            gas = accumulation_steps(global_batch, base.plan.per_device_train_batch_size, gpus)
        except HfscaleError:
            return None  # not a whole number of micro-batches per GPU at this count
    return base.plan.but(strategy=strategy, world_size=gpus, processes_per_node=min(gpus, gpus_per_node),
                         gradient_accumulation_steps=gas)


def project(base: Baseline, strategies: list, gpus: list[int], gpus_per_node: int, links: tuple[Links, Links, Links],
            token_budget: float, global_batch: int | None) -> list[Point]:
    """links = (typical, optimistic, pessimistic) bandwidths; s_per_iter = (typical, fastest, slowest)."""
    points = []
    for strategy in strategies:
        measured = base.plan.but(strategy=strategy)
        computes = [micro_compute_s(measured, base, s, link) for s, link in zip(base.s_per_iter, links)]
        error = model_error(strategy.name)
        reference_tps = None
        for n in gpus:
            plan = plan_at(base, strategy, n, gpus_per_node, global_batch)
            if plan is None or plan.refusal():
                continue  # e.g. HSDP on one node, or a pair the strategy table refuses
            pattern = pattern_of(plan, base.powersgd_rank)
            times = [step_of(plan, base, c, link, pattern) for c, link in zip(computes, links)]
            tokens = plan.tokens_per_step
            days = [token_budget / (tokens / st.total_s) / SECONDS_PER_DAY for st in times]
            if error and n > base.plan.world_size:  # measured days = projected x (projected / measured speed)
                days += [days[1] * min(error[0], 1.0), days[2] * max(error[1], 1.0)]
            tps = tokens / times[0].total_s
            reference_tps = reference_tps or tps / n
            verdict = fit(plan, base.device_memory_bytes)
            points.append(Point(strategy.name, n, plan.nodes, plan.gradient_accumulation_steps, plan.global_batch_size,
                                times[0].total_s, tps, days[0], days[0] * n, min(days), max(days), times[0].exposed_s,
                                times[0].straggler_s,
                                pattern_of(plan, base.powersgd_rank).bytes_per_step(plan.gradient_accumulation_steps,
                                                                                    n, gpus_per_node),
                                tps / n / reference_tps, verdict.fits, verdict.total_per_gpu,
                                verdict.reason if verdict.fits is False else None))
    return points


def calibrated_flops_per_s(base: Baseline, s_per_iter: float, links: Links) -> float:
    """FLOPs per second one GPU achieved on the measured run's own compute (its exposed communication taken out):
    what a 3D layout's stages are assumed to run at."""
    plan = base.plan
    _, hardware = training_flops_per_sequence(plan.shape, plan.seq_len, plan.activation_checkpointing)
    return hardware * plan.per_device_train_batch_size / micro_compute_s(plan, base, s_per_iter, links)


def grid_point(plan: GridPlan, rates: list[float], links, base: Baseline, gpus_per_node: int, token_budget: float,
               series: str) -> Point:
    """One 3D layout's projected point (rates and links: typical, optimistic, pessimistic)."""
    times = [grid_step_time(plan.run, flops_per_s=r, links=link, gpus_per_node=gpus_per_node)
             for r, link in zip(rates, links)]
    tokens = plan.tokens_per_step
    days = [token_budget / (tokens / st.total_s) / SECONDS_PER_DAY for st in times]
    low, high = GRID_MODEL_ERROR  # the check against Megatron's published throughput (docs/project.md)
    days += [days[1] * min(low, 1.0), days[2] * max(high, 1.0)]
    verdict = fit(plan, base.device_memory_bytes)
    st, n = times[0], plan.world_size
    tps = tokens / st.total_s
    return Point(series, n, plan.nodes, plan.gradient_accumulation_steps, plan.global_batch_size, st.total_s, tps,
                 days[0], days[0] * n, min(days), max(days), st.tp_comm_s + st.p2p_s + st.dp_comm_s, 0.0,
                 st.comm_bytes, float("nan"), verdict.fits, verdict.total_per_gpu,
                 verdict.reason if verdict.fits is False else None, plan.grid.label)


def project_grids(base: Baseline, families: list[str], gpus: list[int], gpus_per_node: int, links, token_budget: float,
                  global_batch: int | None, grid_opts) -> list[Point]:
    """The 3D layouts' points: at each GPU count, the given (--tp, --pp) layouts as their own series, or - when none is
    given - the fastest layout that fits, searched over every TP and PP Megatron allows (grid_layouts). Each runs the
    global batch the data-parallel strategies run there (or --global_batch_size), at the measured run's FLOPs per GPU
    (calibrated_flops_per_s): a stage computes 1/(TP x PP) of the model. They step Megatron's Adam whatever the
    measured run's optimizer (Megatron offers no other)."""
    rates = [calibrated_flops_per_s(base, s, link) for s, link in zip(base.s_per_iter, links)]
    plan0 = base.plan
    mbs = plan0.per_device_train_batch_size
    fixed = bool(grid_opts.tp or grid_opts.pp)
    tps = comma_list(grid_opts.tp, "--tp", int) if grid_opts.tp else None
    pps = comma_list(grid_opts.pp, "--pp", int) if grid_opts.pp else None
    points = []
    for family in families:
        by_series: dict[str, list[Point]] = {}
        for n in gpus:
            gbs = global_batch or mbs * plan0.gradient_accumulation_steps * n
            candidates = []
            for tp, pp in grid_layouts(plan0.shape, n, gpus_per_node, tps or ([1] if pps else None),
                                       pps or ([1] if tps else None), uneven_stages=FAMILIES[family]):
                dp = n // (tp * pp)
                if gbs % (mbs * dp):
                    continue  # the global batch does not split into whole micro-batches per pipeline
                plan = GridPlan(family, "adamw", plan0.shape, plan0.seq_len, tp=tp, pp=pp, dp=dp,  # Megatron's Adam
                                per_device_train_batch_size=mbs, gradient_accumulation_steps=gbs // (mbs * dp),
                                processes_per_node=min(n, gpus_per_node), precision=plan0.precision,
                                recompute=grid_opts.recompute, sequence_parallel=grid_opts.sequence_parallel)
                if plan.refusal():
                    continue
                series = plan.name if fixed else family
                candidates.append(grid_point(plan, rates, links, base, gpus_per_node, token_budget, series))
            if fixed:
                for p in candidates:
                    by_series.setdefault(p.strategy, []).append(p)
            elif candidates:  # the fastest that fits; when none fits, the leanest (marked: it does not fit)
                fitting = [p for p in candidates if p.fits is not False]
                pick = (min(fitting, key=lambda p: p.days) if fitting
                        else min(candidates, key=lambda p: p.total_per_gpu or 0))
                by_series.setdefault(family, []).append(pick)
        for series in by_series.values():
            first = series[0].tokens_per_s / series[0].gpus
            for p in series:
                p.efficiency = p.tokens_per_s / p.gpus / first
            points += series
    return points


CHECKS_FILE = Path(__file__).with_name("projection_checks.json")


def model_error(strategy: str, checks_file: Path | None = None) -> tuple[float, float] | None:
    """(lowest, highest) projected / measured tokens/s of this strategy's checks against real runs
    (benchmarks/projection_vs_real.py --out: from 1 process to 2 and 4 on a CPU machine), or None when unchecked.
    Checks with more processes than the machine had cores are left out: there the ranks take turns on the cores, so
    one rank's wait in a collective is another's compute - a regime no GPU job is in (docs/project.md)."""
    ratios = _checked_ratios(checks_file or CHECKS_FILE).get(strategy)
    return (min(ratios), max(ratios)) if ratios else None


@lru_cache(maxsize=4)
def _checked_ratios(path: Path) -> dict[str, list[float]]:
    """{strategy: every round's ratio} of a checks file, read once (empty when it is missing or malformed)."""
    out = {}
    try:
        data = json.loads(path.read_text())
        cores = data.get("cores") or float("inf")
        for c in data["checks"]:
            if c["processes"] <= cores:
                out.setdefault(c["strategy"], []).extend(float(r) for r in c.get("ratios") or [c["ratio"]])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return out


def knee(points: list[Point], gain_threshold: float) -> int | None:
    """The first GPU count from which doubling the GPUs saves less than `gain_threshold` of the days (points that
    cannot fit are never the knee)."""
    by_gpus = {p.gpus: p for p in points if p.fits is not False}
    for n in sorted(by_gpus):
        if 2 * n in by_gpus and 1 - by_gpus[2 * n].days / by_gpus[n].days < gain_threshold:
            return n
    return None


def best(points: list[Point]) -> dict[int, str]:
    """The fastest strategy that fits, at each GPU count (a 3D layout with its grid: megatron (tp8-pp4-dp16))."""
    out = {}
    for n in sorted({p.gpus for p in points}):
        fitting = [p for p in points if p.gpus == n and p.fits is not False]
        if fitting:
            top = min(fitting, key=lambda p: p.days)
            out[n] = f"{top.strategy} ({top.layout})" if top.layout else top.strategy
    return out


# ---- inputs --------------------------------------------------------------------------------------------------------

def _bandwidths(text: str, flag: str) -> tuple[float, float, float]:
    """'150' or '100:200' (GB/s) -> (typical, high, low) bytes/s; typical is the middle of a range."""
    try:
        parts = [float(x) for x in str(text).split(":")]
    except ValueError:
        raise HfscaleError(f"--{flag} must be GB/s or LOW:HIGH GB/s, got {text!r}") from None
    if len(parts) not in (1, 2) or any(not (x > 0 and x != float("inf")) for x in parts):
        raise HfscaleError(f"--{flag} must be positive GB/s (or LOW:HIGH), got {text!r}")
    low, high = min(parts), max(parts)
    return (low + high) / 2 * GB, high * GB, low * GB


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
                       per_device_train_batch_size=cfg.micro_batch_size, gradient_accumulation_steps=cfg.grad_accum,
                       world_size=world, processes_per_node=max(1, world // nodes), precision=cfg.precision or "fp32",
                       activation_checkpointing=bool(cfg.checkpointing),
                       attention=(data.estimate or {}).get("attention", "sdpa"), torch_compile=bool(cfg.torch_compile),
                       fused_linear_cross_entropy=bool(cfg.fused_linear_cross_entropy),
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
                    overlap=not on_cpu, step_sd_s=step_noise_s(history), device_memory_bytes=device_bytes)


def megatron_log_plan(data, path: Path, gpus_per_node: int) -> GridPlan:
    """The 3D layout an imported Megatron log (`hfscale import-logs`) ran, from what its header stated."""
    cfg = data.config
    try:
        shape = data.model.shape()
    except HfscaleError:
        raise HfscaleError(f"{path}: the log states no GPT-2/BLOOM model shape (num_layers, hidden_size, "
                           "num_attention_heads in its arguments block), so it cannot be projected") from None
    if not (cfg.tp and cfg.pp and cfg.dp and cfg.micro_batch_size and cfg.global_batch_size and cfg.seq_len):
        raise HfscaleError(f"{path}: the log does not state its TP, PP, DP, micro-batch and global batch")
    if cfg.global_batch_size % (cfg.micro_batch_size * cfg.dp):
        raise HfscaleError(f"{path}: its global batch {cfg.global_batch_size} is not a whole number of micro-batches "
                           f"of {cfg.micro_batch_size} per pipeline over DP {cfg.dp}")
    family = "megatron-deepspeed" if str(data.strategy).startswith("megatron-deepspeed") else "megatron"
    recompute = (cfg.extra.get("recompute") or "full") if cfg.checkpointing else "none"
    return GridPlan(family, "adamw", shape, cfg.seq_len, tp=cfg.tp, pp=cfg.pp, dp=cfg.dp,
                    per_device_train_batch_size=cfg.micro_batch_size,
                    gradient_accumulation_steps=cfg.global_batch_size // (cfg.micro_batch_size * cfg.dp),
                    processes_per_node=min(cfg.world_size or gpus_per_node, gpus_per_node),
                    precision=cfg.precision or "bf16", recompute=recompute,
                    sequence_parallel=bool(cfg.extra.get("sequence_parallel")))


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
                  activation_checkpointing=plan.recompute != "none")
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
                     gradient_accumulation_steps=opts.gradient_accumulation_steps)
    tokens_per_micro = plan.per_device_train_batch_size * plan.seq_len
    if opts.tokens_per_s_per_gpu is not None:
        micro_s = tokens_per_micro / opts.tokens_per_s_per_gpu
        source = f"--tokens_per_s_per_gpu {opts.tokens_per_s_per_gpu:g}"
    else:
        _, hardware = training_flops_per_sequence(plan.shape, plan.seq_len, plan.activation_checkpointing)
        micro_s = hardware * plan.per_device_train_batch_size / (opts.tflops_per_gpu * 1e12)
        source = f"--tflops_per_gpu {opts.tflops_per_gpu:g} (hardware FLOPs)"
    s = micro_s * plan.gradient_accumulation_steps  # compute only: a one-GPU baseline, no communication
    return Baseline(plan, [s, s, s], source, device_memory_bytes=device_bytes)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="hfscale project", allow_abbrev=False,
                       description="Days and GPU-days to a token budget vs number of GPUs, per strategy; every point "
                                   "judged by the memory estimate on the device.")
    p.add_argument("results", nargs="?", type=Path, help="a results.json of a finished run (its measured throughput)")
    p.add_argument("--tokens_per_s_per_gpu", type=float, help="instead of a results file: measured per-GPU throughput")
    p.add_argument("--tflops_per_gpu", type=float, help="instead of a results file: achieved hardware TFLOPs per GPU")
    add_model_flags(p)
    p.add_argument("--seq_len", type=int)
    p.add_argument("--per_device_train_batch_size", type=int, default=1)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--activation_checkpointing", action="store_true")
    p.add_argument("--attn_implementation", default="sdpa")
    add_precision_flags(p)
    p.add_argument("--optim", default="adamw", help="the optimizer (its states count in the memory verdict)")
    p.add_argument("--strategy", help="comma-separated or `all` (default: the run's); `all` includes the 3D layouts "
                   "megatron and megatron-deepspeed (ZeRO-1 over DP), which may also be named")
    add_grid_flags(p)
    p.add_argument("--gpus", default=DEFAULT_GPUS, help=f"GPU counts (default {DEFAULT_GPUS})")
    p.add_argument("--global_batch_size", type=int, help="hold the global batch (samples) fixed instead of the per-GPU work")
    p.add_argument("--device", help=f"the GPU the points are judged on: {', '.join(DEVICES)} (default: a run's own)")
    p.add_argument("--device_memory_gb", type=float, help="memory per GPU in GB instead of a --device name")
    add_link_flags(p)
    p.add_argument("--token_budget", type=float, default=1e11)
    p.add_argument("--gain_threshold", type=float, default=0.25, help="report where doubling GPUs saves less than this share of the days")
    p.add_argument("--out", type=Path, help="write projection.{md,csv,json} and days_vs_gpus.png here")
    p.add_argument("--json", action="store_true")
    return p


def add_link_flags(p) -> None:
    """The links of the communication model (`hfscale project`, `hfscale report --days_at_gpus`)."""
    p.add_argument("--gpus_per_node", type=int, default=8)
    p.add_argument("--intra_bw", default=f"{DEFAULT_INTRA_GB_S:g}", help="intra-node bus bandwidth per GPU, GB/s or "
                   f"LOW:HIGH (default {DEFAULT_INTRA_GB_S:g}, assumed)")
    p.add_argument("--inter_bw", default=f"{DEFAULT_INTER_GB_S:g}", help="inter-node bus bandwidth per GPU, GB/s or "
                   f"LOW:HIGH (default {DEFAULT_INTER_GB_S:g}, assumed)")
    p.add_argument("--intra_latency_us", type=float, default=5.0)
    p.add_argument("--inter_latency_us", type=float, default=20.0)
    p.add_argument("--bandwidth_file", type=Path, help="measured by `hfscale bandwidth --out` (sets --intra_bw and the latency)")


def tokens_per_s_at(results_path: Path, gpus: int, gpus_per_node: int, links) -> Point:
    """The projected point of a finished run's configuration at `gpus` GPUs with the same global batch (so its loss
    per token is unchanged), judged on the run's own GPU. HfscaleError when it cannot be projected there."""
    base = baseline_from_results(results_path)
    strategy = base.plan.strategy
    reason = base.plan.but(world_size=gpus, processes_per_node=min(gpus, gpus_per_node)).refusal()
    if reason:
        raise HfscaleError(reason)
    points = project(base, [strategy], [gpus], gpus_per_node, links, 1.0, base.plan.global_batch_size)
    if not points:
        raise HfscaleError(f"its global batch {base.plan.global_batch_size} is not a multiple of MBS "
                           f"{base.plan.per_device_train_batch_size} x {gpus} GPUs")
    return points[0]


def links_from(opts) -> tuple[Links, Links, Links]:
    intra, inter = _bandwidths(opts.intra_bw, "intra_bw"), _bandwidths(opts.inter_bw, "inter_bw")
    for name in ("intra_latency_us", "inter_latency_us"):
        if not 0 <= getattr(opts, name) < float("inf"):
            raise HfscaleError(f"--{name} must be >= 0, got {getattr(opts, name)}")
    intra_lat, fits, meets = opts.intra_latency_us * 1e-6, (), ()
    if opts.bandwidth_file:
        measured = read_bandwidth_file(opts.bandwidth_file)
        if "fit" in measured:  # the latency-bandwidth line fitted over every size, per collective kind
            bw = measured["busbw_largest"]["all_reduce"]
            try:
                fits = tuple((kind, float(f["busbw"]), float(f["latency_s"])) for kind, f in measured["fit"].items())
            except (TypeError, KeyError, ValueError, AttributeError):
                fits = ()
            if not fits or not all(0 < b < float("inf") and 0 <= lat < float("inf") for _, b, lat in fits):
                raise HfscaleError(f"{opts.bandwidth_file}: malformed fit (each collective needs a positive busbw and "
                                   "a latency_s >= 0); write it again with `hfscale bandwidth --out`")
            bw, intra_lat = dict((k, (b, lat)) for k, b, lat in fits).get("all_reduce", (bw, intra_lat))
            meets = meeting_curves(measured, opts.bandwidth_file)
        else:  # an older file: its largest message's bandwidth and its smallest message's latency
            bw = measured["busbw_largest"]["all_reduce"]
            try:
                smallest = min((r for r in measured["rows"] if r["kind"] == "all_reduce"), key=lambda r: r["size_bytes"])
                intra_lat = float(smallest["time_s"]) / (2 * (int(measured["ranks"]) - 1))
            except (TypeError, KeyError, ValueError, ZeroDivisionError):
                intra_lat = -1.0
            if not 0 <= intra_lat < float("inf"):
                raise HfscaleError(f"{opts.bandwidth_file}: malformed rows (no all_reduce row with its time_s, or no "
                                   "ranks > 1); write it again with `hfscale bandwidth --out`")
        intra = (bw, bw, bw)
    return tuple(Links(intra[i], inter[i], intra_lat, opts.inter_latency_us * 1e-6, fits, meets) for i in range(3))


def meeting_curves(measured: dict, path) -> tuple:
    """Links.intra_meets from a bandwidth file measured with --compute_ms: per kind, (gap, seconds) points in rising
    gap order; () when it has none (measured back to back)."""
    if "meet_s" not in measured:
        if measured.get("compute_s_between"):  # hfscale before 2026-11-26: fits timed after compute, meeting included
            raise HfscaleError(f"{path}: measured by an older `hfscale bandwidth --compute_ms`, whose fits include the "
                               "meeting after a whole step (now measured apart, per piece); write it again with "
                               "`hfscale bandwidth --compute_ms X --out`")
        return ()
    try:
        curves = tuple((kind, tuple(sorted((float(gap), float(s)) for gap, s in points)))
                       for kind, points in measured["meet_s"].items())
    except (TypeError, ValueError, AttributeError):
        curves = ()
    if not curves or not all(points and all(0 < gap < float("inf") and 0 <= s < float("inf") for gap, s in points)
                             for _, points in curves):
        raise HfscaleError(f"{path}: malformed meet_s (per collective, [gap_s > 0, seconds >= 0] points); write it "
                           "again with `hfscale bandwidth --compute_ms X --out`")
    return curves


def run_projection(opts):
    if opts.results and (opts.tokens_per_s_per_gpu or opts.tflops_per_gpu):
        raise HfscaleError("give a results file or --tokens_per_s_per_gpu/--tflops_per_gpu, not both")
    positive(opts, "tokens_per_s_per_gpu", "tflops_per_gpu", "per_device_train_batch_size",
             "gradient_accumulation_steps", "gpus_per_node", "global_batch_size", "token_budget", "seq_len")
    if not 0 < opts.gain_threshold < 1:
        raise HfscaleError(f"--gain_threshold must be between 0 and 1, got {opts.gain_threshold}")
    gpus = sorted(set(comma_list(opts.gpus, "--gpus", int)))
    check_whole_nodes(gpus, opts.gpus_per_node)
    links = links_from(opts)
    device_bytes = (device_memory_bytes(opts.device, opts.device_memory_gb)
                    if opts.device or opts.device_memory_gb is not None else None)
    if opts.results and read_results(opts.results).source == "megatron-log":
        base, logged = baseline_from_megatron_log(opts.results, links, opts.gpus_per_node, device_bytes)
        opts.global_batch_size = opts.global_batch_size or logged.global_batch_size  # the log's, by default
        if not (opts.strategy or opts.tp or opts.pp):  # by default the log's own layout
            opts.strategy, opts.tp, opts.pp = logged.family, str(logged.tp), str(logged.pp)
            opts.recompute_granularity = logged.recompute if logged.recompute != "none" else "full"
            opts.sequence_parallel = opts.sequence_parallel or logged.sequence_parallel
    elif opts.results:
        base = baseline_from_results(opts.results, device_bytes)
    elif opts.tokens_per_s_per_gpu or opts.tflops_per_gpu:
        opts.strategy = opts.strategy or "ddp"
        base = baseline_from_flags(opts, device_bytes)
    else:
        raise HfscaleError("nothing to project from: give a results.json, --tokens_per_s_per_gpu or --tflops_per_gpu")
    strategies, families = (strategies_and_families(opts.strategy, with_3d=True, timed=True) if opts.strategy
                            else ([base.plan.strategy], []))
    if (opts.tp or opts.pp) and not families:
        raise HfscaleError("--tp/--pp describe the 3D layouts: add megatron or megatron-deepspeed to --strategy")
    points = project(base, strategies, gpus, opts.gpus_per_node, links, opts.token_budget, opts.global_batch_size)
    grid_opts = GridOptions(opts.tp, opts.pp, opts.recompute_granularity if base.plan.activation_checkpointing
                            else "none", opts.sequence_parallel)
    points += project_grids(base, families, gpus, opts.gpus_per_node, links, opts.token_budget, opts.global_batch_size,
                            grid_opts)
    if not points and opts.global_batch_size:
        raise HfscaleError(f"--global_batch_size {opts.global_batch_size} is not a multiple of MBS x GPUs for any of "
                           f"--gpus {opts.gpus}")
    if not points:
        raise HfscaleError(f"no 3D layout of this model for --gpus {opts.gpus}: TP must divide the heads inside a "
                           "node, PP at most the layers (dividing them for megatron), TP x PP the GPUs")
    series = [s.name for s in strategies] + list(dict.fromkeys(p.strategy for p in points if p.layout))
    knees = {name: knee([p for p in points if p.strategy == name], opts.gain_threshold) for name in series}
    return base, links, points, knees


def markdown(points: list[Point], knees: dict, budget: float) -> str:
    lines = [f"| strategy | GPUs | nodes | GAS | GBS | s/it | tokens/s | days to {budget / 1e9:g}B | band | GPU-days | "
             "exposed comm s/it | straggler s/it | comm GB/GPU/it | scaling eff. | fits |", "|" + "---|" * 15]
    for p in points:
        fits = "?" if p.fits is None else "yes" if p.fits else f"**no**: {p.fit_reason}"
        name = f"{p.strategy} ({p.layout})" if p.layout else p.strategy
        lines.append(f"| {name} | {p.gpus} | {p.nodes} | {p.grad_accum} | {p.global_batch} | {p.s_per_iter:.4g} | "
                     f"{p.tokens_per_s:,.0f} | {p.days:,.2f} | {p.days_low:,.2f}–{p.days_high:,.2f} | "
                     f"{p.gpu_days:,.1f} | {p.exposed_comm_s:.3g} | {p.straggler_s:.3g} | "
                     f"{p.comm_bytes_per_gpu / GB:.3g} | {p.efficiency:.0%} | {fits} |")
    lines.append("")
    for name, n in knees.items():
        lines.append(f"- {name}: " + (f"doubling past {n} GPUs saves less than the threshold" if n else
                                      "doubling keeps paying over the counts given"))
    for n, name in best(points).items():
        lines.append(f"- fastest that fits at {n} GPUs: {name}")
    return "\n".join(lines) + "\n"


def plot(points: list[Point], path: Path, budget: float) -> None:
    import matplotlib  # heavy, and only for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(p.strategy for p in points):
        mine = [p for p in points if p.strategy == name]
        fitting = [p for p in mine if p.fits is not False]
        line = ax.plot([p.gpus for p in fitting], [p.days for p in fitting], marker="o", label=name)
        color = line[0].get_color()
        if fitting:
            ax.fill_between([p.gpus for p in fitting], [p.days_low for p in fitting], [p.days_high for p in fitting],
                            alpha=0.2, color=color)
        out = [p for p in mine if p.fits is False]  # hollow, no line: a configuration that cannot start
        if out:
            ax.scatter([p.gpus for p in out], [p.days for p in out], facecolors="none", edgecolors=color,
                       label=f"{name} (does not fit)")
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="days (wall clock)",
           title=f"Projected days to train {budget / 1e9:g}B tokens")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)


def error_line(strategies: list[str]) -> str:
    """What the model's own checks against real runs measured, for each strategy projected."""
    parts = []
    for name in strategies:
        error = GRID_MODEL_ERROR if name.startswith(tuple(FAMILIES)) else model_error(name)
        parts.append(f"{name} {error[0]:.2f}–{error[1]:.2f}" if error else f"{name} not checked")
    return ("model error, projected / measured tokens/s of real runs projected from 1 process on a CPU machine "
            "(benchmarks/projection_vs_real.py; docs/project.md): " + ", ".join(parts)
            + "; the band beyond the measured count is widened by it")


def meeting_line(links: Links) -> str:
    if not links.intra_meets:
        return ("no meeting cost: the collectives inside a node are timed back to back (measure it with `hfscale "
                "bandwidth --compute_ms`)")
    longest = max(gap for _, curve in links.intra_meets for gap, _ in curve)
    return ("each piece inside a node also pays the ranks' meeting after the compute before it (the step's, spread "
            "evenly), as measured: " + ", ".join(f"{kind} {links.meet_s(kind, longest) * 1e6:.0f} us after "
                                                  f"{longest * 1e3:.3g} ms" for kind, _ in links.intra_meets))


def assumptions_of(base: Baseline, links, strategies: list[str]) -> list[str]:
    plan = base.plan
    memory = (f"every point judged by the memory estimate on {base.device_memory_bytes / GB:g} GB per GPU "
              "(hfscale estimate's verdict; a point that does not fit is marked and never recommended)"
              if base.device_memory_bytes else
              "memory not judged: no device memory known (pass --device or --device_memory_gb) - a point may not fit")
    return [f"from {base.source}: {plan.strategy.name} with {plan.optimizer.name} on {plan.world_size} GPU(s), MBS "
            f"{plan.per_device_train_batch_size}, GAS {plan.gradient_accumulation_steps}, seq {plan.seq_len}, "
            f"{plan.precision}, {base.s_per_iter[0]:.4g} s/it (spread {base.s_per_iter[1]:.4g}–{base.s_per_iter[2]:.4g})",
            f"links: intra-node {links[0].intra_bw / GB:g} GB/s, inter-node {links[0].inter_bw / GB:g} GB/s "
            f"bus bandwidth per GPU (band {links[2].inter_bw / GB:g}–{links[1].inter_bw / GB:g}); latency "
            f"{links[0].intra_latency_s * 1e6:g}/{links[0].inter_latency_s * 1e6:g} us per ring step",
            meeting_line(links[0]),
            (f"per-step noise {base.step_sd_s * 1e3:.3g} ms (sd, from the run's logging intervals): waiting for "
             "the slowest rank costs sd x E[max of n normals] per step" if base.step_sd_s else
             "per-step noise unknown (fewer than 4 logging intervals, or no run): no straggler term"),
            "compute per micro-batch is the same for every strategy and GPU count (the measured one, less its "
            "own exposed communication); docs/project.md lists what overlaps"
            + ("" if base.overlap else " - nothing here: a CPU run, whose collectives share the compute cores"),
            memory, error_line(strategies)] + ([
                "megatron* layouts: each pipeline stage computes 1/(TP x PP) of the step's FLOPs at the FLOPs per GPU "
                "the measured run achieved; TP's all-reduces (2 + 2 per block per micro-batch, inside a node), the "
                "point-to-point sends, the 1F1B bubble ((PP - 1) of M + PP - 1 slots) and the DP gradient reduction "
                "are all exposed; they step Megatron's Adam; the global batch is the data-parallel strategies' at "
                "each count (or --global_batch_size); the band is widened by the check against Megatron-LM's "
                "published throughput "
                f"({GRID_MODEL_ERROR[0]:.2f}–{GRID_MODEL_ERROR[1]:.2f}, docs/project.md)"]
                if any(name.startswith(tuple(FAMILIES)) for name in strategies) else [])


# What a flag-based projection is told about the run; a results file brings all of it (its model, shape, batch,
# precision and optimizer), so the same flag beside one would be silently ignored
RUN_FLAGS = ("--model", "--model_name_or_path", *(f"--{flag}" for flag in MODEL_OVERRIDES), "--seq_len",
             "--per_device_train_batch_size", "--gradient_accumulation_steps", "--activation_checkpointing",
             "--attn_implementation", "--bf16", "--fp16", "--torch_compile", "--fused_linear_cross_entropy", "--optim")


def refuse_run_flags_beside_results(argv: list[str], opts) -> None:
    given = next((a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in RUN_FLAGS), None)
    if opts.results and given:
        raise HfscaleError(f"{given} describes the run of a projection from --tokens_per_s_per_gpu or --tflops_per_gpu; "
                           f"{opts.results} brings its own model and run: drop {given}")


def main(argv: list[str]) -> None:
    refuse_renamed(argv)
    opts = build_parser().parse_args(argv)
    refuse_run_flags_beside_results(argv, opts)
    if opts.out:
        check_writable_dir(opts.out, "--out")
    base, links, points, knees = run_projection(opts)
    assumptions = assumptions_of(base, links, list(knees))
    report = {"assumptions": assumptions, "knee_gpus": knees, "best_that_fits": best(points),
              "points": [asdict(p) for p in points]}
    text = markdown(points, knees, opts.token_budget) + "\n" + "\n".join(f"- {a}" for a in assumptions) + "\n"
    if opts.out:
        csv_buf = io.StringIO()
        writer = csv.DictWriter(csv_buf, fieldnames=list(asdict(points[0])))
        writer.writeheader()
        writer.writerows(asdict(p) for p in points)
        atomic_write_text(opts.out / "projection.md", text)
        atomic_write_text(opts.out / "projection.csv", csv_buf.getvalue())
        atomic_write_text(opts.out / "projection.json", json.dumps(report, indent=2) + "\n")
        plot(points, opts.out / "days_vs_gpus.png", opts.token_budget)
    print(json.dumps(report, indent=2) if opts.json else text)
