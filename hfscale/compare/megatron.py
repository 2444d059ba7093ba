"""`hfscale import-logs FILES...`: Megatron-LM / Megatron-DeepSpeed training logs as rows of hfscale's report.

A log's iteration lines look like
    iteration      200/  292968 | ... | elapsed time per iteration (ms): 61236.4 | ... | global batch size:   512 |
    lm loss: 6.527E+00 | ...
Sizes come from BigScience-style file names (`61B-megatron-mbs-2-pp16-dp-1-gas-512-200977.out`: model size, MBS,
PP, DP, GAS, job id; TP as `tp-4` when present) or from flags. The iteration time is averaged over the logged
iterations after the first `--skip_first` (the first interval includes start-up and compilation); TFLOPs per GPU use
the BigScience formula, the only one a log allows. A log with no iteration line becomes a `fail` row (`OOM` when
the log says it ran out of memory).
"""

import re
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError
from ..formulas.metrics import bigscience_tflops_per_gpu, days_to_train, size_label
from ..run.results import write_results

ITERATION_TIME = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+(?:[eE][+-]?\d+)?)")
ITERATION = re.compile(r"iteration\s+(\d+)\s*/")
GLOBAL_BATCH = re.compile(r"global batch size:\s*(\d+)")
LM_LOSS = re.compile(r"lm loss:\s*([0-9.]+(?:[eE][+-]?\d+)?)")
NAME_FIELDS = {key: re.compile(rf"(?:^|[-_]){key}[-_]?(\d+)(?=[-_.]|$)", re.IGNORECASE) for key in ("mbs", "gas", "pp", "dp", "tp")}
NAME_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([MBT])(\d*)", re.IGNORECASE)
UNITS = {"M": 1e6, "B": 1e9, "T": 1e12}


def parse_name(name: str) -> dict:
    """Sizes in a BigScience log name: '61B-megatron-mbs-2-pp16-dp-1-gas-512-200977.out' -> params 61e9, mbs 2, ..."""
    fields = {key: int(m.group(1)) for key, rx in NAME_FIELDS.items() if (m := rx.search(name))}
    size = NAME_SIZE.match(name)
    if size:  # "61B", "1.3B", and BigScience's "1B3" (= 1.3B)
        whole, unit, decimals = size.groups()
        fields["params"] = int(float(f"{whole}.{decimals}" if decimals else whole) * UNITS[unit.upper()])
        fields["size"] = size.group(0)
    return fields


def parse_log(text: str) -> dict:
    from ..launch import OOM_MARKERS

    times, losses, gbs = [], [], None
    oom = next((line.strip() for line in text.splitlines() if any(m in line for m in OOM_MARKERS)), None)
    for line in text.splitlines():
        match = ITERATION_TIME.search(line)
        if not match:
            continue
        times.append(float(match.group(1)) / 1000.0)
        step, loss, batch = ITERATION.search(line), LM_LOSS.search(line), GLOBAL_BATCH.search(line)
        if batch:
            gbs = int(batch.group(1))
        if step and loss:
            losses.append({"step": int(step.group(1)), "loss": float(loss.group(1)), "grad_norm": None, "lr": None})
    return {"iteration_s": times, "loss_history": losses, "global_batch_size": gbs, "oom": oom}


def import_log(path: Path, *, gpus: int | None, seq_len: int, params: float | None, checkpointing: bool,
               skip_first: int, token_budget: float = 1e11) -> dict:
    """One results record (same schema as a training run's, `source: megatron-log`)."""
    path = Path(path)
    if not path.is_file():
        raise HfscaleError(f"{path}: log file not found")
    name = parse_name(path.name)
    log = parse_log(path.read_text(errors="replace"))
    n_params = int(params) if params else name.get("params")
    if not n_params:
        raise HfscaleError(f"{path.name}: no model size in the file name (like '61B-...'); pass --params")
    tp, pp, dp = name.get("tp", 1), name.get("pp", 1), name.get("dp")
    world = gpus or (tp * pp * dp if dp else None)
    if not world:
        raise HfscaleError(f"{path.name}: no DP in the file name (like '-dp-4-'); pass --gpus")
    if dp is None:
        if world % (tp * pp):
            raise HfscaleError(f"{path.name}: --gpus {world} is not a multiple of TP x PP = {tp * pp}")
        dp = world // (tp * pp)
    mbs, gas = name.get("mbs"), name.get("gas")
    gbs = log["global_batch_size"] or (mbs * gas * dp if mbs and gas else None)
    record = {
        "source": "megatron-log", "log_file": str(path.resolve()), "run_name": path.stem,
        "strategy": f"megatron-tp{tp}-pp{pp}", "optim": "?",
        "model": {"name": name.get("size") or size_label(n_params), "params_model": n_params},
        "config": {"world_size": world, "dp": dp, "tp": tp, "pp": pp, "micro_batch_size": mbs, "grad_accum": gas,
                   "global_batch_size": gbs, "seq_len": seq_len, "checkpointing": checkpointing,
                   "token_budget": token_budget},
        "memory": {}, "loss_history": log["loss_history"], "checkpoints": [],
    }
    measured = log["iteration_s"][skip_first:] if len(log["iteration_s"]) > skip_first else log["iteration_s"]
    if not measured:
        if log["oom"]:
            return {**record, "status": "OOM", "error": log["oom"][:300], "perf": {}}
        return {**record, "status": "fail", "error": "no 'elapsed time per iteration' line in the log", "perf": {}}
    if not gbs:
        raise HfscaleError(f"{path.name}: no global batch size in the log or MBS/GAS in the name; rename or pass them")
    s_per_iter = sum(measured) / len(measured)
    tokens_per_s = gbs * seq_len / s_per_iter
    days, gpu_days = days_to_train(token_budget, tokens_per_s, world)
    perf = {"s_per_iter": s_per_iter, "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s / world,
            "samples_per_s": gbs / s_per_iter,
            "tflops_per_gpu_bigscience": bigscience_tflops_per_gpu(n_params, seq_len, gbs, s_per_iter, world, checkpointing),
            "days_to_budget": days, "gpu_days_to_budget": gpu_days, "iterations_averaged": len(measured),
            "iterations_skipped": len(log["iteration_s"]) - len(measured)}
    return {**record, "status": "ok", "error": None, "perf": perf}


def main(argv: list[str]) -> None:
    parser = ArgumentParser(prog="hfscale import-logs", description="Turn Megatron-LM/Megatron-DeepSpeed logs into "
                            "report rows (one results.json per log under --out).")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("runs/megatron"), help="default runs/megatron")
    parser.add_argument("--gpus", type=int, help="total GPUs (default TP x PP x DP from the file name)")
    parser.add_argument("--seq_len", type=int, default=2048, help="sequence length (default 2048)")
    parser.add_argument("--params", type=float, help="model parameters (default: the size in the file name)")
    parser.add_argument("--no_checkpointing", action="store_true",
                        help="the runs did not recompute activations (F = 3 instead of 4 in the TFLOPs formula)")
    parser.add_argument("--skip_first", type=int, default=1, help="logged iterations left out of the average (default 1)")
    opts = parser.parse_args(argv)
    for name, value in (("--gpus", opts.gpus), ("--seq_len", opts.seq_len), ("--params", opts.params)):
        if value is not None and value <= 0:
            raise HfscaleError(f"{name} must be positive, got {value}")
    if opts.skip_first < 0:
        raise HfscaleError(f"--skip_first must be >= 0, got {opts.skip_first}")
    records = [import_log(f, gpus=opts.gpus, seq_len=opts.seq_len, params=opts.params,
                          checkpointing=not opts.no_checkpointing, skip_first=opts.skip_first) for f in opts.files]
    from .report import collect, markdown_table

    dirs = []
    for record in records:  # all parsed before anything is written: a bad file leaves nothing half-imported
        run_dir = opts.out / record["run_name"]
        write_results(run_dir, record)
        dirs.append(run_dir)
    print(markdown_table(collect(dirs)))
    print(f"imported {len(records)} log(s) into {opts.out}; `hfscale report {opts.out} runs/...` puts them beside hfscale runs")
