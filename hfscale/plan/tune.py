"""`hfscale tune`: the best configuration for a model and a GPU count, found by short real trials, handed back as
files that launch unchanged.

    hfscale tune --model gpt2-350m --seq_len 1024 --num_processes 8 --device A100-80GB --bf16 \
        --global_batch_size 512 --out runs/tune -- --max_steps 20

1. Enumerate strategy x optimizer x micro-batch x activation checkpointing (x accumulation = GBS / (MBS x GPUs)),
   each axis named as the training flag it sets, with comma-separated values.
2. Drop, each with its reason, what the strategy table refuses and what the memory estimate says cannot fit
   (the same verdict as `hfscale estimate` and `hfscale project`: plan/options.fit).
3. Run a short trial of each of the rest (launching.run_one: failures stay rows; a second call skips finished trials;
   `--time_budget` stops launching new ones).
   Megatron's 3D layouts (megatron, megatron-deepspeed) cannot be trialled: each is projected from the winning
   trial's throughput instead, a `projected` row beside the trials.
4. Rank by measured tokens/s (= projected days to the token budget at this GPU count), mark the Pareto set of speed
   against peak memory, and write for the winner `best/accelerate_config.yaml`, `best/ds_config.json` (DeepSpeed
   strategies) and `best/launch.sh` - the exact command, usable as it is. The trials whose speed is within the
   trials' own step-to-step noise of the winner's are named: one short trial each cannot order them.
"""

import itertools
import json
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from ..errors import ArgumentParser, HfscaleError
from ..files import atomic_write_text, check_writable_dir, exclusive_dir, load_yaml
from ..flags import (RENAMED, bool_flag, comma_list, drop_flag, flag_value, positive, refuse_renamed,
                     split_train_args)
from ..formulas.comm import Links
from ..formulas.float8 import FLOAT8_DEVICES, device_roofline, float8_step
from ..formulas.peaks import device_key
from ..formulas.precision import float8_device_refusal
from ..formulas.metrics import GB, days_to_train
from ..launching import (TRAIN_SCRIPT, RunSpec, check_same_flags, check_training_flags, default_num_processes,
                         refuse_run_file, run_one, start_up_refusal)
from ..parallel.distributed import check_local_processes, device_capability, on_accelerator
from ..parallel.strategies import get_strategy
from ..run.planning import FP16_NEEDS_GPU
from ..run.results import RESULTS_FILE, read_results
from ..runplan import accumulation_steps
from .baseline import step_noise_s
from .grid import GridOptions
from .options import (ATTENTION, add_model_flags, base_plan, check_attention, check_float8_recipe, device_memory_bytes,
                      fit, model_flags, optimizers_option, shape_from_options, strategies_and_families)

TUNE_FILE = "tune.json"
FLOAT8_SLOWER = "--fp8 does not pay here"  # a float8 trial pruned by the step model (float8_slower) says so first
AXES_SET_BY_TUNE = ("--strategy", "--optim", "--per_device_train_batch_size", "--gradient_accumulation_steps",
                    "--activation_checkpointing", "--output_dir", "--model", "--model_name_or_path", "--seq_len",
                    "--bf16", "--fp16", "--fused_linear_cross_entropy", "--fp8")


@dataclass
class Candidate:
    run: RunSpec
    status: str  # planned | pruned | refused | ok | untimed | OOM | fail | timeout | skipped | projected (a 3D layout)
    reason: str | None = None
    estimate_gb: float | None = None  # the plan's whole GPU (states, step, buffers, runtime): what prunes a trial
    tokens_per_s: float | None = None
    days: float | None = None
    memory_gb: float | None = None  # measured model states + step peak, the rank that holds the most
    memory_estimate_gb: float | None = None  # ... and the run's own estimate of the same
    pareto: bool = False
    noise: float = 0.0  # relative standard error of the measured speed (0: too few logging intervals to say)

    @property
    def slower_in_float8(self) -> bool:
        """Pruned because the float8 step model says --fp8 would be slower than bf16 (float8_slower)."""
        return (self.reason or "").startswith(FLOAT8_SLOWER)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="hfscale tune", allow_abbrev=False,
                       description="Short real trials of every configuration that fits; the winner as launch files. "
                                   "Training flags for every trial go after `--`.")
    add_model_flags(p)
    p.add_argument("--seq_len", type=int)
    p.add_argument("--num_processes", type=int, default=None,
                   help="processes per trial (default: every local GPU, or 2 on CPU)")
    p.add_argument("--strategy", default="all", help="comma-separated strategies, or all (default)")
    p.add_argument("--optim", default="all", help="comma-separated optimizers, or all (default)")
    p.add_argument("--per_device_train_batch_size", default="1,2,4,8", help="micro-batch sizes to try (default 1,2,4,8)")
    p.add_argument("--activation_checkpointing", default="false,true", help="false, true or false,true (default)")
    p.add_argument("--global_batch_size", type=int, help="target samples per optimizer step (default: GAS 1)")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fp16", action="store_true", help="GPUs only")
    p.add_argument("--fp8", default="auto", dest="fp8_axis",
                   help="float8 matmuls (--fp8, torchao): false, true or false,true; auto (default): false,true where "
                        "--device has float8 tensor cores, else false. A float8 trial the step model says would be "
                        "slower than bf16 is pruned (formulas/float8); --fp8_recipe after `--` picks the recipe")
    p.add_argument("--fused_linear_cross_entropy", action="store_true",
                   help="every trial computes its loss with the fused linear cross-entropy (and is estimated so)")
    p.add_argument("--attn_implementation", default="sdpa", help=f"for the memory estimate: {', '.join(ATTENTION)}")
    p.add_argument("--device", default="A100-80GB")
    p.add_argument("--device_memory_gb", type=float)
    p.add_argument("--token_budget", type=float, default=1e11)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per trial")
    p.add_argument("--time_budget", type=float, help="seconds for all trials; no new trial starts after it")
    p.add_argument("--out", type=Path, default=Path("runs/tune"))
    p.add_argument("--dry_run", action="store_true", help="print the trials it would run, and the pruned and refused "
                   "configurations with their reasons, and stop: nothing launched or written")
    return p


def candidates(opts, fixed: list[str]) -> tuple[list[Candidate], object, int]:
    """Every configuration, pruned ones with their reason. Returns (candidates, shape, seq)."""
    shape = shape_from_options(opts)
    positive(opts, "seq_len")
    check_attention(opts.attn_implementation)
    memory_per_gpu = device_memory_bytes(opts.device, opts.device_memory_gb)
    strategies, _ = strategies_and_families(opts.strategy, with_3d=True, timed=True)  # 3D layouts: projected after the trials
    optimizers = optimizers_option(opts.optim)
    sizes = sorted(set(comma_list(opts.per_device_train_batch_size, "--per_device_train_batch_size", int)))
    modes = comma_list(opts.activation_checkpointing, "--activation_checkpointing", bool)
    # the trials run here, on the route each run takes (--use_cpu among the training flags: the CPU, GPU or not)
    device_type = "cuda" if on_accelerator(bool_flag(fixed, "--use_cpu")) else "cpu"
    if opts.fp16 and device_type == "cpu":  # every trial would be refused by its own start-up check
        raise HfscaleError(FP16_NEEDS_GPU)
    recipe, fp8_modes, gpu = float8_axis(opts, fixed)
    out, seq = [], None
    for strategy, optimizer, mbs, ckpt, fp8 in itertools.product(strategies, optimizers, sizes, modes, fp8_modes):
        try:
            gas = (accumulation_steps(opts.global_batch_size, mbs, opts.num_processes) if opts.global_batch_size
                   else 1)
        except HfscaleError:
            continue  # this micro-batch cannot make the global batch on this many processes
        plan = base_plan(opts, strategy, optimizer, world_size=opts.num_processes,
                         processes_per_node=opts.num_processes, device_type=device_type,
                         per_device_train_batch_size=mbs, gradient_accumulation_steps=gas,
                         activation_checkpointing=ckpt, shape=shape,  # trials run on this machine: one node
                         float8=recipe if fp8 else None)
        seq = plan.seq_len
        run = RunSpec(strategy.name, optimizer.name, opts.num_processes, mbs, gas, ckpt, fp8=fp8)
        reason = plan.refusal() or (float8_trial_refusal(opts, fixed, device_type, gpu) if fp8 else None)
        if reason:
            out.append(Candidate(run, "refused", reason))
            continue
        verdict = fit(plan, memory_per_gpu)
        slower = float8_slower(plan, gpu) if fp8 else None
        out.append(Candidate(run, "planned" if verdict.fits and not slower else "pruned",
                             None if verdict.fits and not slower else slower or f"estimate: {verdict.reason}",
                             verdict.total_per_gpu / GB))
    if not out:
        raise HfscaleError(f"no micro-batch in --per_device_train_batch_size {opts.per_device_train_batch_size} divides "
                           f"--global_batch_size {opts.global_batch_size} over {opts.num_processes} processes")
    return out, shape, seq


def float8_axis(opts, fixed: list[str]) -> tuple[str, list[bool], object]:
    """(--fp8_recipe among the training flags, the --fp8 values to try, the --device's roofline or None)."""
    gpu = device_roofline(device_key(opts.device)) if opts.device else None
    recipe = check_float8_recipe(flag_value(fixed, "--fp8_recipe") or "tensorwise")
    if opts.fp8_axis == "auto":
        return recipe, [False, True] if gpu else [False], gpu
    return recipe, comma_list(opts.fp8_axis, "--fp8", bool), gpu


def float8_trial_refusal(opts, fixed: list[str], device_type: str, gpu) -> str | None:
    """Why a float8 trial cannot run: --device has no float8 tensor cores, or the trials run here on a CPU (unless
    --fp8_emulate: the code path, for tests)."""
    if gpu is None:
        return (f"--fp8: --device {opts.device} has no float8 tensor cores (float8 GPUs: "
                f"{', '.join(FLOAT8_DEVICES)})")
    on_cuda = device_type == "cuda"
    capability, name = device_capability() if on_cuda else (None, "cpu")
    return float8_device_refusal(on_cuda, capability, name, bool_flag(fixed, "--fp8_emulate"))


def float8_slower(plan, gpu) -> str | None:
    """Why a float8 trial is not worth running: the step model (formulas/float8) says it is slower than bf16."""
    step = float8_step(plan.shape, plan.seq_len, plan.per_device_train_batch_size, plan.float8, gpu)
    if step.pays:
        return None
    return (f"{FLOAT8_SLOWER}: compute x{step.compute_factor:.2f} of bf16 (its layers {step.layer_speedup:.2f}x "
            f"as fast at {plan.per_device_train_batch_size * plan.seq_len} tokens per matmul; formulas/float8)")


def pruned_by(cands: list[Candidate]) -> str:
    memory = sum(c.status == "pruned" and not c.slower_in_float8 for c in cands)
    slower = sum(c.status == "pruned" and c.slower_in_float8 for c in cands)
    return f"{memory} by the memory estimate" + (f", {slower} as float8 slower than bf16" if slower else "")


def check_something_runs(cands: list[Candidate], opts) -> None:
    """A tune with no trial to run is an impossible request, refused in one line before anything is written: every
    pair refused by the strategy table, or nothing that fits the device (the closest named)."""
    if any(c.status == "planned" for c in cands):
        return
    pruned = [c for c in cands if c.status == "pruned" and not c.slower_in_float8]
    slower = [c for c in cands if c.status == "pruned" and c.slower_in_float8]
    if slower and not pruned:
        raise HfscaleError(f"every trial left is float8, and slower than bf16 by its step model: {slower[0].run.name}: "
                           f"{slower[0].reason}; tune with --fp8 false,true or a larger micro-batch")
    if not pruned:
        raise HfscaleError(f"every configuration asked is refused by the strategy table: {cands[0].run.strategy} x "
                           f"{cands[0].run.optim}: {cands[0].reason}")
    closest = min(pruned, key=lambda c: c.estimate_gb)
    raise HfscaleError(f"nothing fits {opts.num_processes} process(es) here; the smallest is {closest.run.name}, "
                       f"{closest.reason}: try a larger --device or --device_memory_gb, more processes, or a smaller "
                       f"model")


def measured(cand: Candidate, out: Path, budget: float) -> None:
    """Read a finished trial's results into the candidate."""
    path = out / "trials" / cand.run.name / "results.json"
    if not path.is_file():
        return
    res = read_results(path)
    cand.status = res.status
    cand.reason = res.error if cand.status != "ok" else None
    if cand.status == "ok" and not res.perf.tokens_per_s:  # finished inside its untimed warm-up: nothing to rank
        why = " (ddp_powersgd's: its uncompressed warm-up)" if cand.run.strategy == "ddp_powersgd" else ""
        cand.status = "untimed"
        cand.reason = (f"no step timed after the {res.perf.warmup_steps} untimed{why}; give the trials more "
                       "--max_steps")
    if cand.status == "ok":
        cand.tokens_per_s = res.perf.tokens_per_s
        cand.days = days_to_train(budget, cand.tokens_per_s, cand.run.num_processes)[0]
        held = res.states_and_step()  # like for like: neither side counts the runtime or the interpreter
        cand.memory_gb = None if held.measured is None else held.measured / GB
        cand.memory_estimate_gb = None if held.estimated is None else held.estimated / GB
        cand.noise = relative_noise(res)


def relative_noise(res) -> float:
    """The relative standard error of a trial's speed: the per-step sd of its step time (from its logging intervals,
    plan/baseline.step_noise_s) over the square root of its timed steps, against its mean. Within one run: a floor
    under the run-to-run spread (a shared cluster's hour, a warm cache), which only repeated runs measure."""
    sd, s_per_iter, steps = step_noise_s([x for x in res.perf_history if x.get("s_per_iter")]), res.perf.s_per_iter, \
        res.perf.measured_steps
    return sd / s_per_iter / math.sqrt(steps) if sd and s_per_iter and steps else 0.0


def within_noise(ranked: list[Candidate]) -> list[Candidate]:
    """The trials after the winner (ranked[0]) slower by less than twice their combined standard error: within what the
    trials' own noise can tell apart."""
    best = ranked[0]
    return [c for c in ranked[1:]
            if best.tokens_per_s - c.tokens_per_s <= 2 * best.tokens_per_s * math.hypot(best.noise, c.noise)]


def projected_layouts(winner: Candidate, families: list[str], opts) -> list[Candidate]:
    """Megatron's 3D layouts beside the trials: hfscale cannot launch them, so each family's fastest layout that fits
    at the trials' process count is projected (plan/projection.project_grids) from the winning trial's measured
    throughput, at its global batch - a `projected` row, never the winner."""
    from .baseline import baseline_from_results
    from .links import DEFAULT_INTER_GB_S, DEFAULT_INTRA_GB_S
    from .projection import project_grids

    device_bytes = device_memory_bytes(opts.device, opts.device_memory_gb)
    base = baseline_from_results(opts.out / "trials" / winner.run.name / RESULTS_FILE, device_bytes)
    links = (Links(DEFAULT_INTRA_GB_S * GB, DEFAULT_INTER_GB_S * GB, collectives="nccl"),) * 3  # project's defaults
    recompute = "full" if base.plan.activation_checkpointing else "none"
    points = project_grids(base, families, [opts.num_processes], opts.num_processes, links, opts.token_budget,
                           base.plan.global_batch_size, GridOptions(recompute=recompute))
    out = []
    for p in points:
        run = RunSpec(f"{p.strategy}-{p.layout}", "adamw", opts.num_processes, base.plan.per_device_train_batch_size,
                      p.gradient_accumulation_steps, base.plan.activation_checkpointing)
        reason = (f"projected from {winner.run.name}'s throughput (docs/project.md, 3D layouts); hfscale cannot "
                  "launch a 3D layout" + ("" if p.fits is not False else f"; does not fit: {p.fit_reason}"))
        out.append(Candidate(run, "projected", reason, p.total_per_gpu / GB, p.tokens_per_s, p.days))
    return out


def mark_pareto(cands: list[Candidate]) -> None:
    """Speed against memory: a trial is on the front when no other is at least as fast and as lean, and better in one."""
    ok = [c for c in cands if c.status == "ok" and c.tokens_per_s and c.memory_gb is not None]
    for c in ok:
        c.pareto = not any(o is not c and o.tokens_per_s >= c.tokens_per_s and o.memory_gb <= c.memory_gb
                           and (o.tokens_per_s > c.tokens_per_s or o.memory_gb < c.memory_gb) for o in ok)


def write_winner(best: Candidate, out: Path, fixed: list[str], flags: list[str]) -> Path:
    """best/accelerate_config.yaml, best/ds_config.json (DeepSpeed), best/launch.sh: the winner, ready to launch."""
    strategy = get_strategy(best.run.strategy)
    folder = out / "best"
    config = load_yaml(strategy.accelerate_config_path)
    config["num_processes"] = best.run.num_processes
    if strategy.deepspeed_config:
        atomic_write_text(folder / "ds_config.json", json.dumps(strategy.deepspeed_settings(), indent=2) + "\n")
        config["deepspeed_config"] = {**config.get("deepspeed_config", {}),
                                      "deepspeed_config_file": str((folder / "ds_config.json").resolve())}
    header = (f"# hfscale tune winner: {best.run.name}, {best.tokens_per_s:,.0f} tokens/s measured over "
              f"{best.run.num_processes} processes\n")
    atomic_write_text(folder / "accelerate_config.yaml", header + yaml.safe_dump(config, sort_keys=False))
    train_args = [*flags, *best.run.train_args(drop_flag(fixed, "--max_steps"))]  # the trials' length is not the run's
    # the accelerate of the interpreter that wrote this: the script runs from a shell without the venv activated
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str((folder / "accelerate_config.yaml").resolve()), TRAIN_SCRIPT, *train_args]
    stock = (["# a stock transformers Trainer script takes the same files: accelerate launch --config_file "
              f"{folder / 'accelerate_config.yaml'} run_clm.py --deepspeed {folder / 'ds_config.json'} ..."]
             if strategy.deepspeed_config else [])
    atomic_write_text(folder / "launch.sh", "#!/usr/bin/env bash\n" + header + "\n".join(stock) + "\n"
                      + shlex.join(command) + ' "$@"\n')
    (folder / "launch.sh").chmod(0o755)
    return folder


def table(cands: list[Candidate]) -> str:
    lines = ["| rank | trial | status | tokens/s | days | states + step GB (estimated / measured) | "
             "whole GPU GB (estimated) | Pareto | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    ranked = sorted(cands, key=lambda c: (c.status != "ok", -(c.tokens_per_s or 0), c.run.name))

    def gb(x):
        return "" if x is None else f"{x:.2f}"

    for i, c in enumerate(ranked, 1):
        held = "" if c.memory_gb is None and c.memory_estimate_gb is None else \
            f"{gb(c.memory_estimate_gb) or 'n/a'} / {gb(c.memory_gb) or 'n/a'}"
        lines.append(f"| {i if c.status == 'ok' else ''} | {c.run.name} | {c.status} | "
                     f"{'' if c.tokens_per_s is None else f'{c.tokens_per_s:,.0f}'} | "
                     f"{'' if c.days is None else f'{c.days:,.1f}'} | {held} | "
                     f"{gb(c.estimate_gb)} | {'*' if c.pareto else ''} | "
                     f"{(c.reason or '').replace('|', '/')[:120]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    own, fixed = split_train_args(argv)
    refuse_renamed(own, {**RENAMED, "--gpus": "--num_processes"})  # tune's trials run here: processes, not GPUs
    opts = build_parser().parse_args(own)
    for flag in AXES_SET_BY_TUNE:
        if any(a == flag or a.startswith(flag + "=") for a in fixed):
            raise HfscaleError(f"{flag} is set by hfscale tune; remove it from the training flags after `--`")
    refuse_run_file(fixed)
    check_training_flags([*model_flags(opts), *fixed])
    dropout = flag_value(fixed, "--dropout")  # the trials' model drops out: their estimates count its masks
    opts.dropout = None if dropout is None else float(dropout)
    if opts.num_processes is None:
        opts.num_processes = default_num_processes()
    positive(opts, "num_processes", "timeout", "time_budget", "token_budget", "global_batch_size")
    check_local_processes(opts.num_processes)  # the trials run on this node
    if opts.dry_run:
        return dry_run(opts, fixed)
    check_writable_dir(opts.out, "--out")
    with exclusive_dir(opts.out, "--out", "tune"):  # a second tune into it would record its trials over this one's
        return tune(opts, fixed)


def dry_run(opts, fixed: list[str]) -> int:
    """The candidates as a tune would plan them (the trials, the ones the estimate prunes, the ones the strategy table
    refuses, each with its estimate or reason), printed; nothing launched or written."""
    cands, _, _ = candidates(opts, fixed)
    check_something_runs(cands, opts)
    print(table(cands), end="")
    counts = {status: sum(c.status == status for c in cands) for status in ("planned", "pruned", "refused")}
    print(f"dry run: {counts['planned']} trials would run, {counts['pruned']} pruned ({pruned_by(cands)}), "
          f"{counts['refused']} refused by the strategy table; nothing launched or written")
    return 0


def tune(opts, fixed: list[str]) -> int:
    """Plan the candidates, run the ones the estimate lets through, rank them, hand back the winner."""
    cands, shape, seq = candidates(opts, fixed)
    check_something_runs(cands, opts)
    flags = [*model_flags(opts), "--seq_len", str(seq), *(["--bf16"] if opts.bf16 else []),
             *(["--fp16"] if opts.fp16 else []),
             *(["--fused_linear_cross_entropy"] if opts.fused_linear_cross_entropy else [])]
    trials_dir = opts.out / "trials"
    planned = [c for c in cands if c.status == "planned"]
    for cand in planned:  # what each trial's own start-up would refuse on this machine (its host's RAM, its layout)
        cand.reason = start_up_refusal(cand.run.train_args([*flags, *fixed]), cand.run.num_processes)[1]
        cand.status = "refused" if cand.reason else "planned"
    if planned and all(c.status == "refused" for c in planned):
        raise HfscaleError(f"every trial would be refused as it starts on this machine: {planned[0].run.name}: "
                           f"{planned[0].reason}")
    planned = [c for c in planned if c.status == "planned"]
    check_same_flags([c.run for c in planned], trials_dir, [*flags, *fixed], "tune")
    start = time.monotonic()
    bar = tqdm(planned, desc="tune", unit="trial")
    for cand in bar:
        bar.set_postfix_str(cand.run.name)
        if opts.time_budget and time.monotonic() - start > opts.time_budget:
            cand.status, cand.reason = "skipped", "time budget spent"
            continue
        run_one(cand.run, trials_dir, [*flags, *fixed], opts.timeout)
        measured(cand, opts.out, opts.token_budget)
    mark_pareto(cands)
    ok = sorted((c for c in cands if c.status == "ok"), key=lambda c: -c.tokens_per_s)
    families = strategies_and_families(opts.strategy, with_3d=True, timed=True)[1]
    if families and ok:
        cands += projected_layouts(ok[0], families, opts)
    text = table(cands)
    summary = {"model": opts.model, "num_processes": opts.num_processes, "seq_len": seq, "tried": len(planned),
               "pruned_by_estimate": sum(c.status == "pruned" and not c.slower_in_float8 for c in cands),
               "pruned_float8": sum(c.status == "pruned" and c.slower_in_float8 for c in cands),
               "refused": sum(c.status == "refused" for c in cands), "seconds": round(time.monotonic() - start, 1),
               "candidates": [{**asdict(c), "run": c.run.name} for c in cands]}
    if ok:
        folder = write_winner(ok[0], opts.out, fixed, flags)
        close = within_noise(ok)
        summary["winner"], summary["within_noise"] = ok[0].run.name, [c.run.name for c in close]
        text += f"\nwinner: {ok[0].run.name} ({ok[0].tokens_per_s:,.0f} tokens/s) -> {folder}/launch.sh\n"
        if close:
            text += ("within the trials' noise of it (one short trial each cannot order them; `hfscale sweep --repeats 3` "
                     "can): " + ", ".join(f"{c.run.name} ({c.tokens_per_s:,.0f})" for c in close) + "\n")
    atomic_write_text(opts.out / TUNE_FILE, json.dumps(summary, indent=2) + "\n")
    atomic_write_text(opts.out / "tune.md", text)
    print(text)
    print(f"{summary['tried']} trials, {summary['pruned_by_estimate'] + summary['pruned_float8']} pruned "
          f"({pruned_by(cands)}), "
          f"{summary['refused']} refused (by the strategy table, or as they would start here), "
          f"{summary['seconds']} s")
    return 0 if ok else 1
