"""`hfscale slurm`: an sbatch script for a multi-node hfscale run, ready for `sbatch` with no edits.

    hfscale slurm --nodes 4 --gpus_per_node 8 --partition gpu --time 20:00:00 -- --strategy zero1 --model bloom-7b1 --bf16 > job.sbatch
    sbatch job.sbatch

One `hfscale launch` per node (`srun --ntasks-per-node=1 --kill-on-bad-exit=1`), static rendezvous: the main address
is the allocation's first host (`scontrol show hostnames`), one port, and each node's machine rank is
`$SLURM_NODEID` expanded *on that node* (escaped in the srun line: expanded by the batch shell, every node would get
0 and the job would hang). `--num_processes` is the total, nodes x GPUs per node, as accelerate counts it; DeepSpeed
uses its `standard` multi-node launcher (no pdsh/ssh). `--strategy a,b --out DIR` writes one script per strategy.

`--requeue SECONDS`: SLURM warns every rank SECONDS before the time limit (`--signal=USR1@SECONDS`); the run saves a
checkpoint at its next logging step and stops (run/stopping.py), and the script puts the job back in the queue
(`scontrol requeue`), where the same script resumes it (`--resume_from_checkpoint latest`). docs/multinode.md.
"""

import re
import shlex
import sys
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError
from ..files import atomic_write_text, check_writable_dir
from ..flags import at_most_gpus, comma_list, drop_flag, flag_value, refuse_renamed, split_train_args
from ..launching import check_training_flags, strategy_launch
from ..parallel.strategies import all_strategies
from ..run.checkpoints import LATEST

DEFAULT_PORT = 29500
_NAME = re.compile(r"^[A-Za-z0-9_.,:+=@-]+$")  # partition, account, constraint, job name: one shell word, no spaces
# SLURM's D-HH:MM:SS, D-HH:MM, D-HH, HH:MM:SS, MM:SS, MM (minutes and seconds below 60), or no limit
_TIME = re.compile(r"^((\d+-)?\d+(:[0-5]?\d){0,2}|UNLIMITED|INFINITE)$", re.IGNORECASE)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="hfscale slurm", allow_abbrev=False,
                       description="An sbatch script for a multi-node hfscale run (training flags after `--`).")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus_per_node", type=int, required=True)
    p.add_argument("--cpus_per_task", type=int, help="CPU cores per node for the launcher and its processes")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--constraint", help="e.g. v100-32g")
    p.add_argument("--time", help="time limit, e.g. 20:00:00")
    p.add_argument("--job_name", help="default: hfscale-<strategy>-<model>")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"rendezvous port on the first node (default {DEFAULT_PORT})")
    p.add_argument("--setup", action="append", default=[], help="a line run before the launch on the batch host, "
                   "e.g. 'module load cuda/12.4' or 'source ~/venvs/hfscale/bin/activate' (repeatable)")
    p.add_argument("--python", default="python", help="the interpreter that has hfscale (default: python on PATH)")
    p.add_argument("--config_file", help="an accelerate config instead of the strategy's shipped one")
    p.add_argument("--requeue", type=int, metavar="SECONDS", help="SLURM warns the run this many seconds before "
                   "--time runs out: it saves a checkpoint at its next logging step and stops, and the job goes back "
                   "in the queue to resume from it (needs --output_dir after --; leave time for a logging interval "
                   "and a checkpoint save)")
    p.add_argument("--strategy", help="the run's strategy, or comma-separated: one script per strategy (with --out); "
                   "default: the training flags' --strategy, else ddp")
    p.add_argument("--out", type=Path, help="write <job name>.sbatch files here instead of printing one")
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true", help="print the script (the default "
                   "without --out)")
    return p


def check(opts) -> None:
    for name in ("nodes", "gpus_per_node", "cpus_per_task"):
        value = getattr(opts, name)
        if value is not None and value <= 0:
            raise HfscaleError(f"--{name} must be positive, got {value}")
    at_most_gpus("--nodes", opts.nodes)
    at_most_gpus("--gpus_per_node", opts.gpus_per_node)
    if not 0 < opts.port < 65536:
        raise HfscaleError(f"--port must be between 1 and 65535, got {opts.port}")
    for name in ("partition", "account", "constraint", "job_name"):
        value = getattr(opts, name)
        if value is not None and not _NAME.match(value):
            raise HfscaleError(f"--{name} {value!r} is not one SLURM name (letters, digits, _.,:+=@-; no spaces)")
    if not opts.python.strip():  # the script would run `'' -m hfscale launch` on every node
        raise HfscaleError("--python is empty: name the interpreter that has hfscale (e.g. ~/venvs/hfscale/bin/python)")
    if opts.time is not None and not _TIME.match(opts.time):
        raise HfscaleError(f"--time {opts.time!r} is not a SLURM time limit (e.g. 20:00:00 or 2-00:00:00)")
    if opts.requeue is not None:
        if opts.requeue <= 0:
            raise HfscaleError(f"--requeue must be a positive number of seconds, got {opts.requeue}")
        limit = time_limit_s(opts.time) if opts.time is not None else None
        if limit is not None and opts.requeue >= limit:
            raise HfscaleError(f"--requeue {opts.requeue} warns before the job starts: --time {opts.time} is {limit} s")
    if opts.strategy and "," in opts.strategy and not opts.out:
        raise HfscaleError(f"--strategy {opts.strategy} writes one script per strategy: give --out DIR")
    if opts.out:
        check_writable_dir(opts.out, "--out")


def time_limit_s(text: str) -> int | None:
    """SLURM's time limit in seconds (None: no limit): minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = ([0, 0] + parts)[-3:] if len(parts) == 3 else (0, *(parts + [0])[:2])
    total = (((int(days or 0) * 24) + hours) * 60 + minutes) * 60 + seconds
    return total or None  # --time 0: no limit


def requeue_args(train_args: list[str]) -> list[str]:
    """The training flags of a job that requeues itself: it must name its folder, and resume from its latest checkpoint
    there (what each requeued start runs)."""
    if not flag_value(train_args, "--output_dir"):
        raise HfscaleError("--requeue needs the run's --output_dir after --: the requeued job resumes from the "
                           "checkpoint it finds there")
    resume = flag_value(train_args, "--resume_from_checkpoint")
    if resume is None:
        return [*train_args, "--resume_from_checkpoint", "latest"]
    if resume not in LATEST:
        raise HfscaleError(f"--requeue resumes each requeued start from its latest checkpoint; --resume_from_checkpoint "
                           f"{resume} would start every one from the same checkpoint (pass latest, or drop it)")
    return train_args


def script(opts, train_args: list[str], job_name: str) -> str:
    """The sbatch script. Only `$SLURM_NODEID` is left for each node's shell; the rest is fixed here."""
    total = opts.nodes * opts.gpus_per_node
    # validates the strategy, the launcher config and the process arithmetic now, not on the cluster
    strategy_launch(train_args, total, opts.config_file, opts.nodes, check_gpus=False)
    launch = [opts.python, "-m", "hfscale", "launch", "--num_machines", str(opts.nodes), "--num_processes", str(total),
              *(["--config_file", opts.config_file] if opts.config_file else [])]
    header = [f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={opts.nodes}",
              "#SBATCH --ntasks-per-node=1          # one launcher per node; it starts the GPU processes",
              f"#SBATCH --gres=gpu:{opts.gpus_per_node}", "#SBATCH --hint=nomultithread",
              "#SBATCH --output=%x-%j.out"]
    for flag, value in (("cpus-per-task", opts.cpus_per_task), ("partition", opts.partition),
                        ("account", opts.account), ("constraint", opts.constraint), ("time", opts.time)):
        if value is not None:
            header.append(f"#SBATCH --{flag}={value}")
    requeue = []
    if opts.requeue is not None:
        train_args = requeue_args(train_args)
        header += [f"#SBATCH --signal=USR1@{opts.requeue}  # every rank, {opts.requeue} s before the limit: a checkpoint, "
                   "then stop", "#SBATCH --requeue", "#SBATCH --open-mode=append  # each requeued start adds to the log"]
        results = shlex.quote(f"{flag_value(train_args, '--output_dir')}/results.json")
        check = 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["status"] != "stopped")'
        requeue = ["# stopped on SLURM's warning (results status \"stopped\"): back in the queue, to resume from there",
                   f"if {shlex.quote(opts.python)} -c {shlex.quote(check)} {results}; then",
                   '    scontrol requeue "$SLURM_JOB_ID"', "fi"]
    cpus = f"--cpus-per-task={opts.cpus_per_task} " if opts.cpus_per_task else ""
    node_command = (f"{_in_double_quotes(shlex.join(launch))} --machine_rank \\$SLURM_NODEID --main_process_ip "
                    f"$MASTER_ADDR --main_process_port $MASTER_PORT {_in_double_quotes(shlex.join(train_args))}")
    lines = ["#!/bin/bash", f"# generated by: hfscale slurm {shlex.join(sys.argv[2:]) if sys.argv[1:2] == ['slurm'] else ''}".rstrip(),
             *header, "", "set -euo pipefail", *opts.setup,
             'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             f"export MASTER_PORT={opts.port}",
             f"echo \"hfscale: {opts.nodes} nodes x {opts.gpus_per_node} GPUs, rendezvous $MASTER_ADDR:$MASTER_PORT\"",
             "# \\$SLURM_NODEID is escaped: each node's own shell expands it to that node's machine rank",
             *([f"# --cpus-per-task again: since Slurm 22.05 srun does not inherit #SBATCH's, and the launcher with "
                f"its {opts.gpus_per_node} processes would share one core"] if opts.cpus_per_task else []),
             f'srun --ntasks-per-node=1 {cpus}--kill-on-bad-exit=1 bash -c "{node_command}"', *requeue, ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    own, train_args = split_train_args(argv)
    refuse_renamed(own)
    opts = build_parser().parse_args(own)
    check(opts)
    check_training_flags(train_args, here=False, appended=True)  # the job runs elsewhere: its files are the cluster's to have
    strategies = job_strategies(opts.strategy, flag_value(train_args, "--strategy"))
    if len(strategies) > 1 and flag_value(train_args, "--output_dir"):
        raise HfscaleError(f"--strategy {opts.strategy} with one --output_dir: every job would run in that folder; "
                           "drop it (each run gets runs/<run name>) or write one script per strategy")
    scripts = []
    for strategy in strategies:
        args = ["--strategy", strategy, *drop_flag(train_args, "--strategy")]
        model = flag_value(args, "--model") or Path(flag_value(args, "--model_name_or_path") or "tiny").name
        name = opts.job_name or f"hfscale-{strategy}-{model}"
        if len(strategies) > 1:
            name = f"{opts.job_name}-{strategy}" if opts.job_name else name
        scripts.append((name, script(opts, args, name)))  # every script is built (and checked) before any is written
    if not opts.cpus_per_task:  # once the job is known to be valid: a refusal stays one line
        print(f"hfscale: warning: no --cpus_per_task: each node's launcher and its {opts.gpus_per_node} processes get "
              "the CPUs your cluster gives a task by default (often 1 core: data loading and any offloaded optimizer "
              "step crawl); pass the node's cores, e.g. --cpus_per_task 64", file=sys.stderr)
    if not opts.out:
        print(scripts[0][1], end="")
        return 0
    for name, text in scripts:
        atomic_write_text(opts.out / f"{name}.sbatch", text)
        print(f"wrote {opts.out / f'{name}.sbatch'}   (sbatch it)")
    return 0


def job_strategies(own: str | None, training: str | None) -> list[str]:
    """The strategies of the jobs: slurm's own --strategy (a comma list: one job each), else the training flags'
    --strategy, else ddp. Both, naming different strategies: refused."""
    if own is None:
        return [training or "ddp"]
    strategies = comma_list(own, "--strategy", valid=all_strategies(), what="strategy")
    if training is not None and strategies != [training]:
        raise HfscaleError(f"--strategy {own} (slurm's) and --strategy {training} (the training flags') disagree: give "
                           "it once")
    return strategies


def _in_double_quotes(text: str) -> str:
    """Text that reaches each node's `bash -c` unchanged through the batch shell's double quotes."""
    for char in ("\\", '"', "$", "`"):
        text = text.replace(char, "\\" + char)
    return text
