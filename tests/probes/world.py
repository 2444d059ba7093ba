"""A gloo world of several processes for the probes: the parent serves the rendezvous store on the port its command
line ends with (0: one the kernel picks as it binds), spawns the ranks, and collects what each rank's work returned.
Each rank leaves through os._exit (see powersgd_hooks.py), after a barrier."""

import json
import os
import sys
import tempfile
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, port: int, world: int, work, out: str) -> None:
    # a client of the parent's store, bound before any worker started: no port to pick, none another process can take
    store = dist.TCPStore("127.0.0.1", port, world + 1, False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    result = work(rank)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.barrier()
    os._exit(0)


def spawn_world(world: int, work) -> list:
    """Run `work(rank)` (a module-level function returning JSON-able data) on each of `world` ranks of a gloo process
    group; returns what each rank returned, in rank order."""
    store = dist.TCPStore("127.0.0.1", int(sys.argv[-1]), world + 1, True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    with tempfile.TemporaryDirectory(prefix="hfscale-probe-") as folder:
        out = os.path.join(folder, "rank")
        mp.spawn(_rank, args=(store.port, world, work, out), nprocs=world)
        ranks = []
        for rank in range(world):
            with open(f"{out}.{rank}") as f:
                ranks.append(json.load(f))
    return ranks
