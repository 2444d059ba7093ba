"""`hfscale bandwidth`: all-reduce, all-gather and reduce-scatter bus bandwidth over a process group, sizes swept,
reported the way nccl-tests reports it (algbw = size / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n
for all-gather and reduce-scatter), so `hfscale project --bandwidth_file` can use what this machine really does.

    hfscale bandwidth --num_processes 2 --out runs/bandwidth.json        # this node (gloo on CPU, NCCL on GPUs)
    srun ... torchrun --nnodes 2 ... -m hfscale.plan.bandwidth --worker --out bw.json   # across nodes

Each size is timed `--iters` times after a warm-up, with a barrier before each. The mean is reported, as nccl-tests
reports it (a training step pays every slow collective, not the typical one; the median is kept beside it), and a
latency-bandwidth line T(S) = steps x latency + volume x S / busbw is fitted per collective over the sizes (relative
least squares): `hfscale project --bandwidth_file` uses these fits.

`--compute_ms X` (the compute of the step you project from) also measures what a collective costs more when the
ranks come to it from a stretch of compute than back to back - their skew, and communication threads that went idle
to wake (on 2 shared CPU cores about 1-2 ms; on NCCL little) - at the smallest size, after X, X/4, X/16 and X/64 of
compute (`meet_s`): the projection charges each piece by the compute before it (formulas/comm.Links.meet_s).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ..errors import ArgumentParser, HfscaleError, exit_on_user_error
from ..files import atomic_write_text, check_writable_file
from ..flags import at_most_gpus, positive, refuse_renamed
from ..formulas.comm import RING
from .inter_node import describe, inter_node_from_runs, write_inter_node
from .links import DEFAULT_INTER_GB_S, DEFAULT_INTRA_GB_S, KINDS, links_from



def bus_factor(kind: str, ranks: int) -> float:
    return 2 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks


def _busy(seconds: float, work) -> None:
    """Compute on this rank's device for `seconds` (wall clock), as a training step does between its collectives."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work @ work


def _time_collective(kind: str, size_bytes: int, iters: int, device, compute_s: float = 0.0) -> tuple[float, float]:
    """(mean, median) seconds of one collective of `size_bytes`. compute_s > 0: each one follows that much compute
    on every rank and no barrier, as in a training step (it then pays the ranks' skew and the wake-up of idle
    communication threads, which back-to-back timing never sees)."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_world_size()
    elements = max(ranks, size_bytes // 4 // ranks * ranks)  # fp32, divisible into equal shards
    full = torch.ones(elements, dtype=torch.float32, device=device)
    shard = torch.empty(elements // ranks, dtype=torch.float32, device=device)
    run = {"all_reduce": lambda: dist.all_reduce(full),
           "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}[kind]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    run()
    sync()
    work = torch.randn(256, 256, device=device)
    times = []
    for _ in range(iters):
        if compute_s > 0:
            _busy(compute_s, work)
            sync()
        else:
            dist.barrier()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.fmean(times), statistics.median(times)


MEET_FRACTIONS = (1 / 64, 1 / 16, 1 / 4, 1)  # of --compute_ms: the gaps the meeting cost is measured after


def meeting_curve(size_bytes: int, compute_s: float, device) -> dict:
    """{kind: [[gap_s, seconds], ...]}: per collective kind, the mean cost of one `size_bytes` collective after each
    gap of compute (MEET_FRACTIONS of compute_s) less its mean back to back (200 of them), at least 0. The cost is a
    mean of rare slow ones, so each gap is timed over min(1 s, 50 x compute_s) of compute, 20 to 1000 collectives."""
    budget = min(1.0, 50 * compute_s)
    out = {}
    for kind in KINDS:
        alone = _time_collective(kind, size_bytes, 200, device)[0]
        out[kind] = [[gap, max(0.0, _time_collective(kind, size_bytes, max(20, min(1000, round(budget / gap))), device,
                                                     gap)[0] - alone)]
                     for gap in (compute_s * f for f in MEET_FRACTIONS)]
    return out


def fit_latency_bandwidth(rows: list[dict], kind: str, ranks: int) -> dict:
    """Fit time = ring_steps x latency + volume x size / busbw to the rows of one collective, minimising relative
    errors (so the small, latency-bound sizes count as much as the large ones). Latency is per ring step."""
    volume, steps = RING[kind]
    pts = [(steps(ranks), volume(ranks) * r["size_bytes"], r["time_s"]) for r in rows if r["kind"] == kind]
    # weighted normal equations for t = a*x + b*y with weights 1/t^2
    sxx = sum(x * x / t ** 2 for x, y, t in pts)
    syy = sum(y * y / t ** 2 for x, y, t in pts)
    sxy = sum(x * y / t ** 2 for x, y, t in pts)
    sxt = sum(x / t for x, y, t in pts)
    syt = sum(y / t for x, y, t in pts)
    det = sxx * syy - sxy * sxy
    a, b = ((syy * sxt - sxy * syt) / det, (sxx * syt - sxy * sxt) / det) if det > 0 else (0.0, 0.0)
    if a < 0:  # no measurable latency: bandwidth alone
        a, b = 0.0, syt / syy
    if b <= 0:  # time does not grow with size (noise): each term bounded by the extremes, a pessimistic reading
        smallest, largest = min(pts, key=lambda p: p[1]), max(pts, key=lambda p: p[1])
        a, b = smallest[2] / smallest[0], largest[2] / largest[1]
    return {"latency_s": a, "busbw": 1 / b}


def worker(sizes: list[int], iters: int, out: str | None, compute_s: float = 0.0) -> None:
    import torch
    import torch.distributed as dist

    on_cuda = torch.cuda.is_available()
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if on_cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    ranks = dist.get_world_size()
    rows = []
    for kind in KINDS:
        for size in sizes:
            seconds, median = _time_collective(kind, size, iters, device)
            algbw = size / seconds
            rows.append({"kind": kind, "size_bytes": size, "time_s": seconds, "time_median_s": median,
                         "algbw": algbw, "busbw": algbw * bus_factor(kind, ranks)})
    meet = meeting_curve(sizes[0], compute_s, device) if compute_s > 0 else None
    if dist.get_rank() == 0:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ranks))
        report = {"ranks": ranks, "ranks_per_node": local, "nodes": max(1, ranks // local),
                  "backend": dist.get_backend(), "device": torch.cuda.get_device_name() if on_cuda else "cpu",
                  "rows": rows, "busbw_largest": {k: max((r for r in rows if r["kind"] == k),
                                                         key=lambda r: r["size_bytes"])["busbw"] for k in KINDS},
                  "fit": {k: fit_latency_bandwidth(rows, k, ranks) for k in KINDS}}
        if meet:
            report.update(compute_s_between=compute_s, meet_size_bytes=sizes[0], meet_s=meet)
        print(table(report), flush=True)
        if out:
            atomic_write_text(Path(out), json.dumps(report, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def table(report: dict) -> str:
    lines = [f"{report['ranks']} ranks ({report['nodes']} node(s)), {report['backend']} on {report['device']}",
             f"{'collective':<15} {'size':>10} {'mean (us)':>11} {'median (us)':>12} {'algbw (GB/s)':>13} "
             f"{'busbw (GB/s)':>13}"]
    for r in report["rows"]:
        lines.append(f"{r['kind']:<15} {r['size_bytes']:>10} {r['time_s'] * 1e6:>11.1f} "
                     f"{r['time_median_s'] * 1e6:>12.1f} {r['algbw'] / 1e9:>13.3f} {r['busbw'] / 1e9:>13.3f}")
    for kind, f in report["fit"].items():
        lines.append(f"fit {kind}: {f['latency_s'] * 1e6:.1f} us per ring step, bus bandwidth {f['busbw'] / 1e9:.3f} GB/s")
    for kind, curve in report.get("meet_s", {}).items():
        lines.append(f"meeting {kind} ({report['meet_size_bytes']} bytes), us more than back to back after "
                     + ", ".join(f"{gap * 1e3:.3g} ms: {seconds * 1e6:.0f}" for gap, seconds in curve))
    return "\n".join(lines)


def message_memory_refusal(max_bytes: int, nproc: int, on_gpu: bool, memory_bytes: int) -> str | None:
    """Why the largest message cannot be held, or None: each rank holds it whole and a shard of it beside
    (_time_collective), on its own GPU (`memory_bytes`: one device's), or on a CPU machine every rank on the one
    host (`memory_bytes`: what the host has available). Before: the run allocated until the OOM killer ended it."""
    held = max_bytes * (1 + 1 / nproc) * (1 if on_gpu else nproc)
    if held <= memory_bytes:
        return None
    where = "a GPU's" if on_gpu else f"the host's available (over {nproc} processes)"
    return (f"--max_bytes {max_bytes} needs {held / 1e9:,.1f} GB, more than {where} {memory_bytes / 1e9:,.1f} GB: "
            "give a smaller --max_bytes")


def from_runs(opts) -> int:
    """`--from_runs ONE_NODE MULTI_NODE`: the inter-node link two runs of one recipe imply, printed (and written)."""
    if opts.out is not None:
        check_writable_file(opts.out, "--out")
    links = argparse.Namespace(intra_bw=opts.intra_bw, inter_bw=f"{DEFAULT_INTER_GB_S:g}", collectives=None,
                               intra_hop="nvlink", intra_latency_us=None, inter_latency_us=None,
                               bandwidth_file=opts.bandwidth_file, nics_per_node=opts.nics_per_node)
    link = inter_node_from_runs(*opts.from_runs, links_from(links)[0])
    print(describe(link, opts.nics_per_node))
    if opts.out is not None and link.at_bound is None:
        write_inter_node(Path(opts.out), link, [str(p) for p in opts.from_runs], opts.nics_per_node)
    return 0


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    refuse_renamed(argv)
    parser = ArgumentParser(prog="hfscale bandwidth", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--num_processes", type=int, default=None, help="processes on this node (default: every GPU, or 2 on CPU)")
    parser.add_argument("--min_bytes", type=int, default=1 << 12)
    parser.add_argument("--max_bytes", type=int, default=None, help="largest message (default 256 MB on GPU, 16 MB on CPU)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", help="write the figures here (JSON) for `hfscale project --bandwidth_file`")
    parser.add_argument("--compute_ms", type=float, default=0.0,
                        help="also measure what a collective costs more after this much compute (and 1/4, 1/16, "
                             "1/64 of it) than back to back, as training meets it: the step time of the run you "
                             "project from; 0: back to back only, like nccl-tests")
    parser.add_argument("--worker", action="store_true", help="run as one rank of an already launched group")
    parser.add_argument("--from_runs", nargs=2, type=Path, metavar=("ONE_NODE", "MULTI_NODE"),
                        help="measure nothing: the inter-node bus bandwidth that two results.json of the same recipe "
                             "(one node, 2+ nodes) imply, for `hfscale project --inter_bw` (with --out: a file it reads)")
    parser.add_argument("--intra_bw", default=f"{DEFAULT_INTRA_GB_S:g}",
                        help="with --from_runs: the intra-node bus bandwidth per GPU, GB/s (default "
                             f"{DEFAULT_INTRA_GB_S:g}, assumed)")
    parser.add_argument("--nics_per_node", type=int, help="with --from_runs: the network links per node a ring across "
                        "nodes spreads over (default: one per GPU); the figure found is one link's")
    parser.add_argument("--bandwidth_file", type=Path, help="with --from_runs: this node's links as measured by "
                        "`hfscale bandwidth --out` (instead of --intra_bw)")
    opts = parser.parse_args(argv)
    if opts.from_runs:
        return from_runs(opts)
    if not 0 <= opts.compute_ms < float("inf"):
        raise HfscaleError(f"--compute_ms must be >= 0, got {opts.compute_ms}")
    positive(opts, "num_processes", "min_bytes", "max_bytes", "iters")
    at_most_gpus("--num_processes", opts.num_processes)
    import torch

    max_bytes = opts.max_bytes or ((256 << 20) if torch.cuda.is_available() else (16 << 20))
    if opts.min_bytes > max_bytes:
        raise HfscaleError(f"--min_bytes {opts.min_bytes} is larger than --max_bytes {max_bytes}")
    sizes = []
    size = opts.min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    if opts.out is not None and not opts.worker:
        check_writable_file(opts.out, "--out")
    if opts.worker:
        worker(sizes, opts.iters, opts.out, opts.compute_ms / 1e3)
        return 0
    nproc = opts.num_processes or torch.cuda.device_count() or 2
    if nproc < 2:
        raise HfscaleError("--num_processes must be at least 2: a collective over one rank moves nothing")
    on_gpu = torch.cuda.is_available()
    refusal = message_memory_refusal(max_bytes, nproc, on_gpu, torch.cuda.get_device_properties(0).total_memory
                                     if on_gpu else psutil.virtual_memory().available)
    if refusal:
        raise HfscaleError(refusal)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "hfscale.plan.bandwidth", "--worker", "--min_bytes", str(opts.min_bytes), "--max_bytes",
           str(max_bytes), "--iters", str(opts.iters), "--compute_ms", str(opts.compute_ms),
           *(["--out", opts.out] if opts.out else [])]
    return subprocess.call(cmd, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})


if __name__ == "__main__":
    sys.exit(main())
