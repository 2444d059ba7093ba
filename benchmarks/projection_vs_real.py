"""Does `hfscale project` predict a real 2-process run from a 1-process one on this machine? Prints the figures.

Measured in one go, side by side: two independent 1-process ddp runs at once (each with the compute conditions of
one rank of a 2-process run on this 2-core machine), `hfscale bandwidth` over 2 processes, the projection from the
first 1-process run to 2 processes, and a real 2-process ddp run with the same per-rank work.

    python benchmarks/projection_vs_real.py                        # tiny GPT-2, MBS 4, seq 64, 60 steps
    python benchmarks/projection_vs_real.py --per_device_train_batch_size 16 --steps 100
    python benchmarks/projection_vs_real.py --json                 # the figures as JSON (tests/test_project.py)

The bandwidth is measured as training meets it (`--compute_ms` = the 1-process step time between collectives).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(opts) -> dict:
    """One round: the twin 1-process runs, the bandwidth, the projection and the real 2-process run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = ["--strategy", "ddp", "--model", "tiny", "--seq_len", "64", "--per_device_train_batch_size", str(opts.per_device_train_batch_size),
            "--save_strategy", "no", "--max_steps", str(opts.steps), "--logging_steps", "10"]
    hfscale = [sys.executable, "-m", "hfscale"]
    with tempfile.TemporaryDirectory(prefix="hfscale-projection-") as tmp:
        tmp = Path(tmp)
        alone = [subprocess.Popen([*hfscale, "train", *args, "--output_dir", str(tmp / f"alone{i}")], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
        if any(p.wait() for p in alone):
            sys.exit("a 1-process run failed")
        step_ms = json.loads((tmp / "alone0" / "results.json").read_text())["perf"]["s_per_iter"] * 1e3
        subprocess.run([*hfscale, "bandwidth", "--num_processes", "2", "--max_bytes", str(4 << 20), "--compute_ms",
                        f"{step_ms:.2f}", "--out", str(tmp / "bw.json")], env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*hfscale, "launch", "--num_processes", "2", *args, "--output_dir", str(tmp / "two")], env=env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([*hfscale, "project", str(tmp / "alone0" / "results.json"), "--strategy", "ddp", "--gpus", "1,2",
                        "--gpus_per_node", "2", "--bandwidth_file", str(tmp / "bw.json"), "--out", str(tmp / "proj")],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        one = json.loads((tmp / "alone0" / "results.json").read_text())["perf"]
        two = json.loads((tmp / "two" / "results.json").read_text())["perf"]
        points = {p["gpus"]: p for p in json.loads((tmp / "proj" / "projection.json").read_text())["points"]}
        fit = json.loads((tmp / "bw.json").read_text())["fit"]["all_reduce"]
    return {"one": one, "two": two, "projected": points[2], "all_reduce_fit": fit,
            "ratio": points[2]["tokens_per_s"] / two["tokens_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=1, help="independent rounds; the median round is reported "
                        "(this machine's load drifts between the phases of one round)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    opts = parser.parse_args()
    rounds = sorted((measure(opts) for _ in range(opts.repeats)), key=lambda r: r["ratio"])
    median = rounds[len(rounds) // 2]
    if opts.json:
        print(json.dumps({**median, "ratios": [r["ratio"] for r in rounds]}))
        return
    one, two, projected, fit, ratio = (median[k] for k in ("one", "two", "projected", "all_reduce_fit", "ratio"))
    print(f"tiny GPT-2, MBS {opts.per_device_train_batch_size}, seq 64, {opts.steps} steps; all-reduce fit: bus bandwidth "
          f"{fit['busbw'] / 1e9:.2f} GB/s, latency {fit['latency_s'] * 1e6:.0f} us per ring step")
    print(f"1 process (beside a twin):   {one['s_per_iter'] * 1e3:7.2f} ms/it  {one['tokens_per_s']:9,.0f} tokens/s")
    print(f"2 processes, projected:      {projected['s_per_iter'] * 1e3:7.2f} ms/it  {projected['tokens_per_s']:9,.0f} tokens/s"
          f"  (exposed communication {projected['exposed_comm_s'] * 1e3:.2f} ms/it, waiting for the slower rank "
          f"{projected['straggler_s'] * 1e3:.2f} ms/it)")
    print(f"2 processes, measured:       {two['s_per_iter'] * 1e3:7.2f} ms/it  {two['tokens_per_s']:9,.0f} tokens/s")
    print(f"projected / measured tokens/s = {ratio:.2f}  (target within 0.75-1.25)"
          + (f"; all rounds: {', '.join(f'{r:.2f}' for r in sorted(r['ratio'] for r in rounds))}" if len(rounds) > 1 else ""))


if __name__ == "__main__":
    main()
