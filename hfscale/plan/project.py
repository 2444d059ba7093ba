"""`hfscale project`: wall-days and GPU-days to a token budget against the number of GPUs, per strategy, from a
measured run (or a given per-GPU throughput) and a communication model (hfscale/formulas/comm.py).

    hfscale project runs/zero1-run/results.json --gpus 8,16,32,64,128 --gpus_per_node 8 \\
        --intra_bw 150 --inter_bw 12.5:25 --strategy zero1,zero3,ddp --out runs/projection
    hfscale project --model bloom-7b1 --tflops_per_gpu 120 --seq_len 2048 --micro_batch_size 2 --grad_accum 16 ...

Compute per micro-batch comes from the measurement with the run's own exposed communication taken out (at the
run's GPU count and links); each projected point adds back what the strategy moves at that GPU count. By default
each GPU keeps the measured micro-batch and accumulation (the global batch grows with the GPUs);
`--global_batch_size` holds the global batch instead (accumulation shrinks as GPUs are added). docs/project.md.
"""

import csv
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError, one_of
from ..files import atomic_path, atomic_write_text
from ..formulas.comm import Links, comm_pattern, powersgd_elements, step_time
from ..formulas.memory import DTYPE_BYTES, parameter_tensors
from ..formulas.metrics import SECONDS_PER_DAY, ModelShape, param_count, training_flops_per_sequence
from ..parallel.strategies import layout_refusal

GB = 1e9
DEFAULT_GPUS = "8,16,32,64,128,256,512,1024"


@dataclass
class Baseline:
    """What was measured (or given): the model, the per-GPU work and its speed."""

    shape: ModelShape
    strategy: str
    seq: int
    micro_batch: int
    grad_accum: int
    gpus: int
    gpus_per_node: int
    precision: str
    s_per_iter: list[float]  # [typical, fastest, slowest]; equal when only one figure is known
    source: str
    powersgd_rank: int | None = None
    overlap: bool = True  # communication hides under compute (GPUs); not on a CPU, where gloo shares the cores
    step_sd_s: float = 0.0  # per-step noise of the step time (the straggler term), from the run's logging intervals


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


def _pattern(strategy, base: Baseline, ranks: int, gpus_per_node: int):
    P = param_count(base.shape)
    t = DTYPE_BYTES["fp32" if base.precision == "tf32" else base.precision]
    if strategy.engine == "ddp":  # fp32 weights and fp32 gradients under autocast
        psgd = None
        if strategy.comm_hook == "powersgd":
            rank = base.powersgd_rank or strategy.powersgd["rank"]
            psgd = 4 * powersgd_elements([tp.shape for tp in parameter_tensors(base.shape)], rank)
        return comm_pattern("ddp", None, param_bytes=4 * P, grad_bytes=4 * P, ranks=ranks, powersgd_bytes=psgd)
    return comm_pattern(strategy.engine, strategy.zero_stage, param_bytes=t * P, grad_bytes=t * P, ranks=ranks,
                        offload_optimizer=strategy.offloads_state("optimizer_states"),
                        offload_params=strategy.offloads_state("parameters"),
                        shard_ranks=strategy.shard_ranks(ranks, gpus_per_node) if strategy.hybrid else None)


def micro_compute_s(strategy, base: Baseline, s_per_iter: float, links: Links) -> float:
    """Compute seconds per micro-batch: the measured step less the exposed communication the model gives the measured
    configuration itself (solved by fixed-point iteration: the exposed part depends on the compute that hides it)."""
    pattern = _pattern(strategy, base, base.gpus, base.gpus_per_node)
    compute = s_per_iter / base.grad_accum
    for _ in range(50):
        st = step_time(pattern, micro_compute_s=compute, grad_accum=base.grad_accum, ranks=base.gpus,
                       gpus_per_node=base.gpus_per_node, links=links, overlap=base.overlap, step_sd_s=base.step_sd_s)
        compute = max(s_per_iter - st.exposed_s - st.straggler_s, 1e-3 * s_per_iter) / base.grad_accum
    return compute


def project(base: Baseline, strategies: list, gpus: list[int], gpus_per_node: int, links: tuple[Links, Links, Links],
            token_budget: float, global_batch: int | None) -> list[Point]:
    """links = (typical, optimistic, pessimistic) bandwidths; s_per_iter = (typical, fastest, slowest)."""
    points = []
    for strategy in strategies:
        computes = [micro_compute_s(strategy, base, s, link) for s, link in zip(base.s_per_iter, links)]
        reference_tps = None
        for n in gpus:
            gas = base.grad_accum
            if global_batch is not None:
                if global_batch % (base.micro_batch * n):
                    continue  # not a whole number of micro-batches per GPU at this count
                gas = global_batch // (base.micro_batch * n)
            if layout_refusal(strategy, n, min(n, gpus_per_node)):
                continue  # e.g. HSDP on one node
            pattern = _pattern(strategy, base, n, gpus_per_node)
            times = [step_time(pattern, micro_compute_s=c, grad_accum=gas, ranks=n, gpus_per_node=gpus_per_node,
                               links=link, overlap=base.overlap, step_sd_s=base.step_sd_s)
                     for c, link in zip(computes, links)]
            gbs = base.micro_batch * gas * n
            tokens = gbs * base.seq
            days = [token_budget / (tokens / st.total_s) / SECONDS_PER_DAY for st in times]
            tps = tokens / times[0].total_s
            reference_tps = reference_tps or tps / n
            points.append(Point(strategy.name, n, max(1, -(-n // gpus_per_node)), gas, gbs, times[0].total_s, tps,
                                days[0], days[0] * n, min(days), max(days), times[0].exposed_s, times[0].straggler_s,
                                pattern.bytes_per_step(gas, n, gpus_per_node), tps / n / reference_tps))
    return points


def knee(points: list[Point], gain_threshold: float) -> int | None:
    """The first GPU count from which doubling the GPUs saves less than `gain_threshold` of the days."""
    by_gpus = {p.gpus: p for p in points}
    for n in sorted(by_gpus):
        if 2 * n in by_gpus and 1 - by_gpus[2 * n].days / by_gpus[n].days < gain_threshold:
            return n
    return None


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


def _positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise HfscaleError(f"--{flag} must be comma-separated integers, got {text!r}") from None
    if not values or values[0] <= 0:
        raise HfscaleError(f"--{flag} must be positive integers, got {text!r}")
    return values


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


def baseline_from_results(path: Path) -> Baseline:
    from ..files import load_json

    data = load_json(path, "results file")
    if data.get("status") != "ok":
        raise HfscaleError(f"{path}: the run did not finish (status {data.get('status')!r}); project from a run "
                           "that ended `ok`")
    try:
        model, cfg, perf = data["model"], data["config"], data["perf"]
        shape = ModelShape(model["family"], model["n_layer"], model["hidden"], model["n_head"], model["vocab"],
                           model["positions"], model.get("ffn"))
        s = float(perf["s_per_iter"])
        history = [x for x in data.get("perf_history", []) if x.get("s_per_iter")]
        spread = [float(x["s_per_iter"]) for x in history]
        nodes = (data.get("environment") or {}).get("nodes", 1) or 1
        return Baseline(shape, data["strategy"], cfg["seq_len"], cfg["micro_batch_size"], cfg["grad_accum"],
                        cfg["world_size"], max(1, cfg["world_size"] // nodes), cfg.get("precision", "fp32"),
                        [s, min(spread + [s]), max(spread + [s])], str(path), cfg.get("powersgd_rank"),
                        overlap=(data.get("environment") or {}).get("device_type") != "cpu",
                        step_sd_s=step_noise_s(history))
    except (KeyError, TypeError, ValueError) as err:
        raise HfscaleError(f"{path}: not an hfscale results file with measured throughput (missing {err})") from None


def baseline_from_flags(opts) -> Baseline:
    from ..run.models import resolve_seq_len
    from .estimate import model_shape

    shape = model_shape(opts)
    seq = resolve_seq_len(shape, opts.seq_len)
    tokens_per_micro = opts.micro_batch_size * seq
    if opts.tokens_per_s_per_gpu is not None:
        micro_s = tokens_per_micro / opts.tokens_per_s_per_gpu
        source = f"--tokens_per_s_per_gpu {opts.tokens_per_s_per_gpu:g}"
    else:
        _, hardware = training_flops_per_sequence(shape, seq, opts.activation_checkpointing)
        micro_s = hardware * opts.micro_batch_size / (opts.tflops_per_gpu * 1e12)
        source = f"--tflops_per_gpu {opts.tflops_per_gpu:g} (hardware FLOPs)"
    s = micro_s * opts.grad_accum  # compute only: a one-GPU baseline, no communication
    return Baseline(shape, opts.strategy.split(",")[0], seq, opts.micro_batch_size, opts.grad_accum, 1, 1,
                    "bf16" if opts.bf16 else "fp32", [s, s, s], source)


def build_parser() -> ArgumentParser:
    from .estimate import add_model_flags

    p = ArgumentParser(prog="hfscale project", allow_abbrev=False,
                       description="Days and GPU-days to a token budget vs number of GPUs, per strategy.")
    p.add_argument("results", nargs="?", type=Path, help="a results.json of a finished run (its measured throughput)")
    p.add_argument("--tokens_per_s_per_gpu", type=float, help="instead of a results file: measured per-GPU throughput")
    p.add_argument("--tflops_per_gpu", type=float, help="instead of a results file: achieved hardware TFLOPs per GPU")
    add_model_flags(p)
    p.add_argument("--seq_len", type=int)
    p.add_argument("--micro_batch_size", type=int, default=1)
    p.add_argument("--grad_accum", type=int, default=1)
    p.add_argument("--activation_checkpointing", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--strategy", help="comma-separated or `all` (default: the run's)")
    p.add_argument("--gpus", default=DEFAULT_GPUS, help=f"GPU counts (default {DEFAULT_GPUS})")
    p.add_argument("--global_batch_size", type=int, help="hold the global batch (samples) fixed instead of the per-GPU work")
    add_link_flags(p)
    p.add_argument("--token_budget", type=float, default=1e11)
    p.add_argument("--gain_threshold", type=float, default=0.25, help="report where doubling GPUs saves less than this share of the days")
    p.add_argument("--out", type=Path, help="write projection.{md,csv,json} and days_vs_gpus.png here")
    p.add_argument("--json", action="store_true")
    return p


def add_link_flags(p) -> None:
    """The links of the communication model (`hfscale project`, `hfscale report --days_at_gpus`)."""
    p.add_argument("--gpus_per_node", type=int, default=8)
    p.add_argument("--intra_bw", default="150", help="intra-node bus bandwidth per GPU, GB/s or LOW:HIGH (default 150, assumed)")
    p.add_argument("--inter_bw", default="12.5", help="inter-node bus bandwidth per GPU, GB/s or LOW:HIGH (default 12.5, assumed)")
    p.add_argument("--intra_latency_us", type=float, default=5.0)
    p.add_argument("--inter_latency_us", type=float, default=20.0)
    p.add_argument("--bandwidth_file", type=Path, help="measured by `hfscale bandwidth --out` (sets --intra_bw and the latency)")


def check_whole_nodes(gpus: list[int], gpus_per_node: int, flag: str = "--gpus") -> None:
    """A GPU count beyond one node must fill whole nodes (estimate, project and report --days_at_gpus)."""
    bad = [n for n in gpus if n > gpus_per_node and n % gpus_per_node]
    if bad:
        raise HfscaleError(f"{flag} {bad[0]} is not a multiple of --gpus_per_node {gpus_per_node}")


def tokens_per_s_at(results_path: Path, gpus: int, gpus_per_node: int, links) -> float:
    """Projected tokens/s of a finished run's configuration at `gpus` GPUs with the same global batch (so its loss
    per token is unchanged). Raises HfscaleError when the batch does not split over that many GPUs."""
    from ..parallel.strategies import all_strategies

    base = baseline_from_results(results_path)
    global_batch = base.micro_batch * base.grad_accum * base.gpus
    strategy = all_strategies().get(base.strategy)
    if strategy is None:
        raise HfscaleError(f"{results_path}: strategy {base.strategy!r} is not one hfscale projects")
    reason = layout_refusal(strategy, gpus, min(gpus, gpus_per_node))
    if reason:
        raise HfscaleError(reason)
    points = project(base, [strategy], [gpus], gpus_per_node, links, 1.0, global_batch)
    if not points:
        raise HfscaleError(f"its global batch {global_batch} is not a multiple of MBS {base.micro_batch} x {gpus} GPUs")
    return points[0].tokens_per_s


def links_from(opts) -> tuple[Links, Links, Links]:
    intra, inter = _bandwidths(opts.intra_bw, "intra_bw"), _bandwidths(opts.inter_bw, "inter_bw")
    for name in ("intra_latency_us", "inter_latency_us"):
        if not 0 <= getattr(opts, name) < float("inf"):
            raise HfscaleError(f"--{name} must be >= 0, got {getattr(opts, name)}")
    intra_lat = opts.intra_latency_us * 1e-6
    if opts.bandwidth_file:
        from .bandwidth import read_bandwidth_file

        measured = read_bandwidth_file(opts.bandwidth_file)
        if "fit" in measured:  # the latency-bandwidth line fitted over every size
            bw, intra_lat = measured["fit"]["all_reduce"]["busbw"], measured["fit"]["all_reduce"]["latency_s"]
        else:  # an older file: its largest message's bandwidth and its smallest message's latency
            bw = measured["busbw_largest"]["all_reduce"]
            smallest = min((r for r in measured["rows"] if r["kind"] == "all_reduce"), key=lambda r: r["size_bytes"])
            intra_lat = smallest["time_s"] / (2 * (measured["ranks"] - 1))
        intra = (bw, bw, bw)
    return tuple(Links(intra[i], inter[i], intra_lat, opts.inter_latency_us * 1e-6) for i in range(3))


def run_projection(opts):
    from ..parallel.strategies import all_strategies

    if opts.results and (opts.tokens_per_s_per_gpu or opts.tflops_per_gpu):
        raise HfscaleError("give a results file or --tokens_per_s_per_gpu/--tflops_per_gpu, not both")
    for name in ("tokens_per_s_per_gpu", "tflops_per_gpu", "micro_batch_size", "grad_accum", "gpus_per_node",
                 "global_batch_size", "token_budget", "seq_len"):
        value = getattr(opts, name)
        if value is not None and not 0 < value < float("inf"):
            raise HfscaleError(f"--{name} must be positive, got {value}")
    if not 0 < opts.gain_threshold < 1:
        raise HfscaleError(f"--gain_threshold must be between 0 and 1, got {opts.gain_threshold}")
    gpus = _positive_ints(opts.gpus, "gpus")
    check_whole_nodes(gpus, opts.gpus_per_node)
    links = links_from(opts)
    if opts.results:
        base = baseline_from_results(opts.results)
    elif opts.tokens_per_s_per_gpu or opts.tflops_per_gpu:
        opts.strategy = opts.strategy or "ddp"
        base = baseline_from_flags(opts)
    else:
        raise HfscaleError("nothing to project from: give a results.json, --tokens_per_s_per_gpu or --tflops_per_gpu")
    names = list(all_strategies()) if opts.strategy == "all" else (opts.strategy or base.strategy).split(",")
    for name in names:
        if name not in all_strategies():
            raise one_of("strategy", name, [*all_strategies(), "all"])
    strategies = [all_strategies()[n] for n in names]
    points = project(base, strategies, gpus, opts.gpus_per_node, links, opts.token_budget, opts.global_batch_size)
    if not points:
        raise HfscaleError(f"--global_batch_size {opts.global_batch_size} is not a multiple of MBS x GPUs for any of "
                           f"--gpus {opts.gpus}")
    knees = {s.name: knee([p for p in points if p.strategy == s.name], opts.gain_threshold) for s in strategies}
    return base, links, points, knees


def markdown(points: list[Point], knees: dict, budget: float) -> str:
    lines = [f"| strategy | GPUs | nodes | GAS | GBS | s/it | tokens/s | days to {budget / 1e9:g}B | band | GPU-days | "
             "exposed comm s/it | straggler s/it | comm GB/GPU/it | scaling eff. |", "|" + "---|" * 14]
    for p in points:
        lines.append(f"| {p.strategy} | {p.gpus} | {p.nodes} | {p.grad_accum} | {p.global_batch} | {p.s_per_iter:.4g} | "
                     f"{p.tokens_per_s:,.0f} | {p.days:,.2f} | {p.days_low:,.2f}–{p.days_high:,.2f} | "
                     f"{p.gpu_days:,.1f} | {p.exposed_comm_s:.3g} | {p.straggler_s:.3g} | "
                     f"{p.comm_bytes_per_gpu / GB:.3g} | {p.efficiency:.0%} |")
    lines.append("")
    for name, n in knees.items():
        lines.append(f"- {name}: " + (f"doubling past {n} GPUs saves less than the threshold" if n else
                                      "doubling keeps paying over the counts given"))
    return "\n".join(lines) + "\n"


def plot(points: list[Point], path: Path, budget: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(p.strategy for p in points):
        mine = [p for p in points if p.strategy == name]
        xs = [p.gpus for p in mine]
        ax.plot(xs, [p.days for p in mine], marker="o", label=name)
        ax.fill_between(xs, [p.days_low for p in mine], [p.days_high for p in mine], alpha=0.2)
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="days (wall clock)",
           title=f"Projected days to train {budget / 1e9:g}B tokens")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)


def main(argv: list[str]) -> None:
    opts = build_parser().parse_args(argv)
    base, links, points, knees = run_projection(opts)
    assumptions = [f"from {base.source}: {base.strategy} on {base.gpus} GPU(s), MBS {base.micro_batch}, GAS "
                   f"{base.grad_accum}, seq {base.seq}, {base.precision}, {base.s_per_iter[0]:.4g} s/it "
                   f"(spread {base.s_per_iter[1]:.4g}–{base.s_per_iter[2]:.4g})",
                   f"links: intra-node {links[0].intra_bw / GB:g} GB/s, inter-node {links[0].inter_bw / GB:g} GB/s "
                   f"bus bandwidth per GPU (band {links[2].inter_bw / GB:g}–{links[1].inter_bw / GB:g}); latency "
                   f"{links[0].intra_latency_s * 1e6:g}/{links[0].inter_latency_s * 1e6:g} us per ring step",
                   (f"per-step noise {base.step_sd_s * 1e3:.3g} ms (sd, from the run's logging intervals): waiting for "
                    "the slowest rank costs sd x E[max of n normals] per step" if base.step_sd_s else
                    "per-step noise unknown (fewer than 4 logging intervals, or no run): no straggler term"),
                   "compute per micro-batch is the same for every strategy and GPU count (the measured one, less its "
                   "own exposed communication); docs/project.md lists what overlaps"
                   + ("" if base.overlap else " - nothing here: a CPU run, whose collectives share the compute cores")]
    report = {"assumptions": assumptions, "knee_gpus": knees, "points": [asdict(p) for p in points]}
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
