"""`hfscale tune`: the best configuration for a model and a GPU count, found by short real trials, handed back as
files that launch unchanged.

    hfscale tune --model gpt2-350m --gpus 8 --device A100-80GB --bf16 --global_batch_size 512 --out runs/tune \\
        -- --seq_len 1024 --max_steps 20

1. Enumerate strategy x optimizer x micro-batch x activation checkpointing (x accumulation = GBS / (MBS x GPUs)).
2. Drop, each with its reason, what the strategy table refuses and what the memory estimate says cannot fit.
3. Run a short trial of each of the rest through the sweep machinery (failures stay rows; a second call skips
   finished trials; `--time_budget` stops launching new ones).
4. Rank by measured tokens/s (= projected days to the token budget at this GPU count), mark the Pareto set of speed
   against peak memory, and write for the winner `best/accelerate_config.yaml`, `best/ds_config.json` (DeepSpeed
   strategies) and `best/launch.sh` - the exact command, usable as it is.
"""

import itertools
import json
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..compare.sweep import RunSpec, run_one
from ..errors import ArgumentParser, HfscaleError
from ..files import atomic_write_text, load_yaml
from ..launch import drop_flag
from ..formulas.memory import GB, rank_memory
from ..formulas.metrics import days_to_train
from ..launch import split_train_args
from ..run.results import read_results

TUNE_FILE = "tune.json"
AXES_SET_BY_TUNE = ("--strategy", "--optim", "--per_device_train_batch_size", "--gradient_accumulation_steps",
                    "--activation_checkpointing", "--output_dir", "--model", "--model_name_or_path", "--seq_len",
                    "--bf16", "--fp16")


@dataclass
class Candidate:
    run: RunSpec
    status: str  # planned | pruned | refused | ok | OOM | fail | timeout | skipped
    reason: str | None = None
    estimate_gb: float | None = None
    tokens_per_s: float | None = None
    days: float | None = None
    memory_gb: float | None = None
    pareto: bool = False


def build_parser() -> ArgumentParser:
    from .estimate import ATTENTION, add_model_flags

    p = ArgumentParser(prog="hfscale tune", allow_abbrev=False,
                       description="Short real trials of every configuration that fits; the winner as launch files. "
                                   "Training flags for every trial go after `--`.")
    add_model_flags(p)
    p.add_argument("--seq_len", type=int)
    p.add_argument("--gpus", type=int, default=None, help="processes per trial (default: every local GPU, or 2 on CPU)")
    p.add_argument("--strategies", default="all")
    p.add_argument("--optims", default="all")
    p.add_argument("--mbs", default="1,2,4,8", help="micro-batch sizes to try (default 1,2,4,8)")
    p.add_argument("--checkpointing", default="off,on", help="off, on or off,on (default)")
    p.add_argument("--global_batch_size", type=int, help="target samples per optimizer step (default: GAS 1)")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--attn_implementation", default="sdpa", help=f"for the memory estimate: {', '.join(ATTENTION)}")
    p.add_argument("--device", default="A100-80GB")
    p.add_argument("--device_memory_gb", type=float)
    p.add_argument("--token_budget", type=float, default=1e11)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per trial")
    p.add_argument("--time_budget", type=float, help="seconds for all trials; no new trial starts after it")
    p.add_argument("--out", type=Path, default=Path("runs/tune"))
    return p


def _csv(text: str, valid, flag: str) -> list[str]:
    names = list(valid) if text == "all" else [x.strip() for x in text.split(",") if x.strip()]
    for name in names:
        if name not in valid:
            from ..errors import one_of

            raise one_of(flag, name, [*valid, "all"])
    return names


def candidates(opts, fixed: list[str]) -> tuple[list[Candidate], object, int]:
    """Every configuration, pruned ones with their reason. Returns (candidates, shape, seq)."""
    from ..parallel.strategies import OPTIMIZERS, all_strategies, incompatibility, layout_refusal, memory_layout
    from ..run.models import resolve_seq_len
    from .estimate import check_attention, device_memory_bytes, model_shape

    shape = model_shape(opts)
    if opts.seq_len is not None and opts.seq_len <= 0:
        raise HfscaleError(f"--seq_len must be positive, got {opts.seq_len}")
    check_attention(opts.attn_implementation)
    seq = resolve_seq_len(shape, opts.seq_len)
    memory_per_gpu = device_memory_bytes(opts.device, opts.device_memory_gb)
    strategies = _csv(opts.strategies, all_strategies(), "strategy")
    optims = _csv(opts.optims, OPTIMIZERS, "optimizer")
    try:
        sizes = sorted({int(x) for x in opts.mbs.split(",")})
    except ValueError:
        raise HfscaleError(f"--mbs must be comma-separated integers, got {opts.mbs!r}") from None
    if not sizes or sizes[0] <= 0:
        raise HfscaleError(f"--mbs must be positive, got {opts.mbs!r}")
    table = {"on": True, "off": False}
    modes = [x.strip() for x in opts.checkpointing.split(",")]
    if not modes or any(m not in table for m in modes):
        raise HfscaleError(f"--checkpointing must be off, on or off,on; got {opts.checkpointing!r}")
    out = []
    for name, optim, mbs, ckpt in itertools.product(strategies, optims, sizes, [table[m] for m in modes]):
        gas = 1
        if opts.global_batch_size:
            if opts.global_batch_size % (mbs * opts.gpus):
                continue  # this micro-batch cannot make the global batch on this many GPUs
            gas = opts.global_batch_size // (mbs * opts.gpus)
        run = RunSpec(name, optim, opts.gpus, mbs, gas, ckpt)
        reason = incompatibility(name, optim) or layout_refusal(all_strategies()[name], opts.gpus, opts.gpus)
        if reason:  # trials run on this machine: one node
            out.append(Candidate(run, "refused", reason))
            continue
        mem = rank_memory(shape, memory_layout(all_strategies()[name], shape.hidden), optim=optim,
                          precision="bf16" if opts.bf16 else "fp32", ranks=opts.gpus, micro_batch=mbs, seq=seq,
                          checkpointing=ckpt, attention=opts.attn_implementation, grad_accum=gas)
        if mem.device_total > memory_per_gpu:
            out.append(Candidate(run, "pruned", f"estimate {mem.device_total / GB:.2f} GB > {memory_per_gpu / GB:g} GB "
                                 "per GPU", mem.device_total / GB))
            continue
        out.append(Candidate(run, "planned", None, mem.device_total / GB))
    if not out:
        raise HfscaleError(f"no micro-batch in --mbs {opts.mbs} divides --global_batch_size {opts.global_batch_size} "
                           f"over {opts.gpus} GPUs")
    return out, shape, seq


def measured(cand: Candidate, out: Path, budget: float) -> None:
    """Read a finished trial's results into the candidate."""
    path = out / "trials" / cand.run.name / "results.json"
    if not path.is_file():
        return
    res = read_results(path)
    cand.status = res.get("status", cand.status)
    cand.reason = res.get("error") if cand.status != "ok" else None
    if cand.status == "ok" and (res.get("perf") or {}).get("tokens_per_s"):
        cand.tokens_per_s = res["perf"]["tokens_per_s"]
        cand.days = days_to_train(budget, cand.tokens_per_s, cand.run.nproc)[0]
        mem = res.get("memory") or {}
        cand.memory_gb = mem.get("peak_allocated_gb", mem.get("peak_rss_gb"))


def mark_pareto(cands: list[Candidate]) -> None:
    """Speed against memory: a trial is on the front when no other is at least as fast and as lean, and better in one."""
    ok = [c for c in cands if c.status == "ok" and c.tokens_per_s and c.memory_gb is not None]
    for c in ok:
        c.pareto = not any(o is not c and o.tokens_per_s >= c.tokens_per_s and o.memory_gb <= c.memory_gb
                           and (o.tokens_per_s > c.tokens_per_s or o.memory_gb < c.memory_gb) for o in ok)


def write_winner(best: Candidate, out: Path, fixed: list[str], model_flags: list[str]) -> Path:
    """best/accelerate_config.yaml, best/ds_config.json (DeepSpeed), best/launch.sh: the winner, ready to launch."""
    import yaml

    from ..parallel.strategies import get_strategy

    strategy = get_strategy(best.run.strategy)
    folder = out / "best"
    config = load_yaml(strategy.accelerate_config_path)
    config["num_processes"] = best.run.nproc
    if strategy.deepspeed_config:
        ds = json.loads(strategy.deepspeed_config_path.read_text())
        atomic_write_text(folder / "ds_config.json", json.dumps(ds, indent=2) + "\n")
        config["deepspeed_config"] = {**config.get("deepspeed_config", {}),
                                      "deepspeed_config_file": str((folder / "ds_config.json").resolve())}
    header = (f"# hfscale tune winner: {best.run.name}, {best.tokens_per_s:,.0f} tokens/s measured over "
              f"{best.run.nproc} processes\n")
    atomic_write_text(folder / "accelerate_config.yaml", header + yaml.safe_dump(config, sort_keys=False))
    train_args = [*model_flags, *best.run.train_args(drop_flag(fixed, "--max_steps"))]  # the trials' length is not the run's
    from ..launch import TRAIN_SCRIPT

    command = ["accelerate", "launch", "--config_file", str((folder / "accelerate_config.yaml").resolve()),
               TRAIN_SCRIPT, *train_args]
    stock = (["# a stock transformers Trainer script takes the same files: accelerate launch --config_file "
              f"{folder / 'accelerate_config.yaml'} run_clm.py --deepspeed {folder / 'ds_config.json'} ..."]
             if strategy.deepspeed_config else [])
    atomic_write_text(folder / "launch.sh", "#!/usr/bin/env bash\n" + header + "\n".join(stock) + "\n"
                      + shlex.join(command) + ' "$@"\n')
    (folder / "launch.sh").chmod(0o755)
    return folder


def table(cands: list[Candidate]) -> str:
    lines = ["| rank | trial | status | tokens/s | days | memory GB (measured) | estimate GB | Pareto | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    ranked = sorted(cands, key=lambda c: (c.status != "ok", -(c.tokens_per_s or 0), c.run.name))
    for i, c in enumerate(ranked, 1):
        lines.append(f"| {i if c.status == 'ok' else ''} | {c.run.name} | {c.status} | "
                     f"{'' if c.tokens_per_s is None else f'{c.tokens_per_s:,.0f}'} | "
                     f"{'' if c.days is None else f'{c.days:,.1f}'} | "
                     f"{'' if c.memory_gb is None else f'{c.memory_gb:.2f}'} | "
                     f"{'' if c.estimate_gb is None else f'{c.estimate_gb:.2f}'} | {'*' if c.pareto else ''} | "
                     f"{(c.reason or '').replace('|', '/')[:120]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    from tqdm.auto import tqdm

    own, fixed = split_train_args(argv)
    opts = build_parser().parse_args(own)
    for flag in AXES_SET_BY_TUNE:
        if any(a == flag or a.startswith(flag + "=") for a in fixed):
            raise HfscaleError(f"{flag} is set by hfscale tune; remove it from the training flags after `--`")
    if opts.gpus is None:
        from ..launch import default_num_processes

        opts.gpus = default_num_processes()
    for name in ("gpus", "timeout", "time_budget", "token_budget", "global_batch_size"):
        value = getattr(opts, name)
        if value is not None and not 0 < value < float("inf"):
            raise HfscaleError(f"--{name} must be positive, got {value}")
    cands, shape, seq = candidates(opts, fixed)
    from .estimate import model_flags as training_model_flags

    model_flags = [*training_model_flags(opts), "--seq_len", str(seq), *(["--bf16"] if opts.bf16 else [])]
    trials_dir = opts.out / "trials"
    planned = [c for c in cands if c.status == "planned"]
    start = time.monotonic()
    bar = tqdm(planned, desc="tune", unit="trial")
    for cand in bar:
        bar.set_postfix_str(cand.run.name)
        if opts.time_budget and time.monotonic() - start > opts.time_budget:
            cand.status, cand.reason = "skipped", "time budget spent"
            continue
        run_one(cand.run, trials_dir, [*model_flags, *fixed], opts.timeout)
        measured(cand, opts.out, opts.token_budget)
    mark_pareto(cands)
    ok = sorted((c for c in cands if c.status == "ok"), key=lambda c: -c.tokens_per_s)
    text = table(cands)
    summary = {"model": opts.model, "gpus": opts.gpus, "seq_len": seq, "tried": len(planned),
               "pruned_by_estimate": sum(c.status == "pruned" for c in cands),
               "refused": sum(c.status == "refused" for c in cands), "seconds": round(time.monotonic() - start, 1),
               "candidates": [{**asdict(c), "run": c.run.name} for c in cands]}
    if ok:
        folder = write_winner(ok[0], opts.out, fixed, model_flags)
        summary["winner"] = ok[0].run.name
        text += f"\nwinner: {ok[0].run.name} ({ok[0].tokens_per_s:,.0f} tokens/s) -> {folder}/launch.sh\n"
    atomic_write_text(opts.out / TUNE_FILE, json.dumps(summary, indent=2) + "\n")
    atomic_write_text(opts.out / "tune.md", text)
    print(text)
    print(f"{summary['tried']} trials, {summary['pruned_by_estimate']} pruned by the memory estimate, "
          f"{summary['refused']} refused by the strategy table, {summary['seconds']} s")
    return 0 if ok else 1
