"""`hfscale project`: wall-days and GPU-days to a token budget against the number of GPUs, per strategy, from a
measured run (or a given per-GPU throughput) and a communication model (hfscale/formulas/comm.py).

    hfscale project runs/zero1-run/results.json --gpus 8,16,32,64,128 --gpus_per_node 8 \\
        --intra_bw 150 --inter_bw 12.5:25 --strategy zero1,zero3,ddp --out runs/projection
    hfscale project --model bloom-7b1 --tflops_per_gpu 120 --seq_len 2048 --per_device_train_batch_size 2 \\
        --gradient_accumulation_steps 16 --bf16 --device A100-80GB ...

The model is plan/projection.py (what it starts from: plan/baseline.py; the links: plan/links.py); this module is
the command: its flags, the table, the plot and the assumptions printed under them. By default each GPU keeps the
measured micro-batch and accumulation (the global batch grows with the GPUs); `--global_batch_size` holds the global
batch instead (accumulation shrinks as GPUs are added). A point that cannot fit on the device (`--device`,
`--device_memory_gb`, or the run's own GPU) is marked, and is never the knee or the recommendation. docs/project.md.
"""

import csv
import io
import json
from dataclasses import asdict, replace
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError
from ..files import atomic_path, atomic_write_text, check_writable_dir
from ..flags import ALL, comma_list, first_given, positive, refuse_renamed
from ..formulas.metrics import GB
from ..formulas.precision import float8_refusal
from ..formulas.peaks import DEVICES, MEMORY_BW_GB_S, device_peak
from ..models import MODEL_OVERRIDES
from ..parallel.strategies import get_strategy
from ..run.results import read_results
from .baseline import Baseline, baseline_from_flags, baseline_from_megatron_log, baseline_from_results
from .grid import FAMILIES
from .links import add_link_flags, collectives_line, fabric_line, links_from, meeting_line
from .options import (SYNC_EACH_BATCH_HELP, add_grid_flags, add_model_flags, add_precision_flags, check_attention,
                      check_grid_flags, check_whole_nodes, device_memory_bytes, float8_of, grid_options,
                      strategies_and_families)
from .projection import (Point, best, grid_model_error, knee, optimizer_step_s, powersgd_step_s, project,
                         project_grids, published_error, published_held_out, strategy_error, tp_projection_refusal,
                         with_float8)

DEFAULT_GPUS = "8,16,32,64,128,256,512,1024"


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
    p.add_argument("--sync_each_batch", action="store_true",
                   help=SYNC_EACH_BATCH_HELP + " (default: as the measured run)")
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


def tokens_per_s_at(results_path: Path, gpus: int, gpus_per_node: int, links) -> Point:
    """The projected point of a finished run's configuration at `gpus` GPUs with the same global batch (so its loss
    per token is unchanged), judged on the run's own GPU. HfscaleError when it cannot be projected there."""
    base = baseline_from_results(results_path)
    strategy = base.plan.strategy
    reason = (tp_projection_refusal(base.plan, strategy, gpus_per_node)
              or base.plan.but(world_size=gpus, processes_per_node=min(gpus, gpus_per_node)).refusal())
    if reason:
        raise HfscaleError(reason)
    points = project(base, [strategy], [gpus], gpus_per_node, links, 1.0, base.plan.global_batch_size)
    if not points:
        raise HfscaleError(f"its global batch {base.plan.global_batch_size} is not a multiple of MBS "
                           f"{base.plan.per_device_train_batch_size} x {gpus} GPUs")
    return points[0]


def run_projection(opts):
    """(the baseline, the links, every projected point, each series' knee) for the command's options."""
    check_projection_flags(opts)
    gpus = sorted(set(comma_list(opts.gpus, "--gpus", int)))
    check_whole_nodes(gpus, opts.gpus_per_node)
    links = links_from(opts)
    device_bytes = (device_memory_bytes(opts.device, opts.device_memory_gb)
                    if opts.device or opts.device_memory_gb is not None else None)
    base = projection_baseline(opts, links, device_bytes)
    if opts.sync_each_batch:  # the projected points reduce every micro-batch, whatever the measured run did
        base = replace(base, sync_each_batch=True)
    if opts.dropout is not None:  # the projected points' model drops out (or not), whatever the measured run's did
        base = replace(base, plan=base.plan.but(dropout=opts.dropout > 0))
    strategies, families = (strategies_and_families(opts.strategy, with_3d=True) if opts.strategy
                            else ([base.plan.strategy], []))
    refused = {s.name: tp_projection_refusal(base.plan, s, opts.gpus_per_node) for s in strategies}
    if opts.strategy == ALL:  # every strategy this run can be projected to
        strategies = [s for s in strategies if not refused[s.name]]
    elif any(refused.values()):
        raise HfscaleError(next(reason for reason in refused.values() if reason))
    check_grid_flags(opts, families, base.plan.activation_checkpointing)
    recipe = float8_of(opts)
    if recipe:
        if opts.strategy == ALL:  # every strategy with a float8 route; the 3D layouts have no float8 model
            families = []
        if families:
            raise HfscaleError(f"--fp8 with {families[0]}: the 3D layouts run at the measured run's FLOPs per GPU, "
                               "with no float8 model; project them without --fp8")
        base = with_float8(base, recipe)
        refused = {s.name: float8_refusal(recipe, base.plan.precision, s.engine) for s in strategies}
        refused = {name: reason for name, reason in refused.items() if reason}
        strategies = [s for s in strategies if s.name not in refused]
        if not strategies:
            raise HfscaleError(next(iter(refused.values())))
        base = replace(base, float8_left_out=refused)
    points = project(base, strategies, gpus, opts.gpus_per_node, links, opts.token_budget, opts.global_batch_size)
    points += project_grids(base, families, gpus, opts.gpus_per_node, links, opts.token_budget, opts.global_batch_size,
                            grid_options(opts, base.plan.activation_checkpointing))
    if not points and opts.global_batch_size:
        raise HfscaleError(f"--global_batch_size {opts.global_batch_size} is not a multiple of MBS x GPUs for any of "
                           f"--gpus {opts.gpus}")
    if not points:
        raise HfscaleError(f"no 3D layout of this model for --gpus {opts.gpus}: TP must divide the heads inside a "
                           "node, PP at most the layers (dividing them for megatron, into --vp chunks each), "
                           "TP x PP x CP the GPUs")
    series = [s.name for s in strategies] + list(dict.fromkeys(p.strategy for p in points if p.layout))
    knees = {name: knee([p for p in points if p.strategy == name], opts.gain_threshold) for name in series}
    return base, links, points, knees


def check_projection_flags(opts) -> None:
    """The speed given once, the numbers in range."""
    if opts.results and (opts.tokens_per_s_per_gpu or opts.tflops_per_gpu):
        raise HfscaleError("give a results file or --tokens_per_s_per_gpu/--tflops_per_gpu, not both")
    if opts.tokens_per_s_per_gpu and opts.tflops_per_gpu:  # the speed was taken from one and the other ignored
        raise HfscaleError("give --tokens_per_s_per_gpu or --tflops_per_gpu, not both: each is the run's speed")
    check_attention(opts.attn_implementation)
    positive(opts, "tokens_per_s_per_gpu", "tflops_per_gpu", "per_device_train_batch_size",
             "gradient_accumulation_steps", "gpus_per_node", "global_batch_size", "token_budget", "seq_len")
    if not 0 < opts.gain_threshold < 1:
        raise HfscaleError(f"--gain_threshold must be between 0 and 1, got {opts.gain_threshold}")


def projection_baseline(opts, links, device_bytes):
    """The measured run everything is projected from: a results file (a Megatron log's brings its layout and batch
    as the defaults), or the speed given as flags (a TFLOPs figure the named device can reach)."""
    if opts.results and read_results(opts.results).source == "megatron-log":
        base, logged = baseline_from_megatron_log(opts.results, links, opts.gpus_per_node, device_bytes)
        opts.global_batch_size = opts.global_batch_size or logged.global_batch_size  # the log's, by default
        if not (opts.strategy or opts.tp or opts.pp or opts.cp):  # by default the log's own layout
            opts.strategy, opts.tp, opts.pp = logged.family, str(logged.tp), str(logged.pp)
            opts.cp, opts.vp = (str(logged.cp) if logged.cp > 1 else None), logged.vp
            opts.recompute_granularity = logged.recompute if logged.recompute != "none" else "full"
            opts.sequence_parallel = opts.sequence_parallel or logged.sequence_parallel
            opts.use_distributed_optimizer = opts.use_distributed_optimizer or logged.distributed_optimizer
        return base
    if opts.results:
        return baseline_from_results(opts.results, device_bytes)
    if opts.tflops_per_gpu and opts.device:  # the device is known by now (device_bytes)
        peak = max(filter(None, (device_peak(opts.device, dtype) for dtype in ("bf16", "fp16", "tf32", "fp32"))))
        if opts.tflops_per_gpu > peak:
            raise HfscaleError(f"--tflops_per_gpu {opts.tflops_per_gpu:g} is above the {opts.device}'s {peak:g} TFLOPs "
                               "dense peak: no run achieves it")
    if opts.tokens_per_s_per_gpu or opts.tflops_per_gpu:
        opts.strategy = opts.strategy or "ddp"
        return baseline_from_flags(opts, device_bytes)
    raise HfscaleError("nothing to project from: give a results.json, --tokens_per_s_per_gpu or --tflops_per_gpu")


def markdown(points: list[Point], knees: dict, budget: float) -> str:
    lines = [f"| strategy | GPUs | nodes | GAS | GBS | s/it | tokens/s | days to {budget / 1e9:g}B | band | GPU-days | "
             "exposed comm s/it | straggler s/it | comm GB/GPU/it | scaling eff. | fits |", "|" + "---|" * 15]
    for p in points:
        fits = "?" if p.fits is None else "yes" if p.fits else f"**no**: {p.fit_reason}"
        name = f"{p.strategy} ({p.layout})" if p.layout else p.strategy
        lines.append(f"| {name} | {p.gpus} | {p.nodes} | {p.gradient_accumulation_steps} | {p.global_batch_size} | {p.s_per_iter:.4g} | "
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
        error = grid_model_error() if name.startswith(tuple(FAMILIES)) else strategy_error(name)
        parts.append(f"{name} {error[0]:.2f}–{error[1]:.2f}" if error else f"{name} not checked")
    return ("model error, projected / measured tokens/s of real runs projected from 1 process on a CPU machine "
            "(benchmarks/projection_vs_real.py) and of the published runs at cluster scale of the strategy's family "
            "(benchmarks/published_record.py), the wider; docs/project.md: " + ", ".join(parts)
            + "; the band beyond the measured count is widened by it")


def published_line(strategies: list[str]) -> str:
    """What the model's check against published cluster-scale runs found, for each strategy projected."""
    parts = []
    for name in strategies:
        found, held = published_error(name), published_held_out(name)
        out = f"; {len(held)} more held out, worst {max(held, key=abs):+.0%}: docs/project.md says why" if held else ""
        parts.append(f"{name} mean |error| {found['mean_abs_error']:.1%} (worst {found['max_abs_error']:.1%}, "
                     f"{found['rows']} rows{out})" if found else f"{name} not yet checked")
    return ("against published runs at 2-3072 GPUs, each projected from its set's baseline row "
            "(benchmarks/published_record.py; docs/project.md): " + ", ".join(parts))


def assumptions_of(base: Baseline, links, strategies: list[str]) -> list[str]:
    plan = base.plan
    memory = (f"every point judged by the memory estimate on {base.device_memory_bytes / GB:g} GB per GPU "
              "(hfscale estimate's verdict; a point that does not fit is marked and never recommended)"
              if base.device_memory_bytes else
              "memory not judged: no device memory known (pass --device or --device_memory_gb) - a point may not fit")
    return [f"from {base.source}: {plan.strategy.name} with {plan.optimizer.name} on {plan.world_size} GPU(s), MBS "
            f"{plan.per_device_train_batch_size}, GAS {plan.gradient_accumulation_steps}, seq {plan.seq_len}, "
            f"{plan.precision}, {base.s_per_iter[0]:.4g} s/it (spread {base.s_per_iter[1]:.4g}–{base.s_per_iter[2]:.4g})",
            f"links: intra-node {links[0].intra_bw / GB:g} GB/s bus bandwidth per GPU, inter-node "
            f"{links[0].inter_bw / GB:g} GB/s per GPU's network link (band {links[2].inter_bw / GB:g}–"
            f"{links[1].inter_bw / GB:g}); "
            + collectives_line(links[0]),
            *filter(None, [fabric_line(links[0])]),
            meeting_line(links[0]),
            (f"per-step noise {base.step_sd_s * 1e3:.3g} ms (sd, from the run's logging intervals): waiting for "
             "the slowest rank costs sd x E[max of n normals] per step" if base.step_sd_s else
             "per-step noise unknown (fewer than 4 logging intervals, or no run): no straggler term"),
            "compute per micro-batch is the same for every strategy and GPU count (the measured one, less its "
            "own exposed communication); docs/project.md lists what overlaps"
            + ("" if base.overlap else " - nothing here: a CPU run, whose collectives share the compute cores"),
            optimizer_line(base), memory, error_line(strategies), published_line(strategies)] + float8_lines(base, strategies) + ([powersgd_line(base)] if "ddp_powersgd" in strategies else []) + ([
                "megatron* layouts: each GPU computes 1/(TP x PP x CP) of the step's FLOPs at the FLOPs per GPU "
                "the measured run achieved; TP's all-reduces (2 + 2 per block per micro-batch, inside a node), the "
                "point-to-point sends, the pipeline's bubble ((PP - 1) of M + PP - 1 slots, 1/VP of a slot each when "
                "interleaved) and the gradient reduction over DP x CP are all exposed, CP's key/value ring where the "
                "attention does not hide it; they step Megatron's Adam (the busiest stage's parameters, timed as the "
                "optimizer's step above); the global batch is the data-parallel strategies' at each count (or "
                "--global_batch_size); the band is widened by the check against published 3D throughput "
                "(Megatron-LM, BigScience's layouts, NeMo's and NVIDIA's recipes to 3,072 GPUs: "
                "{:.2f}–{:.2f}, docs/project.md)".format(*grid_model_error())]
                if any(name.startswith(tuple(FAMILIES)) for name in strategies) else [])


def float8_lines(base: Baseline, strategies: list[str]) -> list[str]:
    """What --fp8 did to the projection: the step model's figures (or that the run was measured with float8), whether
    it pays, and the strategies left out because they have no float8 route."""
    recipe = base.float8 or base.plan.float8
    if not recipe:
        return []
    step = base.float8_step
    if step is None:
        lines = [f"float8 ({recipe}): measured so, projected as it ran"]
    else:
        lines = [f"--fp8 ({recipe}): the blocks' linear layers {step.layer_speedup:.2f}x as fast in float8 on the "
                 f"{base.device} at MBS {base.plan.per_device_train_batch_size} x seq {base.plan.seq_len}, "
                 f"{step.linear_share:.0%} of the step's FLOPs: compute x{step.compute_factor:.2f} of the measured "
                 "bf16 run's (formulas/float8: a roofline of each layer's matmuls and casts, at the rates fitted on an "
                 "H200; docs/project.md)"
                 + ("" if step.pays else " - float8 does NOT pay here: too few tokens per matmul or layers too "
                    "narrow for its casts; project without --fp8")]
    if base.float8_left_out:
        lines.append(f"not projected with --fp8: {', '.join(base.float8_left_out)} (e.g. "
                     f"{next(iter(base.float8_left_out.values()))})")
    return lines


def optimizer_line(base: Baseline) -> str:
    seconds = optimizer_step_s(base.plan, base.device)
    if not seconds:
        return ("the optimizer's step is not modelled apart: no GPU with a known memory bandwidth, so the measured "
                "micro-batches keep it at the measured accumulation (pass --device)")
    return (f"the optimizer's step: {seconds * 1e3:.3g} ms per step of the measured run on the {base.device} (what each "
            f"rank steps, read and written at {MEMORY_BW_GB_S[base.device]:g} GB/s: the whole model under ddp, 1/N "
            "under ZeRO and fsdp, none on the device when offloaded), paid once per optimizer step")


def powersgd_line(base: Baseline) -> str:
    seconds = powersgd_step_s(base.plan.but(strategy=get_strategy("ddp_powersgd")), base.device, base.powersgd_rank)
    if not seconds:
        return ("PowerSGD's own compression (error feedback, the P and Q products, the decompression) is not "
                "modelled: no GPU with a known memory bandwidth (a CPU run's measured step holds it; pass --device)")
    return (f"PowerSGD's own compression: {seconds * 1e3:.3g} ms per step on the {base.device} (8 passes over the "
            f"fp32 gradients and the P, Q products at {MEMORY_BW_GB_S[base.device]:g} GB/s, on the compute stream)")


# What a flag-based projection is told about the run; a results file brings all of it (its model, shape, batch,
# precision and optimizer), so the same flag beside one would be silently ignored
RUN_FLAGS = ("--model", "--model_name_or_path", *(f"--{flag}" for flag in MODEL_OVERRIDES), "--seq_len",
             "--per_device_train_batch_size", "--gradient_accumulation_steps", "--activation_checkpointing",
             "--attn_implementation", "--bf16", "--fp16", "--torch_compile", "--fused_linear_cross_entropy", "--optim")


def refuse_run_flags_beside_results(argv: list[str], opts) -> None:
    given = first_given(argv, RUN_FLAGS)
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
