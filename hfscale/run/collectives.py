"""What the engines really send: the collectives of one optimizer step, as torch's profiler records the c10d ops.

Every collective an engine issues - DDP's C++ reducer, DeepSpeed's and FSDP2's Python calls, the Trainer's own -
passes through a c10d dispatcher op (`c10d::allreduce_`, `c10d::_allgather_base_`, ...), which the profiler records
with its tensors' shapes and dtypes; where the op takes a tensor list, the dtype comes from the backend's own event for
it (`gloo:all_reduce`, `nccl:...`, recorded on the backend's worker thread). Counted here is the op the engine asked for, not how the backend carries it
out (gloo runs a reduce-scatter as an all-reduce). Sizes follow formulas/comm.py: the full message - an all-reduce's
tensors, an all-gather's output, a reduce-scatter's input - never the per-rank share.

`--count_collectives N` records step N this way on every rank (results.json `communication`); the communication model
is checked against these records (tests/test_communication.py, docs/project.md).
"""

from collections import defaultdict

from .profile import PeriodProfiler

# c10d op -> (kind, index of the per-rank input among its arguments, index of its output)
OPS = {"allreduce_": ("all_reduce", 0, 0), "allreduce_coalesced_": ("all_reduce", 0, 0),
       "_allgather_base_": ("all_gather", 1, 0), "allgather_": ("all_gather", 1, 0),
       "allgather_into_tensor_coalesced_": ("all_gather", 1, 0), "allgather_coalesced_": ("all_gather", 1, 0),
       "_reduce_scatter_base_": ("reduce_scatter", 1, 0), "reduce_scatter_": ("reduce_scatter", 1, 0),
       "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 0), "broadcast_": ("broadcast", 0, 0),
       "reduce_": ("reduce", 0, 0), "alltoall_base_": ("all_to_all", 1, 0), "send": ("send", 0, 0),
       "recv_": ("recv", 0, 0)}
BACKENDS = ("gloo:", "nccl:")  # the backend's own event for each op, on its worker thread, with the tensor's dtype
# the profiler's dtype names -> (torch's name, bytes per element)
DTYPES = {"float": ("float32", 4), "double": ("float64", 8), "c10::BFloat16": ("bfloat16", 2),
          "c10::Half": ("float16", 2), "long int": ("int64", 8), "long": ("int64", 8), "int": ("int32", 4),
          "short int": ("int16", 2), "signed char": ("int8", 1), "unsigned char": ("uint8", 1), "bool": ("bool", 1),
          "c10::Float8_e4m3fn": ("float8_e4m3fn", 1), "c10::Float8_e5m2": ("float8_e5m2", 1)}


def _elements(shapes) -> int | None:
    """Elements of a tensor's shape, or of every tensor in a list of shapes; None where the profiler recorded
    nothing (a list of tensor lists)."""
    if not shapes:
        return None
    if all(isinstance(d, int) for d in shapes):
        n = 1
        for d in shapes:
            n *= d
        return n
    parts = [_elements(s) for s in shapes]
    return None if None in parts else sum(parts)


def _shapes(event) -> list:
    return event.structured_input_shapes or event.input_shapes or []


def _own_dtype(event) -> str | None:
    return next((d for d in event.input_dtypes or [] if d in DTYPES), None)


def collectives_of(events, world_size: int) -> list[dict]:
    """[{kind, dtype, elements, bytes}] of the c10d collectives among profiler events, in the order they were issued.
    `elements` is the full message (formulas/comm.py's convention): an all-reduce's tensors, an all-gather's output, a
    reduce-scatter's input (`world_size` scales a list op's per-rank tensors, whose outputs the profiler does not
    record). A tensor-list op records no dtype of its own: it is taken from the backend's event that carried it out -
    the next one, in time, over the same number of elements."""
    events = sorted(events, key=lambda e: e.time_range.start)
    backend = [e for e in events if e.name.startswith(BACKENDS)]
    used = set()
    out = []
    for event in events:
        op = OPS.get(event.name[len("c10d::"):]) if event.name.startswith("c10d::") else None
        if op is None:
            continue
        kind, arg_in, arg_out = op
        shapes = _shapes(event)
        local = _elements(shapes[arg_in]) if len(shapes) > arg_in else None
        dtype = _own_dtype(event)
        for i, b in enumerate(backend):  # its backend event is consumed either way, so the pairs stay in order
            if i not in used and b.time_range.start >= event.time_range.start and _elements(_shapes(b)[:1]) == local:
                used.add(i)
                dtype = dtype or _own_dtype(b)
                break
        output = _elements(shapes[arg_out]) if len(shapes) > arg_out else None
        if kind == "all_gather":  # its output, where recorded (a sub-group's, under HSDP); a list op's: input x world
            full = output if output is not None else (local * world_size if local is not None else None)
        elif kind == "reduce_scatter" and local is None:
            full = output * world_size if output is not None else None
        else:
            full = local
        name, size = DTYPES.get(dtype, (dtype, None))
        out.append({"kind": kind, "dtype": name, "elements": full,
                    "bytes": full * size if full is not None and size else None})
    return out


def tally(collectives: list[dict]) -> list[dict]:
    """Collectives grouped by (kind, dtype, message size): [{kind, dtype, elements, bytes, count}], largest first."""
    groups = defaultdict(int)
    for c in collectives:
        groups[(c["kind"], c["dtype"], c["elements"], c["bytes"])] += 1
    rows = [{"kind": k, "dtype": d, "elements": e, "bytes": b, "count": n} for (k, d, e, b), n in groups.items()]
    return sorted(rows, key=lambda r: (-(r["bytes"] or 0), r["kind"]))


def bytes_by_kind(counted: list[dict], world_size: int, by_dtype: bool = False) -> dict:
    """{kind (or (kind, dtype)): bytes} of a tally, the scalars apart - messages of at most one element per rank (the
    Trainer's token counts, loss logging, grad-norm and overflow checks: latency, not bandwidth)."""
    out = {}
    for c in counted:
        if c["bytes"] is not None and (c["elements"] or 0) > world_size:
            key = (c["kind"], c["dtype"]) if by_dtype else c["kind"]
            out[key] = out.get(key, 0) + c["bytes"] * c["count"]
    return out


class CollectiveCounter(PeriodProfiler):
    """--count_collectives: the collectives of one whole loop period (run/profile.PeriodProfiler: the previous step's
    logging, the batch fetch with its token-count gather, every micro-batch and the optimizer step), host-side c10d ops
    with their shapes."""

    what = "counted"

    def __init__(self, step: int):
        super().__init__(step, record_shapes=True)
        self.collectives: list[dict] | None = None

    def finish(self, profiler, wall_s: float) -> None:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
        self.collectives = tally(collectives_of(profiler.events(), world))
