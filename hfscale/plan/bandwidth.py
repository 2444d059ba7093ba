"""`hfscale bandwidth`: all-reduce, all-gather and reduce-scatter bus bandwidth over a process group, sizes swept,
reported the way nccl-tests reports it (algbw = size / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n
for all-gather and reduce-scatter), so `hfscale project --bandwidth_file` can use what this machine really does.

    hfscale bandwidth --nproc 2 --out runs/bandwidth.json        # this node (gloo on CPU, NCCL on GPUs)
    srun ... torchrun --nnodes 2 ... -m hfscale.plan.bandwidth --worker --out bw.json   # across nodes

Each size is timed `--iters` times after a warm-up, with a barrier before each; the median is reported.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError, exit_on_user_error
from ..files import atomic_write_text

KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def bus_factor(kind: str, ranks: int) -> float:
    return 2 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks


def _time_collective(kind: str, size_bytes: int, iters: int, device) -> float:
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
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(sizes: list[int], iters: int, out: str | None) -> None:
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
            seconds = _time_collective(kind, size, iters, device)
            algbw = size / seconds
            rows.append({"kind": kind, "size_bytes": size, "time_s": seconds, "algbw": algbw,
                         "busbw": algbw * bus_factor(kind, ranks)})
    if dist.get_rank() == 0:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ranks))
        report = {"ranks": ranks, "ranks_per_node": local, "nodes": max(1, ranks // local),
                  "backend": dist.get_backend(), "device": torch.cuda.get_device_name() if on_cuda else "cpu",
                  "rows": rows, "busbw_largest": {k: max((r for r in rows if r["kind"] == k),
                                                         key=lambda r: r["size_bytes"])["busbw"] for k in KINDS}}
        print(table(report), flush=True)
        if out:
            atomic_write_text(Path(out), json.dumps(report, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def table(report: dict) -> str:
    lines = [f"{report['ranks']} ranks ({report['nodes']} node(s)), {report['backend']} on {report['device']}",
             f"{'collective':<15} {'size':>10} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"]
    for r in report["rows"]:
        lines.append(f"{r['kind']:<15} {r['size_bytes']:>10} {r['time_s'] * 1e6:>11.1f} {r['algbw'] / 1e9:>13.3f} "
                     f"{r['busbw'] / 1e9:>13.3f}")
    return "\n".join(lines)


def read_bandwidth_file(path) -> dict:
    """A file written by `hfscale bandwidth --out`: {"busbw_largest": {kind: bytes/s}, "nodes": ...}."""
    from ..files import load_json

    data = load_json(Path(path), "bandwidth file")
    bw = data.get("busbw_largest")
    if not isinstance(bw, dict) or not all(isinstance(bw.get(k), (int, float)) and bw[k] > 0 for k in KINDS):
        raise HfscaleError(f"{path}: not a bandwidth file (written by `hfscale bandwidth --out`): no positive "
                           f"busbw_largest for {', '.join(KINDS)}")
    return data


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = ArgumentParser(prog="hfscale bandwidth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=None, help="processes on this node (default: every GPU, or 2 on CPU)")
    parser.add_argument("--min_bytes", type=int, default=1 << 12)
    parser.add_argument("--max_bytes", type=int, default=None, help="largest message (default 256 MB on GPU, 16 MB on CPU)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", help="write the figures here (JSON) for `hfscale project --bandwidth_file`")
    parser.add_argument("--worker", action="store_true", help="run as one rank of an already launched group")
    opts = parser.parse_args(argv)
    for name in ("nproc", "min_bytes", "max_bytes", "iters"):
        value = getattr(opts, name)
        if value is not None and value <= 0:
            raise HfscaleError(f"--{name} must be positive, got {value}")
    import torch

    max_bytes = opts.max_bytes or ((256 << 20) if torch.cuda.is_available() else (16 << 20))
    if opts.min_bytes > max_bytes:
        raise HfscaleError(f"--min_bytes {opts.min_bytes} is larger than --max_bytes {max_bytes}")
    sizes = []
    size = opts.min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    if opts.worker:
        worker(sizes, opts.iters, opts.out)
        return 0
    nproc = opts.nproc or torch.cuda.device_count() or 2
    if nproc < 2:
        raise HfscaleError("--nproc must be at least 2: a collective over one rank moves nothing")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "hfscale.plan.bandwidth", "--worker", "--min_bytes", str(opts.min_bytes), "--max_bytes",
           str(max_bytes), "--iters", str(opts.iters), *(["--out", opts.out] if opts.out else [])]
    return subprocess.call(cmd, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})


if __name__ == "__main__":
    sys.exit(main())
