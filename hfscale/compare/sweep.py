"""`hfscale sweep`: the cross product of strategies x optimizers x processes x micro-batch x accumulation x
activation checkpointing, each run launched through `accelerate launch` into its own directory. Failures are rows.

    hfscale sweep --strategy ddp,zero2,zero3 --optim adamw,adafactor --num_processes 2 --out runs/sweep1 \\
        -- --model tiny --max_steps 10 --seq_len 64
    hfscale sweep --spec sweep.yaml

Each axis is the training flag it sets, with comma-separated values (`--per_device_train_batch_size 2,4`,
`--activation_checkpointing false,true`); a spec file uses the same names as keys. A run that already has a final
status in its results file is skipped, so an interrupted sweep started again goes on where it stopped
(`--retry_failed` reruns the non-ok ones). Pairs the strategy table refuses, and strategies that cannot run on a
run's processes of one node, are recorded as `refused` rows without launching anything; the training flags after
`--` are checked before anything starts (`--dry_run`: what it would do, nothing launched or written).

`--repeats N` runs each configuration N times (`<run>-r1` .. `-rN`), round by round, so that its measurements are
spread over the sweep's hours rather than taken back to back (on a shared cluster the BigScience runs saw the same
test vary by 40% with the time of day: one measurement is not a result); `hfscale report` shows each configuration's
median and its spread.
"""

import itertools
import json
import shlex
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from tqdm.auto import tqdm

from ..errors import ArgumentParser, HfscaleError
from ..files import atomic_write_text, check_writable_dir, exclusive_dir, load_yaml
from ..flags import RENAMED, comma_list, refuse_renamed, split_train_args
from ..launching import (RunSpec, check_same_flags, check_training_flags, decided_without_launch, run_one,
                         strategy_launch)
from ..parallel.distributed import check_local_processes
from ..parallel.optimizers import OPTIMIZERS
from ..parallel.strategies import all_strategies
from ..run.outcome import STATUSES, STOPPED

SWEEP_FILE = "sweep.json"
AXES = ("strategy", "optim", "num_processes", "per_device_train_batch_size", "gradient_accumulation_steps",
        "activation_checkpointing")  # in RunSpec's order


@dataclass
class SweepSpec:
    strategy: list[str] = field(default_factory=lambda: ["ddp"])
    optim: list[str] = field(default_factory=lambda: ["adamw"])
    num_processes: list[int] = field(default_factory=lambda: [2])
    per_device_train_batch_size: list[int] = field(default_factory=lambda: [4])
    gradient_accumulation_steps: list[int] = field(default_factory=lambda: [1])
    activation_checkpointing: list[bool] = field(default_factory=lambda: [False])
    train_args: list[str] = field(default_factory=list)  # fixed Trainer/hfscale flags for every run
    timeout: float = 1800.0  # seconds per run
    out: str = "runs/sweep"
    repeats: int = 1  # runs of each configuration, round by round

    def __post_init__(self):
        self.strategy = comma_list(self.strategy, "sweep strategy", valid=all_strategies(), what="strategy")
        self.optim = comma_list(self.optim, "sweep optim", valid=OPTIMIZERS, what="optimizer")
        for axis in ("num_processes", "per_device_train_batch_size", "gradient_accumulation_steps"):
            values = getattr(self, axis)
            if not isinstance(values, list) or not values or any(
                    not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values):
                raise HfscaleError(f"sweep {axis} must be a list of positive integers, got {values!r}")
        values = self.activation_checkpointing
        if not isinstance(values, list) or not values or any(not isinstance(v, bool) for v in values):
            raise HfscaleError(f"sweep activation_checkpointing must be a list of true/false, got {values!r}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats <= 0:
            raise HfscaleError(f"sweep repeats must be a positive integer, got {self.repeats!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not 0 < self.timeout < float("inf"):
            raise HfscaleError(f"sweep timeout must be positive seconds, got {self.timeout!r}")
        for flag in ("--strategy", "--optim", "--output_dir", "--per_device_train_batch_size",
                     "--gradient_accumulation_steps", "--activation_checkpointing", "--gradient_checkpointing"):
            if any(arg == flag or arg.startswith(flag + "=") for arg in self.train_args):
                if flag == "--output_dir":  # not an axis: every run's folder is the sweep's
                    raise HfscaleError("--output_dir is set by hfscale sweep (each run's folder under --out); remove "
                                       "it from the fixed train args")
                raise HfscaleError(f"{flag} is a sweep axis; set it in the sweep spec, not in the fixed train args")


def expand(spec: SweepSpec) -> list[RunSpec]:
    """Every run of the sweep in launch order: the cross product of the axes, once per round of --repeats."""
    runs = [RunSpec(*combo) for combo in itertools.product(*(getattr(spec, axis) for axis in AXES))]
    if spec.repeats == 1:
        return runs
    return [replace(run, repeat=k) for k in range(1, spec.repeats + 1) for run in runs]


def load_spec(path: Path) -> dict:
    if not Path(path).is_file():
        raise HfscaleError(f"sweep spec {path}: file not found")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise HfscaleError(f"sweep spec {path}: expected a mapping of sweep axes")
    valid = [f.name for f in fields(SweepSpec)]
    old = sorted(k for k in data if isinstance(k, str) and f"--{k}" in RENAMED)
    if old:
        raise HfscaleError(f"sweep spec {path}: {old[0]} is now {RENAMED['--' + old[0]].lstrip('-')} (the Trainer's "
                           "name)")
    unknown = sorted(map(str, set(data) - set(valid)))
    if unknown:
        raise HfscaleError(f"sweep spec {path}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    for key in AXES:
        if key in data and not isinstance(data[key], list):
            data[key] = [data[key]]
    for key in ("strategy", "optim"):
        if any(not isinstance(v, str) for v in data.get(key, [])):
            raise HfscaleError(f"sweep spec {path}: {key} must be a list of names, got {data[key]!r}")
    args = data.get("train_args", [])
    if isinstance(args, str):
        try:
            args = shlex.split(args)
        except ValueError as err:
            raise HfscaleError(f"sweep spec {path}: train_args: {err}") from None
    if not isinstance(args, list) or any(not isinstance(a, (str, int, float)) or isinstance(a, bool) for a in args):
        raise HfscaleError(f"sweep spec {path}: train_args must be a string or a list of flags, got {args!r}")
    data["train_args"] = [str(a) for a in args]
    if "out" in data and not isinstance(data["out"], str):
        raise HfscaleError(f"sweep spec {path}: out must be a directory path, got {data['out']!r}")
    return data


def run_sweep(spec: SweepSpec, retry_failed: bool = False, progress: bool = True) -> list[dict]:
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    bar = tqdm(expand(spec), desc="sweep", unit="run", disable=not progress)
    for run in bar:
        bar.set_postfix_str(run.name)
        rows.append(run_one(run, out, spec.train_args, spec.timeout, retry_failed))
        if not rows[-1].get("skipped"):
            _write_index(out, spec, rows)
    _write_index(out, spec, rows)
    return rows


def _write_index(out: Path, spec: SweepSpec, rows: list[dict]) -> None:
    atomic_write_text(out / SWEEP_FILE, json.dumps({"spec": asdict(spec), "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                    "runs": rows}, indent=2) + "\n")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hfscale sweep", allow_abbrev=False,
        description="Run strategies x optimizers x processes x MBS x GAS x activation checkpointing; failures (OOM, "
                    "fail, timeout, refused) are rows. Each axis is the training flag it sets, with comma-separated "
                    "values. Trainer flags for every run go after `--`.")
    parser.add_argument("--spec", type=Path, help="YAML file with the keys below (command-line flags override it)")
    parser.add_argument("--strategy", help="comma-separated, e.g. ddp,zero2,zero3, or all")
    parser.add_argument("--optim", help="comma-separated, e.g. adamw,adafactor,adamw_8bit, or all")
    parser.add_argument("--num_processes", help="processes (GPUs) per run, e.g. 1,2")
    parser.add_argument("--per_device_train_batch_size", help="micro-batch sizes, e.g. 2,4")
    parser.add_argument("--gradient_accumulation_steps", help="accumulation steps, e.g. 1,8")
    parser.add_argument("--activation_checkpointing", help="false, true or false,true")
    parser.add_argument("--repeats", type=int, help="runs of each configuration, round by round (default 1); the "
                        "report shows their median and spread")
    parser.add_argument("--timeout", type=float, help="seconds before a run is killed and recorded as timeout (default 1800)")
    parser.add_argument("--out", help="sweep directory (default runs/sweep)")
    parser.add_argument("--retry_failed", action="store_true", help="rerun rows that ended OOM/fail/timeout/refused")
    parser.add_argument("--dry_run", action="store_true",
                        help="print each run's row or launch command, and stop: nothing launched or written")
    return parser


def parse_sweep(argv: list[str]) -> tuple[SweepSpec, object]:
    """The command line (and its --spec file) as a checked SweepSpec; HfscaleError for anything wrong."""
    argv, fixed = split_train_args(argv)
    refuse_renamed(argv)
    opts = build_parser().parse_args(argv)
    values = load_spec(opts.spec) if opts.spec else {}
    kinds = {"num_processes": int, "per_device_train_batch_size": int, "gradient_accumulation_steps": int,
             "activation_checkpointing": bool}
    for key in AXES:
        if getattr(opts, key) is not None:
            values[key] = comma_list(getattr(opts, key), f"--{key}", kinds.get(key, str))
    for key in ("timeout", "out", "repeats"):
        if getattr(opts, key) is not None:
            values[key] = getattr(opts, key)
    values["train_args"] = [*values.get("train_args", []), *fixed]
    try:
        spec = SweepSpec(**values)
    except TypeError as err:
        raise HfscaleError(f"bad sweep spec: {err}") from None
    check_training_flags(spec.train_args, appended=True)
    return spec, opts


def dry_run(spec: SweepSpec, retry_failed: bool) -> None:
    """What the sweep would do, run by run: the rows decided without a launch (already done; refused by the strategy
    table or by what one node's processes can run), and the launch command of every other one."""
    check_same_flags(expand(spec), Path(spec.out), spec.train_args, "sweep")
    for run in expand(spec):
        row = decided_without_launch(run, Path(spec.out), spec.train_args, retry_failed)
        if row is not None:
            print(f"  {row['status']:<8} {run.name}" + ("  (already done)" if row.get("skipped") else f"  {row['error']}"))
            continue
        command = strategy_launch([*run.train_args(spec.train_args), "--output_dir", str(Path(spec.out) / run.name)],
                                  run.num_processes)
        print(f"  launch   {run.name}\n    {shlex.join(command)}")
    print(f"dry run: {len(expand(spec))} runs; nothing launched or written")


def main(argv: list[str]) -> None:
    spec, opts = parse_sweep(argv)
    check_local_processes(max(spec.num_processes))  # every run starts on this node
    if opts.dry_run:
        return dry_run(spec, opts.retry_failed)
    check_writable_dir(spec.out, "--out")
    check_same_flags(expand(spec), Path(spec.out), spec.train_args, "sweep")
    with exclusive_dir(spec.out, "--out", "sweep"):  # a second sweep into it would record its runs over this one's
        rows = run_sweep(spec, retry_failed=opts.retry_failed)
    counts = {s: sum(r["status"] == s for r in rows) for s in (*STATUSES, STOPPED)}
    print(f"sweep {spec.out}: {len(rows)} runs · " + " · ".join(f"{n} {s}" for s, n in counts.items() if n))
    for row in rows:
        note = " (already done)" if row.get("skipped") else f"  {row['error']}" if row.get("error") else ""
        print(f"  {row['status']:<8} {row['run']}{note}")
    print(f"report: hfscale report {spec.out}")
