"""What the launcher asked of this run, read from the environment `accelerate launch` (or torchrun) sets and from an
accelerate config file: the world size and processes per node, the parallelism_config's device mesh, and the strategy
its config means (DeepSpeed by its JSON or ZeRO stage, FSDP with offload, HSDP or TP) - to agree with --strategy."""

import os

from ..errors import HfscaleError
from ..files import load_json
from .strategies import all_strategies


def launcher_world_size() -> int:
    """Processes the launcher started (WORLD_SIZE; 1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launcher_processes_per_node(world: int) -> int:
    """Processes on this node, as the launcher says (torchrun and accelerate set LOCAL_WORLD_SIZE)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world)) or 1


PARALLELISM_ENV = {"dp_replicate": "PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "dp_shard": "PARALLELISM_CONFIG_DP_SHARD_SIZE",
                   "tp": "PARALLELISM_CONFIG_TP_SIZE"}


def launcher_parallel_size(dim: str) -> int:
    """One size of the launcher's parallelism_config (accelerate launch exports each as PARALLELISM_CONFIG_*)."""
    return int(os.environ.get(PARALLELISM_ENV[dim], "1"))


def check_launcher_mesh(sizes: dict[str, int] | None) -> None:
    """A launcher started with its own parallelism_config (accelerate launch, YAML or flags) must agree with the job's
    device mesh (RunPlan.parallel_sizes: HSDP's nodes x processes per node, TP's nodes x processes per node)."""
    if sizes is None or not _true("ACCELERATE_USE_PARALLELISM_CONFIG"):
        return
    asked = {dim: launcher_parallel_size(dim) for dim in sizes}
    if asked != sizes:
        shown = " x ".join(f"{dim} {n}" for dim, n in asked.items())
        wanted = " x ".join(f"{dim} {n}" for dim, n in sizes.items())
        flags = " ".join(f"--parallelism_config_{dim}_size {n}" for dim, n in sizes.items())
        raise HfscaleError(f"the launcher's parallelism_config is {shown}, but this job is {wanted} (from its nodes and "
                           f"processes per node); launch with `hfscale launch` or `hfscale slurm`, which set it from "
                           f"the job, or pass {flags}")


def _true(var: str) -> bool:
    return os.environ.get(var, "false").lower() == "true"


def deepspeed_strategy(config_file: str, zero_stage, offload_optimizer: bool) -> str:
    """The zero* strategy a DeepSpeed launcher config means: by its JSON file's name, else by ZeRO stage and offload."""
    name = os.path.basename(config_file or "")
    for s in all_strategies().values():
        if s.engine == "deepspeed" and name and s.deepspeed_config == name:
            return s.name
    guess = f"zero{zero_stage}" + ("_offload" if offload_optimizer else "")
    if guess not in all_strategies():
        raise HfscaleError(f"the launcher's DeepSpeed config ({name or f'stage {zero_stage}'}) matches no strategy")
    return guess


def launcher_strategy(deepspeed_json: dict | None = None) -> str | None:
    """The strategy an `accelerate launch --config_file ...` asked for, read from the environment it sets
    (`deepspeed_json`: the launcher's DeepSpeed JSON, already read)."""
    if _true("ACCELERATE_USE_DEEPSPEED"):
        ds = {"deepspeed_config_file": os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "")}
        stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
        if stage.isdigit():  # set from the launcher config's fields; "None" when it names a JSON file instead
            ds["zero_stage"] = stage
            ds["offload_optimizer_device"] = os.environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none")
        return config_strategy({"distributed_type": "DEEPSPEED", "deepspeed_config": ds}, deepspeed_json)
    mesh = _true("ACCELERATE_USE_PARALLELISM_CONFIG")
    tensor_parallel = mesh and launcher_parallel_size("tp") > 1
    if _true("ACCELERATE_USE_FSDP"):
        if tensor_parallel:
            return "fsdp_tp"
        hybrid = mesh and launcher_parallel_size("dp_replicate") > 1
        return "fsdp_hybrid" if hybrid else "fsdp_offload" if _true("FSDP_OFFLOAD_PARAMS") else "fsdp"
    return "tp" if tensor_parallel else None


def launcher_deepspeed_config() -> str | None:
    """The DeepSpeed JSON an `accelerate launch --config_file` named (used unless --deepspeed says otherwise)."""
    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "")
    return path if _true("ACCELERATE_USE_DEEPSPEED") and path and os.path.isfile(path) else None


def read_launcher_deepspeed_json() -> tuple[str | None, dict | None]:
    """(path, parsed JSON) of the launcher's DeepSpeed config, read once per run; a malformed file is reported when
    the run checks it against its strategy (strategies.load_deepspeed_config), not here."""
    path = launcher_deepspeed_config()
    try:
        return path, load_json(path) if path else None
    except HfscaleError:
        return path, None  # the strategy is then read from the launcher's fields


def config_strategy(config: dict, deepspeed_json: dict | None = None) -> str | None:
    """The strategy an accelerate config file asks for (None: plain data parallel, any ddp strategy).
    A DeepSpeed config is read from the launcher config's fields, or from its DeepSpeed JSON (`deepspeed_json`)."""
    kind = config.get("distributed_type")
    if kind == "DEEPSPEED":
        ds = config.get("deepspeed_config") or {}
        zero = (deepspeed_json or {}).get("zero_optimization") or {}
        stage = ds.get("zero_stage", zero.get("stage", ""))
        device = ds.get("offload_optimizer_device", (zero.get("offload_optimizer") or {}).get("device", "none"))
        return deepspeed_strategy(ds.get("deepspeed_config_file", ""), stage, str(device) not in ("none", ""))
    mesh = config.get("parallelism_config") or {}
    tensor_parallel = int(mesh.get("parallelism_config_tp_size", 1) or 1) > 1
    if kind == "FSDP":
        if tensor_parallel:
            return "fsdp_tp"
        offload = str((config.get("fsdp_config") or {}).get("fsdp_offload_params", False)).lower() == "true"
        replicas = mesh.get("parallelism_config_dp_replicate_size", 1)
        return "fsdp_hybrid" if int(replicas or 1) > 1 else "fsdp_offload" if offload else "fsdp"
    return "tp" if tensor_parallel else None


def check_agree(asked: str, launched: str | None) -> None:
    if launched is not None and launched != asked:
        raise HfscaleError(
            f"--strategy {asked} contradicts the launcher's config, which asks for {launched}; "
            f"launch with accelerate_configs/{asked}.yaml or drop --config_file"
        )


def resolve_strategy(asked: str | None, launcher_json: dict | None = None) -> str:
    """--strategy, checked against the launcher's config; the launcher's choice when no --strategy; else ddp."""
    launched = launcher_strategy(launcher_json)
    if asked is None:
        return launched or "ddp"
    check_agree(asked, launched)
    return asked
