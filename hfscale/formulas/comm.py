"""Bytes each strategy moves per optimizer step, how long the collectives take over intra- and inter-node links,
and what is left exposed after overlap with compute: the model behind `hfscale project`. Pure, no torch.

Collectives are timed as rings, the way nccl-tests reports bus bandwidth: over n ranks an all-reduce of S bytes
moves 2(n-1)/n·S per rank in 2(n-1) latency-bound steps, an all-gather or a reduce-scatter (n-1)/n·S in n-1 steps.
A ring that crosses nodes runs at the inter-node bus bandwidth per GPU (its slowest link).

Synchronous data parallelism also waits: every optimizer step ends in a collective that no rank can leave before
the slowest arrives, so a step over n ranks takes the *maximum* of n noisy step times, not their mean. With per-step
noise of standard deviation sigma (measured on the baseline run) that costs sigma x E[max of n standard normals].
"""

import math
from dataclasses import dataclass, field

# What each collective moves per rank, as a fraction of the full message S, and its ring steps, for n ranks.
RING = {"all_reduce": (lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1)),
        "all_gather": (lambda n: (n - 1) / n, lambda n: n - 1),
        "reduce_scatter": (lambda n: (n - 1) / n, lambda n: n - 1)}


@dataclass(frozen=True)
class Links:
    """Bus bandwidth (bytes/s per GPU, as nccl-tests prints busbw) and per-step latency (s) inside and across nodes."""

    intra_bw: float
    inter_bw: float
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 20e-6

    def __post_init__(self):
        for name in ("intra_bw", "inter_bw"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("intra_latency_s", "inter_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def collective_s(kind: str, size_bytes: float, ranks: int, gpus_per_node: int, links: Links,
                 across_nodes: bool | None = None) -> float:
    """Seconds for one ring collective of a `size_bytes` message over `ranks` GPUs (0 for one rank). The ring crosses
    nodes when it has more ranks than a node has GPUs, unless `across_nodes` says (a group of one GPU per node does)."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    volume, steps = RING[kind]
    across_nodes = ranks > gpus_per_node if across_nodes is None else across_nodes
    bw = links.inter_bw if across_nodes else links.intra_bw
    latency = links.inter_latency_s if across_nodes else links.intra_latency_s
    return volume(ranks) * size_bytes / bw + steps(ranks) * latency


# Which ranks a collective runs over: all of them, the GPUs of one node, or one GPU per node (HSDP's replicas).
GROUPS = ("world", "node", "replicas")


def group_span(group: str, ranks: int, gpus_per_node: int) -> tuple[int, bool | None]:
    """(ranks in the group, whether its ring crosses nodes; None: decided by its size)."""
    per_node = min(ranks, gpus_per_node)
    if group == "node":
        return per_node, False
    if group == "replicas":
        return ranks // per_node, True
    return ranks, None


def expected_max_std_normal(n: int, points: int = 4001) -> float:
    """E[max of n independent standard normals] = integral of x * n * phi(x) * Phi(x)^(n-1) dx (0 for n = 1,
    1/sqrt(pi) for n = 2, ~sqrt(2 ln n) for large n); trapezoidal rule over [-10, 10]."""
    if n <= 1:
        return 0.0
    h = 20.0 / (points - 1)
    total = 0.0
    for i in range(points):
        x = -10.0 + i * h
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        total += (0.5 if i in (0, points - 1) else 1.0) * x * n * pdf * cdf ** (n - 1)
    return total * h


def straggler_s(step_sd_s: float, ranks: int) -> float:
    """Seconds per optimizer step spent waiting for the slowest of `ranks` ranks at the step's closing collective."""
    return step_sd_s * expected_max_std_normal(ranks)


@dataclass(frozen=True)
class Collective:
    kind: str  # all_reduce | all_gather | reduce_scatter | h2d | d2h (host<->device copies, per rank)
    size_bytes: float  # the full message (the whole tensor set), not the per-rank share
    per: str  # "step" (once per optimizer step) or "micro" (every micro-batch)
    overlaps: str  # what compute hides it: "backward", "forward_backward" or "none"
    what: str = ""  # what moves, for the docs and the tests
    group: str = "world"  # the ranks it runs over (GROUPS)


@dataclass(frozen=True)
class CommPattern:
    """What a strategy moves: a list of collectives with their message sizes and cadence."""

    collectives: tuple[Collective, ...] = field(default_factory=tuple)

    def bytes_per_step(self, grad_accum: int, ranks: int, gpus_per_node: int | None = None) -> float:
        """Bytes each rank sends per optimizer step over the network (host copies excluded)."""
        total = 0.0
        for c in self.collectives:
            if c.kind in RING:
                times = grad_accum if c.per == "micro" else 1
                n, _ = group_span(c.group, ranks, gpus_per_node or ranks)
                total += times * RING[c.kind][0](n) * c.size_bytes if n > 1 else 0.0
        return total

    def messages_per_step(self, grad_accum: int, min_bytes: float = 0.0) -> dict:
        """{kind: bytes} of the full messages one optimizer step issues (host copies apart; messages under
        `min_bytes` apart) - what run/collectives.py counts in a real step."""
        out = {}
        for c in self.collectives:
            if c.kind in RING and c.size_bytes >= min_bytes:
                out[c.kind] = out.get(c.kind, 0) + c.size_bytes * (grad_accum if c.per == "micro" else 1)
        return out


# transformers' Trainer (average_tokens_across_devices, on by default in v5) all-gathers each rank's count of target
# tokens once per optimizer step (Trainer._get_num_items_in_batch) to normalise the loss: one int64 per rank,
# latency-bound, and a synchronisation point of its own.
TOKEN_COUNT_BYTES_PER_RANK = 8

POWERSGD_MIN_COMPRESSION_RATE = 2  # torch PowerSGDState's default: compress only where it saves more than 2x


def powersgd_elements(tensor_shapes: list[tuple[int, ...]], rank: int) -> int:
    """Elements PowerSGD all-reduces per step after warm-up. torch's hook views each gradient as a
    (shape[0], rest) matrix and sends it as P and Q factors, r'(n + m) elements with r' = min(n, m, rank), where that
    is more than POWERSGD_MIN_COMPRESSION_RATE times smaller; the others (1-D tensors among them) go uncompressed."""
    total = 0
    for dims in tensor_shapes:
        n = dims[0]
        m = 1
        for d in dims[1:]:
            m *= d
        r = min(n, m, rank)
        compressed = r * (n + m)
        total += compressed if compressed * POWERSGD_MIN_COMPRESSION_RATE < n * m else n * m
    return total


def comm_pattern(engine: str, zero_stage: int | None, *, param_bytes: float, grad_bytes: float,
                 ranks: int, offload_optimizer: bool = False, offload_params: bool = False,
                 powersgd_bytes: float | None = None, token_count_gather: bool = True,
                 shard_ranks: int | None = None, root_param_bytes: float = 0.0) -> CommPattern:
    """The collectives of one strategy. `param_bytes`/`grad_bytes`: the whole model's parameters in the dtype they are
    gathered in, its gradients in the dtype they are reduced in. Shard sizes are per rank (size / ranks).
    `token_count_gather`: the Trainer's per-step all-gather of the loss normaliser (TOKEN_COUNT_BYTES_PER_RANK).
    `shard_ranks`: HSDP (fsdp only) - sharded over the `shard_ranks` GPUs of a node, replicated across nodes.
    `root_param_bytes` (fsdp only): the root unit's parameters - everything outside the transformer blocks (embeddings,
    the tied head, the final norm) - which FSDP2 does not reshard after the forward (the backward starts with them),
    so they are gathered once per micro-batch, the blocks twice (counted: docs/project.md)."""
    out = []
    if token_count_gather:
        out.append(Collective("all_gather", TOKEN_COUNT_BYTES_PER_RANK * ranks, "step", "none", "token count"))
    if engine == "ddp":
        if powersgd_bytes is not None:  # two all-reduces (P, Q) plus the vectors; not overlapped (P waits for Q)
            out.append(Collective("all_reduce", powersgd_bytes, "step", "none"))
        else:  # bucketed all-reduce during the last micro-batch's backward (no_sync before)
            out.append(Collective("all_reduce", grad_bytes, "step", "backward"))
    elif engine == "fsdp":
        # parameters all-gathered for forward and again for backward, every micro-batch; gradients reduce-scattered in
        # the last micro-batch's backward only: the Trainer accumulates under accelerate's no_sync, which on FSDP2 is
        # set_requires_gradient_sync(False) (unsharded gradients kept until the accumulation boundary)
        group = "node" if shard_ranks else "world"
        out += [Collective("all_gather", param_bytes, "micro", "forward_backward", "parameters", group),
                Collective("all_gather", param_bytes - root_param_bytes, "micro", "forward_backward",
                           "block parameters (backward)", group),
                Collective("reduce_scatter", grad_bytes, "step", "backward", "gradients", group)]
        if shard_ranks:  # HSDP: each rank's gradient shard all-reduced with the same shard on the other nodes
            out.append(Collective("all_reduce", grad_bytes / shard_ranks, "step", "backward", "gradient shard",
                                  "replicas"))
    elif zero_stage == 3:
        # DeepSpeed ignores no_sync: parameters gathered for forward and backward, gradients reduce-scattered, every
        # micro-batch
        out += [Collective("all_gather", param_bytes, "micro", "forward_backward"),
                Collective("all_gather", param_bytes, "micro", "forward_backward"),
                Collective("reduce_scatter", grad_bytes, "micro", "backward")]
    elif zero_stage == 2:  # gradients reduce-scattered every micro-batch (overlap_comm), weights all-gathered per step
        out += [Collective("reduce_scatter", grad_bytes, "micro", "backward"),
                Collective("all_gather", param_bytes, "step", "none")]
    elif zero_stage == 1:  # gradients reduced at the accumulation boundary, updated weights all-gathered
        out += [Collective("reduce_scatter", grad_bytes, "step", "none"),
                Collective("all_gather", param_bytes, "step", "none")]
    else:
        raise ValueError(f"unknown engine {engine!r} / stage {zero_stage!r}")
    held = shard_ranks or ranks  # ranks one shard is divided over
    if offload_optimizer:  # the gradient partition goes to the host, the updated weights come back, per step
        out += [Collective("d2h", grad_bytes / held, "step", "none"),
                Collective("h2d", param_bytes / held, "step", "none")]
    if offload_params:  # each parameter partition copied to the device for forward and for backward
        out.append(Collective("h2d", 2 * param_bytes / held, "micro", "forward_backward"))
    return CommPattern(tuple(out))


@dataclass
class StepTime:
    compute_s: float
    comm_s: float  # all communication, serialised
    exposed_s: float  # what overlap leaves on the critical path
    total_s: float
    straggler_s: float = 0.0  # waiting for the slowest rank (in total_s)


def step_time(pattern: CommPattern, *, micro_compute_s: float, grad_accum: int, ranks: int, gpus_per_node: int,
              links: Links, host_bw: float = 20e9, backward_share: float = 2 / 3, overlap: bool = True,
              step_sd_s: float = 0.0) -> StepTime:
    """Seconds per optimizer step: GAS micro-batches of compute, plus the communication compute cannot hide.

    Overlap windows, per micro-batch: collectives marked "backward" hide under its backward (backward_share of its
    compute), those marked "forward_backward" under the whole micro-batch, and all of them together under no more
    than the micro-batch's compute. A per-step "backward" collective (DDP's all-reduce, after no_sync) hides under the
    last micro-batch's backward only. "none" is always exposed. Host copies run at host_bw (bytes/s).
    overlap=False: nothing hides (a CPU run: gloo's collectives run on the cores that compute).
    step_sd_s: the per-step noise of one rank's step time; adds straggler_s(step_sd_s, ranks)."""
    seconds = {}
    for c in pattern.collectives:
        if c.kind in ("h2d", "d2h"):
            s = c.size_bytes / host_bw
        else:
            n, across = group_span(c.group, ranks, gpus_per_node)
            s = collective_s(c.kind, c.size_bytes, n, gpus_per_node, links, across)
        seconds[(c.per, c.overlaps)] = seconds.get((c.per, c.overlaps), 0.0) + s
    backward_window = backward_share * micro_compute_s if overlap else 0.0
    micro_window = micro_compute_s if overlap else 0.0
    micro_bw, micro_fb = seconds.get(("micro", "backward"), 0.0), seconds.get(("micro", "forward_backward"), 0.0)
    micro_none = seconds.get(("micro", "none"), 0.0)
    exposed_micro = max(0.0, micro_bw + micro_fb - micro_window, micro_bw - backward_window) + micro_none
    step_bw, step_none = seconds.get(("step", "backward"), 0.0), seconds.get(("step", "none"), 0.0)
    step_fb = seconds.get(("step", "forward_backward"), 0.0)
    exposed_step = max(0.0, step_bw - backward_window) + max(0.0, step_fb - micro_window) + step_none
    comm = grad_accum * (micro_bw + micro_fb + micro_none) + step_bw + step_fb + step_none
    exposed = grad_accum * exposed_micro + exposed_step
    compute = grad_accum * micro_compute_s
    wait = straggler_s(step_sd_s, ranks)
    return StepTime(compute, comm, exposed, compute + exposed + wait, wait)
