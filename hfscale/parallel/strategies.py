"""Strategies (declarative files in strategies/) and the one table of which strategy x optimizer pairs work.

A strategy file names its engine (ddp | fsdp | deepspeed), the accelerate and DeepSpeed configs it points at,
and what it shards and offloads. Code exists only for what no library does; see hooks.py and verify.py. The optimizer
axis is its own registry (optimizers.py).
"""

import copy
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

from ..errors import HfscaleError, one_of
from ..files import load_json, load_yaml
from ..formulas.memory import Layout
from .configs import config_dir
from .optimizers import OPTIMIZERS, get_optimizer

ENGINES = ("ddp", "fsdp", "deepspeed")
STATE_KINDS = ("parameters", "gradients", "optimizer_states")

_OFFLOAD_NEEDS_CPU_ADAM = (
    "DeepSpeed ZeRO-Offload runs the optimizer step on the CPU with its own CPU Adam kernel "
    "(the `optimizer` block of ds_configs/{s}.json); {o} would have to step on the device, which offload forbids. "
    "Use --optim adamw, or strategy {base} to keep {o}"
)
_FSDP2 = {
    "adafactor": "transformers' Adafactor mixes plain tensors into the math on FSDP2's DTensor parameters "
                 "(aten.add_ got mixed torch.Tensor and DTensor), and torch.optim.Adafactor (torch 2.13) fails too "
                 "(in-place aten.pow_ on a _NormPartial DTensor); use ddp or a zero* strategy for Adafactor",
}
# Every strategy x optimizer pair not listed here works; each listed one is refused before anything starts.
# Each entry was seen failing (tests/test_multiprocess.py runs every pair not listed).
INCOMPATIBLE = {
    **{(s, o): _OFFLOAD_NEEDS_CPU_ADAM.format(s=s, o=o, base=s.replace("_offload", ""))
       for s in ("zero2_offload", "zero3_offload") for o in ("adafactor", "adamw_8bit")},
    **{(s, o): reason for s in ("fsdp", "fsdp_offload", "fsdp_hybrid", "fsdp_tp") for o, reason in _FSDP2.items()},
    ("tp", "adafactor"): "transformers' Adafactor mixes plain tensors into the math on TP's DTensor parameters "
                         "(aten.add_ got mixed torch.Tensor and DTensor); use fsdp_tp with adamw, or ddp for Adafactor",
    ("tp", "adamw_8bit"): "bitsandbytes' 8-bit kernels do not run on TP's DTensor parameters (optimizer_update_32bit has "
                          "no sharding strategy registered; optimizer_update_8bit_blockwise got mixed torch.Tensor and "
                          "DTensor); use adamw, or fsdp_tp, whose 8-bit Adam is torchao's",
}


# What every generated DeepSpeed JSON holds beside its zero_optimization: precision and the batch arithmetic filled in
# by transformers from the Trainer's flags ("auto"), and DeepSpeed's own logging off (the Trainer logs).
_DEEPSPEED_COMMON = {
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
}
_DEEPSPEED_TAIL = {
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "steps_per_print": 1000000,
    "wall_clock_breakdown": False,
}
# ZeRO-Offload steps on the CPU with DeepSpeed's CPU Adam: the optimizer is DeepSpeed's, named in the JSON
_CPU_ADAM = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
_ON_CPU = {"device": "cpu", "pin_memory": True}


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str
    engine: str
    accelerate_config: str
    deepspeed_config: str | None = None
    zero_stage: int | None = None
    fsdp: str | None = None
    comm_hook: str | None = None
    powersgd: dict = field(default_factory=dict)
    shards: tuple = ()
    offload: tuple = ()
    # Megatron-style tensor parallelism over the processes of each node (parallel/tensor_parallel.py): every block's
    # matrices split by heads and MLP columns, the embedding by vocabulary rows; the engine holds what is left
    tensor_parallel: bool = False
    # DeepSpeed's zero_optimization settings beyond the stage and offload, which zero_stage and offload give
    zero_optimization: dict = field(default_factory=dict)

    @property
    def deepspeed_config_path(self) -> Path | None:
        """Its ds_configs/ JSON, generated from this strategy (hfscale configs): the file a launcher config names."""
        return config_dir("ds_configs") / self.deepspeed_config if self.deepspeed_config else None

    def deepspeed_settings(self) -> dict:
        """The DeepSpeed JSON of a ZeRO strategy: its stage, its settings and its offload, with transformers' "auto"
        values for what the Trainer's flags decide (what ds_configs/ ships, parallel/shipped.py)."""
        zero = {"stage": self.zero_stage, **self.zero_optimization}
        if self.offloads_state("optimizer_states"):
            zero["offload_optimizer"] = dict(_ON_CPU)
        if self.offloads_state("parameters"):
            zero["offload_param"] = dict(_ON_CPU)
        optimizer = {"optimizer": _CPU_ADAM} if self.offloads_state("optimizer_states") else {}
        # a copy all the way down: transformers fills the "auto" values in place
        return copy.deepcopy({**_DEEPSPEED_COMMON, **optimizer, "zero_optimization": zero, **_DEEPSPEED_TAIL})

    @cached_property
    def shipped_deepspeed_config(self) -> dict | None:
        """Its DeepSpeed settings, made once and read by the planners (None: not DeepSpeed); a run takes its own copy
        (deepspeed_settings), which transformers fills in."""
        return self.deepspeed_settings() if self.engine == "deepspeed" else None

    def deepspeed_config_with(self, zero_optimization: dict) -> dict:
        """Its shipped JSON with another zero_optimization block: what a run recorded it ran with (results.json
        config.zero_optimization; its buckets), for a plan that has to model that run."""
        return {**self.shipped_deepspeed_config, "zero_optimization": zero_optimization}

    @property
    def accelerate_config_path(self) -> Path:
        return config_dir("accelerate_configs") / self.accelerate_config

    def shards_state(self, kind: str) -> bool:
        return kind in self.shards

    @property
    def hybrid(self) -> bool:
        """HSDP: sharded over the processes of a node, replicated across nodes (FSDP's `hybrid_shard`)."""
        return "hybrid_shard" in (self.fsdp or "").split()

    def shard_ranks(self, world: int, per_node: int) -> int:
        """How many ranks share one copy of what the strategy shards: a node's processes under HSDP, the nodes under
        TP (each node is one tensor-parallel group, FSDP shards across them), else all."""
        if self.tensor_parallel:
            return max(world // max(per_node, 1), 1)
        return min(per_node, world) if self.hybrid else world

    def tp_size(self, world: int, per_node: int) -> int:
        """The tensor-parallel degree: a node's processes for a tensor-parallel strategy, else 1."""
        return min(per_node, world) if self.tensor_parallel else 1

    @property
    def rank0_builds(self) -> bool:
        """By default only rank 0 builds the whole model and the engine shards it out: FSDP (accelerate's
        cpu_ram_efficient_loading) and ZeRO-3 (zero.Init, accelerate's zero3_init_flag). Under TP each TP group's
        first rank (a node's first process) builds it and the split scatters its slices to the others
        (parallel/tensor_parallel.py). run/construction.rank0_builds applies the run's opt-outs."""
        return self.engine == "fsdp" or self.zero_stage == 3 or self.tensor_parallel

    def construction_shard_ranks(self, world: int, per_node: int) -> int:
        """The ranks the builder's copy is split over while the model is built: TP's group (the node's processes),
        or the ranks the engine shards over."""
        return self.tp_size(world, per_node) if self.tensor_parallel else self.shard_ranks(world, per_node)

    def offloads_state(self, kind: str) -> bool:
        return kind in self.offload


def _parse_strategy(path: Path) -> Strategy:
    raw = load_yaml(path)
    known = set(Strategy.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise HfscaleError(f"{path}: unknown keys {unknown}; valid keys: {sorted(known)}")
    if raw.get("name") != path.stem:
        raise HfscaleError(f"{path}: `name: {raw.get('name')}` must equal the file name {path.stem!r}")
    if raw.get("engine") not in ENGINES:
        raise HfscaleError(f"{path}: engine {raw.get('engine')!r}; choose one of: {', '.join(ENGINES)}")
    if "hybrid_shard" in (raw.get("fsdp") or "").split() and raw.get("engine") != "fsdp":
        raise HfscaleError(f"{path}: `fsdp: hybrid_shard` needs `engine: fsdp`, not {raw.get('engine')!r}")
    if raw.get("tensor_parallel") and (raw.get("engine") == "deepspeed" or raw.get("comm_hook")
                                       or "hybrid_shard" in (raw.get("fsdp") or "").split()):
        raise HfscaleError(f"{path}: `tensor_parallel: true` composes with engine ddp (TP alone) or fsdp (FSDP2 across "
                           f"nodes), without a comm hook or hybrid_shard")
    zero = raw.get("zero_optimization")
    if zero is not None:
        if raw.get("engine") != "deepspeed" or not isinstance(zero, dict):
            raise HfscaleError(f"{path}: zero_optimization is DeepSpeed's settings (a mapping), for engine deepspeed")
        derived = sorted({"stage", "offload_optimizer", "offload_param"} & set(zero))
        if derived:
            raise HfscaleError(f"{path}: zero_optimization sets {derived}, which zero_stage and offload give")
    for key in ("shards", "offload"):
        bad = [k for k in raw.get(key) or [] if k not in STATE_KINDS]
        if bad:
            raise HfscaleError(f"{path}: {key} {bad}; choose from: {', '.join(STATE_KINDS)}")
        raw[key] = tuple(raw.get(key) or ())
    return Strategy(**raw)


@lru_cache(maxsize=None)
def all_strategies() -> dict[str, Strategy]:
    files = sorted(config_dir("strategies").glob("*.yaml"))
    return {path.stem: _parse_strategy(path) for path in files}


def get_strategy(name: str) -> Strategy:
    strategies = all_strategies()
    if name not in strategies:
        raise one_of("strategy", name, strategies)
    return strategies[name]


def incompatibility(strategy: str, optim: str) -> str | None:
    """Why this pair is refused, or None when it works."""
    get_strategy(strategy)
    get_optimizer(optim)
    return INCOMPATIBLE.get((strategy, optim))


def check_pair(strategy: str, optim: str) -> None:
    reason = incompatibility(strategy, optim)
    if reason:
        raise HfscaleError(f"strategy {strategy!r} cannot use optimizer {optim!r}: {reason}")


def hsdp_refusal(nodes: int, per_node: int) -> str | None:
    """Why HSDP cannot run on `nodes` x `per_node` processes: it needs a node dimension and a shard dimension, each of
    2 or more (one node is plain FSDP, one process per node plain DDP)."""
    if nodes < 2 or per_node < 2:
        return (f"fsdp_hybrid shards over a node's processes and replicates across nodes: it needs 2+ nodes with 2+ "
                f"processes each, got {nodes} node(s) x {per_node} process(es)")
    return None


def tp_layout_refusal(strategy: Strategy, gpus: int, per_node: int) -> str | None:
    """Why a tensor-parallel strategy cannot run on `gpus` processes, `per_node` to a node: TP spans one node's
    processes (2 or more); `tp` alone has no data parallelism, so it is one node; fsdp_tp shards over 2+ nodes."""
    if per_node < 1 or gpus % per_node:
        return f"{strategy.name} needs whole nodes: {gpus} processes do not split into nodes of {per_node}"
    nodes = gpus // per_node
    if per_node < 2:
        return (f"{strategy.name} splits every layer over the processes of a node: it needs 2+ processes per node, "
                f"got {per_node}")
    if strategy.engine == "fsdp" and nodes < 2:
        return (f"{strategy.name} is TP inside a node and FSDP across nodes: it needs 2+ nodes, got {nodes}; use tp "
                f"on one node")
    if strategy.engine != "fsdp" and nodes > 1:
        return (f"{strategy.name} is one tensor-parallel group with no data parallelism: it runs on one node, got "
                f"{nodes} nodes; use fsdp_tp across nodes")
    return None


def layout_refusal(strategy: Strategy, gpus: int, per_node: int) -> str | None:
    """Why a strategy cannot run on `gpus` processes, `per_node` to a node (None when it can): PowerSGD compresses
    the all-reduce between ranks; HSDP needs whole nodes (hsdp_refusal); TP needs a node of 2+ (tp_layout_refusal)."""
    if strategy.tensor_parallel:
        return tp_layout_refusal(strategy, gpus, per_node)
    if strategy.comm_hook == "powersgd" and gpus < 2:
        return f"{strategy.name} compresses the gradient all-reduce between ranks; it needs 2 or more processes"
    if strategy.hybrid:
        if per_node < 1 or gpus % per_node:
            return f"fsdp_hybrid needs whole nodes: {gpus} processes do not split into nodes of {per_node}"
        return hsdp_refusal(gpus // per_node, per_node)
    return None


def load_deepspeed_config(path: Path, strategy: Strategy) -> dict:
    """Parse a DeepSpeed JSON and check that it is the ZeRO stage and offload the strategy claims."""
    cfg = load_json(path, "DeepSpeed JSON")
    zero = cfg.get("zero_optimization", {})
    if not isinstance(zero, dict) or zero.get("stage") != strategy.zero_stage:
        raise HfscaleError(
            f"{path}: zero_optimization.stage is {zero.get('stage') if isinstance(zero, dict) else zero!r}, "
            f"but strategy {strategy.name!r} is ZeRO-{strategy.zero_stage}"
        )
    for kind, key in (("optimizer_states", "offload_optimizer"), ("parameters", "offload_param")):
        offloaded = (zero.get(key) or {}).get("device", "none") != "none"
        if offloaded != strategy.offloads_state(kind):
            raise HfscaleError(
                f"{path}: zero_optimization.{key} is {'set' if offloaded else 'not set'}, "
                f"but strategy {strategy.name!r} {'offloads' if strategy.offloads_state(kind) else 'keeps'} {kind} "
                f"{'to CPU' if strategy.offloads_state(kind) else 'on the device'}"
            )
    return cfg


def matrix_markdown() -> str:
    """The strategy x optimizer table, generated from INCOMPATIBLE, with each strategy's --fp8 verdict
    (formulas/precision.float8_refusal, with every optimizer) - docs and `hfscale strategies --matrix`."""
    from ..formulas.precision import float8_refusal

    optims = list(OPTIMIZERS)
    lines = ["| strategy | " + " | ".join(optims) + " | --fp8 |", "|---" * (len(optims) + 2) + "|"]
    fp8_reasons = []
    for name, strategy in all_strategies().items():
        cells = ["refused" if (name, o) in INCOMPATIBLE else "ok" for o in optims]
        fp8 = float8_refusal("tensorwise", "bf16", strategy.engine)
        fp8_reasons += [fp8] if fp8 and fp8 not in fp8_reasons else []
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'no' if fp8 else 'ok'} |")
    reasons = sorted({r for r in INCOMPATIBLE.values()})
    return "\n".join(lines + [""] + [f"- refused: {r}" for r in reasons] + [f"- --fp8 no: {r}" for r in fp8_reasons])


# DeepSpeed's defaults when a JSON leaves a setting out (deepspeed/runtime/zero/config.py), and what transformers
# fills for "auto" (integrations/deepspeed.py: hidden^2, 0.9 x hidden^2, 10 x hidden).
ZERO_DEFAULT_BUCKET = 500_000_000
ZERO_DEFAULT_PERSISTENCE_THRESHOLD = 100_000
ZERO_DEFAULT_MAX_REUSE_DISTANCE = 1_000_000_000


def _bucket(zero: dict, key: str, auto: int, default: int = ZERO_DEFAULT_BUCKET) -> int:
    value = zero.get(key, default)
    return auto if value == "auto" else int(float(value))


def memory_layout(strategy: Strategy, hidden: int, deepspeed_json: dict | None = None) -> Layout:
    """The memory model's view of a strategy (hfscale.formulas.memory.Layout), buckets read from its DeepSpeed JSON."""
    if strategy.engine != "deepspeed":
        return Layout(engine=strategy.engine, offload_params=strategy.offloads_state("parameters"),
                      offload_optimizer=strategy.offloads_state("optimizer_states"))
    ds = deepspeed_json if deepspeed_json is not None else strategy.shipped_deepspeed_config
    zero = ds.get("zero_optimization", {})
    communication = str(ds.get("communication_data_type") or "").lower() or None
    return Layout(engine="deepspeed", zero_stage=strategy.zero_stage,
                  offload_optimizer=strategy.offloads_state("optimizer_states"),
                  offload_params=strategy.offloads_state("parameters"),
                  reduce_bucket=_bucket(zero, "reduce_bucket_size", hidden * hidden),
                  allgather_bucket=_bucket(zero, "allgather_bucket_size", hidden * hidden),
                  prefetch_bucket=_bucket(zero, "stage3_prefetch_bucket_size", int(0.9 * hidden * hidden)),
                  overlap_comm=bool(zero.get("overlap_comm", zero.get("stage") == 3)),
                  bucket_all_reduce=bool(zero.get("use_multi_rank_bucket_allreduce", True))
                  or not zero.get("reduce_scatter", True),
                  persistence_threshold=_bucket(zero, "stage3_param_persistence_threshold", 10 * hidden,
                                                ZERO_DEFAULT_PERSISTENCE_THRESHOLD),
                  max_reuse_distance=_bucket(zero, "stage3_max_reuse_distance", ZERO_DEFAULT_MAX_REUSE_DISTANCE,
                                             ZERO_DEFAULT_MAX_REUSE_DISTANCE),
                  communication_dtype=communication if communication in ("fp32", "fp16", "bf16") else None)
