"""Live measurement during training: seconds per iteration, throughput, TFLOPs, MFU, memory, days.

One timing per logging step: on CUDA a single synchronize before reading the clock (the Trainer's loss
`.item()` at a logging step synchronizes anyway); nothing is synchronized on the other steps. Figures come
from formulas/metrics.py; this module only measures time and memory and routes the numbers.
"""

import resource
import sys
import time

from transformers import TrainerCallback

from ..formulas import metrics
from ..formulas.metrics import GB


def _sync(on_cuda: bool) -> None:
    if on_cuda:
        import torch

        torch.cuda.synchronize()


def _peaks_now(on_cuda: bool) -> dict:
    """The peaks since the last reset: resident host memory always (ru_maxrss, KiB; the kernel's high-water mark, which
    StepMemory resets per step on Linux), the device's allocated and reserved bytes on CUDA."""
    out = {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB}
    if on_cuda:
        import torch

        out["peak_allocated_gb"] = torch.cuda.max_memory_allocated() / GB
        out["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / GB
    return out


def memory_now(on_cuda: bool, step_memory: "StepMemory | None" = None) -> dict:
    """Peak memory of this process over the whole run: device allocated/reserved on CUDA, resident host memory (RSS)
    always. `step_memory` resets the peaks at every step: the largest it saw before each reset counts too (without it,
    a run read its last step's peak - under CUDA graphs, which replay without the allocator, 5.9 of 16.4 GB)."""
    out = _peaks_now(on_cuda)
    for name, earlier in (step_memory.peaks_before_reset if step_memory else {}).items():
        out[name] = max(out.get(name, 0.0), earlier)
    return out


def _proc_status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024  # kB
    return 0


def release_freed_memory() -> None:
    """Hand the memory the allocators hold freed back to the kernel now (Linux): glibc's heap (malloc_trim) and
    pyarrow's pool. The rank that tokenized and packed the data - the first run on a machine - left ~0.1 GB freed in
    them; the model's build then reused it without growing the resident set, and its build window showed that much
    less: ddp's rank 0 measured 0.89 of a copy where rank 1 measured 1.02 (12 layers x 768, 0.35 GB), 1.02 and 1.02
    since."""
    import ctypes

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim  # glibc; other C libraries have no such call
    except (OSError, AttributeError):
        trim = None
    if trim is not None:
        trim(0)
    pyarrow = sys.modules.get("pyarrow")  # its pool (mimalloc or jemalloc) returns freed buffers on its own schedule
    if pyarrow is not None:
        pyarrow.default_memory_pool().release_unused()


class ConstructionMemory:
    """Host memory a rank needs to build its model and shard it (Linux; None where /proc cannot be reset), above the
    resident set before the build:
    - `build_bytes`: the high-water mark over building the model (under ZeRO-3's zero.Init, partitioning included);
    - `bytes`: the high-water mark until training begins, after the engine's `prepare` (FSDP shards there), which
      includes what the engine allocates for itself (ZeRO's master weights and gradient partitions).

    StepMemory resets the high-water mark when it is created (between the build and `prepare`), so the mark is read
    right after the build too and the larger of the two windows is the peak."""

    def __init__(self):
        self.before = None
        self.peak = 0
        self.built = None

    def start(self) -> None:
        if StepMemory.on_linux_with_reset():
            release_freed_memory()
            self.before = _proc_status_bytes("VmRSS")

    def read(self, built: bool = False) -> None:
        """Take the high-water mark so far into the peak (call right after the build with built=True, before anything
        resets the mark, and again at train begin)."""
        if self.before is not None:
            self.peak = max(self.peak, _proc_status_bytes("VmHWM"))
            if built:
                self.built = self.peak

    def build_bytes(self) -> int | None:
        return None if self.built is None else max(self.built - self.before, 0)

    def bytes(self) -> int | None:
        return None if self.before is None else max(self.peak - self.before, 0)


class StepMemory:
    """The memory one optimizer step adds: the step's high-water mark minus the level before it, per step.

    On CUDA, torch's allocator statistics (reset_peak_memory_stats, max_memory_allocated). On a CPU (Linux), the
    kernel's resident-set high-water mark, reset per step through /proc/self/clear_refs ("5") and read from VmHWM;
    glibc must hand freed tensors back to the kernel for this to follow the tensors (MALLOC_MMAP_THRESHOLD_=65536,
    see docs/estimate.md), otherwise a step reuses freed heap and shows less than it holds. Where neither is
    available the step figures are None. Costs one small /proc write and two reads per step on CPU."""

    def __init__(self, on_cuda: bool):
        self.on_cuda = on_cuda
        self.available = on_cuda or (sys.platform.startswith("linux") and self._can_reset())
        self.before = 0
        self.steps: list[tuple[int, int, int]] = []  # (step, bytes before, peak bytes during the step)
        self.peaks_before_reset: dict[str, float] = {}  # memory_now's peaks, the largest read before each reset

    @staticmethod
    def on_linux_with_reset() -> bool:
        return sys.platform.startswith("linux") and StepMemory._can_reset()

    @staticmethod
    def _can_reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def begin(self) -> None:
        if not self.available:
            return
        for name, value in _peaks_now(self.on_cuda).items():  # the run's peaks so far, before this step resets them
            self.peaks_before_reset[name] = max(self.peaks_before_reset.get(name, 0.0), value)
        if self.on_cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            self.before = _proc_status_bytes("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    def end(self, step: int) -> None:
        if not self.available:
            return
        if self.on_cuda:
            import torch

            peak = torch.cuda.max_memory_allocated()
        else:
            peak = _proc_status_bytes("VmHWM")
        self.steps.append((step, self.before, peak))

    def window(self, since_step: int) -> dict:
        """memory/* scalars over the steps after `since_step`: the largest step peak and the largest step delta."""
        recent = [s for s in self.steps if s[0] > since_step]
        if not recent:
            return {}
        return {"memory/step_peak_gb": max(p for _, _, p in recent) / GB,
                "memory/step_delta_gb": max(p - b for _, b, p in recent) / GB}

    def summary(self, skip_first: int = 1) -> dict:
        """Whole-run figures (the first `skip_first` steps allocate the optimizer states and warm the allocator)."""
        steps = self.steps[skip_first:] or self.steps
        if not steps:
            return {}
        return {"step_peak_gb": max(p for _, _, p in steps) / GB, "step_delta_gb": max(p - b for _, b, p in steps) / GB,
                "step_delta_gb_median": sorted(p - b for _, b, p in steps)[len(steps) // 2] / GB,
                "step_memory_source": "cuda allocator" if self.on_cuda else "VmHWM (process RSS)",
                # a run of `skip_first` steps or fewer has only steps that create the gradients and optimizer states
                # inside them: their delta is not the steady step's (memory_line says so rather than compare)
                "steps_measured": len(steps), "first_steps_only": len(self.steps) <= skip_first}


class Meter:
    """Times optimizer steps after `warmup_steps` and turns them into metrics.StepFigures for the run's plan.

    The whole-run figures are the steady state: timed from the first logging step at or after the warm-up when a step
    follows it (else from the warm-up's end). The interval up to that log still pays one-off costs after the warm-up -
    on one H200, 0.2-0.4 s in steps 3-5 of every run, eager and compiled, 350M and 1.3B: 28% of an 18-step 350M
    compiled average, where every later interval matched a hand-written loop (benchmarks/results/h200_2026-11-25/).
    It stays in perf_history. `warmup_steps` 0 times everything, from the very first step."""

    def __init__(self, plan, *, token_budget, peak_tflops, warmup_steps, full_recompute: bool = False):
        self.fixed = dict(micro_batch=plan.per_device_train_batch_size, grad_accum=plan.gradient_accumulation_steps,
                          gpus=plan.world_size, seq=plan.seq_len, checkpointing=plan.activation_checkpointing,
                          token_budget=token_budget, peak_tflops=peak_tflops, full_recompute=full_recompute)
        self.shape, self.warmup_steps, self.on_cuda = plan.shape, warmup_steps, plan.on_cuda
        self.start_step = self.start_time = None  # the end of the warm-up: where the whole-run average starts
        self.mark_step = self.mark_time = None  # the last logging step: where the current interval starts
        self.paused_s = 0.0  # time spent saving/evaluating since start, excluded from training time
        self.end_step = self.end_time = None  # the last optimizer step: where the whole-run average ends
        self.steady = None  # (step, time, paused_s then) at the first logging step after the warm-up
        self._step_end_time = None
        self._paused = False
        self.first_step = 0  # a resumed run starts at its checkpoint's step

    def begin(self, step: int) -> None:
        self.first_step = step
        if self.warmup_steps == 0:  # time from the very first step
            _sync(self.on_cuda)
            self.start_step = self.mark_step = step
            self.start_time = self.mark_time = time.perf_counter()

    def step_end(self, step: int, last: bool = False, pause_follows: bool = False) -> None:
        """pause_follows: a checkpoint save or an evaluation comes next. The clock is then read after the device has
        finished this step's queued work - otherwise that work would drain inside the pause, be excluded as save
        time, and the interval would look faster than it was (only on a GPU, where kernels run asynchronously)."""
        warm = step == self.first_step + self.warmup_steps
        if warm or last or pause_follows:
            _sync(self.on_cuda)
        now = time.perf_counter()
        if warm:
            self.start_step = self.mark_step = step
            self.start_time = self.mark_time = now
        if last:
            self.end_step, self.end_time = step, now
        self._step_end_time = now

    def mark_paused(self) -> None:
        """A checkpoint save or an evaluation happened after the last step; its time is not training time."""
        self._paused = True

    def step_begin(self) -> None:
        if self._paused and self._step_end_time is not None and self.start_time is not None:
            self.pause(time.perf_counter() - self._step_end_time)
        self._paused = False

    def pause(self, seconds: float) -> None:
        self.paused_s += seconds
        if self.mark_time is not None:
            self.mark_time += seconds

    def figures(self, s_per_iter: float) -> metrics.StepFigures:
        return metrics.step_figures(self.shape, s_per_iter=s_per_iter, **self.fixed)

    def interval(self, step: int) -> metrics.StepFigures | None:
        """Figures over the steps since the previous logging step (None during warm-up)."""
        if self.mark_step is None or step < self.mark_step:
            return None
        _sync(self.on_cuda)
        now = time.perf_counter()
        if self.steady is None and self.warmup_steps > 0:
            self.steady = (step, now, self.paused_s)
        if step == self.mark_step:  # a log at the warm-up's last step: no interval yet
            return None
        s_per_iter = (now - self.mark_time) / (step - self.mark_step)
        self.mark_step, self.mark_time = step, now
        return self.figures(s_per_iter)

    def _span_start(self) -> tuple[int | None, float | None, float]:
        """(step, time, paused seconds by then) where the whole-run figures start: the steady state's first logging
        step when a step follows it, else the warm-up's end."""
        if self.steady is not None and self.end_step is not None and self.steady[0] < self.end_step:
            return self.steady
        return self.start_step, self.start_time, 0.0

    def whole_run(self) -> tuple[metrics.StepFigures | None, int]:
        """Figures averaged over the steady state (see the class), and how many steps that is."""
        start_step, start_time, paused_before = self._span_start()
        if start_step is None or self.end_step is None or self.end_step <= start_step:
            return None, 0
        steps = self.end_step - start_step
        return self.figures((self.end_time - start_time - (self.paused_s - paused_before)) / steps), steps

    @property
    def timed_from(self) -> int | None:
        """The step the whole-run figures are timed from (whole_run)."""
        return self._span_start()[0]


def perf_scalars(fig: metrics.StepFigures) -> dict:
    """The perf/* names used in logs, TensorBoard and the results file."""
    return {
        "perf/s_per_iter": fig.s_per_iter,
        "perf/tokens_per_s": fig.tokens_per_s,
        "perf/tokens_per_s_per_gpu": fig.tokens_per_s_per_gpu,
        "perf/samples_per_s": fig.samples_per_s,
        "perf/tflops_per_gpu": fig.tflops_per_gpu_model,
        "perf/tflops_per_gpu_hardware": fig.tflops_per_gpu_hardware,
        "perf/tflops_per_gpu_bigscience": fig.tflops_per_gpu_bigscience,
        **({"perf/mfu": fig.mfu, "perf/hfu": fig.hfu} if fig.mfu is not None else {}),
        "perf/days_to_budget": fig.days_to_budget,
        "perf/gpu_days_to_budget": fig.gpu_days_to_budget,
    }


class TensorBoardWriter:
    """train/*, perf/*, memory/* scalars and the run's hyper-parameters, straight into the run directory,
    so `tensorboard --logdir runs/` overlays every run under its run name."""

    def __init__(self, log_dir: str, hparams: dict):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        self.writer = SummaryWriter(log_dir=log_dir)
        self.hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
        for summary in hparams_summary(self.hparams, {"perf/tokens_per_s": 0.0, "train/loss": 0.0}):
            self.writer.file_writer.add_summary(summary)

    def scalars(self, values: dict, step: int, flush: bool = True) -> None:
        """The numbers among `values` at `step`, as one event holding every tag (TensorBoard reads each as its own
        curve, as from TF1's merged summaries): a logging step's host time is a gap in a GPU's queue, and one event
        per tag - a protobuf, a queue put and a wake of the writer's thread each - took 0.87 ms for a log's 22 tags
        on the 2-core CI machine, against 0.24 ms as one event per x value with one flush (on_log;
        benchmarks/log_cost.py)."""
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.summary import scalar

        tags = [value for name, number in values.items() if isinstance(number, (int, float))
                for value in scalar(name, number).value]
        if tags:
            self.writer.file_writer.add_summary(Summary(value=tags), step)
        if flush:
            self.writer.flush()

    def points(self, values: dict, step: int, curves: list[tuple[str, dict]]) -> None:
        """`values` at `step`, and each (split, loss point)'s loss against tokens and time (curve_scalars) at theirs:
        one event per x value, unflushed."""
        by_step = {step: dict(values)}
        for split, point in curves:
            for tag, value, x in curve_scalars(split, point):
                by_step.setdefault(x, {})[tag] = value
        for x, tags in by_step.items():
            self.scalars(tags, x, flush=False)

    def histories(self, loss_history: list[dict], eval_history: list[dict]) -> None:
        """A finished record's curves under the tags a live run writes (an imported log's: compare/megatron.py)."""
        for split, history, tags in (("train", loss_history, HISTORY_SCALARS["train"]),
                                     ("eval", eval_history, HISTORY_SCALARS["eval"])):
            for point in history:
                self.points({tag: point.get(key) for key, tag in tags.items()}, point["step"], [(split, point)])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


TRAIN_SCALARS = {"loss": "train/loss", "grad_norm": "train/grad_norm", "learning_rate": "train/lr",
                 "eval_loss": "eval/loss", "eval_perplexity": "eval/perplexity"}
# the same tags from a results file's loss_history / eval_history points (run/results.py RunRecord.add_loss/add_eval)
HISTORY_SCALARS = {"train": {"loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/lr"},
                   "eval": {"loss": "eval/loss", "perplexity": "eval/perplexity"}}


def curve_scalars(split: str, point: dict) -> list[tuple[str, float, int]]:
    """A loss point of `split` (train, eval) against tokens seen and training milliseconds: (tag, loss, step) of
    `<split>_by_tokens/loss` and `<split>_by_time_ms/loss`, where the point has them."""
    loss, tokens, elapsed = point.get("loss"), point.get("tokens"), point.get("elapsed_s")
    if loss is None or tokens is None:
        return []
    return [(f"{split}_by_tokens/loss", loss, int(tokens)),
            *([(f"{split}_by_time_ms/loss", loss, int(elapsed * 1000))] if elapsed is not None else [])]


class MeasureCallback(TrainerCallback):
    """Feeds the Meter from the Trainer's events and sends figures to TensorBoard and the run record."""

    def __init__(self, meter: Meter | None, record, tensorboard: TensorBoardWriter | None, is_main: bool,
                 step_memory: StepMemory | None = None, collectives=None, profiler=None):
        self.meter, self.record, self.tb, self.is_main = meter, record, tensorboard, is_main
        self.step_memory, self.collectives = step_memory, collectives  # collectives: a run.collectives.CollectiveCounter
        self.profiler = profiler  # a run.profile.StepProfiler

    def on_train_begin(self, args, state, control, **kwargs):
        if self.meter:
            self.meter.begin(state.global_step)
        for logs in state.log_history:  # resumed: the losses logged before the checkpoint
            if "loss" in logs and "step" in logs:
                self.record.add_loss(logs["step"], logs)
            if "eval_loss" in logs and "step" in logs:
                self.record.add_eval(logs["step"], logs)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.meter:
            self.meter.step_begin()
        if self.step_memory:
            self.step_memory.begin()

    def on_step_end(self, args, state, control, **kwargs):
        if self.step_memory:
            self.step_memory.end(state.global_step)
        if self.collectives:
            self.collectives.step_end(state.global_step)
        if self.profiler:
            self.profiler.step_end(state.global_step)
        if self.meter:  # the Trainer's flow callback has already decided whether a save or an evaluation follows
            self.meter.step_end(state.global_step, last=state.global_step >= state.max_steps,
                                pause_follows=bool(control.should_save or control.should_evaluate))

    def on_save(self, args, state, control, **kwargs):
        if self.meter:
            self.meter.mark_paused()

    def on_evaluate(self, args, state, control, **kwargs):
        if self.meter:
            self.meter.mark_paused()

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        values = {TRAIN_SCALARS[k]: v for k, v in logs.items() if k in TRAIN_SCALARS}
        values.update({k: v for k, v in logs.items() if k.startswith(("perf/", "memory/"))})
        if "perf/s_per_iter" in logs:  # the interval figures: their spread is the run-to-run noise (hfscale project)
            self.record.results.perf_history.append({"step": state.global_step, "s_per_iter": logs["perf/s_per_iter"]})
        if "loss" in logs:
            self.record.add_loss(state.global_step, logs)
        if "eval_loss" in logs:
            self.record.add_eval(state.global_step, logs)
        if self.tb and self.is_main:  # the same loss against tokens and time; one wait for the writer's thread
            self.tb.points(values, state.global_step,
                           [(split, {"loss": logs.get(key), "tokens": logs.get("tokens"), "elapsed_s": logs.get("elapsed_s")})
                            for key, split in (("loss", "train"), ("eval_loss", "eval"))])
            self.tb.writer.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self.tb:  # closed by close(), after the final evaluation (which logs after on_train_end)
            self.tb.writer.flush()

    def close(self) -> None:
        if self.tb:
            self.tb.close()
