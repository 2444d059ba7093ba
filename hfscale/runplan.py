"""The plan of one run: every fact about a run that more than one part of hfscale needs, decided in one place.

Like torchtitan's ParallelDims: the inputs are data, the derived facts are properties computed here and nowhere else.
A plan is built once - from the training arguments in a run (run/planning.py), from the planners' options in `hfscale
estimate`, `project` and `tune` (plan/options.py) - and read by all of them: the memory model takes it
(formulas.memory.rank_memory), as do the communication model, the run's name, its results and its start-up proofs.

    plan = RunPlan(get_strategy("zero3"), get_optimizer("adamw"), PRESETS["bloom-7b1"], seq_len=2048,
                   per_device_train_batch_size=2, gradient_accumulation_steps=16, world_size=64,
                   processes_per_node=8, precision="bf16")
    plan.nodes, plan.shard_ranks, plan.global_batch_size, plan.tokens_per_step, plan.memory().device_total
"""

from dataclasses import dataclass, replace

from .errors import HfscaleError
from .formulas.memory import Layout, RankMemory, construction_host_bytes, rank_memory
from .formulas.precision import Dtypes, engine_dtypes, float8_refusal
from .formulas.metrics import GB, ModelShape, StepFigures, global_batch_size, step_figures, tokens_per_step
from .parallel.optimizers import Optimizer
from .parallel.strategies import Strategy, hsdp_refusal, incompatibility, layout_refusal, memory_layout
from .parallel.tensor_parallel import tp_refusal

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DEVICE_TYPES = ("cuda", "cpu")


def compute_precision(bf16: bool, fp16: bool, mixed_precision: str | None = None, tf32_flag: bool | None = None,
                      tf32_on: bool = False) -> str:
    """What a run computes in, as the engines really set it: the Trainer's mixed precision - its flags, or
    ACCELERATE_MIXED_PRECISION from a user's accelerate config, which transformers reads into `mixed_precision` and
    accelerate turns into autocast - else TF32 where torch's matmuls use it (--tf32, or --torch_compile on a GPU that
    has it), else fp32. The planners pass their flags; a run adds what it reads back from torch."""
    if bf16 or mixed_precision == "bf16":
        return "bf16"
    if fp16 or mixed_precision == "fp16":
        return "fp16"
    return "tf32" if tf32_flag or tf32_on else "fp32"


def accumulation_steps(global_batch_size: int, micro_batch: int, world: int) -> int:
    """Micro-batches per optimizer step that make `global_batch_size` samples on `world` ranks (GBS = MBS x GAS x DP)."""
    per_step = micro_batch * world
    if global_batch_size <= 0 or global_batch_size % per_step:
        raise HfscaleError(f"--global_batch_size {global_batch_size} is not a positive multiple of "
                           f"--per_device_train_batch_size x processes = {micro_batch} x {world} = {per_step}")
    return global_batch_size // per_step


def hsdp_mesh(nodes: int, per_node: int) -> tuple[int, int]:
    """HSDP's 2-D mesh, (dp_replicate, dp_shard) = (nodes, processes per node): replicated across nodes, sharded over a
    node's processes. One node is plain FSDP and one process per node plain DDP, so both are refused."""
    reason = hsdp_refusal(nodes, per_node)
    if reason:
        raise HfscaleError(f"{reason}; use fsdp on one node or ddp with one process per node")
    return nodes, per_node


FUSED_LOSS_UNDER_TP = ("--fused_linear_cross_entropy is not built for a tensor-parallel head (tp, fsdp_tp split the "
                       "vocabulary, and hfscale gathers their logits for the loss); use it with ddp, fsdp* or zero*")


def rank0_builds(strategy, float8: str | None) -> bool:
    """Only rank 0 builds the whole model (Strategy.rank0_builds) - not an fsdp run in float8: accelerate refuses
    torchao with FSDP2's cpu_ram_efficient_loading, so every rank builds it (run/planning.py sets the flag by this).
    TP's split scatters the builder's slices itself, float8 or not."""
    return strategy.rank0_builds and not (float8 and strategy.engine == "fsdp" and not strategy.tensor_parallel)


@dataclass(frozen=True)
class RunPlan:
    strategy: Strategy
    optimizer: Optimizer
    shape: ModelShape
    seq_len: int  # tokens per sample
    per_device_train_batch_size: int = 1  # MBS: samples per rank per micro-batch
    gradient_accumulation_steps: int = 1  # GAS: micro-batches per optimizer step
    world_size: int = 1  # DP: ranks (GPUs, or processes on a CPU machine)
    processes_per_node: int = 1
    precision: str = "fp32"  # what the run computes in (compute_precision); autocast over fp32 weights under ddp
    activation_checkpointing: bool = False
    attention: str | None = "sdpa"  # eager | sdpa | flash_attention_2 (None: transformers' default, sdpa)
    deepspeed_config: dict | None = None  # the loaded DeepSpeed JSON of a zero* run (None: the shipped one)
    torch_compile: bool = False
    device_type: str = "cuda"  # the route: CUDA keeps tensors a CPU does not (formulas/memory.py)
    max_grad_norm: float = 1.0  # gradient clipping (the Trainer's default; 0: off) - FSDP2 all-reduces the norms
    fused_linear_cross_entropy: bool = False  # the head and its loss a chunk of tokens at a time (run/forward.py)
    float8: str | None = None  # --fp8: the blocks' linear layers in float8 by this torchao recipe (run/float8.py)
    kv_cache: bool = False  # the forward keeps transformers' KV cache: never in hfscale's runs since run/forward.py
    logits_output: bool = False  # the forward returns the logits beside the loss: never in hfscale's runs since then
    # accelerate's gradient_accumulation_kwargs.sync_each_batch: gradients reduced every micro-batch (no no_sync), so
    # fsdp* keep their gradients sharded while accumulating, for a reduce-scatter per micro-batch
    sync_each_batch: bool = False
    dropout: bool = False  # the model's hidden/attention dropout is on: its layers keep masks (formulas/activations)

    def __post_init__(self):
        for name in ("seq_len", "per_device_train_batch_size", "gradient_accumulation_steps", "world_size",
                     "processes_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise HfscaleError(f"--{name} must be a positive integer, got {value!r}")
        if self.precision not in PRECISIONS:
            raise HfscaleError(f"precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}")
        if self.device_type not in DEVICE_TYPES:
            raise HfscaleError(f"device type {self.device_type!r}; choose one of: {', '.join(DEVICE_TYPES)}")
        if self.processes_per_node > self.world_size:  # one node, not full: all its processes are the world
            object.__setattr__(self, "processes_per_node", self.world_size)
        if self.world_size % self.processes_per_node:
            raise HfscaleError(f"{self.world_size} processes do not split into nodes of {self.processes_per_node}")

    # ---- derived, here only -----------------------------------------------------------------------------------------
    @property
    def nodes(self) -> int:
        return self.world_size // self.processes_per_node

    @property
    def mesh(self) -> tuple[int, int] | None:
        """HSDP's (dp_replicate, dp_shard) = (nodes, processes per node); None for every other strategy."""
        return hsdp_mesh(self.nodes, self.processes_per_node) if self.strategy.hybrid else None

    @property
    def rank0_builds(self) -> bool:
        return rank0_builds(self.strategy, self.float8)

    @property
    def unreduced_micro_batches(self) -> int:
        """Micro-batches whose gradients accumulate before they are reduced: the accumulation under accelerate's
        no_sync, one under sync_each_batch."""
        return 1 if self.sync_each_batch else self.gradient_accumulation_steps

    @property
    def float8_all_gather(self) -> bool:
        """FSDP2 gathers the converted weights in float8 (torchao's enable_fsdp_float8_all_gather, as torchtitan runs
        it): half the bytes of a bf16 gather. torchao casts them with one scale per tensor: the tensorwise recipe.
        Under fsdp_tp too, where FSDP2 gathers each rank's TP slices (tensor_parallel._distribute keeps the subclass)."""
        return self.float8 == "tensorwise" and self.strategy.engine == "fsdp"

    @property
    def tp(self) -> int:
        """The tensor-parallel degree: a node's processes under tp / fsdp_tp, else 1."""
        return self.strategy.tp_size(self.world_size, self.processes_per_node)

    @property
    def data_parallel_size(self) -> int:
        """DP: ranks that see different samples (the world, over the TP degree)."""
        return self.world_size // self.tp

    @property
    def parallel_sizes(self) -> dict[str, int] | None:
        """The device mesh as accelerate's ParallelismConfig names its sizes - HSDP's (dp_replicate, dp_shard), TP's
        (dp_shard, tp) - or None for a strategy without one."""
        if self.mesh:
            return {"dp_replicate": self.mesh[0], "dp_shard": self.mesh[1], "tp": 1}
        if self.strategy.tensor_parallel:
            return {"dp_replicate": 1, "dp_shard": self.data_parallel_size, "tp": self.tp}
        return None

    @property
    def shard_ranks(self) -> int:
        """Ranks that share one copy of what the strategy shards (a node's processes under HSDP, the nodes under
        fsdp_tp, else all)."""
        return self.strategy.shard_ranks(self.world_size, self.processes_per_node)

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: MBS x GAS x DP."""
        return global_batch_size(self.per_device_train_batch_size, self.gradient_accumulation_steps,
                                 self.data_parallel_size)

    @property
    def tokens_per_step(self) -> int:
        return tokens_per_step(self.per_device_train_batch_size, self.gradient_accumulation_steps,
                               self.data_parallel_size, self.seq_len)

    def step_figures(self, s_per_iter: float, *, token_budget: float, peak_tflops: float | None,
                     full_recompute: bool = False) -> StepFigures:
        """Every figure of a step of this plan timed at `s_per_iter`: the batch over the data-parallel ranks, the FLOPs
        and the days over every rank (under TP a group of ranks shares one batch)."""
        return step_figures(self.shape, s_per_iter=s_per_iter,
                            per_device_train_batch_size=self.per_device_train_batch_size,
                            gradient_accumulation_steps=self.gradient_accumulation_steps,
                            data_parallel_size=self.data_parallel_size, gpus=self.world_size, seq_len=self.seq_len,
                            activation_checkpointing=self.activation_checkpointing, token_budget=token_budget,
                            peak_tflops=peak_tflops, full_recompute=full_recompute)

    @property
    def clips_gradients(self) -> bool:
        return self.max_grad_norm > 0

    @property
    def on_cuda(self) -> bool:
        return self.device_type == "cuda"

    @property
    def dtypes(self) -> Dtypes:
        """What this run holds, computes in and reduces (formulas/precision.engine_dtypes)."""
        return engine_dtypes(self.precision, self.strategy.engine, self.memory_layout.communication_dtype)

    @property
    def memory_layout(self) -> Layout:
        """The memory model's view of the strategy, its DeepSpeed buckets read from this run's JSON."""
        return memory_layout(self.strategy, self.shape.hidden, self.deepspeed_config)

    @property
    def zero_optimization(self) -> dict | None:
        """The zero_optimization block of a ZeRO run's DeepSpeed JSON (its own, else the shipped one); None otherwise."""
        if self.strategy.engine != "deepspeed":
            return None
        return (self.deepspeed_config or self.strategy.shipped_deepspeed_config or {}).get("zero_optimization")

    @property
    def optimizer_memory_rule(self) -> str:
        return self.optimizer.memory_rule_for(self.strategy.engine)

    def refusal(self) -> str | None:
        """Why this plan cannot run (the strategy x optimizer table, the layout: PowerSGD on one process, HSDP without
        whole nodes; TP's heads; float8's engines, models and precision), or None."""
        return (incompatibility(self.strategy.name, self.optimizer.name)
                or layout_refusal(self.strategy, self.world_size, self.processes_per_node)
                or (tp_refusal(self.shape, self.tp) if self.tp > 1 else None)
                or (FUSED_LOSS_UNDER_TP if self.fused_linear_cross_entropy and self.strategy.tensor_parallel else None)
                or (float8_refusal(self.float8, self.precision, self.strategy.engine) if self.float8 else None))

    def memory(self, per_device_train_batch_size: int | None = None) -> RankMemory:
        """Bytes per rank of a training step (formulas.memory.rank_memory), at another micro-batch if given."""
        plan = self if per_device_train_batch_size is None else replace(
            self, per_device_train_batch_size=per_device_train_batch_size)
        return rank_memory(plan)

    def host_per_node(self, mem: RankMemory) -> int:
        """Host RAM of the busiest node: every process's offloaded states, plus building the model
        (formulas.memory.construction_host_bytes)."""
        return self.processes_per_node * mem.host_offload + self.construction_per_node

    @property
    def construction_per_node(self) -> int:
        """Host RAM of the busiest node while the model is built (formulas.memory.construction_host_bytes)."""
        return construction_host_bytes(self.shape, self.processes_per_node, self.rank0_builds,
                                       self.strategy.construction_shard_ranks(self.world_size, self.processes_per_node),
                                       shards_on_host=not (self.strategy.tensor_parallel and self.on_cuda))

    def host_states_per_node(self, mem: RankMemory) -> int:
        """The model states this node's processes keep in host RAM: every component on the CPU route (its device is
        the host), the offloaded ones on a GPU."""
        states = ("parameters", "gradients", "master_weights", "optimizer_states")
        per_rank = sum(mem.component(n) if not self.on_cuda else mem.host.get(n, 0) for n in states)
        return self.processes_per_node * per_rank

    def host_step_peaks_per_node(self, mem: RankMemory) -> int:
        """What this node's processes' steps (activations, the backward's gradients) add to its host RAM: the whole
        step peak of each on the CPU route, nothing on a GPU (its device holds them)."""
        return 0 if self.on_cuda else self.processes_per_node * mem.step_peak

    def but(self, **changes) -> "RunPlan":
        """The same plan with some inputs changed (the derived facts follow). A DeepSpeed JSON belongs to its strategy:
        another strategy takes its own shipped JSON unless one is given."""
        if changes.get("strategy", self.strategy) != self.strategy:
            changes.setdefault("deepspeed_config", None)
        return replace(self, **changes)


@dataclass
class Fit:
    """Whether a plan fits the machine it is planned for: the one verdict estimate, project and tune share."""

    fits: bool | None  # None: the device's memory is unknown (no --device or --device_memory_gb to judge by)
    total_per_gpu: int  # bytes on the device (RankMemory.device_total)
    host_per_node: int  # bytes of host RAM on the busiest node: offloaded states + building the model
    reason: str | None = None  # why not, in words


def _gb(nbytes: float) -> str:
    """GB to one decimal, or three significant digits below 1 GB (a tiny model needs more than '0.0')."""
    return f"{nbytes / GB:,.1f}" if nbytes >= GB else f"{nbytes / GB:.3g}"


def _sync_hint(plan, mem, device_bytes: float) -> str:
    """Where an fsdp* plan misses only by the whole gradients no_sync keeps between micro-batches: say that
    sync_each_batch (its shards kept, a reduce-scatter a micro-batch) fits."""
    if not isinstance(plan, RunPlan) or plan.strategy.engine != "fsdp" or plan.unreduced_micro_batches == 1:
        return ""
    synced = plan.but(sync_each_batch=True).memory()
    if synced.device_total > device_bytes:
        return ""
    return (f" (accumulating under no_sync: whole gradients between micro-batches; with sync_each_batch "
            f"{_gb(synced.device_total)} GB)")


def fit(plan, device_bytes: float | None, host_bytes: float | None = None, mem=None) -> Fit:
    """Does the plan (a RunPlan or a 3D GridPlan) fit `device_bytes` per GPU (and `host_bytes` of host RAM per node,
    when given)?"""
    mem = mem or plan.memory()
    host = plan.host_per_node(mem)
    if device_bytes is None:
        return Fit(None, mem.device_total, host, "no device memory given: not judged")
    if mem.device_total > device_bytes:
        return Fit(False, mem.device_total, host, f"needs {_gb(mem.device_total)} GB per GPU, the device has "
                                                  f"{device_bytes / GB:g}" + _sync_hint(plan, mem, device_bytes))
    if host_bytes is not None and host > host_bytes:
        return Fit(False, mem.device_total, host, f"needs {_gb(host)} GB of host RAM per node, it has "
                                                  f"{host_bytes / GB:g}")
    return Fit(True, mem.device_total, host)
