"""`hfscale launch`: `accelerate launch hfscale/train.py` with the launcher config checked before anything starts.
The command alone; what it shares with sweep, tune, parity and slurm is the library below them (launching.py)."""

import os
import shlex
import signal
import sys

from .errors import ArgumentParser, HfscaleError
from .files import load_yaml
from .launching import check_training_flags, strategy_launch


def check_machine_flags(opts, config: dict) -> None:
    """A port a socket can take, and a machine rank below --num_machines. A job over several machines needs, from
    the flags or the launcher config, this machine's rank and the address of machine 0: without them every launcher
    would wait for a rendezvous that never comes."""
    if opts.main_process_port is not None and not 0 <= opts.main_process_port < 65536:
        raise HfscaleError(f"--main_process_port must be 0 (a free port) to 65535, got {opts.main_process_port}")
    if opts.main_process_ip is not None and (not opts.main_process_ip or len(opts.main_process_ip.split()) != 1):
        raise HfscaleError(f"--main_process_ip {opts.main_process_ip!r} is not one address: give machine rank 0's "
                           "host name or IP")
    if opts.num_machines == 1:
        if opts.machine_rank not in (None, 0):
            raise HfscaleError(f"--machine_rank must be 0 for --num_machines 1, got {opts.machine_rank}")
        return
    given = {flag: getattr(opts, flag) if getattr(opts, flag) is not None else config.get(flag)
             for flag in ("machine_rank", "main_process_ip")}
    missing = [f"--{flag}" for flag, value in given.items() if value in (None, "")]
    if missing:
        raise HfscaleError(f"--num_machines {opts.num_machines} needs {' and '.join(missing)} (flags or launcher "
                           f"config): this machine's rank and the address of machine rank 0 (hfscale slurm writes both)")
    rank = given["machine_rank"]
    if not (isinstance(rank, int) and 0 <= rank < opts.num_machines):
        raise HfscaleError(f"--machine_rank must be 0 to {opts.num_machines - 1} for --num_machines "
                           f"{opts.num_machines}, got {rank}")
    if opts.main_process_port == 0:  # each machine would pick its own free port, and none would meet
        raise HfscaleError(f"--main_process_port 0 (a free port) is for one machine: --num_machines "
                           f"{opts.num_machines} must agree on one port (hfscale slurm writes 29500)")


def main(argv: list[str]) -> int:
    """`hfscale launch`: `accelerate launch hfscale/train.py` with the launcher config checked before anything starts."""
    parser = ArgumentParser(
        prog="hfscale launch", allow_abbrev=False,  # a training flag must never be taken for an abbreviation of ours
        description="Start hfscale/train.py through `accelerate launch` after checking the launcher config: "
                    "--config_file (default: the strategy's shipped accelerate_configs/<strategy>.yaml) must be "
                    "valid and agree with --strategy. Every other flag (after `--` too) goes to the training "
                    "script.")
    parser.add_argument("--config_file", help="an accelerate config (YAML)")
    parser.add_argument("--num_processes", type=int, help="processes on all machines together, as accelerate counts "
                        "them (default: the config's, or every local GPU x --num_machines, or 2 on a CPU machine)")
    parser.add_argument("--num_machines", type=int, default=1)
    parser.add_argument("--machine_rank", type=int, default=None)
    parser.add_argument("--main_process_ip", default=None)
    parser.add_argument("--main_process_port", type=int, default=None,
                        help="the rendezvous port (default on one machine: 0, a free port accelerate picks)")
    parser.add_argument("--dry_run", action="store_true", help="print the accelerate command instead of running it")
    opts, train_args = parser.parse_known_args(argv)
    if "--" in train_args:  # `-- TRAIN FLAGS` as sweep, tune and slurm take them: the same flags
        train_args.remove("--")
    flags = []
    for flag in ("machine_rank", "main_process_ip", "main_process_port"):
        if getattr(opts, flag) is not None:
            flags += [f"--{flag}", str(getattr(opts, flag))]
    cmd = strategy_launch(train_args, opts.num_processes, opts.config_file, opts.num_machines, flags,
                          free_main_port=opts.main_process_port is None and opts.num_machines == 1)
    check_machine_flags(opts, load_yaml(opts.config_file) if opts.config_file else {})
    check_training_flags(train_args)  # a typo is one line here, not a traceback from every rank
    if opts.dry_run:
        print(shlex.join(cmd))
        return 0
    # SIGUSR1 is the ranks' (run/stopping.py): the launcher ignores it (kept across exec and by the processes it
    # starts until each rank installs its handler) so that it lives on while they save and stop; SIGUSR1's default
    # would end it and, under srun, the job step with it
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.execv(sys.executable, cmd)  # accelerate takes over this process: signals (SLURM, Ctrl-C) reach it directly
