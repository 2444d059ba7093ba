"""3D layouts (tensor x pipeline x data parallelism) as the planners see them: `hfscale estimate` and `hfscale project`
weigh them beside the data-parallel strategies. They are what Megatron-LM and Megatron-DeepSpeed run - hfscale plans
them, it does not launch them - and are named as `hfscale import-logs` names those runs: `megatron-tp4-pp16`,
`megatron-deepspeed-tp4-pp16`, `megatron-tp4-pp4-vp5-cp2` (interleaved over 5 model chunks, context parallel 2). The
formulas are hfscale/formulas/parallel3d.py; docs/project.md says how far they were checked."""

from dataclasses import dataclass, replace

from ..errors import HfscaleError
from ..formulas.memory import RankMemory
from ..formulas.metrics import ModelShape, global_batch_size, tokens_per_step
from ..formulas.parallel3d import RECOMPUTE, Grid, GridRun, busiest_stage, grid_refusal

# family -> the optimizer states sharded over DP: Megatron-LM keeps them whole on every DP rank; Megatron-DeepSpeed
# (BigScience's BLOOM runs) ran ZeRO-1 over DP
FAMILIES = {"megatron": False, "megatron-deepspeed": True}
OPTIMIZERS = ("adamw",)  # Megatron's Adam; Adafactor and 8-bit Adam are not Megatron options


@dataclass(frozen=True)
class GridPlan:
    """One 3D layout of one model and batch - the 3D counterpart of hfscale.runplan.RunPlan."""

    family: str
    optimizer: str
    shape: ModelShape
    seq_len: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    per_device_train_batch_size: int = 1  # MBS: samples per micro-batch per pipeline
    gradient_accumulation_steps: int = 1  # M: micro-batches per optimizer step per pipeline
    processes_per_node: int = 8  # GPUs per node
    precision: str = "bf16"
    recompute: str = "none"  # Megatron's --recompute-granularity: none | selective | full
    sequence_parallel: bool = False
    cp: int = 1  # context parallelism: each sequence split over CP GPUs
    vp: int = 1  # model chunks per GPU (Megatron's interleaved schedule)
    flash_attention: bool = True  # a fused attention kernel keeps no scores (Megatron-Core's default)
    distributed_optimizer: bool = False  # megatron: --use-distributed-optimizer, Adam sharded over DP x CP (ZeRO-1)
    dropout: bool = False  # hidden/attention dropout masks kept (hfscale's runs train without; Megatron-LM's 0.1 with)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise HfscaleError(f"unknown 3D layout family {self.family!r}; choose one of: {', '.join(FAMILIES)}")
        if self.recompute not in RECOMPUTE:
            raise HfscaleError(f"recompute granularity {self.recompute!r}; choose one of: {', '.join(RECOMPUTE)}")

    @property
    def name(self) -> str:
        return (f"{self.family}-tp{self.tp}-pp{self.pp}" + (f"-vp{self.vp}" if self.vp > 1 else "")
                + (f"-cp{self.cp}" if self.cp > 1 else ""))

    @property
    def grid(self) -> Grid:
        deepspeed = FAMILIES[self.family]
        return Grid(self.tp, self.pp, self.dp, self.sequence_parallel, zero1=deepspeed or self.distributed_optimizer,
                    uneven_stages=deepspeed, cp=self.cp, vp=self.vp)

    @property
    def world_size(self) -> int:
        return self.grid.gpus

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.processes_per_node)

    @property
    def global_batch_size(self) -> int:
        return global_batch_size(self.per_device_train_batch_size, self.gradient_accumulation_steps, self.dp)

    @property
    def tokens_per_step(self) -> int:
        return tokens_per_step(self.per_device_train_batch_size, self.gradient_accumulation_steps, self.dp,
                               self.seq_len)

    @property
    def run(self) -> GridRun:
        return GridRun(self.shape, self.grid, self.seq_len, self.per_device_train_batch_size,
                       self.gradient_accumulation_steps, self.precision, self.recompute, self.flash_attention,
                       self.dropout)

    def refusal(self) -> str | None:
        if self.optimizer not in OPTIMIZERS:
            return f"{self.family} layouts use Megatron's Adam (adamw); {self.optimizer} is not a Megatron optimizer"
        if self.world_size > self.processes_per_node and self.world_size % self.processes_per_node:
            return f"{self.world_size} GPUs do not fill whole nodes of {self.processes_per_node}"
        if self.cp > 1 and FAMILIES[self.family]:
            return f"CP {self.cp}: Megatron-DeepSpeed has no context parallelism (Megatron-LM has)"
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            return (f"CP {self.cp} cuts each sequence into {2 * self.cp} equal chunks (two a GPU, balancing the causal "
                    f"mask), and seq {self.seq_len} does not divide into them")
        return grid_refusal(self.shape, self.grid, self.processes_per_node)

    def memory(self) -> RankMemory:
        """Bytes on one GPU of the pipeline stage that needs the most (formulas.parallel3d.busiest_stage)."""
        return busiest_stage(self.run)[1]

    def host_per_node(self, mem: RankMemory) -> int:
        """Megatron builds each rank's own slice of the model on its GPU: no host copy, nothing offloaded."""
        return 0

    def but(self, **changes) -> "GridPlan":
        return replace(self, **changes)


@dataclass(frozen=True)
class GridOptions:
    """What the planners' flags say about the 3D layouts to weigh (add_grid_flags)."""

    tp: str | None = None  # comma-separated TP sizes; None: search every size
    pp: str | None = None
    recompute: str = "none"
    sequence_parallel: bool = False
    cp: str | None = None  # comma-separated CP sizes; None: 1
    vp: int = 1
    distributed_optimizer: bool = False
    dropout: float | None = None  # None: the measured run's (Baseline.dropout)

    def plan(self, family: str, optimizer: str, shape: ModelShape, seq_len: int, *, tp: int, pp: int, cp: int, dp: int,
             micro_batch: int, micro_batches: int, processes_per_node: int, precision: str, flash_attention: bool,
             dropout: bool = False) -> GridPlan:
        """The layout these flags describe at one (TP, PP, CP, DP) and batch: the one place the planners' flags
        become a GridPlan (`dropout`: the measured run's, where the flags name none)."""
        return GridPlan(family, optimizer, shape, seq_len, tp=tp, pp=pp, dp=dp, per_device_train_batch_size=micro_batch,
                        gradient_accumulation_steps=micro_batches, processes_per_node=processes_per_node,
                        precision=precision, recompute=self.recompute, sequence_parallel=self.sequence_parallel, cp=cp,
                        vp=self.vp, flash_attention=flash_attention, distributed_optimizer=self.distributed_optimizer,
                        dropout=dropout if self.dropout is None else self.dropout > 0)


def powers_of_two(limit: int) -> list[int]:
    return [2 ** k for k in range(limit.bit_length()) if 2 ** k <= limit]


def grid_layouts(shape: ModelShape, gpus: int, gpus_per_node: int, tps: list[int] | None = None,
                 pps: list[int] | None = None, uneven_stages: bool = False, cps: list[int] | None = None,
                 vp: int = 1) -> list[tuple[int, int, int]]:
    """Every (TP, PP, CP) this family can lay the model out with on `gpus` GPUs: TP a power of two inside a node
    dividing the heads, PP dividing the layers (or any PP up to L with uneven stages; into V chunks each when
    interleaved), TP x PP x CP dividing the GPUs (given lists restrict the search; CP is 1 unless given)."""
    tps = tps or powers_of_two(min(gpus, gpus_per_node))
    pps = pps or list(range(2 if vp > 1 else 1, shape.n_layer + 1))
    cps = cps or [1]
    return [(t, p, c) for t in tps for p in pps for c in cps if gpus % (t * p * c) == 0
            and grid_refusal(shape, Grid(t, p, gpus // (t * p * c), uneven_stages=uneven_stages, cp=c, vp=vp),
                             gpus_per_node) is None]


def split_strategy_names(names: list[str]) -> tuple[list[str], list[str]]:
    """(data-parallel strategy names, 3D layout families) of a --strategy list, order kept."""
    return [n for n in names if n not in FAMILIES], [n for n in names if n in FAMILIES]
