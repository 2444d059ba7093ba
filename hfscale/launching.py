"""Run one training as its own process tree through the real launcher (`accelerate launch`), and say how it ended.

The library below the planners, the comparisons and the cluster scripts: `hfscale sweep`, `tune` and `parity` launch
runs through `run_one` / `run_training`; `hfscale slurm` and the command `hfscale launch` (launch.py) build their
command line with `strategy_launch`, as every route does: the strategy's shipped launcher config, checked. A run that
runs out of memory, crashes, hangs or is refused becomes an outcome with a status and the tail of its log, and its
results file says so; the caller goes on.
"""

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import HfscaleError
from .files import is_run_file, load_json
from .flags import at_most_gpus, flag_value, train_flag
from .formulas.metrics import global_batch_size, param_count
from .models import MODEL_OVERRIDES, model_shape
from .parallel.configs import check_accelerate_config, launcher_deepspeed_json
from .parallel.distributed import check_local_processes, visible_device_memory
from .parallel.launch_env import check_agree, config_strategy
from .parallel.strategies import get_strategy, tp_layout_refusal
from .run.outcome import STATUSES, Outcome, classify, kill_tree
from .run.results import RESULTS_FILE, ConfigRecord, ModelRecord, Results, read_results, write_results
from .runplan import RunPlan, fit, hsdp_mesh

TRAIN_SCRIPT = str(Path(__file__).resolve().parent / "train.py")
LOG_FILE = "launch.log"


def launch_command(train_args: list[str], nproc: int, config_file: str | None = None,
                   launcher_args: list[str] = (), free_main_port: bool = True) -> list[str]:
    """`accelerate launch` for nproc processes (with --multi_gpu when no config file: without it a CPU machine
    starts one process whatever --num_processes says), on a free port unless the caller sets one. Started as
    hfscale.run.launcher: accelerate's launcher with its imports made without garbage collections.

    The free port is accelerate's `--main_process_port 0`: the launcher picks it after its imports, right before
    torchrun binds it. A port picked here would stay unbound for the ~2.5 s the launcher takes to import torch and
    accelerate, time in which any other process (another run's rank connecting to its peers) may take it."""
    cmd = [sys.executable, "-m", "hfscale.run.launcher"]
    if config_file:
        cmd += ["--config_file", config_file]
    elif nproc > 1:
        cmd += ["--multi_gpu"]
    cmd += ["--num_processes", str(nproc), *launcher_args]
    if free_main_port:  # two jobs on one node must not collide
        cmd += ["--main_process_port", "0"]
    return cmd + [TRAIN_SCRIPT, *train_args]


def run_training(train_args: list[str], output_dir: Path, nproc: int, timeout_s: float | None,
                 env: dict | None = None) -> Outcome:
    """Launch, wait (killing the whole process tree after timeout_s), classify. The log goes to output_dir/launch.log."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    log_path = output_dir / LOG_FILE
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("WORLD_SIZE", None)  # a sweep started inside a launched job must not inherit its world
    start, timed_out = time.perf_counter(), False
    cmd = strategy_launch([*train_args, "--output_dir", str(output_dir)], nproc)  # the strategy's own config
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd,
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)
        except BaseException:  # Ctrl-C on the sweep: take the run down with it
            kill_tree(proc.pid)
            raise
        proc.wait()
    seconds = time.perf_counter() - start
    text = log_path.read_text(errors="replace")
    results_status = finished_status(output_dir, final_only=False)
    status, error = classify(proc.returncode, text, results_status, timed_out)
    return Outcome(status, proc.returncode, seconds, error, text[-2000:])


def default_num_processes() -> int:
    """Processes on one node by default: every visible GPU; on a CPU machine, 2."""
    import torch  # a second to import: only when no --num_processes was given

    return torch.cuda.device_count() or 2


def strategy_launch(train_args: list[str], nproc: int | None, config_file: str | None = None,
                    machines: int = 1, launcher_flags: list[str] = (), free_main_port: bool = True,
                    check_gpus: bool = True) -> list[str]:
    """The `accelerate launch` command of one training run, as `hfscale launch`, sweep and parity start it: the
    launcher config (default: the strategy's shipped accelerate_configs/<strategy>.yaml, so a user's default accelerate
    config never leaks in) checked and agreeing with --strategy, its DeepSpeed JSON found, and `nproc` processes in all
    over `machines` machines (accelerate's --num_processes is the total; None: the config's, else every local GPU on
    each machine) - refused when a node would run more processes than it has GPUs."""
    asked = train_flag(train_args, "--strategy")
    if asked is not None:
        get_strategy(asked)  # an unknown name: the list of valid ones
    if nproc is not None and nproc <= 0:  # 0 would read as "not given" below
        raise HfscaleError(f"--num_processes must be positive, got {nproc}")
    config_path = Path(config_file) if config_file else get_strategy(asked or "ddp").accelerate_config_path
    config = check_accelerate_config(config_path)
    deepspeed_json = launcher_deepspeed_json(config, config_path)
    launched = None
    if config_file:
        try:
            launched = config_strategy(config, load_json(deepspeed_json, "DeepSpeed JSON") if deepspeed_json else None)
        except HfscaleError as err:
            raise HfscaleError(f"{config_path}: {err}") from None
        if asked is not None:
            check_agree(asked, launched)
        nproc = nproc or config.get("num_processes")
    if machines <= 0:
        raise HfscaleError(f"--num_machines must be positive, got {machines}")
    nproc = nproc or default_num_processes() * machines
    if nproc <= 0:
        raise HfscaleError(f"--num_processes must be positive, got {nproc}")
    at_most_gpus("--num_machines", machines)
    at_most_gpus("--num_processes", nproc)
    if nproc % machines:
        raise HfscaleError(f"--num_processes {nproc} (processes in all) does not split over {machines} machines")
    if check_gpus:  # not when writing a job script for other machines (hfscale slurm)
        check_local_processes(nproc // machines)
    launcher_args = ["--deepspeed_config_file", deepspeed_json] if deepspeed_json else []
    launcher_args += mesh_and_node_flags(get_strategy(asked or launched or "ddp"), config, nproc, machines)
    launcher_args += list(launcher_flags)
    return launch_command(train_args, nproc, str(config_path), launcher_args, free_main_port=free_main_port)


def mesh_and_node_flags(strategy, config: dict, nproc: int, machines: int) -> list[str]:
    """accelerate launch's flags for the job's shape: HSDP's and TP's device mesh, and the multi-node rendezvous."""
    flags = []
    if strategy.hybrid:  # HSDP's mesh is the job's shape: nodes x processes per node
        replicas, shards = hsdp_mesh(machines, nproc // machines)
        flags += ["--parallelism_config_dp_replicate_size", str(replicas),
                  "--parallelism_config_dp_shard_size", str(shards)]
    elif strategy.tensor_parallel:  # TP over a node's processes, FSDP (fsdp_tp) over the nodes
        reason = tp_layout_refusal(strategy, nproc, nproc // machines)
        if reason:
            raise HfscaleError(reason)
        flags += ["--parallelism_config_dp_shard_size", str(machines),
                  "--parallelism_config_tp_size", str(nproc // machines)]
    if machines > 1:
        # static rendezvous, as flags: accelerate launch ignores rdzv_backend/same_network when they come only from
        # the config file, and c10d rendezvous ignores the machine rank (rank 0 may land on another node)
        flags += ["--num_machines", str(machines), "--rdzv_backend", "static", "--same_network"]
        if config.get("distributed_type") == "DEEPSPEED":  # one launcher per node, no pdsh/ssh
            flags += ["--deepspeed_multinode_launcher", "standard"]
    return flags


def check_training_flags(train_args: list[str], here: bool = True, appended: bool = False) -> None:
    """run/args.check_training_flags, imported when a command hands training flags on: it needs transformers'
    TrainingArguments, which `hfscale launch`'s own checks do not. `appended`: the command adds flags of its own to
    them (a sweep's axes, parity's steps, slurm's strategy), so they cannot be a run file, which stands alone."""
    from .run.args import check_training_flags as check

    if appended:
        refuse_run_file(train_args)
    check(train_args, here)


def refuse_run_file(train_args: list[str]) -> None:
    """Training flags that a command adds flags of its own to cannot be a run file."""
    if is_run_file(train_args):
        raise HfscaleError(f"{train_args[0]}: a run file stands alone (`hfscale train FILE`, `hfscale launch FILE`); "
                           "this command adds flags of its own to the training flags: give the file's keys as flags "
                           "after `--`")


# ---- one run of a sweep or of `hfscale tune` ------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep or of tune, in the training flags' names (the sweep's axes, in their order)."""

    strategy: str
    optim: str
    num_processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    activation_checkpointing: bool
    repeat: int = 0  # a sweep's --repeats: the configuration's k-th run, from 1 (0: measured once)
    fp8: bool = False  # tune's float8 axis: the trial trains with --fp8

    @property
    def name(self) -> str:
        return (f"{self.strategy}-{self.optim}-np{self.num_processes}-mbs{self.per_device_train_batch_size}"
                f"-gas{self.gradient_accumulation_steps}" + ("-ac" if self.activation_checkpointing else "")
                + ("-fp8" if self.fp8 else "") + (f"-r{self.repeat}" if self.repeat else ""))

    @property
    def sweep_record(self) -> dict:
        """What the run's results file says of its place in the sweep (the report merges a configuration's repeats)."""
        return {"nproc": self.num_processes, **({"repeat": self.repeat} if self.repeat else {})}

    def train_args(self, fixed: list[str]) -> list[str]:
        return ["--strategy", self.strategy, "--optim", self.optim,
                "--per_device_train_batch_size", str(self.per_device_train_batch_size),
                "--gradient_accumulation_steps", str(self.gradient_accumulation_steps),
                *(["--activation_checkpointing", "true"] if self.activation_checkpointing else []),
                *(["--fp8"] if self.fp8 else []), *fixed]


def stub_results(run: RunSpec, status: str, error: str | None, fixed: list[str]) -> Results:
    """The row of a run that never wrote a results file (refused up front, or died before training)."""
    return Results(status=status, error=error, run_name=run.name, strategy=run.strategy, optim=run.optim,
                   sweep={**run.sweep_record, "fixed": list(fixed)},
                   model=ModelRecord(name=flag_value(fixed, "--model") or "tiny", params_model=planned_params(fixed)),
                   config=ConfigRecord(world_size=run.num_processes,
                                       per_device_train_batch_size=run.per_device_train_batch_size,
                                       gradient_accumulation_steps=run.gradient_accumulation_steps,
                                       global_batch_size=global_batch_size(run.per_device_train_batch_size,
                                                                           run.gradient_accumulation_steps,
                                                                           run.num_processes),
                                       activation_checkpointing=run.activation_checkpointing))


def planned_params(fixed: list[str]) -> int | None:
    """The parameter count (formula) of the model the fixed args ask for, so a row that never ran still has a Size;
    None for a pretrained checkpoint or args that do not describe a model."""
    if flag_value(fixed, "--model_name_or_path"):
        return None
    try:
        sizes = {flag: int(value) for flag in MODEL_OVERRIDES if (value := flag_value(fixed, f"--{flag}"))}
        return param_count(model_shape(flag_value(fixed, "--model") or "tiny", **sizes))
    except (HfscaleError, ValueError):
        return None


def finished_status(run_dir: Path, final_only: bool = True) -> str | None:
    """The status a run's results file says (None: none, or unreadable); final_only: only a final one (STATUSES)."""
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        return None
    try:
        status = read_results(path).status
    except (HfscaleError, OSError):
        return None
    return status if status in STATUSES or not final_only else None


def record_outcome(run: RunSpec, run_dir: Path, status: str, error: str | None, log_tail: str, seconds: float,
                   fixed: list[str]) -> None:
    """Make the run's results file say how it ended (keeping everything the run itself recorded)."""
    path = run_dir / RESULTS_FILE
    try:
        results = read_results(path) if path.is_file() else stub_results(run, status, error, fixed)
    except HfscaleError:
        results = stub_results(run, status, error, fixed)
    if results.status != "ok" or status != "ok":
        results.status, results.error, results.log_tail = status, error, log_tail if status != "ok" else None
    results.sweep = {"wall_s": round(seconds, 2), **run.sweep_record, "fixed": list(fixed)}
    write_results(run_dir, results)


def check_same_flags(runs, out: Path, fixed: list[str], command: str) -> None:
    """Refuse, before anything runs, an --out whose finished runs were trained with other flags than `fixed` (the
    flags every run of this sweep or tune shares: the model, its sizes, the sequence, ...): their names say only the
    axes, so each would be taken as already done - a tune of one model into another's folder ranked the other's
    trials. A results file from before the flags were recorded is taken as it is."""
    for run in runs:
        path = out / run.name / RESULTS_FILE
        if finished_status(out / run.name) is None:
            continue
        recorded = (read_results(path).sweep or {}).get("fixed")
        if recorded is not None and list(recorded) != list(fixed):
            raise HfscaleError(f"{out / run.name} is a run of other training flags ({shlex.join(recorded) or 'none'}; "
                               f"this {command} passes {shlex.join(fixed) or 'none'}), which its name does not "
                               f"say: give another --out, or remove it")


def start_up_refusal(train_args: list[str], processes: int) -> tuple[RunPlan | None, str | None]:
    """(the plan each rank of a run about to be launched on `processes` processes of this node makes as it starts,
    why that start-up would refuse the run or None): train.check_args over its flags, then the plan's refusal() - the
    same checks as the run's own. The plan is None where the flags themselves are refused."""
    from .train import check_args  # the training stack's argument checks: transformers, imported by its first run

    try:
        plan = check_args(train_args, launched=(processes, processes))[3].plan
    except HfscaleError as err:
        return None, str(err)
    return plan, plan.refusal()


def decided_without_launch(run: RunSpec, out: Path, fixed: list[str], retry_failed: bool = False) -> dict | None:
    """The row of a sweep's (or `hfscale tune`'s) run that is decided without launching it - skipped when out/<run
    name> already has a final status; refused when its own start-up would refuse it (start_up_refusal: the strategy table,
    a layout its processes on this one node cannot make, heads TP does not divide, host RAM on a CPU), or when on a
    GPU its plan does not fit the device's memory - else None: it launches."""
    done = finished_status(out / run.name)
    if done and not (retry_failed and done != "ok"):
        return {"run": run.name, "status": done, "skipped": True}
    plan, reason = start_up_refusal(run.train_args(fixed), run.num_processes)
    if not reason and plan.on_cuda:
        verdict = fit(plan, visible_device_memory())
        reason = None if verdict.fits is not False else f"estimate: {verdict.reason}"
    return {"run": run.name, "status": "refused", "error": reason} if reason else None


def run_one(run: RunSpec, out: Path, fixed: list[str], timeout: float, retry_failed: bool = False) -> dict:
    """One run of a sweep (or of `hfscale tune`) into out/<run name>: decided without a launch when it can be (a
    refused one recorded as such), else launched and its outcome recorded."""
    run_dir = out / run.name
    row = decided_without_launch(run, out, fixed, retry_failed)
    if row is not None:
        if row["status"] == "refused" and not row.get("skipped"):
            write_results(run_dir, stub_results(run, "refused", row["error"], fixed))
        return row
    outcome = run_training(run.train_args(fixed), run_dir, run.num_processes, timeout)
    record_outcome(run, run_dir, outcome.status, outcome.error, outcome.log_tail, outcome.seconds, fixed)
    return {"run": run.name, "status": outcome.status, "error": outcome.error, "wall_s": round(outcome.seconds, 1)}
