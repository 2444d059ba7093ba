"""`hfscale sweep`: the cross product of strategies x optimizers x processes x micro-batch x accumulation x
checkpointing, each run launched through `accelerate launch` into its own directory. Failures are rows.

    hfscale sweep --strategies ddp,zero2,zero3 --optims adamw,adafactor --nprocs 2 --out runs/sweep1 \\
        -- --model tiny --max_steps 10 --seq_len 64
    hfscale sweep --spec sweep.yaml

A run that already has a final status in its results file is skipped, so an interrupted sweep started again
goes on where it stopped (`--retry_failed` reruns the non-ok ones). Pairs the strategy table refuses are recorded
as `refused` rows without launching anything.
"""

import argparse
import itertools
import json
import shlex
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError, one_of
from ..launch import STATUSES, flag_value, run_training, split_train_args
from ..files import atomic_write_text
from ..run.results import RESULTS_FILE, read_results, write_results

SWEEP_FILE = "sweep.json"


@dataclass
class SweepSpec:
    strategies: list[str] = field(default_factory=lambda: ["ddp"])
    optims: list[str] = field(default_factory=lambda: ["adamw"])
    nprocs: list[int] = field(default_factory=lambda: [2])
    micro_batch_sizes: list[int] = field(default_factory=lambda: [4])
    grad_accum: list[int] = field(default_factory=lambda: [1])
    checkpointing: list[bool] = field(default_factory=lambda: [False])
    train_args: list[str] = field(default_factory=list)  # fixed Trainer/hfscale flags for every run
    timeout: float = 1800.0  # seconds per run
    out: str = "runs/sweep"

    def __post_init__(self):
        from ..parallel.strategies import OPTIMIZERS, all_strategies

        for name in self.strategies:
            if name not in all_strategies():
                raise one_of("strategy", name, all_strategies())
        for name in self.optims:
            if name not in OPTIMIZERS:
                raise one_of("optimizer", name, OPTIMIZERS)
        for axis in ("nprocs", "micro_batch_sizes", "grad_accum"):
            values = getattr(self, axis)
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values):
                raise HfscaleError(f"sweep {axis} must be a list of positive integers, got {values!r}")
        if not self.checkpointing or any(not isinstance(v, bool) for v in self.checkpointing):
            raise HfscaleError(f"sweep checkpointing must be a list of true/false, got {self.checkpointing!r}")
        if not 0 < self.timeout < float("inf"):  # NaN fails this too
            raise HfscaleError(f"sweep timeout must be positive seconds, got {self.timeout}")
        for flag in ("--strategy", "--optim", "--output_dir", "--per_device_train_batch_size",
                     "--gradient_accumulation_steps", "--activation_checkpointing", "--gradient_checkpointing"):
            if flag in self.train_args:
                raise HfscaleError(f"{flag} is a sweep axis; set it in the sweep spec, not in the fixed train args")


@dataclass(frozen=True)
class RunSpec:
    strategy: str
    optim: str
    nproc: int
    micro_batch: int
    grad_accum: int
    checkpointing: bool

    @property
    def name(self) -> str:
        return (f"{self.strategy}-{self.optim}-np{self.nproc}-mbs{self.micro_batch}-gas{self.grad_accum}"
                + ("-ac" if self.checkpointing else ""))

    def train_args(self, fixed: list[str]) -> list[str]:
        return ["--strategy", self.strategy, "--optim", self.optim, "--per_device_train_batch_size", str(self.micro_batch),
                "--gradient_accumulation_steps", str(self.grad_accum),
                *(["--activation_checkpointing", "true"] if self.checkpointing else []), *fixed]


def expand(spec: SweepSpec) -> list[RunSpec]:
    return [RunSpec(*combo) for combo in itertools.product(spec.strategies, spec.optims, spec.nprocs,
                                                           spec.micro_batch_sizes, spec.grad_accum, spec.checkpointing)]


def load_spec(path: Path) -> dict:
    from ..files import load_yaml

    if not Path(path).is_file():
        raise HfscaleError(f"sweep spec {path}: file not found")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise HfscaleError(f"sweep spec {path}: expected a mapping of sweep axes")
    valid = [f.name for f in fields(SweepSpec)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise HfscaleError(f"sweep spec {path}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    for key in ("strategies", "optims", "nprocs", "micro_batch_sizes", "grad_accum", "checkpointing"):
        if key in data and not isinstance(data[key], list):
            data[key] = [data[key]]
    for key in ("strategies", "optims"):
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
    if "timeout" in data and (isinstance(data["timeout"], bool) or not isinstance(data["timeout"], (int, float))):
        raise HfscaleError(f"sweep spec {path}: timeout must be seconds, got {data['timeout']!r}")
    if "out" in data and not isinstance(data["out"], str):
        raise HfscaleError(f"sweep spec {path}: out must be a directory path, got {data['out']!r}")
    return data


def stub_results(run: RunSpec, status: str, error: str | None, fixed: list[str]) -> dict:
    """The row of a run that never wrote a results file (refused up front, or died before training)."""
    return {"status": status, "error": error, "run_name": run.name, "strategy": run.strategy, "optim": run.optim,
            "model": {"name": flag_value(fixed, "--model") or "tiny", "params_model": planned_params(fixed)},
            "config": {"world_size": run.nproc, "micro_batch_size": run.micro_batch, "grad_accum": run.grad_accum,
                       "global_batch_size": run.nproc * run.micro_batch * run.grad_accum,
                       "checkpointing": run.checkpointing},
            "perf": {}, "memory": {}, "loss_history": []}


def planned_params(fixed: list[str]) -> int | None:
    """The parameter count (formula) of the model the fixed args ask for, so a row that never ran still has a Size;
    None for a pretrained checkpoint or args that do not describe a model."""
    from ..formulas.metrics import param_count
    from ..run.models import resolve_shape

    if flag_value(fixed, "--model_name_or_path"):
        return None
    sizes = [flag_value(fixed, f) for f in ("--n_layer", "--hidden_size", "--n_head", "--ffn_hidden_size", "--vocab_size")]
    try:
        return param_count(resolve_shape(flag_value(fixed, "--model") or "tiny", *[int(v) if v else None for v in sizes]))
    except (HfscaleError, ValueError):
        return None


def finished_status(run_dir: Path) -> str | None:
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        return None
    try:
        status = read_results(path).get("status")
    except (json.JSONDecodeError, OSError):
        return None
    return status if status in STATUSES else None


def record_outcome(run: RunSpec, run_dir: Path, status: str, error: str | None, log_tail: str, seconds: float,
                   fixed: list[str]) -> None:
    """Make the run's results file say how it ended (keeping everything the run itself recorded)."""
    path = run_dir / RESULTS_FILE
    try:
        results = read_results(path) if path.is_file() else stub_results(run, status, error, fixed)
    except json.JSONDecodeError:
        results = stub_results(run, status, error, fixed)
    results.pop("schema_version", None)
    if results.get("status") != "ok" or status != "ok":
        results.update(status=status, error=error, log_tail=log_tail if status != "ok" else None)
    results["sweep"] = {"wall_s": round(seconds, 2), "nproc": run.nproc}
    write_results(run_dir, results)


def run_one(run: RunSpec, out: Path, fixed: list[str], timeout: float, retry_failed: bool = False) -> dict:
    """One run of a sweep (or of `hfscale tune`) into out/<run name>: skipped when it already has a final status,
    refused without launching when the strategy table refuses the pair, else launched and its outcome recorded."""
    from ..parallel.strategies import check_pair

    run_dir = out / run.name
    done = finished_status(run_dir)
    if done and not (retry_failed and done != "ok"):
        return {"run": run.name, "status": done, "skipped": True}
    try:
        check_pair(run.strategy, run.optim)
    except HfscaleError as err:
        write_results(run_dir, stub_results(run, "refused", str(err), fixed))
        return {"run": run.name, "status": "refused", "error": str(err)}
    outcome = run_training(run.train_args(fixed), run_dir, run.nproc, timeout)
    record_outcome(run, run_dir, outcome.status, outcome.error, outcome.log_tail, outcome.seconds, fixed)
    return {"run": run.name, "status": outcome.status, "error": outcome.error, "wall_s": round(outcome.seconds, 1)}


def run_sweep(spec: SweepSpec, retry_failed: bool = False, progress: bool = True) -> list[dict]:
    from tqdm.auto import tqdm

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


def _csv(kind):
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if kind is bool:
            table = {"on": True, "true": True, "yes": True, "off": False, "false": False, "no": False}
            bad = [t for t in items if t.lower() not in table]
            if bad:
                raise argparse.ArgumentTypeError(f"expected on/off values, got {', '.join(bad)}")
            return [table[t.lower()] for t in items]
        if kind is int:
            try:
                return [int(t) for t in items]
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        return items
    return parse


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hfscale sweep", description="Run strategies x optimizers x processes x MBS x GAS x checkpointing; "
        "failures (OOM, fail, timeout, refused) are rows. Trainer flags for every run go after `--`.")
    parser.add_argument("--spec", type=Path, help="YAML file with the keys below (command-line flags override it)")
    parser.add_argument("--strategies", type=_csv(str), help="comma-separated, e.g. ddp,zero2,zero3")
    parser.add_argument("--optims", type=_csv(str), help="comma-separated, e.g. adamw,adafactor,adamw_8bit")
    parser.add_argument("--nprocs", type=_csv(int), help="processes (GPUs) per run, e.g. 1,2")
    parser.add_argument("--micro_batch_sizes", "--mbs", type=_csv(int), help="per-device micro-batch sizes")
    parser.add_argument("--grad_accum", "--gas", type=_csv(int), help="gradient accumulation steps")
    parser.add_argument("--checkpointing", type=_csv(bool), help="activation checkpointing: off, on or off,on")
    parser.add_argument("--timeout", type=float, help="seconds before a run is killed and recorded as timeout (default 1800)")
    parser.add_argument("--out", help="sweep directory (default runs/sweep)")
    parser.add_argument("--retry_failed", action="store_true", help="rerun rows that ended OOM/fail/timeout/refused")
    return parser


def parse_sweep(argv: list[str]) -> tuple[SweepSpec, argparse.Namespace]:
    """The command line (and its --spec file) as a checked SweepSpec; HfscaleError for anything wrong."""
    argv, fixed = split_train_args(argv)
    opts = build_parser().parse_args(argv)
    values = load_spec(opts.spec) if opts.spec else {}
    for key in ("strategies", "optims", "nprocs", "micro_batch_sizes", "grad_accum", "checkpointing", "timeout", "out"):
        if getattr(opts, key) is not None:
            values[key] = getattr(opts, key)
    values["train_args"] = [*values.get("train_args", []), *fixed]
    try:
        return SweepSpec(**values), opts
    except TypeError as err:
        raise HfscaleError(f"bad sweep spec: {err}") from None


def main(argv: list[str]) -> None:
    spec, opts = parse_sweep(argv)
    rows = run_sweep(spec, retry_failed=opts.retry_failed)
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    print(f"sweep {spec.out}: {len(rows)} runs · " + " · ".join(f"{n} {s}" for s, n in counts.items() if n))
    for row in rows:
        note = " (already done)" if row.get("skipped") else f"  {row['error']}" if row.get("error") else ""
        print(f"  {row['status']:<8} {row['run']}{note}")
    print(f"report: hfscale report {spec.out}")
