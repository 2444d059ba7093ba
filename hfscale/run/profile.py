"""`--profile_step N`: torch's profiler over one whole period of the training loop, where the time of a step goes.

The period is the one `--count_collectives` counts: from the end of optimizer step N-1 to the end of step N (the
previous step's logging, the batch fetch, every micro-batch, the optimizer step). Each rank writes a Chrome/Perfetto
trace (output_dir/profile/rank{R}_step{N}.json: chrome://tracing, ui.perfetto.dev) and results.json `profile` holds
rank 0's summary: the period's wall time, the host's busiest ops (self time), and on a GPU the device's busiest ops,
its busy time (the union of its kernels, copies and sets; not the spans the profiler draws on the device's timeline
for a host range such as `Optimizer.step#AdamW.step`, which cover idle gaps too) and the idle share - the time the
device waited for the host, which is what separates a Trainer step from a hand-written loop (benchmarks/gpu_suite.py
profiles both).
"""

import os
import time
from abc import ABC, abstractmethod

TOP = 12  # ops listed per side


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (overlapping kernels on several streams count once)."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def summarize(events, wall_s: float, on_device: bool) -> dict:
    """The summary of a profiled period from torch's FunctionEvents (profiler.events()): times in seconds."""
    from torch.autograd import DeviceType

    host, device, intervals = {}, {}, []
    for e in events:
        on_gpu = e.device_type != DeviceType.CPU
        if on_gpu and getattr(e, "is_user_annotation", False):
            continue  # a range's span on the device timeline (Optimizer.step#...), idle gaps included: no device work
        table = device if on_gpu else host
        self_us = e.self_device_time_total if on_gpu else e.self_cpu_time_total
        row = table.setdefault(e.name, [0.0, 0])
        row[0] += self_us / 1e6
        row[1] += 1
        if on_gpu:
            intervals.append((e.time_range.start, e.time_range.end))

    def top(table: dict) -> list[dict]:
        rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:TOP]
        return [{"name": name, "self_s": round(s, 6), "calls": n} for name, (s, n) in rows]

    out = {"wall_s": wall_s, "host_top": top(host)}
    if on_device:
        busy = busy_time(intervals) / 1e6
        out.update(device_busy_s=busy, device_idle_share=max(0.0, 1 - busy / wall_s) if wall_s > 0 else None,
                   device_top=top(device))
    return out


class PeriodProfiler(ABC):
    """torch's profiler over one whole period of the training loop: from the end of optimizer step `step - 1` to the
    end of step `step` (step >= 2; the Trainer's global_step after it) - the previous step's logging, the batch fetch,
    every micro-batch and the optimizer step. `step_end` is called at every step's end (MeasureCallback); what the
    period recorded goes to `finish(profiler, wall_s)`, which the recorders built on this define."""

    what = "profiled"

    def __init__(self, step: int, on_cuda: bool = False, record_shapes: bool = False):
        if step < 2:
            raise ValueError(f"the {self.what} step must be 2 or later (its period starts at the end of the one "
                             "before)")
        self.step, self.on_cuda, self.record_shapes = step, on_cuda, record_shapes
        self.profiler, self.start, self.done = None, None, False

    def step_end(self, completed_steps: int) -> None:
        if completed_steps == self.step - 1 and not self.done:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_cuda else [])
            self.profiler = profile(activities=activities, record_shapes=self.record_shapes)
            self.profiler.__enter__()
            self.start = time.perf_counter()
        elif completed_steps == self.step and self.profiler is not None:
            if self.on_cuda:
                import torch

                torch.cuda.synchronize()  # the period's device work is in the trace, and in its wall time
            wall = time.perf_counter() - self.start
            self.profiler.__exit__(None, None, None)
            self.finish(self.profiler, wall)
            self.profiler, self.done = None, True

    @abstractmethod
    def finish(self, profiler, wall_s: float) -> None:
        """Read what the finished period recorded (the profiler has stopped; `wall_s`: the period's wall time)."""

    def stop(self) -> None:
        """Leave the profiler however training ended (a run that stopped inside the period)."""
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler = None


class StepProfiler(PeriodProfiler):
    """--profile_step: the period's trace (one file per rank) and its summary (`summary`)."""

    def __init__(self, step: int, on_cuda: bool, trace_dir: str, rank: int):
        super().__init__(step, on_cuda)
        self.trace_path = os.path.join(trace_dir, f"rank{rank}_step{step}.json")
        self.summary = None

    def finish(self, profiler, wall_s: float) -> None:
        os.makedirs(os.path.dirname(self.trace_path), exist_ok=True)
        partial = f"{self.trace_path}.partial"  # a reader never sees half a trace
        profiler.export_chrome_trace(partial)
        os.replace(partial, self.trace_path)
        self.summary = {"step": self.step, "trace": self.trace_path,
                        **summarize(profiler.events(), wall_s, self.on_cuda)}
