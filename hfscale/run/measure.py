"""Live measurement during training: seconds per iteration, throughput, TFLOPs, MFU, memory, days.

One timing per logging step: on CUDA a single synchronize before reading the clock (the Trainer's loss
`.item()` at a logging step synchronizes anyway); nothing is synchronized on the other steps. Figures come
from formulas/metrics.py; this module only measures time (and reads a GPU's clock) and routes the numbers. The memory
a run measures is run/memory.py's.
"""

import time

from transformers import TrainerCallback

from ..formulas import metrics
from .memory import StepMemory


def synchronize(on_cuda: bool) -> None:
    """Wait for the device's queued work (CUDA); nothing on a CPU, where every op has finished when it returns."""
    if on_cuda:
        import torch

        torch.cuda.synchronize()


def sm_clock_mhz(on_cuda: bool) -> int | None:
    """The GPU's SM clock now, in MHz (NVML, through torch.cuda.clock_rate); None on a CPU or where NVML cannot be read.
    Read at each logging interval: a card held below its boost clock by its power limit runs the same step slower (one
    H100 ran GPT-2 1.3B at 1725-1800 MHz, 350M at 1980: docs/metrics.md)."""
    if not on_cuda:
        return None
    import torch

    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # noqa: BLE001 - nvidia-ml-py missing, or NVML refused: the clock is a clue, not a figure
        return None


class Meter:
    """Times optimizer steps after `warmup_steps` and turns them into metrics.StepFigures for the run's plan.

    The whole-run figures are the steady state: timed from the first logging step at or after the warm-up when a step
    follows it (else from the warm-up's end): the interval up to that log still pays one-off costs after the warm-up
    on a GPU (docs/metrics.md), and stays in perf_history. `warmup_steps` 0 times everything, from the very first step."""

    def __init__(self, plan, *, token_budget, peak_tflops, warmup_steps, full_recompute: bool = False):
        self.plan, self.warmup_steps, self.on_cuda = plan, warmup_steps, plan.on_cuda
        self.fixed = dict(token_budget=token_budget, peak_tflops=peak_tflops, full_recompute=full_recompute)
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
            synchronize(self.on_cuda)
            self.start_step = self.mark_step = step
            self.start_time = self.mark_time = time.perf_counter()

    def step_end(self, step: int, last: bool = False, pause_follows: bool = False) -> None:
        """pause_follows: a checkpoint save or an evaluation comes next. The clock is then read after the device has
        finished this step's queued work - otherwise that work would drain inside the pause, be excluded as save
        time, and the interval would look faster than it was (only on a GPU, where kernels run asynchronously)."""
        warm = step == self.first_step + self.warmup_steps
        if warm or last or pause_follows:
            synchronize(self.on_cuda)
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
        return self.plan.step_figures(s_per_iter, **self.fixed)

    def interval(self, step: int) -> metrics.StepFigures | None:
        """Figures over the steps since the previous logging step (None during warm-up)."""
        if self.mark_step is None or step < self.mark_step:
            return None
        synchronize(self.on_cuda)
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
            interval = {"step": state.global_step, "s_per_iter": logs["perf/s_per_iter"]}
            clock = sm_clock_mhz(self.meter.on_cuda) if self.meter else None
            self.record.results.perf_history.append({**interval, **({"sm_mhz": clock} if clock else {})})
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
