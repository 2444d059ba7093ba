"""The parallelism no library wires up for us: PowerSGD through the Trainer, and real FSDP2 on CPU.

Applied in a fixed order by HfscaleTrainer: (1) FSDP on CPU is forced when the accelerator is created,
(2) the PowerSGD comm hook is registered on the DDP module before the first backward.
"""

from dataclasses import dataclass


@dataclass
class PowerSGDConfig:
    rank: int  # matrix_approximation_rank: each n x m gradient travels as (n + m) x rank numbers
    warmup_steps: int  # start_powerSGD_iter: optimizer steps of plain all-reduce before compressing

    @property
    def start_iter(self) -> int:
        """The optimizer steps the hook all-reduces uncompressed: with error feedback and warm start (torch's
        defaults) torch requires at least 2 before compressing."""
        return max(self.warmup_steps, 2)


def apply_powersgd(ddp_model, config: PowerSGDConfig):
    """Register PowerSGD as the DDP comm hook; returns its state (iteration count, low-rank factors) for checks."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    import torch.distributed as dist

    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=config.rank,
                                        start_powerSGD_iter=config.start_iter)
    hook = powerSGD_hook.powerSGD_hook
    if dist.get_backend() != "nccl":
        hook = in_launch_order(hook)
    ddp_model.register_comm_hook(state, hook)
    return state


def in_launch_order(hook):
    """Run a chained comm hook to completion before DDP goes on, so every rank launches collectives in one order.

    powerSGD_hook launches its P and Q all-reduces from future callbacks. NCCL futures complete as soon as the work
    is queued on the stream, so the callbacks run at once, in the launching thread; gloo futures complete later on a
    gloo worker thread, so those launches race with what DDP launches next from the autograd thread (the next
    bucket, or find_unused_parameters' used-parameter map). Two ranks that lose the race differently pair unrelated
    collectives, and gloo aborts ("Received data size doesn't match expected size"). Waiting here gives up overlap
    of communication with the backward pass - on CPU runs only, which are about correctness, not speed.
    """
    import torch

    def hook_in_order(state, bucket):
        done = torch.futures.Future()
        done.set_result(hook(state, bucket).wait())
        return done

    return hook_in_order


POWERSGD_FILE = "powersgd_rank{rank}.pt"


def powersgd_state_dict(state) -> dict:
    """PowerSGD's per-rank state (iteration, error feedback, warm-start factors, RNG) as plain tensors and numbers,
    so a checkpoint reloads with torch.load(weights_only=True). Without it a resumed run restarts the warm-up and
    loses the error feedback, and its losses differ from an uninterrupted run's."""
    import torch

    name, keys, pos, has_gauss, cached = state.rng.get_state()
    return {"iter": state.iter, "error_dict": dict(state.error_dict), "p_memory_dict": dict(state.p_memory_dict),
            "q_memory_dict": dict(state.q_memory_dict), "rng": [name, torch.from_numpy(keys.copy()), pos, has_gauss, cached],
            "numel": [state.total_numel_before_compression, state.total_numel_after_compression]}


def load_powersgd_state(state, saved: dict) -> None:
    state.iter = saved["iter"]
    for attr in ("error_dict", "p_memory_dict", "q_memory_dict"):
        getattr(state, attr).clear()
        getattr(state, attr).update(saved[attr])
    name, keys, pos, has_gauss, cached = saved["rng"]
    state.rng.set_state((name, keys.numpy(), pos, has_gauss, cached))
    state.total_numel_before_compression, state.total_numel_after_compression = saved["numel"]


def save_powersgd(state, folder, rank: int) -> None:
    import torch

    torch.save(powersgd_state_dict(state), f"{folder}/{POWERSGD_FILE.format(rank=rank)}")


def restore_powersgd(state, folder, rank: int) -> bool:
    """Reload this rank's PowerSGD state from a checkpoint; False when the checkpoint has none."""
    from pathlib import Path

    import torch

    path = Path(folder) / POWERSGD_FILE.format(rank=rank)
    if not path.is_file():
        return False
    load_powersgd_state(state, torch.load(path, weights_only=True))
    return True


def powersgd_facts(state) -> dict:
    """What the hook has done so far: compression has started once low-rank factors (P, Q) exist."""
    return {
        "rank": state.matrix_approximation_rank,
        "warmup_steps": state.start_powerSGD_iter,
        "iterations": state.iter,
        "compressing": bool(state.p_memory_dict),
        "compressed_buckets": len(state.p_memory_dict),
    }


def fsdp_plugin_from_args(fsdp_plugin_args: dict):
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(**fsdp_plugin_args)


def force_fsdp_state(accelerator, fsdp_plugin_args: dict, mesh: tuple[int, int] | None = None) -> None:
    """accelerate leaves a CPU (gloo) run as MULTI_CPU and wraps it in plain DDP even when FSDP was asked for.

    FSDP2's fully_shard itself works on gloo; switching the shared state to FSDP before `prepare` makes accelerate
    apply it. Only called when the state is MULTI_CPU, so the GPU route never passes here. `mesh`: HSDP's
    (dp_replicate, dp_shard), set up as accelerate's GPU route does from a ParallelismConfig (which it refuses on
    MULTI_CPU): the config and its device mesh on the shared state, where fsdp2_prepare_model takes the mesh from.
    """
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    from torch.distributed.fsdp import CPUOffloadPolicy

    plugin = fsdp_plugin_from_args(fsdp_plugin_args)
    if isinstance(plugin.cpu_offload, CPUOffloadPolicy):
        plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)  # pinned memory needs an accelerator
    state = accelerator.state
    if state.mixed_precision != "no":  # what accelerate does for FSDP on the GPU route: FSDP2 has no autocast
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    # As accelerate does on its FSDP route: every later AcceleratorState() copies PartialState's values over its own,
    # which would quietly turn the state back into MULTI_CPU after `prepare`.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    if mesh:
        from accelerate.parallelism_config import ParallelismConfig

        config = ParallelismConfig(dp_replicate_size=mesh[0], dp_shard_size=mesh[1])
        state.parallelism_config = config
        state.device_mesh = config.get_device_mesh("cpu")


def use_tensor_parallel_state(accelerator, config, model) -> None:
    """Hand accelerate the mesh the model was split on (distributed.tensor_parallel_config), on either route, right
    after the Trainer creates its accelerator (before `prepare`); accelerate cannot take it earlier:
    - on CPU it refuses any ParallelismConfig on MULTI_CPU; set on the state, it only reads it.
    - tp alone: the full (tp) config, so `prepare_model` leaves the DTensor model unwrapped (no DDP: one replica).
    - fsdp_tp: accelerate 1.15's own TP preparation under FSDP2 imports `ReplicateParallel`, which transformers 5 no
      longer has (ImportError); with every parameter already a DTensor it would have nothing to do. accelerate gets the
      data-parallel part (dp_shard) as its config, on the full (dp_shard, tp) mesh: FSDP2 shards over
      mesh["dp_shard_cp"], and the data loader (which reads the mesh) gives a TP group's ranks the same batch.
    The model's `_tp_size`, which the Trainer reads for its batch and loss accounting (get_tp_size) and accelerate
    for its check of a TP model, is set here too: set before the Trainer's accelerator exists, it would make the
    Trainer build a ParallelismConfig of its own."""
    from accelerate.parallelism_config import ParallelismConfig

    state = accelerator.state
    if config.dp_shard_enabled:
        # every size given: a size left out is read from the launcher's PARALLELISM_CONFIG_* (its tp_size too)
        data_parallel = ParallelismConfig(dp_replicate_size=1, dp_shard_size=config.dp_shard_size, tp_size=1, cp_size=1,
                                          sp_size=1)
        data_parallel.device_mesh = config.device_mesh
        state.parallelism_config = data_parallel
    else:
        state.parallelism_config = config
    state.device_mesh = config.device_mesh
    model._tp_size = config.tp_size
