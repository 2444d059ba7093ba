"""How a launched training run ended: its status (ok, OOM, fail, timeout, refused; stopped to be run again) and a
one-line error, read from its exit code, its log and its results file; and taking its whole process tree down."""

import signal
from dataclasses import dataclass

import psutil

STATUSES = ("ok", "OOM", "fail", "timeout", "refused")  # final: a sweep skips such a run when started again
STOPPED = "stopped"  # saved and stopped on SIGUSR1 (run/stopping.py): run again
# How the stack says in a log that it ran out of memory: torch's caching allocator (CUDA, ROCm's HIP), a kernel's own
# cudaMalloc ("CUDA error: out of memory"), cuBLAS creating its handle or workspace, NCCL's buffers, and the host's
# allocators
OOM_MARKERS = ("CUDA out of memory", "HIP out of memory", "OutOfMemoryError", "CUDA error: out of memory",
               "CUBLAS_STATUS_ALLOC_FAILED", "Cuda failure 'out of memory'", "Cuda failure: out of memory",
               "DefaultCPUAllocator: can't allocate memory", "std::bad_alloc", "Cannot allocate memory")
OOM_KILLED = "Signal 9 (SIGKILL)"  # torchrun's words for a child the kernel's OOM killer (or a user) killed


@dataclass
class Outcome:
    status: str
    returncode: int | None
    seconds: float
    error: str | None  # one line
    log_tail: str


def kill_tree(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process and all its descendants, then SIGKILL what is left after grace_s (0: SIGKILL at once).

    The whole tree, found before anything is signalled: torchrun starts each rank in a session of its own, so
    signalling the launcher's process group would leave the ranks running as orphans."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for sig in ((signal.SIGTERM, signal.SIGKILL) if grace_s > 0 else (signal.SIGKILL,)):
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, procs = psutil.wait_procs(procs, timeout=grace_s if sig == signal.SIGTERM else 10)
        if not procs:
            return


def classify(returncode: int | None, log: str, results_status: str | None, timed_out: bool) -> tuple[str, str | None]:
    """(status, one-line error) from how the process ended, its log and what its results file says."""
    if timed_out:
        return "timeout", "killed after the sweep's timeout"
    if returncode == 0 and results_status == "ok":
        return "ok", None
    if returncode == 0 and results_status == STOPPED:
        return STOPPED, "stopped on SIGUSR1 after saving a checkpoint; the sweep runs it again when started again"
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    user_errors = [line for line in lines if line.startswith("hfscale: error:")]
    if results_status == "refused" or user_errors:
        return "refused", (user_errors[0][len("hfscale: error:"):].strip() if user_errors else _last_error(lines))
    oom = [line for line in lines if any(m in line for m in OOM_MARKERS)]
    if oom:
        return "OOM", oom[-1][:300]
    if any(OOM_KILLED in line for line in lines):
        return "OOM", "a rank was killed by SIGKILL (the kernel's OOM killer, unless someone else killed it)"
    return "fail", _last_error(lines) or f"exit code {returncode}"


def _last_error(lines: list[str]) -> str | None:
    for line in reversed(lines):
        if "Error" in line or "error" in line or "Exception" in line:
            return line[:300]
    return lines[-1][:300] if lines else None
