"""Does `hfscale project` predict a real N-process run from a 1-process one on this machine? Prints the figures.

Measured in one go per strategy and process count N, side by side: N independent 1-process runs at once (each with
the compute conditions of one rank of an N-process run on this machine), `hfscale bandwidth` over N processes, the
projection from the first 1-process run to N processes, and a real N-process run with the same per-rank work.

    python benchmarks/projection_vs_real.py                        # ddp, 2 processes, tiny GPT-2, MBS 4, seq 64
    python benchmarks/projection_vs_real.py --strategy all --num_processes 2,4 --repeats 3
    python benchmarks/projection_vs_real.py --json                 # the figures as JSON
    python benchmarks/projection_vs_real.py --strategy all --num_processes 2,4 --out hfscale/plan/projection_checks.json
    python benchmarks/projection_vs_real.py --strategy ddp,zero3 --repeats 3 --keep benchmarks/results/projection_DATE
    python benchmarks/projection_vs_real.py --replay benchmarks/results/projection_DATE --out hfscale/plan/projection_checks.json

The bandwidth is measured back to back for its fits and, with `--compute_ms` = the 1-process step time, after
compute for the ranks' meeting (docs/project.md).
`--out` writes the median ratio per strategy and process count: `hfscale project` prints that strategy's measured
model error with every projection (docs/project.md). `--keep` writes every round's measurements (the 1-process
results, the bandwidth fit, the real run's results): tests/test_project.py projects them again with the code of the
day, so a round measured once checks every later change to the projection without timing anything in CI.
`--replay DIR` measures nothing: it projects the rounds kept in DIR again with this checkout's code (after a change
to the model, `--out` then refreshes the checks from them).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def measure(opts, strategy: str, n: int) -> dict:
    """One round: the N twin 1-process runs, the bandwidth and the real N-process run (a record `replay` projects)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu"}
    args = ["--strategy", strategy, "--model", "tiny", "--seq_len", "64",
            "--per_device_train_batch_size", str(opts.per_device_train_batch_size), "--save_strategy", "no",
            "--max_steps", str(opts.steps), "--logging_steps", "10", *(["--bf16"] if opts.bf16 else [])]
    hfscale = [sys.executable, "-m", "hfscale"]
    with tempfile.TemporaryDirectory(prefix="hfscale-projection-") as tmp:
        tmp = Path(tmp)

        def start(what: str, *cmd: str) -> tuple[str, subprocess.Popen, Path]:
            log = tmp / f"{what.replace(' ', '-')}.log"
            with log.open("w") as stderr:  # the child keeps its own copy of the descriptor
                return what, subprocess.Popen([*hfscale, *cmd], env=env, stdout=subprocess.DEVNULL, stderr=stderr), log

        def wait(*started: tuple[str, subprocess.Popen, Path]) -> None:
            for what, proc, log in started:
                if proc.wait():
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                    sys.exit(f"{strategy}: {what} failed (exit {proc.returncode}); the end of its output:\n{tail}")

        # one process of a strategy that needs ranks to shard over runs as ddp would: the projection puts the strategy
        # back (`--strategy`); a 1-process ddp_powersgd is refused, so its twins run plain ddp
        alone_args = args if strategy != "ddp_powersgd" else [*args[:1], "ddp", *args[2:]]
        wait(*[start(f"1-process run {i}", "train", *alone_args, "--output_dir", str(tmp / f"alone{i}"))
               for i in range(n)])
        step_ms = json.loads((tmp / "alone0" / "results.json").read_text())["perf"]["s_per_iter"] * 1e3
        wait(start("bandwidth", "bandwidth", "--num_processes", str(n), "--max_bytes", str(4 << 20), "--compute_ms",
                   f"{step_ms:.2f}", "--out", str(tmp / "bw.json")))
        wait(start(f"{n}-process run", "launch", "--num_processes", str(n), *args, "--output_dir", str(tmp / "real")))
        record = {"strategy": strategy, "processes": n,
                  "one": projected_fields(json.loads((tmp / "alone0" / "results.json").read_text())),
                  "bandwidth": json.loads((tmp / "bw.json").read_text()),
                  "real": projected_fields(json.loads((tmp / "real" / "results.json").read_text()))}
    return {**record, **replay(record)}


# What a projection never reads from a results file (losses, the start-up proof, memory, logs): a kept round is a few
# KB, and replays exactly as it was measured.
UNREAD = ("loss_history", "eval_history", "log_tail", "strategy_check", "trainer_metrics", "batch_digests",
          "final_weights", "probe_logits", "communication", "host_syncs", "profile", "checkpoints", "memory", "sweep")


def projected_fields(results: dict) -> dict:
    return {k: v for k, v in results.items() if k not in UNREAD}


def replay(record: dict) -> dict:
    """The projection of a measured round by this checkout's code: `hfscale project` (in this process) from the round's
    1-process results and bandwidth fit to its process count, against its real run's tokens/s. The live rounds and
    the kept ones (tests/test_project.py) go through here alike."""
    from dataclasses import asdict

    from hfscale.plan.project import build_parser, run_projection

    n = record["processes"]
    with tempfile.TemporaryDirectory(prefix="hfscale-replay-") as tmp:
        one, bandwidth = Path(tmp) / "results.json", Path(tmp) / "bw.json"
        one.write_text(json.dumps(record["one"]))
        bandwidth.write_text(json.dumps(record["bandwidth"]))
        opts = build_parser().parse_args([str(one), "--strategy", record["strategy"], "--gpus", f"1,{n}",
                                          "--gpus_per_node", str(n), "--bandwidth_file", str(bandwidth)])
        points = {p.gpus: p for p in run_projection(opts)[2]}
    return {"projected": asdict(points[n]), "all_reduce_fit": record["bandwidth"]["fit"]["all_reduce"],
            "ratio": points[n].tokens_per_s / record["real"]["perf"]["tokens_per_s"]}


def keep(folder: Path, rounds: list[dict]) -> None:
    """Write each round's record (`--keep`): `<strategy>-np<N>-round<i>.json`, what `kept_rounds` reads back."""
    from hfscale.files import atomic_write_text

    folder.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(rounds):
        record = {k: r[k] for k in ("strategy", "processes", "one", "bandwidth", "real")}
        record["ratio_when_measured"] = round(r["ratio"], 4)
        atomic_write_text(folder / f"{r['strategy']}-np{r['processes']}-round{i}.json", json.dumps(record) + "\n")


def kept_rounds(folder: Path) -> dict[tuple[str, int], list[dict]]:
    """The kept rounds of a folder, by (strategy, process count)."""
    rounds: dict[tuple[str, int], list[dict]] = {}
    for path in sorted(Path(folder).glob("*-np*-round*.json")):
        record = json.loads(path.read_text())
        rounds.setdefault((record["strategy"], record["processes"]), []).append(record)
    return rounds


def median_round(rounds: list[dict]) -> dict:
    rounds = sorted(rounds, key=lambda r: r["ratio"])
    return {**rounds[len(rounds) // 2], "ratios": [r["ratio"] for r in rounds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="ddp", help="comma-separated, or `all` (every strategy that runs "
                        "on this machine's processes)")
    parser.add_argument("--num_processes", default="2", help="comma-separated process counts to project to")
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--repeats", type=int, default=1, help="independent rounds; the median round is reported "
                        "(this machine's load drifts between the phases of one round)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object (one strategy and "
                        "count) or list")
    parser.add_argument("--out", type=Path, help="write the median ratios per strategy and count here (JSON)")
    parser.add_argument("--keep", type=Path, help="write every round's measurements here, one JSON file each, as "
                        "tests/test_project.py replays them with the code of the day (benchmarks/results/projection_*)")
    parser.add_argument("--replay", type=Path, help="measure nothing: project the rounds kept in this folder again "
                        "with this checkout's code (--strategy, --num_processes and --repeats are ignored)")
    opts = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # each figure as it is measured (a full run takes a while)
    from hfscale.parallel.strategies import all_strategies

    strategies = [s for s in all_strategies() if s != "fsdp_hybrid"] if opts.strategy == "all" else \
        opts.strategy.split(",")
    counts = [int(x) for x in opts.num_processes.split(",")]
    if opts.replay:
        kept = kept_rounds(opts.replay)
        if not kept:
            sys.exit(f"--replay {opts.replay}: no kept rounds (*-np*-round*.json) there")
        from hfscale.run.results import Results

        # what the rounds ran, for the printed figures (their results files of either schema)
        config = Results.from_dict(next(iter(kept.values()))[0]["one"]).config
        opts.per_device_train_batch_size, opts.steps = config.per_device_train_batch_size, config.max_steps
        opts.bf16 = config.precision == "bf16"
        measured = [[{**r, **replay(r)} for r in records] for records in kept.values()]
    else:
        measured = ([measure(opts, strategy, n) for _ in range(opts.repeats)] for strategy in strategies for n in counts)
    results = []
    for rounds in measured:
        if opts.keep and not opts.replay:
            keep(opts.keep, rounds)
        results.append(median_round(rounds))
        if not opts.json:
            show(results[-1], opts)
    if opts.out:
        write_checks(opts, results)
    if opts.json:
        figures = [{"strategy": r["strategy"], "processes": r["processes"], "one": r["one"]["perf"],
                    "real": r["real"]["perf"], **{k: r[k] for k in ("projected", "all_reduce_fit", "ratio", "ratios")}}
                   for r in results]
        print(json.dumps(figures[0] if len(figures) == 1 else figures))


def write_checks(opts, results: list[dict]) -> None:
    """Record the median ratio per strategy and process count in `--out`, replacing the checks of those pairs it
    already holds and keeping the others (a later call with other strategies or counts adds to the file)."""
    import datetime

    from hfscale.files import atomic_write_text

    command = "python benchmarks/projection_vs_real.py " + " ".join(sys.argv[1:])
    today = datetime.date.today().isoformat()
    try:
        kept = json.loads(opts.out.read_text())["checks"]
    except (OSError, ValueError, KeyError):
        kept = []
    done = {(r["strategy"], r["processes"]) for r in results}
    checks = [c for c in kept if (c["strategy"], c["processes"]) not in done] + [
        {"strategy": r["strategy"], "processes": r["processes"], "ratio": round(r["ratio"], 4),
         "ratios": [round(x, 4) for x in r["ratios"]], "date": today, "command": command} for r in results]
    report = {"machine": f"{platform.node()}: {os.cpu_count()} CPU cores, gloo", "cores": os.cpu_count(),
              "model": f"tiny GPT-2, MBS {opts.per_device_train_batch_size}, seq 64, {opts.steps} steps"
                       + (", bf16" if opts.bf16 else ""),
              "checks": sorted(checks, key=lambda c: (c["strategy"], c["processes"]))}
    atomic_write_text(opts.out, json.dumps(report, indent=2) + "\n")


def show(r: dict, opts) -> None:
    projected, fit, ratio = (r[k] for k in ("projected", "all_reduce_fit", "ratio"))
    one, real = r["one"]["perf"], r["real"]["perf"]
    n = r["processes"]
    print(f"{r['strategy']} -> {n} processes: tiny GPT-2, MBS {opts.per_device_train_batch_size}, seq 64, "
          f"{opts.steps} steps; all-reduce fit: bus bandwidth {fit['busbw'] / 1e9:.2f} GB/s, latency "
          f"{fit['latency_s'] * 1e6:.0f} us per ring step")
    print(f"  1 process (beside {n - 1} twin(s)): {one['s_per_iter'] * 1e3:7.2f} ms/it  {one['tokens_per_s']:9,.0f} tokens/s")
    print(f"  {n} processes, projected:      {projected['s_per_iter'] * 1e3:7.2f} ms/it  "
          f"{projected['tokens_per_s']:9,.0f} tokens/s  (exposed communication {projected['exposed_comm_s'] * 1e3:.2f} "
          f"ms/it, waiting for the slowest rank {projected['straggler_s'] * 1e3:.2f} ms/it)")
    print(f"  {n} processes, measured:       {real['s_per_iter'] * 1e3:7.2f} ms/it  {real['tokens_per_s']:9,.0f} tokens/s")
    print(f"  projected / measured tokens/s = {ratio:.2f}  (target within 0.75-1.25)"
          + (f"; all rounds: {', '.join(f'{x:.2f}' for x in r['ratios'])}" if len(r["ratios"]) > 1 else ""))


if __name__ == "__main__":
    main()
