"""`hfscale parity`: do the strategies train the same model? Each strategy's loss and grad-norm curves (and final
weights) against the `ddp` reference, same data, seed and precision, for N steps.

    hfscale parity --strategy zero1,zero2,zero3,fsdp --max_steps 20 --num_processes 2 -- --model tiny --seq_len 64

Fairness: every run builds the model in fp32 from the same seed (so FSDP, which keeps parameters in the load
dtype, and DeepSpeed, which keeps fp32 master weights, start from the same fp32 weights), uses dropout 0 (masks
would differ per rank layout), logs every step and gathers the full final weights. Exact strategies are judged
against the tolerance; lossy ones (PowerSGD, 8-bit Adam, Adafactor under DeepSpeed's flat partitions) are reported
with why they differ and judged only against --lossy_tolerance when given. A failing exact strategy is a bug, not a
tolerance to widen. A strategy x optimizer pair that cannot run is refused before anything is launched.
"""

import json
import math
import shlex
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError
from ..files import atomic_write_text, check_writable_dir, exclusive_dir
from ..flags import comma_list, flag_value, positive, refuse_renamed, split_train_args
from ..launching import check_training_flags, finished_status, run_training, start_up_refusal, strategy_launch
from ..parallel.distributed import check_local_processes
from ..parallel.optimizers import get_optimizer
from ..parallel.strategies import all_strategies
from ..run.results import Results, read_results

REFERENCE = "ddp"
EXPECTED = {
    "ddp": "the reference: gradients all-reduced (averaged) across ranks every step",
    "ddp_powersgd": "lossy by design: after warm-up, gradients are all-reduced as rank-r PowerSGD factors with error feedback",
    "fsdp": "exact: gradients reduce-scattered, parameters sharded in the load dtype (fp32 here); only the summation order differs",
    "fsdp_offload": "exact: as fsdp, with parameters and the optimizer step on the CPU",
    "zero1": "exact: DeepSpeed keeps fp32 master weights and shards optimizer states; only bucketing/summation order differs",
    "zero2": "exact: as zero1, gradients reduce-scattered too",
    "zero2_offload": "exact up to DeepSpeed's CPU Adam (its own fused kernel; same maths, different rounding)",
    "zero3": "exact: parameters sharded and gathered per layer; only summation order differs",
    "zero3_offload": "exact up to DeepSpeed's CPU Adam (its own fused kernel; same maths, different rounding)",
}
LOSSY_STRATEGIES = {"ddp_powersgd"}  # lossy optimizers say so in their registry entry (parallel/optimizers.py)


@dataclass
class Comparison:
    strategy: str
    status: str  # the run's status
    steps: int
    loss_max_rel: float | None
    grad_norm_max_rel: float | None
    weights_max_rel: float | None
    lossy: bool
    verdict: str  # pass | FAIL | info | error
    explanation: str


def max_rel(a: list[float], b: list[float]) -> float:
    """max |a - b| / max(|b|, tiny): the relative deviation from the reference b, elementwise."""
    if len(a) != len(b):
        raise ValueError(f"curves of different lengths ({len(a)} vs {len(b)})")
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=0.0)


def weights_deviation(ref: dict | None, other: dict | None) -> float | None:
    """Worst relative difference of the final-weight fingerprints {name: [sum, L1, L2]}. A sum can be ~0 (biases),
    so its difference is measured against the tensor's magnitude (L1); a missing or extra tensor is infinite."""
    if not ref or not other:
        return None
    if set(ref) != set(other):
        return math.inf
    worst = 0.0
    for name, (ref_sum, ref_l1, ref_l2) in ref.items():
        total, l1, l2 = other[name]
        scale = max(ref_l1, 1e-12)
        worst = max(worst, abs(total - ref_sum) / scale, abs(l1 - ref_l1) / scale, abs(l2 - ref_l2) / max(ref_l2, 1e-12))
    return worst


def curve(results: Results, key: str) -> list[float]:
    return [p[key] for p in results.loss_history if p.get(key) is not None]


def compare(reference: Results, run: Results, strategy: str, optim: str, tolerance: float,
            lossy_tolerance: float | None) -> Comparison:
    lossy_reason = get_optimizer(optim).lossy_for(all_strategies()[strategy].engine)
    lossy = strategy in LOSSY_STRATEGIES or lossy_reason is not None
    explanation = "; ".join(x for x in (EXPECTED.get(strategy, ""), lossy_reason and f"with {optim}: {lossy_reason}")
                            if x)
    if run.status != "ok":
        return Comparison(strategy, run.status, 0, None, None, None, lossy, "error",
                          f"run did not finish: {run.error}")
    ref_loss, loss = curve(reference, "loss"), curve(run, "loss")
    if not ref_loss or len(loss) != len(ref_loss):
        return Comparison(strategy, "ok", len(loss), None, None, None, lossy, "error",
                          f"{len(loss)} logged losses vs {len(ref_loss)} for ddp: log every step (--logging_steps 1)")
    loss_dev = max_rel(loss, ref_loss)
    ref_gn, gn = curve(reference, "grad_norm"), curve(run, "grad_norm")
    gn_dev = max_rel(gn, ref_gn) if gn and len(gn) == len(ref_gn) else None
    weights_dev = weights_deviation(reference.final_weights, run.final_weights)
    deviations = [d for d in (loss_dev, gn_dev, weights_dev) if d is not None and not math.isnan(d)]
    worst = max(deviations) if deviations else float("nan")
    limit = lossy_tolerance if lossy else tolerance
    if lossy and lossy_tolerance is None:
        verdict = "info"
    else:
        verdict = "pass" if worst <= limit else "FAIL"
    return Comparison(strategy, "ok", len(loss), loss_dev, gn_dev, weights_dev, lossy, verdict, explanation)


def launch_order(strategies: list[str]) -> list[str]:
    return [REFERENCE, *[s for s in strategies if s != REFERENCE]]


def run_args(strategy: str, steps: int, fixed: list[str]) -> list[str]:
    """One run of the comparison: every step logged and the final weights fingerprinted, nothing saved."""
    return ["--strategy", strategy, "--max_steps", str(steps), "--logging_steps", "1", "--fingerprint_weights",
            "--save_strategy", "no", "--overwrite_output_dir", *fixed]


def run_parity(strategies: list[str], *, steps: int, nproc: int, fixed: list[str], out: Path, tolerance: float,
               lossy_tolerance: float | None, timeout: float) -> list[Comparison]:
    optim = flag_value(fixed, "--optim") or "adamw"
    results = {}
    reference_dir = out / REFERENCE
    created = [p for p in (reference_dir, *reference_dir.parents) if not p.exists()]  # deepest first
    for strategy in launch_order(strategies):
        run_dir = out / strategy
        outcome = run_training(run_args(strategy, steps, fixed), run_dir, nproc, timeout)
        results[strategy] = read_results(run_dir) if finished_status(run_dir) else Results(run_name=strategy)
        if outcome.status != "ok":
            results[strategy].status, results[strategy].error = outcome.status, outcome.error
        if strategy == REFERENCE and outcome.status == "refused":  # the Trainer flags themselves are bad: keep nothing
            _remove_created(created)
            raise HfscaleError(outcome.error or f"the ddp reference run was refused; see {run_dir}/launch.log")
        if strategy == REFERENCE and outcome.status != "ok":  # nothing to compare with: launch no other strategy
            raise HfscaleError(f"the ddp reference run failed ({outcome.error}); see {run_dir}/launch.log")
    reference = results[REFERENCE]
    return [compare(reference, results[s], s, optim, tolerance, lossy_tolerance) for s in strategies if s != REFERENCE]


def _remove_created(created: list[Path]) -> None:
    """Remove the folders this parity created (the reference's, then each parent it made), deepest first."""
    if created:
        shutil.rmtree(created[0], ignore_errors=True)
    for path in created[1:]:
        try:
            path.rmdir()
        except OSError:  # something else was written there meanwhile: keep it
            return


def table(comparisons: list[Comparison], tolerance: float) -> str:
    def f(x):
        return "" if x is None else f"{x:.2e}"

    lines = [f"| strategy | steps | loss max rel. dev. | grad-norm max rel. dev. | weights max rel. dev. | verdict (tol {tolerance:g}) | why it may differ |",
             "|---|---|---|---|---|---|---|"]
    for c in comparisons:
        lines.append(f"| {c.strategy} | {c.steps} | {f(c.loss_max_rel)} | {f(c.grad_norm_max_rel)} | "
                     f"{f(c.weights_max_rel)} | {c.verdict}{' (lossy)' if c.lossy else ''} | {c.explanation} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    argv, fixed = split_train_args(argv)
    refuse_renamed(argv)
    parser = ArgumentParser(prog="hfscale parity", allow_abbrev=False,
                            description="Compare strategies' loss/grad-norm curves and final weights with ddp on the "
                                        "same data, seed and precision. Trainer flags go after `--`.")
    parser.add_argument("--strategy", default="zero1,zero2,zero3,fsdp",
                        help="comma-separated, or all (default zero1,zero2,zero3,fsdp)")
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--num_processes", type=int, default=2, help="processes per run (default 2)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max relative deviation for exact strategies (default 1e-4)")
    parser.add_argument("--lossy_tolerance", type=float, help="also judge lossy runs (PowerSGD, 8-bit Adam, Adafactor under "
                        "DeepSpeed) against this")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=Path("runs/parity"))
    parser.add_argument("--dry_run", action="store_true",
                        help="print each run's launch command, and stop: nothing launched or written")
    opts = parser.parse_args(argv)
    positive(opts, "max_steps", "num_processes", "tolerance", "lossy_tolerance", "timeout")
    strategies = strategies_to_compare(opts, fixed)
    if opts.dry_run:
        for strategy in launch_order(strategies):
            command = strategy_launch([*run_args(strategy, opts.max_steps, fixed), "--output_dir",
                                       str(opts.out / strategy)], opts.num_processes)
            print(f"  launch   {strategy}\n    {shlex.join(command)}")
        print(f"dry run: ddp and {len(strategies) - (REFERENCE in strategies)} strategies compared with it; nothing "
              "launched or written")
        return 0
    check_writable_dir(opts.out, "--out")
    with exclusive_dir(opts.out, "--out", "parity check"):  # another one into it would launch into the same run folders
        comparisons = run_parity(strategies, steps=opts.max_steps, nproc=opts.num_processes, fixed=fixed, out=opts.out,
                                 tolerance=opts.tolerance, lossy_tolerance=opts.lossy_tolerance, timeout=opts.timeout)
        text = table(comparisons, opts.tolerance)
        atomic_write_text(opts.out / "parity.md", text)
        atomic_write_text(opts.out / "parity.json", json.dumps(
            {"tolerance": opts.tolerance, "steps": opts.max_steps, "nproc": opts.num_processes, "train_args": fixed,
             "comparisons": [asdict(c) for c in comparisons]}, indent=2) + "\n")
    print(text)
    failed = [c.strategy for c in comparisons if c.verdict in ("FAIL", "error")]
    judged = [c for c in comparisons if c.verdict != "info"]
    verdict = ("FAILED for " + ", ".join(failed) if failed else "all judged strategies match ddp" if judged
               else "nothing judged: every run is lossy (judge them with --lossy_tolerance)")
    print(f"parity: {verdict} (details: {opts.out / 'parity.json'})")
    return 1 if failed else 0


def strategies_to_compare(opts, fixed: list[str]) -> list[str]:
    """The strategies asked for that can run here, checked before anything is launched: the pair with --optim, the
    strategy on these processes of this one node, the Trainer flags. Under `all` the others are left out; named,
    the first is refused in one line."""
    strategies = comma_list(opts.strategy, "--strategy", valid=all_strategies(), what="strategy")
    tensor_parallel = [s for s in strategies if all_strategies()[s].tensor_parallel]
    if tensor_parallel and opts.strategy != "all":  # under "all" they are left out
        raise HfscaleError(f"hfscale parity runs every strategy on the same processes and micro-batch, but the ranks "
                           f"of {tensor_parallel[0]}'s TP group share one batch (its global batch is ddp's / TP); "
                           f"compare it at --per_device_train_batch_size x TP, as tests/test_tensor_parallel.py does")
    strategies = [s for s in strategies if s not in tensor_parallel]
    for flag in ("--strategy", "--max_steps", "--output_dir", "--logging_steps"):
        if flag_value(fixed, flag) is not None or flag in fixed:
            raise HfscaleError(f"{flag} is set by hfscale parity; remove it from the Trainer flags")
    check_training_flags(fixed, appended=True)
    check_local_processes(opts.num_processes)  # every run starts on this node
    # checked before anything is launched: each strategy's run as its ranks will plan it on these processes of this
    # one node (the pair with --optim, the layout, a flag for another strategy)
    refused = {s: start_up_refusal(run_args(s, opts.max_steps, fixed), opts.num_processes)[1] for s in strategies}
    explicit = next((s for s, why in refused.items() if why and opts.strategy != "all"), None)
    if explicit:
        raise HfscaleError(refused[explicit])
    strategies = [s for s in strategies if not refused[s]]  # under "all" they are left out
    if not [s for s in strategies if s != REFERENCE]:  # a parity run of ddp alone judges nothing
        raise HfscaleError(f"--strategy {opts.strategy}: nothing to compare with {REFERENCE}; name another strategy "
                           "(default zero1,zero2,zero3,fsdp)")
    return strategies
