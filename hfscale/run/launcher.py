"""`python -m hfscale.run.launcher ARGS` is `accelerate launch ARGS`, with Python's garbage collector off while the
launcher imports torch and accelerate, then one full collection and the survivors frozen (hfscale/run/garbage.py):
~0.5 CPU-s less per launch; the same launcher, flags and process tree. The command `hfscale launch`, sweep, tune,
parity and the SLURM script start (`launching.launch_command`); `accelerate launch` typed by hand is the stock one.

It also gives every process the same share of the node's CPUs (`cpu_threads_per_process`), whatever the strategy,
and ends quietly, with the ranks' exit code 2, when they refused their input: the first to refuse printed its one
line (`hfscale: error: ...`; errors.first_to_say), and torch's report of a failed child (a traceback and a table)
would bury it."""

import gc
import os
import sys

from hfscale.errors import EXIT_USAGE
from hfscale.run import garbage


def cpu_threads_per_process(cpus: int, processes_per_node: int) -> int:
    """The intra-op threads (OMP_NUM_THREADS) of each process: its share of the CPUs this node gives the job."""
    return max(1, cpus // max(1, processes_per_node))


def launcher_flag(argv: list[str], flag: str) -> str | None:
    """The value of one of accelerate launch's own flags: those before the training script."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py"):
            break
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def share_the_cpus(argv: list[str], environ: dict) -> None:
    """OMP_NUM_THREADS for every rank, unless the user set it. accelerate sets it to 1 on its DDP and FSDP routes and
    leaves it unset on DeepSpeed's, where a lone process then runs on every core (torchrun sets 1 from two processes
    per node on): one process of zero2_offload stepped its CPU Adam on all cores while fsdp_offload's CPU AdamW, like
    any ddp run's CPU work, had one. Each process now gets cores / processes per node, the rule of accelerate's own
    `--cpu` runs and DeepSpeed's --bind_cores_to_rank."""
    if "OMP_NUM_THREADS" in environ:
        return
    try:
        processes = int(launcher_flag(argv, "--num_processes") or 1)
        machines = int(launcher_flag(argv, "--num_machines") or 1)
    except ValueError:  # accelerate's own parser says what is wrong with them
        return
    environ["OMP_NUM_THREADS"] = str(cpu_threads_per_process(len(os.sched_getaffinity(0)), processes // machines))


def main() -> None:
    share_the_cpus(sys.argv[1:], os.environ)
    gc.disable()  # this process is the launcher's: nothing of a caller's to restore
    from accelerate.commands.launch import main as accelerate_launch

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    garbage.settle()  # before collection is back on: its first young collection would walk every import again
    gc.enable()
    try:
        accelerate_launch()
    except ChildFailedError as err:
        if err.get_first_failure()[1].exitcode != EXIT_USAGE:
            raise  # a crash: torch's report names the rank, its exit code or signal, and its error file
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
