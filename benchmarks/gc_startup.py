"""What pausing Python's garbage collector through start-up saves a launched run. Prints the figures side by side.

Two variants of the same `accelerate launch` (2 processes, tiny GPT-2, a few steps), interleaved REPEATS times so that
machine noise hits them alike, compared by the CPU seconds of the whole process tree (the launcher and its ranks) and
by wall time:

  hfscale    hfscale/train.py as shipped: no collections until train begin, then --gc_freq's schedule
  automatic  the same script with Python's automatic collector throughout and nothing frozen (hfscale's
             `gc.disable()` and `gc.freeze()` made no-ops, --gc_freq 0): what every rank did before
             hfscale/run/garbage.py

    python benchmarks/gc_startup.py                       # ddp, 4 steps, 5 repeats
    python benchmarks/gc_startup.py --strategy zero3 --repeats 3

On CPU nearly all of such a run is start-up (imports, model, engine), which is what the pause is for; on a GPU the
training steps' share (--gc_freq's domain) is measured by benchmarks/gpu_suite.py's runs instead.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hfscale.launching import launch_command  # noqa: E402

# The "automatic" variant's training script: hfscale/train.py run as __main__, with gc.disable and gc.freeze no-ops.
AUTOMATIC = """import gc, runpy, sys
gc.disable = gc.freeze = lambda: None
sys.argv[0] = {train!r}
runpy.run_path({train!r}, run_name="__main__")
"""


def tree_cpu_seconds(cmd: list[str], env: dict) -> tuple[float, float]:
    """(CPU seconds of the command and every process it waited for, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--max_steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    train = str(REPO / "hfscale" / "train.py")
    cpu: dict[str, list[float]] = {"hfscale": [], "automatic": []}
    wall: dict[str, list[float]] = {"hfscale": [], "automatic": []}
    with tempfile.TemporaryDirectory(prefix="hfscale-gc-") as tmp:
        script = Path(tmp) / "train_automatic_gc.py"
        script.write_text(AUTOMATIC.format(train=train))
        for r in range(opts.repeats):
            for variant in (["hfscale", "automatic"] if r % 2 == 0 else ["automatic", "hfscale"]):
                args = ["--strategy", opts.strategy, "--model", "tiny", "--seq_len", "64", "--per_device_train_batch_size",
                        "4", "--save_strategy", "no", "--max_steps", str(opts.max_steps), "--report_to", "none",
                        "--output_dir", str(Path(tmp) / f"{variant}-{r}")]
                if variant == "automatic":
                    args += ["--gc_freq", "0"]
                cmd = launch_command(args, opts.num_processes)
                if variant == "automatic":
                    cmd[cmd.index(train)] = str(script)
                seconds, elapsed = tree_cpu_seconds(cmd, env)
                cpu[variant].append(seconds)
                wall[variant].append(elapsed)
                print(f"  repeat {r + 1}/{opts.repeats} {variant:9s} {seconds:6.2f} CPU-s {elapsed:6.2f} s wall", flush=True)
    med_cpu = {v: statistics.median(t) for v, t in cpu.items()}
    med_wall = {v: statistics.median(t) for v, t in wall.items()}
    print(f"\n{opts.strategy}, {opts.num_processes} processes, tiny GPT-2, {opts.max_steps} steps; median of {opts.repeats}:")
    print(f"{'variant':10s} {'CPU-s':>7s} {'wall s':>7s}")
    for v in cpu:
        print(f"{v:10s} {med_cpu[v]:7.2f} {med_wall[v]:7.2f}")
    print(f"\nhfscale / automatic: CPU {med_cpu['hfscale'] / med_cpu['automatic']:.3f}, "
          f"wall {med_wall['hfscale'] / med_wall['automatic']:.3f}; "
          f"{(med_cpu['automatic'] - med_cpu['hfscale']) / opts.num_processes:.2f} CPU-s saved per rank")


if __name__ == "__main__":
    main()
