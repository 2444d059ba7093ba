"""Stop on a warning: save a complete checkpoint and end the run cleanly when SIGUSR1 arrives.

A SLURM job is killed at its time limit, and a preempted one soon after it is told; the work since its last checkpoint
is lost. `#SBATCH --signal=USR1@120` (what `hfscale slurm --requeue` writes) asks SLURM to send SIGUSR1 to every
process of the job 120 s before; the same signal, sent by hand (`scancel --signal=USR1 JOB`, `kill -USR1`), works the
same way. Megatron-LM's `--exit-signal-handler` and Lightning's SLURM requeue do the same with SIGTERM and SIGUSR1.

On the signal each rank only sets a flag. At each logging step, the ranks agree on the flags (an all-reduce of one
number over gloo on the host, so no device sync): once any rank has one, every rank saves the checkpoint of that step
(complete, marked as every checkpoint is: run/checkpoints.py) and the Trainer's loop ends. The results say
`status: "stopped"` with the step, and the process exits 0; `--resume_from_checkpoint latest` continues from there.
A step counted by `--count_collectives` is left out of the agreement, so its count is the engine's alone.
"""

import logging
import signal

import numpy as np
import torch
import torch.distributed as dist
from transformers import TrainerCallback

logger = logging.getLogger("hfscale")

SIGNAL = signal.SIGUSR1


class StopOnSignal(TrainerCallback):
    """SIGUSR1 -> at the next logging step every rank saves a checkpoint and the loop stops; `stopped_at` is that step."""

    def __init__(self, counted_step: int = 0):
        self.counted_step = counted_step  # --count_collectives' step: no agreement there
        self.received: int | None = None
        self.stopped_at: int | None = None
        self._agreed_at: int | None = None
        self._previous, self._installed = None, False
        self._group = None
        # the flag lives in numpy memory a host tensor shares: reading it is not a tensor read (run/host_syncs.py)
        self._flag = np.zeros(1, dtype=np.int32)

    def install(self) -> None:
        self._previous, self._installed = signal.signal(SIGNAL, self._on_signal), True

    def uninstall(self) -> None:
        if self._installed:  # SIG_IGN where hfscale launch set it, SIG_DFL, or a Python handler
            signal.signal(SIGNAL, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def _on_signal(self, signum, frame) -> None:
        self.received = signum  # nothing else here: a write to stderr from a handler can land inside another one

    def on_train_begin(self, args, state, control, **kwargs):
        if dist.is_initialized() and self._group is None:  # every rank: a collective call
            cpu_capable = "gloo" in str(dist.get_backend())  # the CPU route's group, or "cpu:gloo,cuda:nccl"
            self._group = dist.group.WORLD if cpu_capable else dist.new_group(backend="gloo")

    def on_step_end(self, args, state, control, **kwargs):
        self._agree(state, control)

    def on_epoch_end(self, args, state, control, **kwargs):  # --logging_strategy epoch logs here
        self._agree(state, control)

    def _agree(self, state, control) -> None:
        """At a logging step (the same steps on every rank), every rank calls this collective."""
        if not control.should_log or state.global_step in (self.counted_step, self._agreed_at):
            return
        self._agreed_at = state.global_step  # an epoch's last step can log at its end and at the epoch's
        if self.received is not None and not self._flag[0]:
            logger.warning("%s received: every rank saves a checkpoint of step %d, then stops",
                           signal.Signals(self.received).name, state.global_step)
        self._flag[0] = self.received is not None
        if dist.is_initialized():
            dist.all_reduce(torch.from_numpy(self._flag), op=dist.ReduceOp.MAX, group=self._group)
        if self._flag[0]:
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
