"""What each strategy really sends per optimizer step, beside what hfscale's communication model says it sends.

Runs each strategy for a few steps on this machine with `--count_collectives` (torch's profiler over one whole loop
period, every c10d op: hfscale/run/collectives.py) and prints, per strategy, the bytes of each collective kind and
dtype that one rank issued in that step - the scalars (a token count, loss or grad norm per rank) apart
- beside formulas/comm.py's pattern for the same plan (plan/projection.pattern_of). Sizes are full messages (an
all-gather's output, a reduce-scatter's input), as in the model.

    python benchmarks/count_collectives.py                                   # ddp zero1 zero2 zero3 fsdp, bf16, GAS 2
    python benchmarks/count_collectives.py --strategy fsdp,zero3 --no-bf16 --gradient_accumulation_steps 1
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def modelled(train_args: list[str], processes: int) -> dict:
    """{kind: bytes} per optimizer step of formulas/comm.py's pattern for this command's plan on `processes` processes
    (host copies and the token count apart)."""
    from hfscale.plan.projection import pattern_of
    from hfscale.train import check_args

    plan = check_args(train_args)[3].plan.but(world_size=processes, processes_per_node=processes)
    return pattern_of(plan).messages_per_step(plan.gradient_accumulation_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="ddp,zero1,zero2,zero3,fsdp")
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    opts = parser.parse_args()
    from hfscale.launching import launch_command
    from hfscale.run.collectives import bytes_by_kind

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in opts.strategy.split(","):
            args = ["--strategy", strategy, "--model", "tiny", "--seq_len", "64", "--per_device_train_batch_size", "2",
                    "--gradient_accumulation_steps", str(opts.gradient_accumulation_steps), "--max_steps", "3",
                    "--save_strategy", "no", "--logging_steps", "1", "--count_collectives", "2",
                    *(["--bf16"] if opts.bf16 else []), "--output_dir", str(Path(tmp) / strategy)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
            proc = subprocess.run(launch_command(args, opts.num_processes), cwd=REPO, env=env, capture_output=True,
                                  text=True)
            if proc.returncode != 0:
                print(f"{strategy}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            res = json.loads((Path(tmp) / strategy / "results.json").read_text())
            rows.append({"strategy": strategy, "params": res["model"]["params_model"],
                         "measured": {f"{k} {d}": b for (k, d), b in
                                      bytes_by_kind(res["communication"]["per_rank"][0], opts.num_processes, by_dtype=True).items()},
                         "modelled": modelled(args, opts.num_processes)})
    if opts.json:
        print(json.dumps(rows))
        return
    print(f"bytes per optimizer step, one rank, {opts.num_processes} processes, GAS {opts.gradient_accumulation_steps}, "
          f"{'bf16' if opts.bf16 else 'fp32'} (P = parameters)")
    print(f"{'strategy':10} {'collective':28} {'measured':>12} {'x P':>6}   {'model':>12} {'x P':>6}")
    for row in rows:
        p = row["params"]
        kinds = sorted({k.split()[0] for k in row["measured"]} | set(row["modelled"]))
        for kind in kinds:
            got = {k: v for k, v in row["measured"].items() if k.split()[0] == kind}
            label = ", ".join(k.split()[1] for k in got) or "-"
            total, model = sum(got.values()), row["modelled"].get(kind, 0)
            print(f"{row['strategy']:10} {kind + ' (' + label + ')':28} {total:12,d} {total / p:6.2f}   "
                  f"{int(model):12,d} {model / p:6.2f}")


if __name__ == "__main__":
    main()
