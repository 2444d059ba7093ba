"""`--profile_step N`: torch's profiler over one whole period of the training loop, where the time of a step goes.

The period is the one `--count_collectives` counts: from the end of optimizer step N-1 to the end of step N (the
previous step's logging, the batch fetch, every micro-batch, the optimizer step). Each rank writes a Chrome/Perfetto
trace (output_dir/profile/rank{R}_step{N}.json: chrome://tracing, ui.perfetto.dev) and results.json `profile` holds
rank 0's summary: the period's wall time, the host's busiest ops (self time), and on a GPU the device's busiest ops,
its busy time (the union of its kernels, copies and sets) and the idle share - the time the device waited for the
host, which is what separates a Trainer step from a hand-written loop (benchmarks/gpu_suite.py profiles both).
"""

import os
import time

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


class StepProfiler:
    """Profiles optimizer step `step` (>= 2) as one loop period; called at every step's end (MeasureCallback)."""

    def __init__(self, step: int, on_cuda: bool, trace_dir: str, rank: int):
        if step < 2:
            raise ValueError("the profiled step must be 2 or later (its period starts at the end of the one before)")
        self.step, self.on_cuda, self.rank = step, on_cuda, rank
        self.trace_path = os.path.join(trace_dir, f"rank{rank}_step{step}.json")
        self.profiler, self.start, self.summary = None, None, None

    def step_end(self, completed_steps: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if completed_steps == self.step - 1 and self.summary is None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_cuda else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
            self.start = time.perf_counter()
        elif completed_steps == self.step and self.profiler is not None:
            if self.on_cuda:
                torch.cuda.synchronize()  # the period's device work is in the trace, and in its wall time
            wall = time.perf_counter() - self.start
            self.profiler.__exit__(None, None, None)
            os.makedirs(os.path.dirname(self.trace_path), exist_ok=True)
            partial = f"{self.trace_path}.partial"  # a reader never sees half a trace
            self.profiler.export_chrome_trace(partial)
            os.replace(partial, self.trace_path)
            self.summary = {"step": self.step, "trace": self.trace_path,
                            **summarize(self.profiler.events(), wall, self.on_cuda)}
            self.profiler = None

    def stop(self) -> None:
        """Leave the profiler however training ended (a run that stopped inside the period)."""
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler = None
