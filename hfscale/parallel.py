"""The parallelism no library wires up for us: PowerSGD through the Trainer, and real FSDP2 on CPU.

Applied in a fixed order by HfscaleTrainer: (1) FSDP on CPU is forced when the accelerator is created,
(2) the PowerSGD comm hook is registered on the DDP module before the first backward.
"""

from dataclasses import dataclass


@dataclass
class PowerSGDConfig:
    rank: int  # matrix_approximation_rank: each n x m gradient travels as (n + m) x rank numbers
    warmup_steps: int  # start_powerSGD_iter: optimizer steps of plain all-reduce before compressing


def apply_powersgd(ddp_model, config: PowerSGDConfig):
    """Register PowerSGD as the DDP comm hook; returns its state (iteration count, low-rank factors) for checks."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    # Error feedback and warm start are on (torch's defaults), and with them torch requires at least 2
    # uncompressed iterations before compressing.
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=config.rank,
        start_powerSGD_iter=max(config.warmup_steps, 2),
    )
    ddp_model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return state


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


def force_fsdp_state(accelerator, fsdp_plugin_args: dict) -> None:
    """accelerate leaves a CPU (gloo) run as MULTI_CPU and wraps it in plain DDP even when FSDP was asked for.

    FSDP2's fully_shard itself works on gloo; switching the shared state to FSDP before `prepare` makes accelerate
    apply it. Only called when the state is MULTI_CPU, so the GPU route never passes here.
    """
    from accelerate.utils import DistributedType

    from torch.distributed.fsdp import CPUOffloadPolicy

    plugin = fsdp_plugin_from_args(fsdp_plugin_args)
    if isinstance(plugin.cpu_offload, CPUOffloadPolicy):
        plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)  # pinned memory needs an accelerator
    state = accelerator.state
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
