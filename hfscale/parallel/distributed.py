"""Process-group set-up the libraries get wrong on a CPU-only machine (what the launcher asked for: launch_env.py).

Traps this module exists for (each seen with transformers 5 / accelerate 1.x on a CPU-only machine):
- Launched with 2 processes, the Trainer on CPU runs with accelerate's distributed_type NO unless `use_cpu=True`:
  no DDP wrapper, every rank trains on the same batches. hfscale sets `use_cpu` on CPU.
- With DeepSpeed on CPU, the Trainer's own state set-up either drops DeepSpeed (`use_cpu=True`) or believes the
  world size is 1 (same batches on every rank while DeepSpeed averages their gradients). The route that works:
  create accelerate's `PartialState(backend="gloo")` with ACCELERATE_USE_DEEPSPEED=true *before* the
  TrainingArguments, and let the Trainer reuse it (`accelerator_config.use_configured_state`); `use_cpu=True` is then
  harmless and lets --bf16 through (TrainingArguments refuses bf16 without a bf16 GPU unless use_cpu is set).
  `use_cpu` is decided with the other arguments (run/planning.py); the state is created here, in `setup_processes`.
- A run started without a launcher gets a one-process group of its own, so FSDP and DeepSpeed run unchanged.
"""

import os

from ..errors import HfscaleError
from ..flags import at_most_gpus


def has_accelerator() -> bool:
    """A CUDA device is visible (whether the run uses it is `on_accelerator`)."""
    import torch

    return torch.cuda.is_available()


def on_accelerator(use_cpu: bool = False) -> bool:
    """The route of a run: GPU when a CUDA device is visible and the user did not pass --use_cpu. Every CPU/GPU
    difference in hfscale is decided from this (docs/strategies.md, "CPU and GPU routes")."""
    return has_accelerator() and not use_cpu


def device_capability() -> tuple[tuple[int, int], str]:
    """(compute capability, name) of this node's first visible GPU: what float8 matmuls need (Ada/Hopper on)."""
    import torch

    return tuple(torch.cuda.get_device_capability(0)), torch.cuda.get_device_name(0)


def visible_device_memory() -> int:
    """Bytes of memory of this node's first visible GPU (the GPU route's device, which a trial's plan must fit)."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory


def check_local_processes(nproc_per_node: int) -> None:
    """On a GPU machine a node runs at most one process per visible GPU (two ranks on one GPU share its memory and
    NCCL refuses them); a CPU machine runs any number (gloo, one core each at best) up to MAX_GPUS."""
    import torch

    at_most_gpus("--num_processes", nproc_per_node)

    if not has_accelerator():
        return
    visible = torch.cuda.device_count()
    if nproc_per_node > visible:
        raise HfscaleError(f"{nproc_per_node} processes per node but this node sees {visible} GPU(s) "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); launch at most "
                           f"{visible} per node")


def tf32_matmuls(on_cuda: bool) -> bool:
    """torch's fp32 matmuls run in TF32 on this GPU (--tf32, or --torch_compile on Ampere+, which transformers switches
    on by itself); never on a CPU."""
    import torch

    return on_cuda and torch.backends.cuda.matmul.fp32_precision == "tf32"


def restate_matmul_precision() -> None:
    """Make torch's legacy matmul-precision getter readable after transformers set TF32 through the new API.

    transformers switches TF32 on with `torch.backends.fp32_precision` (--tf32, or --torch_compile on Ampere+), and
    torch then refuses `torch.get_float32_matmul_precision()` ("mix of the legacy and new APIs"). Inductor's autotuning
    (--torch_compile_mode max-autotune*) still reads that getter for its cache key, so the run failed at its first
    compiled step (pytorch/pytorch#196728). Where every matmul backend holds the one global
    setting, saying it again through the legacy call changes nothing torch computes and makes the getter answer."""
    import torch

    backends = torch.backends
    try:
        torch.get_float32_matmul_precision()
        return
    except RuntimeError:
        pass
    same = {backends.fp32_precision, backends.cuda.matmul.fp32_precision, backends.mkldnn.matmul.fp32_precision}
    legacy = {"tf32": "high", "ieee": "highest"}
    if len(same) == 1 and (setting := same.pop()) in legacy:
        torch.set_float32_matmul_precision(legacy[setting])


def ensure_process_group_env() -> None:
    """Give a process started without a launcher the environment of a one-process group. A WORLD_SIZE without
    LOCAL_RANK is no launcher's (accelerate, torchrun and srun-started torchrun set both): transformers would then
    drive every visible GPU from one process with nn.DataParallel, which no strategy means."""
    if "WORLD_SIZE" in os.environ:
        if "LOCAL_RANK" not in os.environ:
            raise HfscaleError("WORLD_SIZE is set but LOCAL_RANK is not: start the run with a launcher (hfscale launch, "
                               "accelerate launch, torchrun) or unset WORLD_SIZE")
        return
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # port 0: the one rank's TCPStore binds a port the kernel picks as it binds (torchrun --standalone's localhost:0);
    # no other rank needs to know it. A free port chosen here is bound only later, and any process on the machine can
    # take it meanwhile (a listener's bind, an outgoing connection), which fails the run at start.
    os.environ.setdefault("MASTER_PORT", "0")


def configure_state_for_cpu_deepspeed() -> dict:
    """Pre-create accelerate's state for DeepSpeed over gloo; returns the accelerator_config the Trainer needs."""
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    # the CPU route on any host: with --use_cpu on a GPU machine accelerate would otherwise bind each rank to a GPU
    os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
    skip_deepspeed_shm_kernel()
    PartialState(backend="gloo")
    return {"use_configured_state": True}


def skip_deepspeed_shm_kernel() -> None:
    """DeepSpeed's CPU accelerator JIT-compiles its shared-memory all-reduce kernel (deepspeed_shm_comm, ~35 s on 2
    cores, in whichever process first starts deepspeed.comm) for `inference_all_reduce` alone; training's collectives
    are torch.distributed's. Marked incompatible before deepspeed.comm starts (deepspeed/comm/torch.py build_shm_op
    reads deepspeed.ops.__compatible_ops__), it is neither built nor set up. A DeepSpeed without that table builds it
    as before. CPU route only: on CUDA no such kernel exists."""
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


def eager_optimizer_step(optimizer, on_cuda: bool, torch_compile: bool) -> bool:
    """CPU route without --torch_compile: the optimizer's step ignores torch.compile too
    (`torch.compiler.set_stance("force_eager")` around it), as the model does. torchao's AdamW8bit (fsdp* x
    adamw_8bit) compiles its step once per parameter shape; on a CPU that is inductor generating and compiling C++,
    ~30 CPU-s per rank before the first step of a cold run (a 6-step 2-process run: 81 CPU-s compiled, 15 eager),
    for ~0.05 s per step back (0.10 vs 0.155 s/iter, tiny GPT-2, inductor's cache warm): worth it from some hundreds
    of steps, which is what --torch_compile asks for. The GPU route keeps torchao's compiled step. Returns whether
    the step was made eager; idempotent. An optimizer a DeepSpeed JSON defines is accelerate's DummyOptim here, with no
    step of its own: DeepSpeed's engine steps it."""
    compiled_step = getattr(optimizer, "step", None)
    if on_cuda or torch_compile or compiled_step is None or getattr(compiled_step, "eager_on_cpu", False):
        return False
    import functools

    import torch

    @functools.wraps(compiled_step)
    def step(*args, **kwargs):
        with torch.compiler.set_stance("force_eager"):
            return compiled_step(*args, **kwargs)

    step.eager_on_cpu = True
    optimizer.step = step
    return True


def keep_cpu_info() -> None:
    """py-cpuinfo's get_cpu_info starts a Python interpreter for every call (~1 s each), and DeepSpeed calls it three
    times per rank when ZeRO-Offload loads its CPU Adam (the op builder for -march and for the SIMD width, the
    optimizer for the vendor): the first answer is kept for the others - the CPU does not change during a run. Both
    routes (the CPU Adam steps on the host either way)."""
    import functools

    try:
        import cpuinfo
    except ImportError:  # DeepSpeed then asks lscpu
        return
    if not hasattr(cpuinfo.get_cpu_info, "cache_info"):  # DeepSpeed imports it from the package when it calls it
        cpuinfo.get_cpu_info = functools.cache(cpuinfo.get_cpu_info)


def unwrap_without_importing_deepspeed() -> None:
    """accelerate's extract_model_from_parallel (the Trainer calls it when it is built and at every save) imports
    DeepSpeed whenever it is installed, only to ask isinstance(model, DeepSpeedEngine): ~0.6 CPU-s of imports in
    every rank of a run that uses no DeepSpeed (ddp, fsdp, tp). A model can be a DeepSpeedEngine only once deepspeed
    has been imported, so there it asks whether it has been: the answer is the same, and no import is made. Both
    routes; idempotent."""
    import sys

    from accelerate.utils import other

    available = other.is_deepspeed_available
    if getattr(available, "imported_only", False):
        return

    def deepspeed_imported_and_available() -> bool:
        return "deepspeed" in sys.modules and available()

    deepspeed_imported_and_available.imported_only = True
    other.is_deepspeed_available = deepspeed_imported_and_available


def setup_processes(plan) -> dict:
    """Everything that must happen before the TrainingArguments build their device state, for a run's RunPlan: the
    one-process group environment when no launcher started us; on the GPU route, the CPU backend FSDP offload needs and
    HSDP's mesh (as accelerate's ParallelismConfig); on the CPU route, the DeepSpeed set-up above, and HSDP's mesh kept
    from accelerate, which refuses a ParallelismConfig without GPUs (hooks.force_fsdp_state applies it). Called once,
    explicitly, by train.run(). Returns the TrainingArguments overrides this needs."""
    ensure_process_group_env()
    unwrap_without_importing_deepspeed()
    strategy, mesh = plan.strategy, plan.mesh
    if strategy.engine == "deepspeed" and strategy.offloads_state("optimizer_states"):
        keep_cpu_info()
    if strategy.tensor_parallel:  # its mesh is built with the model (tensor_parallel_config) and set on accelerate's
        os.environ.pop("ACCELERATE_USE_PARALLELISM_CONFIG", None)  # state by hooks.use_tensor_parallel_state
    if plan.on_cuda:
        if mesh:
            from accelerate.parallelism_config import ParallelismConfig

            return {"parallelism_config": ParallelismConfig(dp_replicate_size=mesh[0], dp_shard_size=mesh[1])}
        if strategy.engine == "fsdp" and strategy.offloads_state("parameters"):
            # accelerate adds "cpu:gloo" to the process group (for the all-reduces of CPU-offloaded shards, e.g. the
            # gradient norm) only when these are exported - by its launcher, from an FSDP config; not by torchrun,
            # `python`, a --multi_gpu launch, or a sweep
            os.environ["ACCELERATE_USE_FSDP"] = "true"
            os.environ["FSDP_OFFLOAD_PARAMS"] = "true"
        return {}
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports deepspeed
    os.environ.pop("ACCELERATE_USE_PARALLELISM_CONFIG", None)  # MULTI_CPU + ParallelismConfig: accelerate raises
    if strategy.engine == "deepspeed":
        return {"accelerator_config": configure_state_for_cpu_deepspeed()}
    return {}


def tensor_parallel_config(plan):
    """A tensor-parallel run's ParallelismConfig - (dp_shard, tp) = (nodes, processes per node) - with its device mesh
    built: the model is split on mesh["tp"] before the Trainer exists, and accelerate is handed the same mesh
    (hooks.use_tensor_parallel_state), so FSDP2 shards the TP slices over mesh["dp_shard_cp"] and the data loader
    gives the ranks of one TP group the same batch. None for every other strategy. Needs the process group."""
    if not plan.strategy.tensor_parallel:
        return None
    from accelerate.parallelism_config import ParallelismConfig

    sizes = plan.parallel_sizes
    config = ParallelismConfig(dp_replicate_size=1, dp_shard_size=sizes["dp_shard"], tp_size=sizes["tp"], cp_size=1,
                               sp_size=1)  # every size: one left out is read from the launcher's environment
    config.get_device_mesh("cuda" if plan.on_cuda else "cpu")
    return config


def barrier() -> None:
    """torch.distributed.barrier on the GPU this rank drives: without device_ids NCCL guesses the device from the
    current context and warns ("barrier(): using the device under current context ...") at every call."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def shutdown(wait_for_all: bool = True) -> bool:
    """Tear the process group down before interpreter exit (after a barrier when the run succeeded).

    Left to interpreter exit, gloo's worker threads can be destroyed mid-flight, which aborts a rank with
    "terminate called without an active exception" (exit -6) after its results are written (pytorch#190489).
    A failing rank skips the barrier: the others may never reach it. Returns whether there was a group.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if wait_for_all:
            barrier()
        dist.destroy_process_group()
        return True
    return False
