"""Does hfscale's live measurement slow training? Prints the ratio side by side, measured in one run.

Four variants of the same training (same model, data, seed), interleaved REPEATS times so that machine noise hits
them alike, compared by the Trainer's own `train_runtime` (the whole training loop; the hand-written loop times its
loop the same way):

  hfscale            hfscale/train.py (measurement on: the default)
  hfscale-nomeasure  hfscale/train.py --measure false
  plain-trainer      benchmarks/plain_trainer.py: HF's plain Trainer, no hfscale code in the loop
  hand-written       benchmarks/hand_written_loop.py: no Trainer either (torch DataLoader, AdamW, clipping, schedule)

hfscale against the hand-written loop is host work per step (the same forward: neither builds transformers' KV
cache, which the plain Trainer's model still does): the Trainer's loop, accelerate's wrappers, hfscale's callbacks
and the data path, the work a host-bound GPU step pays in full. Every variant runs with the same steady heap
(--allocator steady, the default: glibc keeps freed tensors for the next step instead of handing the top of its heap
back to the kernel, MALLOC_MMAP_THRESHOLD_ 32 MB and MALLOC_TRIM_THRESHOLD_ 1 GB): with glibc's own thresholds
(--allocator glibc) whether a step's largest buffers (the logits, their softmax and its gradient, 8 MB each at the
defaults) are paged in afresh every step depends on where they fall in each process's heap, and hfscale's process
re-faulted them where the hand-written one mostly did not (2.4M page faults against 0.9M over 300 steps): a gap in
kernel time that says nothing about either loop. A variable that you set yourself is kept.

    python benchmarks/measure_overhead.py                 # tiny GPT-2, 300 steps, 5 repeats, 1 process
    python benchmarks/measure_overhead.py --steps 100 --repeats 3 --model gpt2-124m --seq_len 256 --per_device_train_batch_size 2
    python benchmarks/measure_overhead.py --steps 100 --repeats 3 --model tiny-llama --seq_len 256 --per_device_train_batch_size 16

Target: hfscale / hfscale-nomeasure <= 1.01 (median over repeats).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = {
    "hfscale": [str(REPO / "hfscale" / "train.py"), "--optim", "adamw"],
    "hfscale-nomeasure": [str(REPO / "hfscale" / "train.py"), "--optim", "adamw", "--measure", "false"],
    "plain-trainer": [str(REPO / "benchmarks" / "plain_trainer.py"), "--optim", "adamw_torch", "--report_to", "tensorboard"],
    "hand-written": [str(REPO / "benchmarks" / "hand_written_loop.py"), "--report_to", "none"],
}


# glibc's heap, the same for every variant (see the module's docstring)
ALLOCATORS = {"steady": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}, "glibc": {}}
BASELINE_FILES = {"plain-trainer": "plain.json", "hand-written": "hand.json"}  # {"train_runtime": s} each


def runtime(variant: str, out: Path) -> float:
    if variant in BASELINE_FILES:
        return json.loads((out / BASELINE_FILES[variant]).read_text())["train_runtime"]
    return json.loads((out / "results.json").read_text())["trainer_metrics"]["train_runtime"]


def direct_cost(steps: int = 20000, logging_steps: int = 10) -> float:
    """Seconds per optimizer step spent in hfscale's measurement code itself (Meter calls on every step, figures and
    TensorBoard scalars on logging steps), timed in-process: the bound the end-to-end ratio cannot resolve."""
    import time

    sys.path.insert(0, str(REPO))
    from hfscale.models import resolve_shape
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.run.measure import Meter, TensorBoardWriter, perf_scalars
    from hfscale.runplan import RunPlan

    plan = RunPlan(get_strategy("ddp"), get_optimizer("adamw"), resolve_shape("tiny"), 128,
                   per_device_train_batch_size=8, device_type="cpu")
    meter = Meter(plan, token_budget=1e11, peak_tflops=1.0, warmup_steps=2)
    with tempfile.TemporaryDirectory() as tmp:
        tb = TensorBoardWriter(tmp, {"strategy": "ddp"})
        meter.begin(0)
        start = time.perf_counter()
        for step in range(1, steps + 1):
            meter.step_begin()
            meter.step_end(step, last=step == steps)
            if step % logging_steps == 0:
                figures = meter.interval(step)
                if figures is not None:
                    tb.scalars(perf_scalars(figures), step)
        elapsed = time.perf_counter() - start
        tb.close()
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--logging_steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--allocator", choices=sorted(ALLOCATORS), default="steady",
                        help="glibc's heap for every variant: steady (default) or glibc's own thresholds")
    opts = parser.parse_args()
    common = ["--model", opts.model, "--seq_len", str(opts.seq_len), "--per_device_train_batch_size", str(opts.per_device_train_batch_size),
              "--max_steps", str(opts.steps), "--logging_steps", str(opts.logging_steps), "--save_strategy", "no",
              "--seed", "42", "--disable_tqdm", "true"]
    env = {**ALLOCATORS[opts.allocator], **os.environ, "TOKENIZERS_PARALLELISM": "false"}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    names = list(VARIANTS)
    with tempfile.TemporaryDirectory(prefix="hfscale-overhead-") as tmp:
        for r in range(opts.repeats):
            for variant in names[r % len(names):] + names[:r % len(names)]:  # rotate the order each repeat
                out = Path(tmp) / f"{variant}-{r}"
                cmd = [sys.executable, *VARIANTS[variant][:1], *common, *VARIANTS[variant][1:], "--output_dir", str(out)]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"{variant} failed:\n{proc.stderr[-3000:]}")
                times[variant].append(runtime(variant, out))
                print(f"  repeat {r + 1}/{opts.repeats} {variant:18s} train_runtime {times[variant][-1]:.3f} s", flush=True)
    med = {v: statistics.median(t) for v, t in times.items()}
    print(f"\n{opts.model}, seq {opts.seq_len}, MBS {opts.per_device_train_batch_size}, {opts.steps} steps, logging every "
          f"{opts.logging_steps}, 1 process, {opts.allocator} heap; median of {opts.repeats}:")
    print(f"{'variant':18s} {'median s':>9s} {'min s':>8s} {'s/step':>8s}")
    for v in names:
        print(f"{v:18s} {med[v]:9.3f} {min(times[v]):8.3f} {med[v] / opts.steps:8.4f}")
    print(f"\nmeasurement overhead  hfscale / hfscale-nomeasure = {med['hfscale'] / med['hfscale-nomeasure']:.4f}  (target <= 1.01)")
    print(f"hfscale vs plain      hfscale / plain-trainer     = {med['hfscale'] / med['plain-trainer']:.4f}")
    print(f"hfscale's step against the hand-written one: hand-written / hfscale = "
          f"{med['hand-written'] / med['hfscale']:.4f}  (target >= 0.97 on CPU)")
    print(f"the Trainer's and hfscale's host work per step: {(med['hfscale'] - med['hand-written']) / opts.steps * 1e3:+.2f} "
          "ms (hfscale - hand-written: both forwards without the KV cache, which the plain Trainer's model builds)")
    per_step = direct_cost(logging_steps=opts.logging_steps)
    step_s = med["hfscale-nomeasure"] / opts.steps
    print(f"measurement code itself: {per_step * 1e6:.1f} us per step = {per_step / step_s:.5f} of a {step_s * 1e3:.1f} ms step "
          f"(ratio {1 + per_step / step_s:.5f})")


if __name__ == "__main__":
    main()
