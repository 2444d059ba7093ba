"""Host syncs: reads of a tensor's values by Python while training (`--count_host_syncs`).

On a GPU every such read - `.item()`, `bool(t)` (an `if` or `or` on a tensor), `float(t)`, `int(t)`, `.tolist()`,
`.numpy()`, `.cpu()`, `.to("cpu")` - waits until the device has run everything queued before it. A training step that
makes none lets the host queue the next step's kernels while the device still computes this one, so the host's own
per-step work (the Trainer's loop, callbacks, the data path, the next forward's Python) hides under device time. One
read per micro-batch stops the host at every micro-batch instead, and all of that work shows up as idle device time:
the gap between a Trainer step and a hand-written loop, largest where the step is short (torch.compile, small models).

Counted with a TorchFunctionMode, each with the line that made it: value reads of tensors on the device, and copies
between host and device that are not non_blocking (torch copies those with a stream synchronize). On the CPU route
every value read counts, since every tensor is a host tensor there: an upper bound of what a GPU would wait for. Not
seen: reads made inside C++ (DDP's reducer) or inside a compiled graph; on CUDA, `torch.cuda.set_sync_debug_mode
("warn")` names those.

A period is one whole loop iteration, from one optimizer step's `on_step_begin` to the next one's: the step's
micro-batches, its logging, and the fetch of the next step's batch. results.json `host_syncs` (rank 0's):
{"steps": [{"step", "reads", "sites": {site: reads}}]}. docs/metrics.md ("Where a step's time goes") says what a
step still reads.
"""

import os
import sys
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from transformers import TrainerCallback

# Tensor methods whose result is a Python value: each one reads the tensor's values on the host
VALUE_READS = frozenset({"item", "__bool__", "__float__", "__int__", "__index__", "__complex__", "tolist", "numpy"})
TRANSFERS = frozenset({"to", "cpu", "cuda"})  # a copy between devices: blocking unless non_blocking=True
_HERE = os.path.abspath(__file__)
_WRAPPERS = tuple(os.path.join(os.path.dirname(torch.__file__), name) for name in ("_tensor.py", "overrides.py"))


def _target_device(name: str, args: tuple, kwargs: dict):
    if name == "cpu":
        return torch.device("cpu"), False
    if name == "cuda":
        return torch.device("cuda"), bool(kwargs.get("non_blocking", False))
    device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
    return device, non_blocking


def is_host_sync(func, args: tuple, kwargs: dict, device_type: str) -> bool:
    """Whether a call waits for the device on a GPU: a value read of a tensor on the device, or a blocking copy
    between the host and the device. On the CPU route (`device_type` "cpu") every tensor is a host tensor, so every
    value read counts (an upper bound: on a GPU some of them, say torch optimizers' step counters, read host
    tensors) and no copy crosses devices."""
    name = getattr(func, "__name__", "")
    tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if tensor is None:
        return False
    if name in VALUE_READS:
        return device_type == "cpu" or tensor.device.type != "cpu"
    if name in TRANSFERS:
        target, non_blocking = _target_device(name, args, kwargs)
        return target is not None and target.type != tensor.device.type and not non_blocking
    return False


def call_site(skip: int = 2) -> str:
    """`path:line (function)` of the code that made the call (torch's own Python wrappers and this module skipped),
    the path from its package down: `transformers/trainer.py:1922 (_inner_training_loop)`."""
    frame = sys._getframe(skip)
    while frame is not None and (frame.f_code.co_filename in _WRAPPERS
                                 or os.path.abspath(frame.f_code.co_filename) == _HERE):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        relative = os.path.relpath(path)
        path = path if relative.startswith("..") else relative
    return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"


class HostReads(TorchFunctionMode):
    """Counts host syncs by call site while entered (`with HostReads("cuda") as reads: ...; reads.sites`)."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type = device_type
        self.sites: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_host_sync(func, args, kwargs, self.device_type):
            self.sites[call_site()] += 1
        return func(*args, **kwargs)

    def take(self) -> Counter:
        """The reads so far, and start counting afresh."""
        sites, self.sites = self.sites, Counter()
        return sites


class HostSyncCallback(TrainerCallback):
    """Counts host reads per loop period from the first optimizer step's `on_step_begin` to the end of training.
    Added after the start-up checks (their one-off reads are not training's); `stop()` leaves the mode on any exit."""

    def __init__(self, device_type: str):
        self.mode = HostReads(device_type)
        self.active = False
        self.step = None  # the optimizer step whose period is being counted
        self.steps: list[dict] = []

    def _close_period(self) -> None:
        sites = self.mode.take()
        if self.step is not None:
            self.steps.append({"step": self.step, "reads": sum(sites.values()), "sites": dict(sites)})

    def on_train_begin(self, args, state, control, **kwargs):
        self.mode.__enter__()
        self.active = True

    def on_step_begin(self, args, state, control, **kwargs):
        self._close_period()
        self.step = state.global_step + 1

    def on_train_end(self, args, state, control, **kwargs):
        self.stop()

    def stop(self) -> None:
        if self.active:
            self._close_period()
            self.mode.__exit__(None, None, None)
            self.active = False
        self.step = None

    def summary(self) -> dict:
        return {"steps": self.steps}
