"""A report's row: one run (or the repeats of one configuration) as `hfscale report` tabulates and plots it. Its own
module: report.py builds the rows and plots.py draws them, neither importing the other's."""

from dataclasses import dataclass, field


@dataclass
class Row:
    run: str
    status: str
    gpus: int | None
    params: int | None
    strategy: str
    optim: str
    dp: int | None
    mbs: int | None
    gas: int | None
    gbs: int | None
    s_per_iter: float | None
    tflops: float | None  # BigScience convention: comparable with imported Megatron rows
    mfu: float | None  # exact model FLOPs against the peak recorded by the run
    mem_gb: float | None
    mem_kind: str  # "device" (CUDA allocated) or "RSS" (host process)
    tokens_per_s: float | None
    days: float | None
    notes: str
    loss_history: list
    path: str
    group: str = ""  # model, data and sequence length: runs of one group can be compared by convergence
    eval_history: list = field(default_factory=list)
    repeat: int = 0  # a sweep's --repeats: the configuration's k-th run (0: measured once)
    runs: int = 1  # the repeats merged into this row
    s_per_iter_range: tuple[float, float] | None = None  # fastest and slowest of the merged repeats that finished

    @property
    def ok(self) -> bool:
        return self.status == "ok"
