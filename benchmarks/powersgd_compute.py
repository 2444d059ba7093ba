"""What PowerSGD's own compute adds to a step, on one rank: the compression the projection does not model.

`hfscale project` takes a strategy's compute from the run it projects from. Projected from a ddp run, ddp_powersgd
is missing the hook's own work per step - error feedback, the P = MQ and Q = MᵀP products, P's orthogonalisation,
the decompression - which the 1-process twins of `projection_vs_real.py` cannot run (hfscale refuses ddp_powersgd on
one process). This times the same model's forward and backward under DDP over one gloo rank with and without torch's
powerSGD_hook (past its warm-up), side by side, and prints the difference per step.

    python benchmarks/powersgd_compute.py                      # tiny GPT-2, MBS 4, seq 64, the strategy's rank
    python benchmarks/powersgd_compute.py --out benchmarks/results/projection_DATE/powersgd_compute.json
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def step_times(model_preset: str, batch: int, seq_len: int, rank: int | None, steps: int) -> list[float]:
    """Seconds of each forward + backward of a fresh DDP model (rank: PowerSGD's; None: plain all-reduce)."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    from hfscale.models import PRESETS, build_model

    model = DistributedDataParallel(build_model(PRESETS[model_preset], 0))
    if rank is not None:
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    ids = torch.randint(0, PRESETS[model_preset].vocab, (batch, seq_len))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        times.append(time.perf_counter() - start)
    return times[10:]  # past PowerSGD's warm-up and the allocator's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs, side by side; the median is kept")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    opts = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29571"))
    import torch
    import torch.distributed as dist

    from hfscale.parallel.strategies import get_strategy

    torch.set_num_threads(1)  # one rank's core, as in projection_vs_real's runs
    dist.init_process_group("gloo", rank=0, world_size=1)
    rank = get_strategy("ddp_powersgd").powersgd["rank"]
    extra = []
    for _ in range(opts.repeats):
        shape = (opts.model, opts.per_device_train_batch_size, opts.seq_len)
        plain = statistics.median(step_times(*shape, None, opts.steps))
        hooked = statistics.median(step_times(*shape, rank, opts.steps))
        extra.append(hooked - plain)
        print(f"{opts.model}, MBS {opts.per_device_train_batch_size}, seq {opts.seq_len}: forward + backward "
              f"{plain * 1e3:.2f} ms, with PowerSGD rank {rank} {hooked * 1e3:.2f} ms: +{(hooked - plain) * 1e3:.2f} ms",
              flush=True)
    dist.destroy_process_group()
    if opts.out:
        from hfscale.files import atomic_write_text

        atomic_write_text(opts.out, json.dumps({
            "model": opts.model, "per_device_train_batch_size": opts.per_device_train_batch_size,
            "seq_len": opts.seq_len, "powersgd_rank": rank, "extra_s_per_step": sorted(extra),
            "median_extra_s_per_step": statistics.median(extra),
            "command": "python benchmarks/powersgd_compute.py " + " ".join(sys.argv[1:])}, indent=2) + "\n")


if __name__ == "__main__":
    main()
