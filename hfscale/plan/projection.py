"""The projection model: a measured configuration's step at other GPU counts and under other strategies.

Compute per micro-batch comes from the measurement with the run's own exposed communication taken out (at the run's
GPU count and links); each projected point adds back what the strategy moves at that GPU count (formulas/comm.py).
Megatron's 3D layouts run at the FLOPs per GPU the measured run achieved (formulas/parallel3d.py). Every point is a
RunPlan the memory estimate judges on the device. docs/project.md."""

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from ..errors import HfscaleError
from ..flags import comma_list
from ..formulas.comm import Links, bucket_pieces, comm_pattern, powersgd_compute_s, powersgd_elements, step_time
from ..formulas.float8 import FLOAT8_DEVICES, device_roofline, float8_step
from ..formulas.precision import block_linears, float8_block_elements, storage_dtype
from ..formulas.peaks import MEMORY_BW_GB_S, PEAK_TFLOPS
from ..formulas.memory import DTYPE_BYTES, model_state_bytes, optimizer_step_bytes
from ..formulas.tensors import parameter_tensors, tp_local_tensors, zero3_gathers
from ..formulas.metrics import days_to_train, training_flops_per_sequence
from ..formulas.parallel3d import grid_step_time
from ..models.family import UNTIED_HEAD
from ..runplan import RunPlan, accumulation_steps
from .baseline import Baseline
from .grid import FAMILIES, GridPlan, grid_layouts
from .options import fit


@dataclass
class Point:
    strategy: str
    gpus: int
    nodes: int
    gradient_accumulation_steps: int
    global_batch_size: int  # samples
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
    """What a plan moves per step over its data-parallel ranks (formulas.comm.comm_pattern), in the dtype each engine
    communicates, with the pieces it issues them in and the engine's settings (the run's DeepSpeed JSON) that change
    what moves. Under fsdp_tp FSDP2 shards each rank's TP slices over the data-parallel ranks (one a node): its
    gathers and reductions are of those slices (formulas/tensors.tp_local_tensors); TP's own collectives are in the
    measured micro-batch's compute (step_of)."""
    strategy, shape = plan.strategy, plan.shape
    tensors = tp_local_tensors(shape, plan.tp)  # a rank's TP slices (without TP: the whole model's tensors)
    P = sum(tp.numel for tp in tensors)
    t, g = DTYPE_BYTES[plan.dtypes.parameters], DTYPE_BYTES[plan.dtypes.gradients]
    backward_order = [tp.numel for tp in reversed(tensors)]
    if strategy.engine == "ddp":  # fp32 weights and fp32 gradients under autocast
        psgd = None
        if strategy.comm_hook == "powersgd":
            rank = powersgd_rank or strategy.powersgd["rank"]
            psgd = g * powersgd_elements([tp.shape for tp in tensors], rank)
        return comm_pattern("ddp", None, param_bytes=t * P, grad_bytes=g * P, ranks=plan.data_parallel_size,
                            powersgd_bytes=psgd, sync_each_batch=plan.sync_each_batch,
                            reduce_buckets=bucket_pieces([g * n for n in backward_order], DDP_BUCKET_BYTES))
    common = dict(param_bytes=t * P, grad_bytes=g * P, ranks=plan.data_parallel_size,
                  offload_optimizer=strategy.offloads_state("optimizer_states"),
                  offload_params=strategy.offloads_state("parameters"))
    if strategy.engine == "fsdp":
        # An untied head (Llama's) is a unit of its own, resharded after the forward and gathered again for the
        # backward as a block is (counted on a 2-process Llama run); the rest outside the blocks is FSDP2's root unit
        spec = shape.spec
        head = sum(tp.numel for tp in tensors if tp.name == UNTIED_HEAD)
        resharded = sum(tp.numel for tp in tensors if spec.is_block(tp.name)) + head
        root = P - resharded
        tail = (spec.final_norm + ".", spec.embedding, UNTIED_HEAD)
        leftover = sum(tp.numel for tp in tensors
                       if not (spec.is_block(tp.name) or tp.name.startswith(tail)))  # the model's own unit
        float8 = {}
        if plan.float8_all_gather:  # the converted weights gathered one byte an element, their scales all-reduced
            converted = shape.n_layer * float8_block_elements(shape)
            float8 = dict(block_gather_bytes=t * resharded - (t - 1) * converted,
                          float8_scales=shape.n_layer * sum(c for _, _, c in block_linears(shape)))
        return comm_pattern("fsdp", None, **common, shard_ranks=plan.shard_ranks if strategy.hybrid else None,
                            root_param_bytes=t * root, root_leftover_bytes=t * leftover,
                            units=shape.n_layer + (1 if head else 0),
                            norm_tensors=len(backward_order) if plan.clips_gradients else 0,
                            sync_each_batch=plan.sync_each_batch, **float8)
    layout = plan.memory_layout
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


def powersgd_step_s(plan: RunPlan, device: str | None, powersgd_rank: int | None) -> float:
    """Seconds per step of PowerSGD's own compression on the baseline's GPU (formulas/comm.powersgd_compute_s, at
    its datasheet memory bandwidth and fp32 peak: the hook works on the fp32 gradients); 0 for another strategy, and
    for a CPU run or an unknown GPU, whose measured step already holds it or whose bandwidth is not known."""
    if plan.strategy.comm_hook != "powersgd" or device not in MEMORY_BW_GB_S or not PEAK_TFLOPS[device].get("fp32"):
        return 0.0
    return _powersgd_s(plan.shape, powersgd_rank or plan.strategy.powersgd["rank"],
                       DTYPE_BYTES[plan.dtypes.gradients], device)


@lru_cache(maxsize=64)
def _powersgd_s(shape, rank: int, element_bytes: int, device: str) -> float:
    return powersgd_compute_s([tp.shape for tp in parameter_tensors(shape)], rank, element_bytes,
                              PEAK_TFLOPS[device]["fp32"] * 1e12, MEMORY_BW_GB_S[device] * 1e9)


def optimizer_step_s(plan: RunPlan, device: str | None) -> float:
    """Seconds of one rank's optimizer step on the baseline's GPU, at its datasheet memory bandwidth (the step is
    elementwise passes over what the rank steps: formulas/memory.optimizer_step_bytes), once per optimizer step - so
    it weighs more per token at less accumulation, and less per GPU where the strategy shards it. 0 for a CPU run or
    an unknown GPU, whose measured micro-batches keep it at the measured accumulation."""
    if device not in MEMORY_BW_GB_S:
        return 0.0
    return _optimizer_bytes(plan.shape, plan.memory_layout, plan.optimizer_memory_rule, storage_dtype(plan.precision),
                            plan.shard_ranks, plan.unreduced_micro_batches, plan.tp) / (MEMORY_BW_GB_S[device] * 1e9)


@lru_cache(maxsize=256)
def _optimizer_bytes(shape, layout, rule: str, precision: str, ranks: int, grad_accum: int, tp: int) -> int:
    mem = model_state_bytes(shape, layout, rule, precision, ranks, grad_accum, tp)
    return optimizer_step_bytes(mem, layout.engine, rule, precision)


def dp_per_node(plan: RunPlan) -> int:
    """The data-parallel ranks a node holds: its processes, over the TP degree (one under fsdp_tp)."""
    return max(1, plan.processes_per_node // plan.tp)


def step_of(plan: RunPlan, base: Baseline, micro_compute: float, links: Links, pattern):
    """pattern: the plan's pattern_of, computed once by the caller (it walks the model's tensors). Once per step, on
    the compute stream: the optimizer's step (optimizer_step_s) and, under PowerSGD, the compression's compute
    (powersgd_step_s). Under TP the measured micro-batch holds TP's own all-reduces, at the TP degree the run had and
    every projected point keeps (tp_projection_refusal): they are not timed apart."""
    st = step_time(pattern, micro_compute_s=micro_compute,
                   grad_accum=plan.gradient_accumulation_steps, ranks=plan.data_parallel_size,
                   gpus_per_node=dp_per_node(plan), links=links, overlap=base.overlap,
                   step_sd_s=base.step_sd_s)
    extra = powersgd_step_s(plan, base.device, base.powersgd_rank) if plan.world_size > 1 else 0.0
    extra += optimizer_step_s(plan, base.device)
    return replace(st, compute_s=st.compute_s + extra, total_s=st.total_s + extra) if extra else st


def micro_compute_s(plan: RunPlan, base: Baseline, s_per_iter: float, links: Links, pattern=None) -> float:
    """Compute seconds per micro-batch: the measured step less the exposed communication the model gives the measured
    configuration itself, and less PowerSGD's compression where it ran (solved by fixed-point iteration: the exposed
    part depends on the compute that hides it), and less its optimizer's step (optimizer_step_s). pattern: what the
    run moved, where it is not the plan's pattern_of (a published run whose engine reduced otherwise)."""
    gas = plan.gradient_accumulation_steps
    compute = s_per_iter / gas
    if pattern is None:  # what moves does not depend on the compute that hides it
        pattern = pattern_of(plan, base.powersgd_rank)
    ran_it = base.plan.strategy.comm_hook == "powersgd" and plan.world_size > 1  # the measured step holds it
    own = powersgd_step_s(base.plan, base.device, base.powersgd_rank) if ran_it else 0.0
    own += optimizer_step_s(plan, base.device)
    for _ in range(50):
        st = step_of(plan, base, compute, links, pattern)
        compute = max(s_per_iter - st.exposed_s - st.straggler_s - own, 1e-3 * s_per_iter) / gas
    return compute


def tp_projection_refusal(measured: RunPlan, strategy, gpus_per_node: int) -> str | None:
    """Why `strategy` cannot be projected from the measured run, or None. A TP rank's micro-batch holds its 1/TP of
    the compute and TP's all-reduces, which the data-parallel step model does not time apart: so a TP strategy
    projects only from a run of one, at the run's TP degree (a node's processes), and a TP run only to TP strategies."""
    ran = measured.strategy
    if strategy.tensor_parallel and not ran.tensor_parallel:
        return (f"{strategy.name} is projected only from a tp or fsdp_tp run (its micro-batch holds TP's split compute "
                f"and all-reduces, which the step model does not time); from a {ran.name} run, project TP's costs "
                "with the megatron layouts (--strategy megatron --tp N)")
    if ran.tensor_parallel and not strategy.tensor_parallel:
        return (f"{strategy.name} from a {ran.name} run: its micro-batch holds TP's split compute and all-reduces, "
                f"which the step model does not time apart; project it as tp or fsdp_tp (or measure {strategy.name})")
    if strategy.tensor_parallel and gpus_per_node != measured.processes_per_node:
        return (f"a {ran.name} run's TP degree is its {measured.processes_per_node} processes per node, which every "
                f"projected point keeps: project it with --gpus_per_node {measured.processes_per_node}")
    return None


def plan_at(base: Baseline, strategy, gpus: int, gpus_per_node: int, global_batch: int | None) -> RunPlan | None:
    """The measured configuration under `strategy` on `gpus` GPUs (None: the global batch does not split there)."""
    gas = base.plan.gradient_accumulation_steps
    if global_batch is not None:
        try:
            gas = accumulation_steps(global_batch, base.plan.per_device_train_batch_size, gpus)
        except HfscaleError:
            return None  # not a whole number of micro-batches per GPU at this count
    return base.plan.but(strategy=strategy, world_size=gpus, processes_per_node=min(gpus, gpus_per_node),
                         gradient_accumulation_steps=gas, float8=base.float8 or base.plan.float8,
                         sync_each_batch=base.plan.sync_each_batch if base.sync_each_batch is None
                         else base.sync_each_batch)


def project(base: Baseline, strategies: list, gpus: list[int], gpus_per_node: int, links: tuple[Links, Links, Links],
            token_budget: float, global_batch: int | None) -> list[Point]:
    """links = (typical, optimistic, pessimistic) bandwidths; s_per_iter = (typical, fastest, slowest)."""
    points = []
    for strategy in strategies:
        computes = [micro_compute_s(base.plan, base, s, link) * base.compute_factor
                    for s, link in zip(base.s_per_iter, links)]
        error = strategy_error(strategy.name)
        reference_tps = None
        for n in gpus:
            plan = plan_at(base, strategy, n, gpus_per_node, global_batch)
            if plan is None or plan.refusal() or plan.tp != base.plan.tp:
                continue  # e.g. HSDP on one node, a pair the strategy table refuses, fewer GPUs than a TP group
            pattern = pattern_of(plan, base.powersgd_rank)
            times = [step_of(plan, base, c, link, pattern) for c, link in zip(computes, links)]
            tokens = plan.tokens_per_step
            days = [days_to_train(token_budget, tokens / st.total_s, n)[0] for st in times]
            if error and n > base.plan.world_size:  # measured days = projected x (projected / measured speed)
                days += [days[1] * min(error[0], 1.0), days[2] * max(error[1], 1.0)]
            tps = tokens / times[0].total_s
            reference_tps = reference_tps or tps / n
            verdict = fit(plan, base.device_memory_bytes)
            points.append(Point(strategy.name, n, plan.nodes, plan.gradient_accumulation_steps, plan.global_batch_size,
                                times[0].total_s, tps, days[0], days[0] * n, min(days), max(days), times[0].exposed_s,
                                times[0].straggler_s,
                                pattern.bytes_per_step(plan.gradient_accumulation_steps, plan.data_parallel_size,
                                                       dp_per_node(plan)),
                                tps / n / reference_tps, verdict.fits, verdict.total_per_gpu,
                                verdict.reason if verdict.fits is False else None))
    return points


def with_float8(base: Baseline, recipe: str) -> Baseline:
    """The baseline projected with --fp8 `recipe`: the blocks' linear layers in float8 on the baseline's GPU, its
    compute per micro-batch scaled by formulas/float8's step model (the communication does not change: DDP reduces
    fp32 gradients either way). A run measured with float8 is projected as it ran."""
    if base.plan.float8:
        if base.plan.float8 != recipe:
            raise HfscaleError(f"--fp8_recipe {recipe}: the run trained with float8 recipe {base.plan.float8}, and "
                               "projects as it ran")
        return base
    if base.plan.precision != "bf16":  # the step model is float8 against bf16, the precision around its matmuls
        raise HfscaleError(f"--fp8 projects a bf16 run with float8 matmuls; this one computed in "
                           f"{base.plan.precision}: measure the recipe in bf16 first")
    gpu = device_roofline(base.device)
    if gpu is None:
        where = f"the {base.device}" if base.device else "a GPU the peak table does not know (or a CPU run)"
        raise HfscaleError(f"--fp8: the baseline ran on {where}, which has no float8 tensor cores with a known peak "
                           f"and memory bandwidth; float8 GPUs: {', '.join(FLOAT8_DEVICES)} (--device)")
    plan = base.plan
    step = float8_step(plan.shape, plan.seq_len, plan.per_device_train_batch_size, recipe, gpu)
    return replace(base, float8=recipe, float8_step=step)


def calibrated_flops_per_s(base: Baseline, s_per_iter: float, links: Links) -> float:
    """FLOPs per second one GPU achieved on the measured run's own compute (its exposed communication taken out):
    what a 3D layout's stages are assumed to run at."""
    plan = base.plan  # a TP rank computes 1/TP of each sample (TP's all-reduces stay in its rate)
    _, hardware = training_flops_per_sequence(plan.shape, plan.seq_len, plan.activation_checkpointing)
    return hardware * plan.per_device_train_batch_size / plan.tp / micro_compute_s(plan, base, s_per_iter, links)


def grid_point(plan: GridPlan, rates: list[float], links, base: Baseline, gpus_per_node: int, token_budget: float,
               series: str) -> Point:
    """One 3D layout's projected point (rates and links: typical, optimistic, pessimistic)."""
    bw = MEMORY_BW_GB_S.get(base.device, 0.0) * 1e9  # Adam's step timed apart where the rates were solved without it
    times = [grid_step_time(plan.run, flops_per_s=r, links=link, gpus_per_node=gpus_per_node, memory_bw=bw)
             for r, link in zip(rates, links)]
    tokens = plan.tokens_per_step
    days = [days_to_train(token_budget, tokens / st.total_s, plan.world_size)[0] for st in times]
    low, high = grid_model_error()  # the check against the published record's 3D rows (docs/project.md)
    days += [days[1] * min(low, 1.0), days[2] * max(high, 1.0)]
    verdict = fit(plan, base.device_memory_bytes)
    st, n = times[0], plan.world_size
    tps = tokens / st.total_s
    return Point(series, n, plan.nodes, plan.gradient_accumulation_steps, plan.global_batch_size, st.total_s, tps,
                 days[0], days[0] * n, min(days), max(days), st.tp_comm_s + st.p2p_s + st.dp_comm_s + st.cp_comm_s, 0.0,
                 st.comm_bytes, float("nan"), verdict.fits, verdict.total_per_gpu,
                 verdict.reason if verdict.fits is False else None, plan.grid.label)


def project_grids(base: Baseline, families: list[str], gpus: list[int], gpus_per_node: int, links, token_budget: float,
                  global_batch: int | None, grid_opts) -> list[Point]:
    """The 3D layouts' points: at each GPU count, the given (--tp, --pp, --cp) layouts as their own series, or - when
    none is given - the fastest layout that fits, searched over every TP and PP Megatron allows (grid_layouts), each
    interleaved over --vp model chunks (PP searched from 2 then, unless given). Each runs the global batch the
    data-parallel strategies run there (or --global_batch_size), at the measured run's FLOPs per GPU
    (calibrated_flops_per_s): a GPU computes 1/(TP x PP x CP) of the model's work. They step Megatron's Adam whatever
    the measured run's optimizer (Megatron offers no other)."""
    rates = [calibrated_flops_per_s(base, s, link) for s, link in zip(base.s_per_iter, links)]
    plan0 = base.plan
    mbs = plan0.per_device_train_batch_size
    flash = plan0.attention != "eager"  # the measured run's attention: a fused kernel keeps no scores
    fixed = bool(grid_opts.tp or grid_opts.pp or grid_opts.cp)
    tps = comma_list(grid_opts.tp, "--tp", int) if grid_opts.tp else None
    pps = comma_list(grid_opts.pp, "--pp", int) if grid_opts.pp else None
    cps = comma_list(grid_opts.cp, "--cp", int) if grid_opts.cp else None
    points = []
    for family in families:
        by_series: dict[str, list[Point]] = {}
        for n in gpus:
            gbs = global_batch or mbs * plan0.gradient_accumulation_steps * n
            candidates = []
            given_tps = tps or ([1] if pps or cps else None)
            given_pps = pps or ([1] if (tps or cps) and grid_opts.vp == 1 else None)  # interleaved: PP searched from 2
            for tp, pp, cp in grid_layouts(plan0.shape, n, gpus_per_node, given_tps, given_pps,
                                           uneven_stages=FAMILIES[family], cps=cps, vp=grid_opts.vp):
                dp = n // (tp * pp * cp)
                if gbs % (mbs * dp):
                    continue  # the global batch does not split into whole micro-batches per pipeline
                plan = grid_opts.plan(family, "adamw", plan0.shape, plan0.seq_len, tp=tp, pp=pp, cp=cp, dp=dp,
                                      micro_batch=mbs, micro_batches=gbs // (mbs * dp),  # Megatron's Adam
                                      processes_per_node=min(n, gpus_per_node), precision=plan0.precision,
                                      flash_attention=flash, dropout=base.dropout)
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
PUBLISHED_FILE = Path(__file__).with_name("published_record_checks.json")  # benchmarks/published_record.py --out
PUBLISHED_FAMILIES = {"ddp": "DDP", "ddp_powersgd": "PowerSGD", "zero1": "ZeRO-1", "zero3": "ZeRO-3",
                      "zero3_offload": "ZeRO-3", "fsdp": "FSDP", "fsdp_tp": "FSDP", **{f: "3D" for f in FAMILIES}}


def published_error(strategy: str, path: Path | None = None) -> dict | None:
    """The published record's summary for this strategy's family ({"mean_abs_error", "max_abs_error", "rows"}), or
    None when no public measurement of it at cluster scale is checked (or the file is missing or malformed)."""
    family = PUBLISHED_FAMILIES.get(strategy)
    try:
        return json.loads((path or PUBLISHED_FILE).read_text())["summary"][family] if family else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def published_held_out(strategy: str, path: Path | None = None) -> list[float]:
    """The errors of this strategy's family's rows the published record prints but holds out of its means (`left_out`,
    each set with its reason in benchmarks/published_record.json): a user projecting that class should see them."""
    family = PUBLISHED_FAMILIES.get(strategy)
    try:
        rows = json.loads((path or PUBLISHED_FILE).read_text())["rows"]
        return [r["error"] for r in rows if r["family"] == family and not r["baseline"] and r.get("left_out")]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def published_band(family: str, path: Path | None = None) -> tuple[float, float] | None:
    """(lowest, highest) projected / published throughput over a family's rows of the published record (its sets'
    baseline rows left out: they match by construction; so are the sets whose recipe changes with the scale, which a
    projection never does), or None when none is checked (or the file is unreadable)."""
    try:
        rows = json.loads((path or PUBLISHED_FILE).read_text())["rows"]
        ratios = [1 + r["error"] for r in rows
                  if r["family"] == family and not r["baseline"] and not r.get("left_out")]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (min(ratios), max(ratios)) if ratios else None


def grid_model_error() -> tuple[float, float]:
    """The band around the 3D layouts' days: the published record's 3D rows (Megatron-LM, BigScience's layouts,
    NeMo's and NVIDIA's recipes), 1.0 both ways when the record cannot be read."""
    return published_band("3D") or (1.0, 1.0)


def strategy_error(strategy: str) -> tuple[float, float] | None:
    """The band around a data-parallel strategy's days: its checks against real runs (model_error, on a CPU machine)
    and its family's rows of the published record at cluster scale (published_band), whichever reach further; None
    when neither has checked it."""
    bands = [band for band in (model_error(strategy), published_band(PUBLISHED_FAMILIES.get(strategy, ""))) if band]
    return (min(b[0] for b in bands), max(b[1] for b in bands)) if bands else None


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
