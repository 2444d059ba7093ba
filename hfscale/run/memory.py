"""Memory measured during a run: the process's peaks (the device's allocated and reserved bytes on CUDA, the host's
resident set always), per step (StepMemory) and while the model is built and sharded (ConstructionMemory). The
estimate they are checked against is formulas/memory.py's."""

import os
import resource
import sys

from ..formulas.metrics import GB


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
                # the resident set follows the tensors only where glibc hands freed ones back at once
                "follows_tensors": self.on_cuda or "MALLOC_MMAP_THRESHOLD_" in os.environ,
                # a run of `skip_first` steps or fewer has only steps that create the gradients and optimizer states
                # inside them: their delta is not the steady step's (memory_line says so rather than compare)
                "steps_measured": len(steps), "first_steps_only": len(self.steps) <= skip_first}
