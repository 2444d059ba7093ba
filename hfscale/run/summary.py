"""The one-screen summary a run prints at its end, from its results (run/results.Results): what ran, how fast, the
TFLOPs by each convention, memory estimated against measured, days to the token budget, checkpoints, and where a
step's time went when it was profiled."""

import sys

from ..formulas import metrics
from ..formulas.activations import window_caveat
from ..formulas.metrics import GB


def format_summary(results) -> str:
    """The one-screen summary printed at the end of a run (a run/results.Results)."""
    perf, mem, model, cfg, env = results.perf, results.memory, results.model, results.config, results.environment
    unit = "GPU" if env.device_type == "cuda" else "process"  # a CPU run's ranks are processes, not GPUs

    def f(key, fmt="{:.3g}"):
        value = getattr(perf, key)
        return fmt.format(value) if isinstance(value, (int, float)) else "n/a"

    def t(key):
        return metrics.tflops_label(getattr(perf, key)) if isinstance(getattr(perf, key), (int, float)) else "n/a"
    lines = [
        f"hfscale run {results.run_name}  [{results.status}]",
        f"  strategy {results.strategy} · optim {results.optim} · model {model.name} "
        f"({model.params_model / 1e6:.2f}M params) · {cfg.world_size} x {env.device_name}",
        f"  DP {cfg.dp or cfg.world_size}" + (f" · TP {cfg.tp}" if (cfg.tp or 1) > 1 else "")
        + f" · MBS {cfg.per_device_train_batch_size} · GAS {cfg.gradient_accumulation_steps} · GBS "
        f"{cfg.global_batch_size} · seq {cfg.seq_len} · checkpointing {cfg.activation_checkpointing} · "
        f"{f'fp8 {cfg.float8} (bf16 outside its matmuls)' if cfg.float8 else cfg.precision} · "
        + ("compiled (--torch_compile false for eager)" if cfg.torch_compile else "eager")
        + (" · fused linear cross-entropy" if cfg.fused_linear_cross_entropy else ""),
        f"  speed {f('s_per_iter', '{:.4f}')} s/it over {perf.measured_steps or 0} steps"
        + (f" after {perf.warmup_steps} untimed" if perf.measured_steps else
           f" (none after the {perf.warmup_steps} untimed: --perf_warmup_steps 0 times every step)"
           if perf.warmup_steps else "") + " · "
        f"tokens/s {f('tokens_per_s', '{:,.0f}')} ({f('tokens_per_s_per_gpu', '{:,.0f}')} per {unit})",
        f"  TFLOPs/{unit}: exact {t('tflops_per_gpu_model')} · hardware {t('tflops_per_gpu_hardware')} · "
        f"BigScience {t('tflops_per_gpu_bigscience')} · MFU {f('mfu', '{:.1%}')} · HFU {f('hfu', '{:.1%}')} "
        f"(peak {t('peak_tflops')} TFLOPs, {perf.peak_source or 'n/a'})"
        + (f" · MFU of the fp8 peak ({perf.peak_tflops_fp8:g} TFLOPs) {perf.tflops_per_gpu_model / perf.peak_tflops_fp8:.1%}"
           if perf.peak_tflops_fp8 and perf.tflops_per_gpu_model else ""),
        f"  memory: peak RSS {mem.peak_rss_gb or 0:.2f} GB"
        + (f" · device allocated {mem.peak_allocated_gb:.2f} GB, reserved {mem.peak_reserved_gb:.2f} GB"
           if mem.peak_allocated_gb is not None else ""),
        loss_line(results),
        *([eval_line(results)] if results.eval_history else []),
        memory_line(results),
        *window_line(results),
        f"  {cfg.token_budget / 1e9:g}B tokens: {f('days_to_budget', '{:,.1f}')} days on "
        f"{cfg.world_size} {unit}{'(es)' if unit == 'process' else '(s)'} = {f('gpu_days_to_budget', '{:,.1f}')} "
        f"{unit}-days",
        *checkpoint_line(results),
        *step_time_lines(results),
        f"  results: {results.output_dir}/results.json",
    ]
    return "\n".join(lines)


def checkpoint_line(results) -> list[str]:
    """Where the checkpoints went and how big they are: the Trainer's final save keeps a full one even for a smoke
    run (--save_strategy no keeps none)."""
    saved = [c for c in results.checkpoints if c.get("step") is not None]
    stopped = [f"  stopped on {results.stopped['signal']} at step {results.stopped['step']}, its checkpoint saved: "
               "the same command with --resume_from_checkpoint latest continues"] if results.stopped else []
    if not saved:
        return stopped
    last = saved[-1]
    size = f"{last['size_gb']:.3g} GB" if isinstance(last.get("size_gb"), (int, float)) else "size unknown"
    return [f"  checkpoints: {len(saved)} saved; the last {results.output_dir}/checkpoint-{last['step']} ({size}; "
            "--save_strategy no keeps none, --save_total_limit N the newest N)", *stopped]


def step_time_lines(results) -> list[str]:
    """--profile_step and --count_host_syncs in a line each (rank 0's; the whole records are in results.json)."""
    lines = []
    profile = results.profile
    if profile:
        first = lambda rows: f"{rows[0]['name']} ({rows[0]['self_s'] * 1e3:.1f} ms)" if rows else "n/a"  # noqa: E731
        idle = profile.get("device_idle_share")
        device = (f" · device idle {idle:.1%} · busiest on the device {first(profile.get('device_top') or [])}"
                  if idle is not None else "")
        lines.append(f"  step {profile['step']} profiled: {profile['wall_s'] * 1e3:.1f} ms{device} · busiest on the "
                     f"host {first(profile['host_top'])} · trace {profile['trace']}")
    steps = (results.host_syncs or {}).get("steps") or []
    if steps:
        reads = sorted(s["reads"] for s in steps)
        lines.append(f"  host syncs per step: {reads[0]} to {reads[-1]}, median {reads[len(reads) // 2]} over "
                     f"{len(steps)} steps (results.json host_syncs names each line)")
    return lines


def loss_line(results) -> str:
    points = [p for p in results.loss_history if p.get("loss") is not None]
    if not points:
        return "  loss: not logged"
    first, last = points[0], points[-1]
    tokens = f" ({last['tokens']:,} tokens)" if last.get("tokens") else ""
    return f"  loss {first['loss']:.3f} at step {first['step']} -> {last['loss']:.3f} at step {last['step']}{tokens}"


def eval_line(results) -> str:
    last = results.eval_history[-1]
    return (f"  eval loss {last['loss']:.3f} (perplexity {last['perplexity']:,.1f}) at step {last['step']} over "
            f"{len(results.eval_history)} evaluation(s)")


def memory_line(results) -> str:
    """Estimated vs measured memory of the rank that holds the most (hfscale.formulas.memory; docs/estimate.md)."""
    m = results.states_and_step()

    def gb(x):
        return f"{x / GB:.3f}" if isinstance(x, (int, float)) else "n/a"

    measured_step = ("n/a (the run's only step created the gradients and optimizer states: run 2 or more to compare)"
                     if m.first_step_only else f"{gb(m.measured_step)} GB")
    if not m.follows_tensors and not m.first_step_only:  # glibc's reused heap: a step can show more or less than it holds
        measured_step += " (process RSS with glibc's heap reuse; MALLOC_MMAP_THRESHOLD_=65536 makes it follow the tensors)"
    return (f"  memory per rank, estimated / measured: model states {gb(m.estimated_states)} / {gb(m.measured_states)} "
            f"GB · step peak above the states {gb(m.estimated_step)} / {measured_step}")


def window_line(results) -> list[str]:
    """The estimate's caveat where the model's windowed layers saw less than the sequence (formulas/activations.py)."""
    est, model, seq = results.estimate or {}, results.model, results.config.seq_len
    if not est or model.family is None or not seq:
        return []
    caveat = window_caveat(model.shape(), seq, est.get("attention"))
    return [f"  its step peak estimate: {caveat}"] if caveat else []


def print_summary(results) -> None:
    print(format_summary(results), file=sys.stdout, flush=True)
