"""Measure a GPU machine in one call: every strategy x optimizer that fits the visible GPUs, a hand-written training
step of the same shape (eager and compiled, no Trainer), and the CUDA activation calibration grid. Prints progress as it
goes; writes one JSON and one markdown table. The committed results under benchmarks/results/ are what CI checks the
formulas against (tests/test_memory.py), so one GPU session guards the code for good. benchmarks/README.md says how to
install the packages on a machine without a registry.

    python benchmarks/gpu_suite.py --out benchmarks/results/h100_$(date +%F)      # gpt2-350m, bf16, seq 1024, MBS 8
    python benchmarks/gpu_suite.py --model gpt2-1.3b --only reference,runs --strategy ddp,zero1
    python benchmarks/gpu_suite.py --only runs --strategy zero1,zero2,zero3,fsdp --optim adamw --profile
    python benchmarks/gpu_suite.py --dry_run --out /tmp/suite                       # CPU: the same code, tiny sizes

Sections (--only), run in this order:
- `reference` (first, so that a call cut short still has it): the same model stepped by hand (bf16 autocast over fp32
  weights, SDPA, fused AdamW, clipping 1.0, random tokens on the device, the steps after warm-up timed as one window
  with no per-step sync; eager and torch.compile), and one of its steps profiled. It returns the model's logits, as a
  loop written with the HF model does; `loss-only` is the compiled step with hfscale's training forward (the loss
  alone, run/forward.py), so that hfscale's ratio to it is the Trainer's and hfscale's own cost and nothing else.
- `runs`: `hfscale launch` of each pair, eager; then ddp's variants (DDP_VARIANTS): compiled (hfscale's GPU default),
  compiled with the Trainer's per-micro-batch syncs put back, compiled with --gc_freq 0, with CUDA graphs, eager
  naming every host sync of a step (--count_host_syncs), compiled with one step profiled (--profile_step), compiled
  with twice the micro-batch (mbs2x), with the vocabulary padded to a multiple of 128 (vocab128) and with the fused
  linear cross-entropy (flce); then zero2
  and zero3 with other bucket sizes beside the shipped JSONs (ZERO_VARIANTS). Each: s/it, tokens/s, TFLOPs,
  MFU, the allocator's peak beside the estimate, and for ddp the ratio to the hand-written step. `--profile` profiles
  one step of every run (the busiest device ops and the device's idle share of each strategy); a profiled run's speed
  is that of its logging intervals before the profiled one.
- `grid`: what autograd keeps and the step's peak for GPT-2 eager/sdpa, BLOOM eager and Llama sdpa x
  fp32/autocast_bf16/bf16 x checkpointing off/on x compiled or not, over shapes varied one at a time (Llama's with
  its key/value heads and MLP width varied too; the rows benchmarks/calibrate_activations.py --fit takes).
`--references eager,compiled,loss-only`, `--no-pairs` (ddp's and the ZeRO variants only) and `--grid_filter REGEX` pick parts of
a section; an item that raises is recorded with its error and the suite goes on (a lease is 15 minutes).
`--budget_s` (default 530: under 9 minutes with start-up) stops starting new items and records them as skipped; the
JSON and the table are rewritten (atomically) after every item, so a call stopped from outside keeps what it measured.
"""

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GRID_SHAPES = [(4, 1024, 16, 50257, 1024, 4), (8, 1024, 16, 50257, 1024, 4), (4, 1024, 16, 50257, 2048, 4),
               (4, 1024, 16, 50257, 1024, 8), (4, 2048, 16, 50257, 1024, 4), (4, 1024, 16, 8192, 1024, 4),
               (4, 1024, 32, 50257, 1024, 4), (2, 1536, 12, 32768, 1536, 2)]  # (layers, hidden, heads, vocab, seq, MBS)
DRY_SHAPES = [(2, 128, 4, 512, 128, 4), (3, 128, 4, 512, 128, 4)]  # each activation >= 64 KB: mmapped on CPU
GRID_MODES = [f"{fam}/{attn}/{prec}/{ck}" for fam, attns in (("gpt2", ("sdpa", "eager")), ("bloom", ("eager",)),
                                                            ("llama", ("sdpa",)), ("qwen3", ("sdpa",)),
                                                            ("gemma3", ("sdpa",)), ("olmo2", ("sdpa",)),
                                                            ("phi3", ("sdpa",)))
              for attn in attns for prec in ("autocast_bf16", "bf16", "fp32") for ck in (0, 1)]
# Llama's: (key/value heads, MLP width) after the sizes, varied apart from the hidden size and from each other (its
# activation model has per-layer b·s·f and b·s·kv terms: benchmarks/calibrate_activations.py LLAMA_SHAPES), and then
# a head width after them (below)
LLAMA_GRID_SHAPES = [(*shape, kv, f) for shape, kv, f in zip(GRID_SHAPES, (4, 4, 4, 4, 8, 4, 8, 4),
                                                              (2816, 2816, 2816, 2816, 5632, 2816, 2816, 4096))]
LLAMA_GRID_SHAPES += [(4, 1024, 16, 50257, 1024, 4, 16, 2816), (4, 1024, 16, 50257, 1024, 4, 2, 4096)]
LLAMA_DRY_SHAPES = [(*shape, 2, f) for shape, f in zip(DRY_SHAPES, (352, 256))]
# Llama's and Qwen3's: a head width after those, hidden / heads and then apart from it (a b·s·q term: the query
# width; calibrate_activations.py HEAD_WIDTH_SHAPES). The committed Llama rows have none: their fit's b·s·h term holds
# the queries', and serves shapes whose queries are h wide alone (activations.fitted_row)
HEAD_WIDTH_GRID_SHAPES = [(*shape, shape[1] // shape[2]) for shape in LLAMA_GRID_SHAPES]
HEAD_WIDTH_GRID_SHAPES += [(4, 1024, 16, 50257, 1024, 4, 4, 2816, 128), (4, 1024, 8, 50257, 1024, 4, 4, 2816, 64),
                           (4, 1024, 16, 50257, 1024, 4, 8, 2816, 96)]
HEAD_WIDTH_DRY_SHAPES = [(*shape, 64) for shape in LLAMA_DRY_SHAPES]
REFERENCES = ("eager", "compiled", "loss-only")  # the hand-written steps, in the order they run
COMPILED_SHAPES = 3  # compiling costs tens of seconds per shape: the compiled grid takes the first few shapes
# --fused_linear_cross_entropy's modes (the estimate's fused_loss_bytes, structural until measured): the first shapes
FUSED_MODES = ("gpt2/sdpa/autocast_bf16/0", "gpt2/sdpa/bf16/0", "bloom/eager/autocast_bf16/0")


class Clock:
    """Progress with elapsed time, and the budget: `left()` says whether a new item may start."""

    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.monotonic(), budget_s

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:6.0f} s] {text}", flush=True)

    def left(self) -> bool:
        return time.monotonic() - self.start < self.budget_s


def attempt(fn, *args) -> tuple[object, str | None]:
    """(fn(*args), None), or (None, the error) if it raised: one item that breaks on a new machine (a kernel, a library
    version) costs that item, not the rest of a call of scarce device time."""
    try:
        return fn(*args), None
    except Exception as err:  # noqa: BLE001 - recorded in the report, and the suite goes on
        import traceback

        error = f"{type(err).__name__}: {err}"[:300] + " | " + traceback.format_exc()[-600:]
        print(f"  failed: {error}", flush=True)
        return None, error


# ---- runs ----------------------------------------------------------------------------------------------------------

def pairs(gpus: int, strategies: str, optims: str) -> list[tuple[str, str]]:
    """Every strategy x optimizer hfscale runs on `gpus` processes of one node."""
    from hfscale.flags import comma_list
    from hfscale.models import PRESETS
    from hfscale.parallel.optimizers import OPTIMIZERS, get_optimizer
    from hfscale.parallel.strategies import all_strategies, get_strategy
    from hfscale.runplan import RunPlan

    out = []
    for s in comma_list(strategies, "--strategy", valid=all_strategies(), what="strategy"):
        for o in comma_list(optims, "--optim", valid=OPTIMIZERS, what="optimizer"):
            plan = RunPlan(get_strategy(s), get_optimizer(o), PRESETS["tiny"], 64, world_size=gpus,
                           processes_per_node=gpus)
            if plan.refusal() is None:
                out.append((s, o))
    return out


# ddp variants, run after the pairs: hfscale's GPU default (compiled), the same with the Trainer's own defaults that
# stop the host at every micro-batch put back (before/after of run/planning._no_host_syncs), with Python's automatic
# garbage collector (--gc_freq 0 against the default 50), with CUDA graphs (torch.compile's reduce-overhead mode),
# an eager run naming every host sync of a step, a compiled run with one step profiled, and two levers of MFU
# (issue 21's 50% at 1.3B): twice the micro-batch, and the vocabulary padded to a multiple of 128 (Megatron's
# --make-vocab-size-divisible-by default; nanoGPT's 50304): GPT-2's 50257 rows make the head's matmul ragged; and a
# third, the fused linear cross-entropy (no b x s x V logits: its speed, and the memory it frees for a larger batch);
# then the first two together (one H200, 1.3B, 2026-11-25, steady state: 49.6% MFU with MBS 16, 47.3% with the padded
# vocabulary at MBS 8)
DDP_VARIANTS = [("", True, []),
                ("trainer-syncs", True, ["--logging_nan_inf_filter", "true",
                                         "--accelerator_config", '{"non_blocking": false}']),
                ("gc0", True, ["--gc_freq", "0"]),
                ("cudagraphs", True, ["--torch_compile_mode", "reduce-overhead"]),  # CUDA graphs: no launch overhead
                # the batches collated and pinned by 2 worker processes, off the host thread that launches the kernels (a
                # 350M compiled step is host-bound on an H100: results/h100_2026-11-26b/record.md)
                ("workers2", True, ["--dataloader_num_workers", "2"]),
                ("host-syncs", False, ["--count_host_syncs"]),
                ("profile", True, ["--profile_step", "PROFILED"]),  # PROFILED: the steps' last but 2 (after compiling)
                ("mbs2x", True, ["--per_device_train_batch_size", "MBS2X"]),
                ("vocab128", True, ["--vocab_size", "VOCAB128"]),
                ("flce", True, ["--fused_linear_cross_entropy"]),
                ("mbs2x+vocab128", True, ["--per_device_train_batch_size", "MBS2X", "--vocab_size", "VOCAB128"]),
                # ... with inductor's matmul autotuning (Triton templates benchmarked against cuBLAS per shape; no CUDA
                # graphs): the H100 ran the pair at 48.3%, the H200 at 51.3% (results/h100_2026-11-27/)
                ("mbs2x+vocab128+autotune", True, ["--per_device_train_batch_size", "MBS2X", "--vocab_size", "VOCAB128",
                                                   "--torch_compile_mode", "max-autotune-no-cudagraphs"]),
                # every step its own logging interval: which steps after the warm-up pay the one-off 0.2-0.4 s one H200
                # showed in steps 3-5 of every run (results/h200_2026-11-25/record.md)
                ("per-step", True, ["--logging_steps", "1", "--perf_warmup_steps", "1"]),  # intervals from step 2
                # float8 matmuls in the blocks (torchao, tensorwise; issue 64): beside the compiled bf16 run, the same
                # step's tokens/s and the allocator's peak against the estimate (no autocast copies of the converted
                # weights, one layer's float8 operands at the peak: formulas/activations)
                ("fp8", True, ["--fp8"]),
                # the compiled bf16 run with another seed: the run-to-run spread an fp8 loss curve is judged against
                ("seed2", True, ["--seed", "2"])]
NOT_SPEED = ("host-syncs", "profile", "per-step")  # slowed by what they record: no speed figure


def fill_placeholders(extra, opts) -> list[str]:
    """A variant's flags with PROFILED, MBS2X and VOCAB128 replaced by their values for this suite's run."""
    from hfscale.models import PRESETS

    values = {"PROFILED": max(opts.steps - 2, 2), "MBS2X": 2 * opts.per_device_train_batch_size,
              "VOCAB128": -(-PRESETS[opts.model].vocab // 128) * 128}
    return [str(values.get(a, a)) for a in extra]


SECTIONS = ("reference", "runs", "grid")  # --only, in the order they run


def variant_names(asked: str) -> set[str]:
    """--ddp_variants: a comma list of DDP_VARIANTS' names ("compiled" for the first), "all" or "none"."""
    from hfscale.flags import comma_list

    names = [variant or "compiled" for variant, _, _ in DDP_VARIANTS]
    return set() if asked == "none" else set(comma_list(asked, "--ddp_variants", valid=names, what="ddp variant"))
# zero2.json and zero3.json carry DeepSpeed's own bucket sizes (reduce_bucket_size 5e8, stage3_prefetch_bucket_size
# 5e7, stage3_param_persistence_threshold 1e5): on one H100 they ran zero2 1.34x and zero3 1.57x faster than the
# "auto" values they shipped with before, which transformers fills from the model (hidden^2, 0.9 hidden^2, 10 hidden:
# 1M, 0.9M and 10k elements at 350M; 195 reductions a step; results/h100_2026-11-26b). Each variant runs the strategy
# beside its shipped JSON: "auto-buckets" the values before (the before/after), "5e7-buckets" a tenth of DeepSpeed's
# reduce bucket, which still cuts a 350M model's gradients into 8 reductions a step that several GPUs can overlap with
# the backward (one 5e8 bucket reduces it all after the backward) and allocates 0.2 GB where 5e8 allocates 2 GB.
ZERO_VARIANTS = [("zero2", "auto-buckets", {"reduce_bucket_size": "auto"}),
                 ("zero2", "5e7-buckets", {"reduce_bucket_size": 50_000_000}),
                 ("zero3", "auto-buckets", {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                            "stage3_param_persistence_threshold": "auto"}),
                 ("zero3", "5e7-buckets", {"reduce_bucket_size": 50_000_000})]


def zero_variant_names(asked: str) -> set[str]:
    """--zero_variants: a comma list of ZERO_VARIANTS' names, "all" or "none"."""
    from hfscale.flags import comma_list

    names = list(dict.fromkeys(variant for _, variant, _ in ZERO_VARIANTS))
    return set() if asked == "none" else set(comma_list(asked, "--zero_variants", valid=names, what="ZeRO variant"))


def deepspeed_variant(strategy: str, variant: str, overrides: dict, out: Path) -> Path:
    """The strategy's shipped DeepSpeed JSON with `overrides` in its zero_optimization, written to
    out/ds_configs/STRATEGY-VARIANT.json."""
    from hfscale.files import atomic_write_text
    from hfscale.parallel.strategies import get_strategy

    config = get_strategy(strategy).deepspeed_settings()
    config["zero_optimization"].update(overrides)
    path = out / "ds_configs" / f"{strategy}-{variant}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(config, indent=2) + "\n")
    return path


def speed_before_profile(history: list[dict], warmup_steps: int, logging_steps: int, profiled: int) -> float | None:
    """A profiled run's s/it without its profiled period (from the end of step `profiled` - 1, the profiler's own host
    cost on every op inside): the mean over its logging intervals (`perf_history`, each ending at its step) after the
    warm-up that end before that period, weighted by their steps - after the first of them where another follows, as
    run/measure.Meter times a run from the first logging step after the warm-up (the first interval holds that log's
    one-off costs: 0.4 s on one H200). None when no such interval ends before the period."""
    clean = []
    for row in history or []:
        start = max(row["step"] - logging_steps, warmup_steps)
        if row["step"] <= profiled - 1 and row["step"] > start and row.get("s_per_iter"):
            clean.append((row["step"] - start, row["s_per_iter"]))
    clean = clean[1:] if len(clean) > 1 else clean
    steps = sum(n for n, _ in clean)
    return sum(n * s for n, s in clean) / steps if steps else None


def unprofiled_speed(entry: dict, profiled: int, logging_steps: int) -> dict:
    """A run entry whose speed figures (s/it, tokens/s, TFLOPs, MFU) leave out its profiled period; the whole run's
    s/it stays as `s_per_iter_with_profile`. Unchanged where no timed interval ends before that period."""
    clean = speed_before_profile(entry.get("perf_history"), entry.get("warmup_steps") or 0, logging_steps, profiled)
    if clean is None or not entry.get("s_per_iter"):
        return entry
    scale = entry["s_per_iter"] / clean
    return {**entry, "s_per_iter_with_profile": entry["s_per_iter"], "s_per_iter": clean,
            **{k: entry[k] * scale for k in ("tokens_per_s", "tflops_per_gpu", "mfu") if entry.get(k)}}


def launch_run(strategy: str, optim: str, opts, out: Path, gpus: int, compiled: bool = False, variant: str = "",
               extra: list[str] | tuple = ()) -> dict:
    """One `hfscale launch` of the pair, eager unless `compiled` (said explicitly: ddp compiles by default on GPUs)."""
    from hfscale.flags import flag_value
    from hfscale.models import PRESETS

    name = f"{strategy}-{optim}" + ("-compiled" if compiled else "") + (f"-{variant}" if variant else "")
    extra = fill_placeholders(extra, opts)
    logging_steps = 5 if opts.steps >= 10 else 2  # the dry run's 4 steps: an interval after the first
    args = [sys.executable, "-m", "hfscale", "launch", "--num_processes", str(gpus), "--strategy", strategy,
            "--optim", optim, "--model", opts.model, "--seq_len", str(opts.seq_len), "--per_device_train_batch_size",
            str(opts.per_device_train_batch_size), "--max_steps", str(opts.steps),
            "--logging_steps", str(logging_steps),
            "--save_strategy", "no", "--output_dir", str(out / name), "--overwrite_output_dir",
            *(["--bf16"] if opts.bf16 else []), "--torch_compile", str(compiled).lower(),
            *(["--activation_checkpointing"] if opts.activation_checkpointing else []),
            *extra,
            *(["--use_cpu"] if opts.dry_run else [])]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    path = out / name / "results.json"
    if proc.returncode or not path.is_file():
        return {"run": name, "status": "fail", "error": run_error(path, proc.stderr or proc.stdout)}
    res = json.loads(path.read_text())
    perf, est, mem = res["perf"], res["estimate"], res["memory"]
    steps = [r for r in mem.get("step_per_rank") or [] if r]
    entry = {"run": name, "status": res["status"], "strategy": strategy, "optim": optim, "compiled": compiled,
            "variant": variant, "flags": list(extra), "host_syncs": res.get("host_syncs"), "profile": res.get("profile"),
            "s_per_iter": perf.get("s_per_iter"), "tokens_per_s": perf.get("tokens_per_s"),
            # the steady state (run/measure.Meter): timed from the step after these, over measured_steps; every
            # logging interval, the first one's one-off costs included
            "warmup_steps": perf.get("warmup_steps"), "measured_steps": perf.get("measured_steps"),
            "perf_history": res.get("perf_history"), "loss_history": res.get("loss_history"),
            "tflops_per_gpu": perf.get("tflops_per_gpu_model"), "mfu": perf.get("mfu"),
            "device_allocated_gb": mem.get("peak_allocated_gb"), "estimate_allocated_gb": est["allocated"] / 1e9,
            "step_peak_above_states_gb": max((r["step_delta_gb"] for r in steps), default=None),
            "estimate_activation_peak_gb": est["activation_peak"] / 1e9,
            "estimate_step_peak_gb": est.get("step_peak", est["activation_peak"]) / 1e9, "plan": {
                "strategy": strategy, "optim": optim, "model": opts.model, "seq_len": opts.seq_len,
                # a variant's own micro-batch or vocabulary (its flags come after the suite's, and win)
                "per_device_train_batch_size": int(flag_value(extra, "--per_device_train_batch_size")
                                                   or opts.per_device_train_batch_size),
                "vocab": int(flag_value(extra, "--vocab_size") or PRESETS[opts.model].vocab), "world_size": gpus,
                "kv_cache": False, "logits_output": False,  # run/forward.py: the loss alone, since 2026-11-26
                "fused_linear_cross_entropy": "--fused_linear_cross_entropy" in extra,
                "precision": res["config"]["precision"], "float8": res["config"].get("float8"),
                "activation_checkpointing": bool(res["config"].get("activation_checkpointing")),
                "torch_compile": compiled,
                "attention": est.get("attention") or "sdpa", **zero_optimization(strategy, extra)}}
    profiled = flag_value(extra, "--profile_step")
    return unprofiled_speed(entry, int(profiled), logging_steps) if profiled else entry


def run_error(results: Path, output: str) -> str:
    """Why a run failed: the rank's own exception where its results file recorded one (an H100's autotuning failure
    came back as torchrun's ChildFailedError summary alone, 2026-11-27), else the end of the launcher's output."""
    try:
        error = json.loads(results.read_text()).get("error")
    except (OSError, ValueError):
        error = None
    return error[:600] if error else output[-600:]


def zero_optimization(strategy: str, extra) -> dict:
    """{"zero_optimization": ...} of the DeepSpeed JSON a ZeRO run used (its --deepspeed, else the shipped one), so its
    estimate can be checked later with the buckets it ran with; {} for the other engines."""
    from hfscale.flags import flag_value
    from hfscale.parallel.strategies import get_strategy, load_deepspeed_config

    chosen, path = get_strategy(strategy), flag_value(extra, "--deepspeed")
    if chosen.engine != "deepspeed":
        return {}
    config = load_deepspeed_config(Path(path), chosen) if path else chosen.shipped_deepspeed_config
    return {"zero_optimization": config["zero_optimization"]}


# ---- the hand-written reference ---------------------------------------------------------------------------------------

def reference_step(opts, compiled: bool, device: str, loss_only: bool = False) -> dict:
    """tokens/s of the same model stepped by hand: no Trainer, no accelerate, no hfscale code in the loop. The model
    returns its logits beside the loss, unless `loss_only` (hfscale's training forward: the loss alone)."""
    import torch

    from hfscale.models import PRESETS, build_model
    from hfscale.run.forward import use_training_forward
    from hfscale.run.measure import sm_clock_mhz

    shape = PRESETS[opts.model]
    model = build_model(shape, seed=0, attn_implementation="sdpa").to(device)
    model.train()
    if loss_only:
        use_training_forward(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith("cuda"))
    step_fn = torch.compile(model) if compiled else model
    ids = torch.randint(0, shape.vocab, (opts.per_device_train_batch_size, opts.seq_len), device=device)
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if opts.bf16 else contextlib.nullcontext()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step():
        with autocast:
            loss = step_fn(input_ids=ids, labels=ids, use_cache=False).loss  # training: no KV cache
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    warmup = max(2, opts.steps // 3)  # warm-up (and compilation), then the rest timed as one window: no per-step sync,
    warmup_steps = []                 # as a hand-written loop runs. The warm-up steps each timed alone, with the SM
    for _ in range(warmup):           # clock after each: does a loop with no Trainer pay hfscale runs' one-off cost of
        began = time.perf_counter()   # steps 3-5 too, and do the clocks ramp meanwhile (results/h200_2026-11-25)
        step()
        sync()
        warmup_steps.append({"s": round(time.perf_counter() - began, 6),
                             "sm_mhz": sm_clock_mhz(device.startswith("cuda"))})
    start = time.perf_counter()
    for _ in range(opts.steps - warmup):
        step()
    sync()
    per_step = (time.perf_counter() - start) / max(opts.steps - warmup, 1)
    tokens = opts.per_device_train_batch_size * opts.seq_len
    profile = profile_reference(step, sync, device.startswith("cuda"))
    return {"reference": "transformers model, by hand" + (", torch.compile" if compiled else "")
            + (", the loss alone" if loss_only else ""), "compiled": compiled, "loss_only": loss_only,
            "s_per_step": per_step, "tokens_per_s": tokens / per_step, "warmup_steps": warmup_steps,
            "per_device_train_batch_size": opts.per_device_train_batch_size, "vocab": shape.vocab,
            "profile": profile}


def release_device(device: str) -> None:
    """Give back what an in-process item (a hand-written reference, a grid point) left on the device before the next
    item - a run launched in another process, or another point - needs it: torch's caching allocator keeps freed
    blocks reserved until empty_cache (and torch.compile's caches, reset here, can keep compiled graphs' buffers). On
    one H100 (2026-11-26) the 1.3B runs that followed a 1.3B reference ran out of memory beside the 35-55 GB the
    suite's process still reserved."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def profile_reference(step, sync, on_cuda: bool) -> dict:
    """One more step of the hand-written loop under torch's profiler: the summary hfscale's --profile_step writes
    (run/profile.summarize), so the device's idle share reads the same way for both."""
    from torch.profiler import ProfilerActivity, profile

    from hfscale.run.profile import summarize

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])) as prof:
        sync()
        start = time.perf_counter()
        step()
        sync()
        wall = time.perf_counter() - start
    return summarize(prof.events(), wall, on_cuda)


# ---- the activation grid ----------------------------------------------------------------------------------------------

def grid_point(mode: str, shape: tuple, compiled: bool, device: str, fused_loss: bool = False,
               dropout: float = 0.0) -> dict:
    """What autograd keeps after the forward and the step's peak above the level before it, third step, in this
    process (the allocator's statistics on CUDA; on CPU the resident set and its high-water mark, with freed tensors
    handed back to the kernel - see cpu_memory_follows_tensors - as calibrate_activations.py measures). The model
    runs hfscale's training forward (run/forward.py: no KV cache; the fused loss if asked), its dropout at `dropout`."""
    import torch

    from hfscale.formulas.metrics import ModelShape
    from hfscale.models import build_model
    from hfscale.run.forward import use_training_forward
    from hfscale.run.memory import StepMemory

    fam, attn, prec, ck = mode.split("/")
    l, h, a, v, s, b, *widths = shape  # Llama's: then its key/value heads and MLP width; Qwen3's, its head width
    kv, f, head_dim = (*widths, None, None, None)[:3]
    row = {"mode": f"{mode}/{int(compiled)}", "n_layer": l, "hidden": h, "heads": a, "vocab": v, "seq": s, "mbs": b,
           **({"kv_heads": kv, "ffn": f} if widths else {}), **({"head_dim": head_dim} if head_dim else {}),
           "fused_loss": fused_loss, "kv_cache": False, "logits_output": False}  # run/forward.py: the loss alone
    try:
        model = build_model(ModelShape(fam, l, h, a, v, max(s, 256), f, kv, head_dim=head_dim), 0, attn,
                            dropout).to(device)
    except ValueError as err:  # e.g. BLOOM with SDPA: transformers refuses it
        return {**row, "error": f"ValueError: {str(err)[:160]}"}
    if ck == "1":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if prec == "bf16":
        model.to(torch.bfloat16)
    model.train()
    use_training_forward(model, fused_loss)
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), fused=device.startswith("cuda"))
    ids = torch.randint(0, v, (b, s), device=device)
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if prec == "autocast_bf16" else contextlib.nullcontext()
    on_cuda = device.startswith("cuda")
    meter = StepMemory(on_cuda)  # the allocator's peak on CUDA; the resident set's high-water mark on CPU
    for _ in range(3):  # the third step is reported: the optimizer states exist, the allocator has settled
        if on_cuda:
            torch.cuda.synchronize()
        meter.begin()
        with autocast:
            loss = forward(input_ids=ids, labels=ids).loss
        after = torch.cuda.memory_allocated() if on_cuda else _rss()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        meter.end(0)
    before, peak = meter.steps[-1][1:]
    return {**row, "activations": after - before, "peak": peak - before}


def cpu_memory_follows_tensors() -> None:
    """glibc maps every allocation from 64 KB up on its own and unmaps it when freed, so the resident set follows the
    tensors (what MALLOC_MMAP_THRESHOLD_=65536 does for calibrate_activations.py, set here in-process)."""
    import ctypes

    M_MMAP_THRESHOLD = -3
    ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 65536)


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


# ---- out ---------------------------------------------------------------------------------------------------------------

def machine(device: str) -> dict:
    import importlib.metadata

    import torch

    versions = {}
    for name in ("torch", "transformers", "accelerate", "deepspeed", "datasets", "torchao", "bitsandbytes"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    return {"machine": torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU ({platform.machine()})",
            "host": host_cpu(), "gpus": torch.cuda.device_count(),
            "versions": {**versions, "hfscale": head.strip() or None}, "command": " ".join(["python", *sys.argv])}


def host_cpu() -> dict:
    """The host's CPU model and cores: a step bound by the host (350M compiled) runs at the host's speed."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
             if line.startswith("model name")]
    return {"cpu": names[0] if names else platform.processor() or None, "cores": os.cpu_count()}


def hand_written_ratios(report: dict, gpus: int) -> None:
    """Every ddp x adamw run that is a speed figure against the hand-written step of its own compile mode and shape (a
    variant with another micro-batch or vocabulary is another step: its MFU says what it gained)."""
    for ref in report["references"]:
        if ref.get("status") == "fail":
            continue
        for r in report["runs"]:
            if r["status"] != "ok":  # a run that failed (out of memory, say) has no step to compare
                continue
            same_step = r["compiled"] == ref["compiled"] and all(
                r["plan"][k] == ref[k] for k in ("per_device_train_batch_size", "vocab") if k in ref)
            if (r["strategy"] == "ddp" and r["optim"] == "adamw" and same_step
                    and not set(r["variant"].split("+")) & set(NOT_SPEED)):
                ratio = round(r["tokens_per_s"] / gpus / ref["tokens_per_s"], 3)
                r["loss_only_ratio" if ref.get("loss_only") else "hand_written_ratio"] = ratio
                if not r["variant"]:
                    ref["hfscale_ratio"] = ratio


def markdown(report: dict) -> str:
    lines = [f"# {report['machine']} ({report['date']})", "", f"`{report['command']}`", "",
             "| run | s/it | tokens/s | TFLOPs/GPU | MFU | allocated GB (est / measured) | / hand-written |",
             "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        loss_only = f" ({r['loss_only_ratio']} of the loss-only step)" if "loss_only_ratio" in r else ""
        if r["status"] != "ok":
            lines.append(f"| {r['run']} | {r['status']} | | | | | |")
            continue
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") else ""
        alloc = r["device_allocated_gb"]
        lines.append(f"| {r['run']} | {r['s_per_iter']:.4f} | {r['tokens_per_s']:,.0f} | {r['tflops_per_gpu']:.1f} | "
                     f"{mfu} | {r['estimate_allocated_gb']:.2f} / {alloc if alloc is None else f'{alloc:.2f}'} | "
                     f"{r.get('hand_written_ratio', '')}{loss_only} |")
    lines += ["", "| reference | tokens/s | hfscale ddp / reference |", "|---|---|---|"]
    for r in report["references"]:
        speed = "fail" if r.get("status") == "fail" else f"{r['tokens_per_s']:,.0f}"
        lines.append(f"| {r['reference']} | {speed} | {r.get('hfscale_ratio', '')} |")
    for r in report["references"]:
        if r.get("warmup_steps"):  # each alone, with the SM clock after it where NVML answers
            steps = ", ".join(f"{w['s']:.4f}" + (f" @{w['sm_mhz']} MHz" if w["sm_mhz"] else "") for w in r["warmup_steps"])
            lines += ["", f"warm-up steps of {r['reference']} (s): {steps}"]
    for r in report["runs"]:  # the SM clock at each logging interval's end, where NVML answered
        clocks = [str(p["sm_mhz"]) for p in r.get("perf_history") or [] if p.get("sm_mhz")]
        if clocks:
            lines += ["", f"SM clock of {r['run']} at each logging interval (MHz): {', '.join(clocks)}"]
    for r in report["runs"]:
        steps = (r.get("host_syncs") or {}).get("steps") or []
        if len(steps) > 1:  # step 2: after the first step's one-off checks, no logging (--logging_steps 5)
            sites = ", ".join(f"{site} x{n}" for site, n in sorted(steps[1]["sites"].items(), key=lambda kv: -kv[1]))
            lines += ["", f"host syncs of {r['run']}, step 2: {steps[1]['reads']} ({sites or 'none'})"]
    profiled = [(r["run"], r["profile"]) for r in report["runs"] if r.get("profile")]
    profiled += [(r["reference"], r["profile"]) for r in report["references"] if r.get("profile")]
    if profiled:
        lines += ["", "| profiled step | wall s | device idle share | busiest device op | busiest host op |",
                  "|---|---|---|---|---|"]
        for name, p in profiled:
            idle = p.get("device_idle_share")
            first = lambda rows: f"{rows[0]['name'][:50]} ({rows[0]['self_s']:.4f} s)" if rows else ""  # noqa: E731
            lines.append(f"| {name} | {p['wall_s']:.4f} | {'' if idle is None else f'{idle:.1%}'} | "
                         f"{first(p.get('device_top') or [])} | {first(p['host_top'])} |")
    lines += loss_lines(report["runs"])
    lines += ["", f"activation grid: {len(report['grid'])} rows (JSON: grid), skipped: {len(report['skipped'])}"]
    return "\n".join(lines) + "\n"


LOSS_TAIL = 0.2  # the share of a run's logged losses, at its end, whose mean is compared


def tail_loss(run: dict) -> float | None:
    """The mean of the last LOSS_TAIL of a run's logged losses (None: too few to say)."""
    losses = [p["loss"] for p in run.get("loss_history") or [] if p.get("loss") is not None]
    tail = losses[-max(1, int(len(losses) * LOSS_TAIL)):] if len(losses) >= 10 else []
    return sum(tail) / len(tail) if tail else None


def loss_lines(runs: list[dict]) -> list[str]:
    """fp8 against bf16 over a long run (the fp8-loss plan): the end of each loss curve, and the fp8 run's distance from
    the compiled bf16 run against the spread between two bf16 seeds (issue 64: within it)."""
    ends = {r["variant"] or "compiled": tail_loss(r) for r in runs if r["status"] == "ok" and r.get("strategy") == "ddp"}
    if not all(ends.get(name) is not None for name in ("compiled", "seed2", "fp8")):
        return []
    spread, gap = abs(ends["seed2"] - ends["compiled"]), abs(ends["fp8"] - ends["compiled"])
    return ["", f"loss over the last {LOSS_TAIL:.0%} of the logged steps: bf16 {ends['compiled']:.4f}, bf16 seed 2 "
            f"{ends['seed2']:.4f}, fp8 {ends['fp8']:.4f}; fp8 - bf16 {gap:.4f} against the seeds' spread "
            f"{spread:.4f}: {'within' if gap <= spread else 'OUTSIDE'} it"]


def grid_shapes(text: str) -> list[tuple[int, ...]]:
    """--grid_shapes: `LxHxAxVxSxB,...` as GRID_SHAPES' tuples (layers, hidden, heads, vocab, seq, MBS), each a shape
    a model can have."""
    from hfscale.errors import HfscaleError
    from hfscale.formulas.metrics import ModelShape
    from hfscale.models import validate_shape

    shapes = []
    for item in text.split(","):
        try:
            shape = tuple(int(v) for v in item.lower().split("x"))
        except ValueError:
            shape = ()
        if len(shape) != 6 or min(shape) <= 0:
            raise HfscaleError(f"--grid_shapes: {item!r} is not LAYERSxHIDDENxHEADSxVOCABxSEQxMBS in positive integers")
        layers, hidden, heads, vocab, seq, _ = shape
        try:
            validate_shape(ModelShape("gpt2", layers, hidden, heads, vocab, max(seq, 256)))
        except HfscaleError as err:
            raise HfscaleError(f"--grid_shapes: {item!r}: {err}") from None
        shapes.append(shape)
    return shapes


# ---- named plans: a whole lease of the `device` tool in one command ----------------------------------------------------
# A lease is one call of under 10 minutes (benchmarks/README.md). A plan is its sections, each a command of this
# suite (or of another benchmark) with a deadline from the plan's start; everything measured so far is packed into one
# file after each section, so a call stopped from outside still brings back all it measured.
ITEM_S = 120  # the longest one item runs past its section's deadline (a 1.3B compiled run, its start-up included)
# progress as it comes; no Hub (the device machines reach nothing); tokenizers' threads quiet beside the runs' workers
PLAN_ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class Section:
    name: str  # its folder under --out (and its runs' folder)
    deadline_s: int  # from the plan's start
    args: tuple[str, ...]  # this suite's arguments (or `script`'s)
    script: str = "gpu_suite.py"  # fp8_matmul.py: its --out is a file
    env: tuple[tuple[str, str], ...] = ()

    def command(self, out: Path, runs: Path, budget_s: float) -> list[str]:
        """This suite (its results under out/NAME, its runs' folders under runs/NAME) or another benchmark
        (fp8_matmul.py: its rows as out/NAME/fp8_matmul.json), under `budget_s`."""
        script = Path(__file__).with_name(self.script)
        if self.script == "gpu_suite.py":
            where = ["--out", str(out / self.name), "--runs_dir", str(runs / self.name)]
        else:
            where = ["--out", str(out / self.name / f"{script.stem}.json")]
        return [sys.executable, str(script), *self.args, *where, "--budget_s", f"{max(budget_s, 0):.0f}"]


def _ddp(*args: str) -> tuple[str, ...]:
    return ("--only", "runs", "--strategy", "ddp", "--optim", "adamw", "--no-pairs", *args)


def _compiled_then_grid(preset: str, family: str, mbs: int = 4) -> tuple[Section, Section]:
    """A family's plan: its preset compiled under ddp at 2,048 tokens (the allocator's peak beside the estimate, whose
    terms are CPU-fitted until then), then the family's rows of the CUDA activation grid."""
    return (Section(preset, 240, ("--model", preset, "--seq_len", "2048", "--per_device_train_batch_size", str(mbs),
                                  *_ddp("--ddp_variants", "compiled", "--steps", "20"))),
            Section("grid", 540, ("--only", "grid", "--grid_filter", f"^{family}/")))


_SHAPES_8 = ("--grid_shapes", "8x1024x16x50257x1024x8,8x1024x16x50257x1024x16")
PLANS: dict[str, tuple[str, tuple[Section, ...]]] = {
    "llama": ("llama-3.2-1b compiled (MFU, beside the hand-written loss-only step, the allocator's peak beside the "
              "estimate), float8 per layer, the Llama rows of the CUDA activation grid (ran on an H200, 2026-11-28, "
              "before the grid varied Llama's query width; the MFU goal is an H100's)", (
        Section("llama1b", 200, ("--model", "llama-3.2-1b", "--seq_len", "2048", "--only", "reference,runs",
                                 "--strategy", "ddp", "--optim", "adamw", "--no-pairs", "--references", "loss-only",
                                 "--ddp_variants", "compiled", "--steps", "20")),
        Section("llama1b-more", 330, ("--model", "llama-3.2-1b", "--seq_len", "2048", *_ddp("--ddp_variants", "mbs2x",
                                                                                             "--steps", "20"))),
        Section("fp8", 400, (), script="fp8_matmul.py"),
        Section("grid", 540, ("--only", "grid", "--grid_filter", "^llama/")))),
    "qwen2": ("qwen2.5-1.5b eager and compiled: the allocator's peak beside the estimate, which takes the Llama rows' "
              "CUDA activation terms (Family.activations_as: its q/k/v biases keep nothing more on CPU), and the MFU", (
        # MBS 4: `hfscale estimate` fits at most 5 eager on 80 GB (its 151,936-token logits), 10 compiled
        Section("qwen2-1.5b", 300, ("--model", "qwen2.5-1.5b", "--seq_len", "2048", "--per_device_train_batch_size",
                                    "4", *_ddp("--ddp_variants", "compiled", "--steps", "20"))),)),
    "qwen3": ("qwen3-1.7b compiled (the allocator's peak beside the estimate, whose Qwen3 terms are CPU-fitted "
              "until this plan's grid measures them), then the Qwen3 rows of the CUDA activation grid (their head "
              "width apart from hidden / heads)", _compiled_then_grid("qwen3-1.7b", "qwen3")),
    "gemma3": ("gemma3-1b compiled (the allocator's peak beside the estimate, whose Gemma 3 terms are CPU-fitted "
               "until this plan's grid measures them; its 512-token window under the 2,048-token sequence: what the "
               "windowed layers' explicit mask keeps on CUDA, which the estimate leaves out), then the Gemma 3 rows of "
               "the CUDA activation grid", _compiled_then_grid("gemma3-1b", "gemma3")),
    "olmo2": ("olmo2-1b compiled (the allocator's peak beside the estimate, whose OLMo 2 terms are CPU-fitted until "
              "this plan's grid measures them), then the OLMo 2 rows of the CUDA activation grid",
              _compiled_then_grid("olmo2-1b", "olmo2")),
    "phi3": ("phi-3-mini compiled (the allocator's peak beside the estimate, whose Phi-3 terms are CPU-fitted until "
             "this plan's grid measures them; its 2,047-token window under the 2,048-token sequence), then the Phi-3 "
             "rows of the CUDA activation grid", _compiled_then_grid("phi-3-mini", "phi3", mbs=2)),
    "fp8": ("--fp8 against bf16, compiled, on one Hopper GPU (issue 64's goals: >= 1.10x at gpt2-1.3b, >= 1.2x at the "
            "largest Llama one GPU trains): tokens/s side by side, the allocator's peak beside the estimate", (
        Section("fp8-gpt2-1.3b", 260, ("--model", "gpt2-1.3b", "--per_device_train_batch_size", "8",  # seq 1024
                                       *_ddp("--ddp_variants", "compiled,fp8", "--steps", "20"))),
        # 3.2B x 16 B of states on one GPU (no DDP buckets): with activation checkpointing `hfscale estimate` fits MBS
        # 19 on an H100's 80 GB; at MBS 8 (16384 tokens a matmul) formulas/float8 predicts x0.79 of bf16's compute
        Section("fp8-llama-3.2-3b", 550, ("--model", "llama-3.2-3b", "--seq_len", "2048",
                                          "--per_device_train_batch_size", "8",
                                          *_ddp("--ddp_variants", "compiled,fp8", "--steps", "20",
                                                "--activation_checkpointing"))))),
    "dropout": ("what dropout's masks add to the CUDA activation grid's 16-bit steps, each point with and without "
                "(activations.counted_dropout is the estimate until then: a 1-byte mask per element, none in SDPA's "
                "fused kernels)", (
        Section("dropout", 540, ("--only", "grid", "--grid_dropout", "0.1", "--grid_filter",
                                 "^[a-z0-9]+/[a-z]+/(autocast_bf16|bf16)/0$")),)),
    "gemm": ("bf16 GEMM rates at the per-GPU shapes of the published record's 3D rows (benchmarks/gemm_rates.py: the "
             "measurement the shape-blind compute model waits for)", (
        Section("gemm", 500, ("--iters", "10"), script="gemm_rates.py"),)),
    "fp8-loss": ("--fp8's loss over 300 steps against bf16's run-to-run spread (two seeds), gpt2-1.3b compiled on one "
                 "Hopper GPU", (
        # MBS 4 x 1024: three compiled runs of 300 steps in one call (the comparison is of losses, not of speed)
        Section("fp8-loss-gpt2-1.3b", 540, ("--model", "gpt2-1.3b", "--per_device_train_batch_size", "4",
                                            *_ddp("--ddp_variants", "compiled,seed2,fp8", "--steps", "300"))),)),
    "mfu": ("gpt2-1.3b compiled at MBS 24 with the padded vocabulary, then with inductor's matmul autotuning at MBS 24 "
            "and 16 (for an H100)", (
        Section("mbs24", 150, ("--model", "gpt2-1.3b", "--per_device_train_batch_size", "12",
                               *_ddp("--ddp_variants", "mbs2x+vocab128", "--steps", "20"))),
        Section("autotune24", 300, ("--model", "gpt2-1.3b", "--per_device_train_batch_size", "12",
                                    *_ddp("--ddp_variants", "mbs2x+vocab128+autotune", "--steps", "20"))),
        Section("autotune16", 450, ("--model", "gpt2-1.3b", *_ddp("--ddp_variants", "mbs2x+vocab128+autotune",
                                                                  "--steps", "20"))))),
    "loss-only": ("350M compiled against the hand-written step with the loss-only forward, 1.3B's MFU with both levers, "
                  "the loss-only step's compiled grid rows (ran 2026-11-27)", (
        Section("a350", 300, ("--only", "reference,runs", "--strategy", "ddp", "--optim", "adamw", "--references",
                              "compiled,loss-only", "--no-pairs", "--ddp_variants", "compiled,profile", "--steps",
                              "40")),
        Section("b13", 410, ("--model", "gpt2-1.3b", *_ddp("--ddp_variants", "mbs2x+vocab128", "--steps", "20"))),
        Section("gridc", 545, ("--only", "grid", "--grid_filter", "^gpt2/sdpa/[a-z0-9_]+/0 compiled$")))),
    "loss-only-grid": ("the loss-only step's compiled grid rows at the whole runs' shapes (8 layers, MBS 8 and 16; "
                       "ran 2026-11-27)", (
        Section("gridl_autocast", 150, ("--only", "grid", *_SHAPES_8, "--grid_filter",
                                        "^gpt2/sdpa/autocast_bf16/0 compiled$")),
        Section("gridl_bf16", 250, ("--only", "grid", *_SHAPES_8, "--grid_filter", "^gpt2/sdpa/bf16/0 compiled$")),
        Section("gridl_fp32", 350, ("--only", "grid", *_SHAPES_8, "--grid_filter", "^gpt2/sdpa/fp32/0 compiled$")))),
    "strategies": ("fsdp with AdamW and torchao's 8-bit AdamW profiled, the ZeRO stages over 30 steps, the host syncs "
                   "of an eager ddp step (ran 2026-11-27)", (
        Section("eightbit", 180, ("--only", "runs", "--strategy", "fsdp", "--optim", "adamw,adamw_8bit",
                                  "--ddp_variants", "none", "--profile", "--steps", "20")),
        Section("zero", 400, ("--only", "runs", "--strategy", "zero1,zero2,zero3", "--optim", "adamw",
                              "--zero_variants", "none", "--ddp_variants", "none", "--steps", "30")),
        Section("syncs", 470, _ddp("--ddp_variants", "host-syncs", "--steps", "20")))),
    "offload": ("the offload strategies with hfscale's host-thread share and with one thread (ran 2026-11-26)", (
        Section("offload", 60, ("--model", "gpt2-124m", "--only", "runs", "--strategy", "fsdp_offload", "--optim",
                                "adamw", "--ddp_variants", "none", "--steps", "12")),
        Section("offload1", 110, ("--model", "gpt2-124m", "--only", "runs", "--strategy", "fsdp_offload", "--optim",
                                  "adamw", "--ddp_variants", "none", "--steps", "12"), env=(("OMP_NUM_THREADS", "1"),)),
        Section("zoffload", 170, ("--model", "gpt2-124m", "--only", "runs", "--strategy", "zero2_offload", "--optim",
                                  "adamw", "--ddp_variants", "none", "--steps", "12")))),
    "zero-buckets": ("zero1, then zero2 and zero3 each with the shipped buckets beside the `auto` ones and a 5e7 "
                     "reduce bucket (ran 2026-11-26)", (
        Section("zero1base", 40, ("--only", "runs", "--strategy", "zero1", "--optim", "adamw", "--ddp_variants", "none",
                                  "--steps", "20")),
        Section("zero2buckets", 140, ("--only", "runs", "--strategy", "zero2", "--optim", "adamw", "--ddp_variants",
                                      "none", "--steps", "20")),
        Section("zero3buckets", 260, ("--only", "runs", "--strategy", "zero3", "--optim", "adamw", "--ddp_variants",
                                      "none", "--steps", "20")))),
}


def section_budget(deadline_s: float, elapsed_s: float, lease_s: float | None) -> float:
    """Seconds a section may start items for: up to its deadline from the plan's start; with `lease_s` (the call's
    limit) no deadline falls within ITEM_S of it, since an item started before its deadline may run a whole item past."""
    if lease_s is not None:
        deadline_s = min(deadline_s, lease_s - ITEM_S)
    return deadline_s - elapsed_s


def pack(out: Path, runs: Path, into: Path | None) -> None:
    """Every run's results.json beside the sections' reports (out/runs/SECTION-RUN.json), then all of out/ in one
    archive, replaced atomically: the one file a device call brings back."""
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for results in runs.glob("*/*/results.json"):
        shutil.copyfile(results, out / "runs" / f"{results.parent.parent.name}-{results.parent.name}.json")
    if into is not None:
        into.parent.mkdir(parents=True, exist_ok=True)
        tmp = into.with_name(into.name + ".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(out, arcname=out.name)
        os.replace(tmp, into)


def run_plan(name: str, out: Path, into: Path | None, lease_s: float | None, runs: Path) -> int:
    """Each section of the plan in turn, as its own process under its deadline, packed after each."""
    _, sections = PLANS[name]
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                          "--format=csv"], capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    (out / "machine.txt").write_text(smi.stdout if smi else "no nvidia-smi\n")
    for section in sections:
        budget = section_budget(section.deadline_s, time.monotonic() - start, lease_s)
        command = section.command(out, runs, budget)
        print(f"== {section.name} ({budget:.0f} s): {' '.join(command[1:])}", flush=True)
        (out / section.name).mkdir(parents=True, exist_ok=True)
        with open(out / f"{section.name}.log", "w") as log:
            try:
                subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **PLAN_ENV,
                                                                                   **dict(section.env)},
                               timeout=max(budget, 0) + ITEM_S)
            except subprocess.TimeoutExpired:  # the section's files so far are packed; the next section goes on
                print(f"{section.name}: stopped {ITEM_S} s past its deadline", file=log)
        progress = re.compile(r"^\[|failed|Error|stopped|^\||^ +\S+ +\d+ +\d+")  # what the old lease scripts showed
        print("".join(l for l in (out / f"{section.name}.log").read_text().splitlines(True) if progress.search(l)),
              end="", flush=True)
        pack(out, runs, into)
        print(f"== packed at {time.monotonic() - start:.0f} s", flush=True)
    return 0


def options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, its names checked before anything runs (one line and exit 2, not a traceback minutes in).
    tests/test_gpu_suite.py parses every section of every plan (PLANS) with it."""
    from hfscale.errors import HfscaleError
    from hfscale.flags import comma_list
    from hfscale.models import resolve_shape

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-350m")
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run and reference (default 12)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--activation_checkpointing", action="store_true", help="every run recomputes its blocks")
    parser.add_argument("--strategy", default="all")
    parser.add_argument("--optim", default="all")
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--plan", choices=sorted(PLANS), help="a whole lease: the plan's sections, each this suite (or "
                        "another benchmark) under its deadline, packed after each (PLANS; the other options are the "
                        "sections' own)")
    parser.add_argument("--pack", type=Path, help="with --plan: everything under --out in this one .tgz after each "
                        "section (on the device machine: $OUT/results.tgz)")
    parser.add_argument("--lease_s", type=float, help="with --plan: the call's limit (timeout_s), which no section's "
                        "deadline may come within an item of (a short call on a warm machine)")
    parser.add_argument("--budget_s", type=float, default=530.0)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_suite"), help="gpu_suite.json/.md and the grid rows")
    parser.add_argument("--runs_dir", type=Path, help="the runs' own directories (default OUT/runs; on the device "
                        "machine put them outside $OUT, which brings back only a few files)")
    parser.add_argument("--dry_run", action="store_true", help="on this CPU machine: tiny sizes, no compilation")
    parser.add_argument("--ddp_variants", default="all", help="which of ddp's variants run after the pairs: a comma "
                        f"list of {', '.join(v or 'compiled' for v, _, _ in DDP_VARIANTS)}; all (default) or none")
    parser.add_argument("--zero_variants", default="all", help="which bucket variants run beside zero2's and zero3's "
                        f"shipped JSONs when those strategies are chosen: a comma list of "
                        f"{', '.join(dict.fromkeys(v for _, v, _ in ZERO_VARIANTS))}; all (default) or none")
    parser.add_argument("--references", default="eager,compiled", help="which hand-written steps the reference "
                        "section times, a comma list of eager, compiled (default: both) and loss-only (compiled, "
                        "hfscale's training forward: the loss alone)")
    parser.add_argument("--pairs", action=argparse.BooleanOptionalAction, default=True, help="run the eager strategy "
                        "x optimizer pairs (--no-pairs: only ddp's variants and the ZeRO variants)")
    parser.add_argument("--grid_filter", default="", help="only the grid points whose label (mode, then ' compiled' "
                        "or ' fused loss') this regular expression finds, e.g. 'compiled' or "
                        "'^gpt2/sdpa/[a-z0-9_]+/0$' (SDPA, eager, no checkpointing); default: every point")
    parser.add_argument("--grid_shapes", help="the grid's shapes instead of its own, each LAYERSxHIDDENxHEADSxVOCABx"
                        "SEQxMBS, comma-separated (e.g. 8x1024x16x50257x1024x16); the compiled points take every one")
    parser.add_argument("--grid_dropout", type=float, default=0.0, help="measure each grid point without dropout and "
                        "with this probability (rows with `dropout` and `without`: what the masks add, which "
                        "calibrate_activations.py --fit fits as activations.DROPOUT_COEFFICIENTS)")
    parser.add_argument("--profile", action="store_true", help="profile one step of every run (--profile_step): the "
                        "busiest device ops and the device's idle share of each strategy; its speed figures are then "
                        "those of the logging intervals before that step")
    opts = parser.parse_args(argv)
    try:
        resolve_shape(opts.model)
        opts.references = set(comma_list(opts.references, "--references", valid=REFERENCES,
                                         what="reference"))
        re.compile(opts.grid_filter)
        if not 0 <= opts.grid_dropout < 1:
            raise HfscaleError(f"--grid_dropout must be in [0, 1), got {opts.grid_dropout}")
        opts.grid_shapes = grid_shapes(opts.grid_shapes) if opts.grid_shapes else None
        variant_names(opts.ddp_variants)
        zero_variant_names(opts.zero_variants)
        pairs(1, opts.strategy, opts.optim)
        for section in opts.only.split(","):
            if section not in SECTIONS:
                raise HfscaleError(f"--only: unknown section '{section}'; choose one of: {', '.join(SECTIONS)}")
    except (HfscaleError, re.error) as err:
        parser.error(str(err) if isinstance(err, HfscaleError) else f"--grid_filter: {err}")
    return opts


def main() -> None:
    from hfscale.files import atomic_write_text

    opts = options()
    if opts.plan:
        run_plan(opts.plan, opts.out, opts.pack, opts.lease_s, opts.runs_dir or Path("/tmp") / f"runs-{opts.plan}")
        return
    import torch

    device = "cpu" if opts.dry_run or not torch.cuda.is_available() else "cuda:0"
    if device == "cpu" and sys.platform.startswith("linux"):
        cpu_memory_follows_tensors()
    if opts.dry_run:
        opts.model, opts.seq_len, opts.per_device_train_batch_size, opts.steps = "tiny", 64, 2, 4
        opts.strategy, opts.optim = ("ddp", "adamw") if opts.strategy == "all" else (opts.strategy, opts.optim)
    gpus = max(torch.cuda.device_count(), 1) if device != "cpu" else 1
    clock, sections = Clock(opts.budget_s), set(opts.only.split(","))
    report = {**machine(device), "date": time.strftime("%Y-%m-%d"), "runs": [], "references": [], "grid": [],
              "skipped": []}
    opts.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every item, atomically: a call stopped from outside still returns what it measured
        hand_written_ratios(report, gpus)
        atomic_write_text(opts.out / "gpu_suite.json", json.dumps(report, indent=1) + "\n")
        atomic_write_text(opts.out / ("cuda_activations.jsonl" if device != "cpu" else "activations.jsonl"),
                          "".join(json.dumps(r) + "\n" for r in report["grid"]))
        atomic_write_text(opts.out / "gpu_suite.md", markdown(report))

    if "reference" in sections:  # first: a call cut short still has what every ddp run is compared with
        for name in REFERENCES if not opts.dry_run else ("eager",):
            compiled, loss_only = name != "eager", name == "loss-only"
            label = f"reference step{' (compiled)' if compiled else ''}{' (the loss alone)' if loss_only else ''}"
            if name not in opts.references:
                continue
            if not clock.left():
                report["skipped"].append(label)
                continue
            clock.say(label)
            ref, error = attempt(reference_step, opts, compiled, device, loss_only)
            release_device(device)
            report["references"].append(ref or {"reference": label, "compiled": compiled, "status": "fail",
                                                "error": error})
            save()
    if "runs" in sections:
        chosen_pairs = pairs(gpus, opts.strategy, opts.optim)
        todo = [(s, o, False, "", []) for s, o in chosen_pairs] if opts.pairs else []
        if "ddp" in {s for s, _ in chosen_pairs}:
            if opts.dry_run:  # the variants that record something, eager and in one launch: their code on this CPU
                todo += [("ddp", "adamw", False, "+".join(NOT_SPEED),
                          [flag for variant, _, extra in DDP_VARIANTS if variant in NOT_SPEED for flag in extra])]
            else:
                chosen = variant_names(opts.ddp_variants)
                todo += [("ddp", "adamw", compiled, variant, extra) for variant, compiled, extra in DDP_VARIANTS
                         if (variant or "compiled") in chosen]
        if not opts.dry_run:
            chosen_strategies, chosen_zero = {s for s, _ in chosen_pairs}, zero_variant_names(opts.zero_variants)
            todo += [(strategy, "adamw", False, variant,
                      ["--deepspeed", str(deepspeed_variant(strategy, variant, values, opts.out))])
                     for strategy, variant, values in ZERO_VARIANTS
                     if strategy in chosen_strategies and variant in chosen_zero]
        if opts.profile:  # one step of every run profiled: where each strategy's step goes (docs/strategies.md)
            todo = [(s, o, c, v, extra if "--profile_step" in extra else [*extra, "--profile_step", "PROFILED"])
                    for s, o, c, v, extra in todo if "--count_host_syncs" not in extra]
        for strategy, optim, compiled, variant, extra in todo:
            label = f"{strategy} x {optim}{' compiled' if compiled else ''}{f' ({variant})' if variant else ''}"
            if not clock.left():
                report["skipped"].append(f"run {label}")
                continue
            clock.say(f"run {label}")
            report["runs"].append(launch_run(strategy, optim, opts, opts.runs_dir or opts.out / "runs", gpus, compiled,
                                             variant, extra))
            save()
    if "grid" in sections:
        shapes = DRY_SHAPES if opts.dry_run else opts.grid_shapes or GRID_SHAPES
        compiled_shapes = shapes if opts.grid_shapes else shapes[:COMPILED_SHAPES]  # chosen ones: each compiled too
        widths = HEAD_WIDTH_DRY_SHAPES if opts.dry_run else HEAD_WIDTH_GRID_SHAPES
        llama = LLAMA_DRY_SHAPES if opts.dry_run else LLAMA_GRID_SHAPES  # OLMo 2, Phi-3: heads hidden / heads wide
        own = {"llama": widths, "qwen3": widths, "gemma3": widths, "olmo2": llama, "phi3": llama}  # else GPT-2's

        def of(mode: str, pool: list) -> list:
            family = own.get(mode.split("/")[0])
            return pool if family is None else family[:len(pool)] if pool is compiled_shapes else family

        points = [(m, shape, False, False) for m in GRID_MODES for shape in of(m, shapes)]
        fused = [(m, shape, False, True) for m in FUSED_MODES for shape in compiled_shapes]
        if not opts.dry_run:
            points += [(m, shape, True, False) for m in GRID_MODES if not m.endswith("/1")
                       for shape in of(m, compiled_shapes)] + fused
        for mode, shape, compiled, fused_loss in points if not opts.dry_run else points[:2] + fused[:1]:
            label = f"{mode}{' compiled' if compiled else ''}{' fused loss' if fused_loss else ''}"
            if opts.grid_filter and not re.search(opts.grid_filter, label):
                continue
            if not clock.left():
                report["skipped"].append(f"grid {label} {shape}")
                continue
            clock.say(f"grid {label} {shape}")
            row, error = attempt(grid_point, mode, shape, compiled, device, fused_loss)
            release_device(device)
            if row and "error" not in row and opts.grid_dropout:  # the same point with dropout, beside it
                with_dropout, error = attempt(grid_point, mode, shape, compiled, device, fused_loss, opts.grid_dropout)
                release_device(device)
                row = with_dropout and {**with_dropout, "dropout": opts.grid_dropout,
                                        "without": {k: row[k] for k in ("activations", "peak")}}
            report["grid"].append(row or {"mode": f"{mode}/{int(compiled)}", "shape": list(shape),
                                          "fused_loss": fused_loss, "error": error})
            save()
    save()
    clock.say(f"wrote {opts.out}/gpu_suite.json, gpu_suite.md; {len(report['skipped'])} item(s) skipped by the budget")
    print(markdown(report))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
