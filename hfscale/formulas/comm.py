"""Bytes each strategy moves per optimizer step, how long the collectives take over intra- and inter-node links,
and what is left exposed after overlap with compute: the model behind `hfscale project`. Pure, no torch.

Bandwidths are bus bandwidths, the way nccl-tests reports them: over n ranks an all-reduce of S bytes moves
2(n-1)/n·S per rank, an all-gather or a reduce-scatter (n-1)/n·S. Two models time a collective (Links.collectives):
- "nccl": NCCL's own cost model, the one it picks an algorithm and a protocol with for every call (src/graph/tuning.cc,
  NCCL 2.19-2.21): ring or tree (all-reduce only), LL, LL128 or Simple, each with its bandwidth factor and its latency
  per hop kind - an NVLink (or PCIe) hop inside a node, a network hop between nodes. A ring over N nodes of p GPUs
  crosses the network N-1 times (all-gather, reduce-scatter) or 2N times (all-reduce); its other hops cost NVLink
  latency. The tree's latency grows with log2 of the nodes. The fastest pair is taken, as NCCL takes it.
- "ring": every one of a ring's 2(n-1) or n-1 steps pays one latency, the inter-node one when the ring crosses nodes:
  what gloo does, and what `hfscale bandwidth` fits (Links.intra_fits) measure. A measured fit always times the
  collectives inside a node, under either model.
A collective that crosses nodes runs at the inter-node bus bandwidth (its slowest link). Under NCCL's model that is
one GPU's network link (Links.inter_bw) times the links its ring can use at once: a ring with p ranks in each node
spreads its channels over p NICs (NCCL's busBw = nChannels x bwInter), so 8 GPUs of a rail-optimised node reduce over
all 8 while a group of one GPU per node (HSDP's replicas, data parallelism beside TP 8) has one.

Synchronous data parallelism also waits: every optimizer step ends in a collective that no rank can leave before
the slowest arrives, so a step over n ranks takes the *maximum* of n noisy step times, not their mean. With per-step
noise of standard deviation sigma (measured on the baseline run) that costs sigma x E[max of n standard normals].
"""

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

# What each collective moves per rank, as a fraction of the full message S, and its ring steps, for n ranks.
RING = {"all_reduce": (lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1)),
        "all_gather": (lambda n: (n - 1) / n, lambda n: n - 1),
        "reduce_scatter": (lambda n: (n - 1) / n, lambda n: n - 1)}


COLLECTIVE_MODELS = ("nccl", "ring")
HOPS = ("nvlink", "pci")  # what links the GPUs of a node: LL128 runs on NVLink only (NCCL enables it there alone)

# NCCL's cost model (src/graph/tuning.cc, NCCL 2.19-2.21): latencies in us per (algorithm, protocol): the base of a
# call, and one hop's per hop kind.
NCCL_BASE_US = {("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 0.0,
                ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4}
NCCL_HOP_US = {"nvlink": {("tree", "LL"): 0.6, ("tree", "LL128"): 1.25, ("tree", "Simple"): 28.0,
                          ("ring", "LL"): 0.6, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4},
               "pci": {("tree", "LL"): 1.0, ("tree", "LL128"): 1.9, ("tree", "Simple"): 28.0,
                       ("ring", "LL"): 1.0, ("ring", "LL128"): 2.5, ("ring", "Simple"): 5.7},
               "net": {("tree", "LL"): 5.0, ("tree", "LL128"): 8.5, ("tree", "Simple"): 28.0,
                       ("ring", "LL"): 2.7, ("ring", "LL128"): 4.0, ("ring", "Simple"): 14.0}}
NCCL_NET_OVERHEAD_US = 1.0  # each step of a multi-node ring posts to the network (x3 for Simple): an Intel host's
# The tree's measured shortfall at mid sizes, per protocol, by log2(bytes / 64) from 0 (64 B) to 22 (256 MB)
NCCL_TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)}
PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True)
class Links:
    """Bus bandwidth (bytes/s per GPU, as nccl-tests prints busbw) inside and across nodes, and how a collective over
    them is timed (`collectives`, COLLECTIVE_MODELS). The per-step latencies (s) are the ring model's; NCCL's model
    takes its hop latencies from NCCL's table, by the kind of hop (`intra_hop` inside a node, the network across)."""

    intra_bw: float
    inter_bw: float
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 20e-6
    # measured inside a node per collective kind ((kind, busbw, latency_s), from `hfscale bandwidth`): each kind timed
    # by its own fit - gloo, for one, carries a reduce-scatter out as an all-reduce, at twice the ring's volume
    intra_fits: tuple = ()
    # what a collective inside a node costs on top of its fit when the ranks come to it from a stretch of compute
    # ((kind, ((compute_s, seconds), ...)), `hfscale bandwidth --compute_ms`): the ranks' skew and the wake-up of
    # idle communication threads, measured per gap
    intra_meets: tuple = ()
    collectives: str = "ring"
    intra_hop: str = "nvlink"
    # network links per node that one multi-node ring can spread its channels over (NCCL's model): None = one per
    # GPU, the rail-optimised DGX/HGX norm; inter_bw is one link's
    nics_per_node: int | None = None
    # the cluster's own nccl-tests ((kind, nodes, ranks, size_bytes, busbw), `hfscale project --nccl_tests`): NCCL's
    # model is scaled by measured / modelled at the nearest measured node counts and sizes (fabric_efficiency)
    fabric: tuple = ()

    def intra(self, kind: str) -> tuple[float, float]:
        """(bus bandwidth, latency per ring step) of one collective kind inside a node."""
        for fitted, bw, latency in self.intra_fits:
            if fitted == kind:
                return bw, latency
        return self.intra_bw, self.intra_latency_s

    def meet_s(self, kind: str, gap_s: float) -> float:
        """Seconds one collective of this kind inside a node pays for meeting after `gap_s` of compute: the measured
        curve, linear between its points and from (0, 0), never more than at its longest gap (0 when not measured)."""
        curve = dict(self.intra_meets).get(kind, ())
        before = (0.0, 0.0)
        for gap, seconds in curve:
            if gap_s <= gap:
                return before[1] + (seconds - before[1]) * (gap_s - before[0]) / (gap - before[0])
            before = (gap, seconds)
        return before[1]

    def __post_init__(self):
        for name in ("intra_bw", "inter_bw"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("intra_latency_s", "inter_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.nics_per_node is not None and not (isinstance(self.nics_per_node, int) and self.nics_per_node >= 1):
            raise ValueError(f"nics_per_node must be a whole number >= 1, got {self.nics_per_node!r}")
        if self.collectives not in COLLECTIVE_MODELS or self.intra_hop not in HOPS:
            raise ValueError(f"collectives must be one of {COLLECTIVE_MODELS} and intra_hop one of {HOPS}, got "
                             f"{self.collectives!r}, {self.intra_hop!r}")
        for point in self.fabric:
            kind, nodes, ranks, size, busbw = point
            if not (kind in RING and 1 <= nodes <= ranks and ranks % nodes == 0 and size > 0 and busbw > 0):
                raise ValueError(f"a fabric point is (kind in {tuple(RING)}, nodes, ranks a multiple of them, "
                                 f"size_bytes > 0, busbw > 0), got {point!r}")
        if self.fabric and self.collectives != "nccl":
            raise ValueError("measured nccl-tests (fabric) scale NCCL's model; the ring model has none")

    def ring_inter_bw(self, ranks_per_node: float) -> float:
        """The bus bandwidth per rank of a ring across nodes with this many of its ranks in each node, under NCCL's
        model: each of a node's ranks leaves through its own NIC on its channels, so the node's egress is its links
        together (at most the NVLink hops'). A send to one rank (a pipeline stage) has one link."""
        rails = max(1, int(ranks_per_node))
        if self.nics_per_node is not None:
            rails = min(rails, self.nics_per_node)
        return min(self.intra_bw, self.inter_bw * rails)

    def point_to_point(self, across_nodes: bool) -> tuple[float, float]:
        """(bandwidth, latency) of one send to a rank in this node or another (pipeline stages)."""
        if self.collectives == "nccl" and (across_nodes or not self.intra_fits):
            hop = "net" if across_nodes else self.intra_hop
            return (self.inter_bw if across_nodes else self.intra_bw), NCCL_HOP_US[hop][("ring", "Simple")] * 1e-6
        return (self.inter_bw, self.inter_latency_s) if across_nodes else self.intra("all_gather")


def collective_s(kind: str, size_bytes: float, ranks: int, gpus_per_node: int, links: Links,
                 across_nodes: bool | None = None, nodes: int | None = None) -> float:
    """Seconds for one collective of a `size_bytes` message over `ranks` GPUs (0 for one rank), by the links' model.
    The group crosses nodes when it has more ranks than a node has GPUs, unless `across_nodes` says (a group of one GPU
    per node does); `nodes`: how many it spans (default: a node's worth of GPUs each, or one GPU each when
    `across_nodes` is given)."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    given = across_nodes is not None
    across_nodes = ranks > gpus_per_node if across_nodes is None else across_nodes
    if links.collectives == "nccl" and (across_nodes or not links.intra_fits):
        spanned = 1 if not across_nodes else nodes or (ranks if given else math.ceil(ranks / gpus_per_node))
        spanned = max(1, min(spanned, ranks))
        return nccl_collective(kind, size_bytes, ranks, spanned, links)[0] / fabric_efficiency(kind, size_bytes,
                                                                                                spanned, links)
    volume, steps = RING[kind]
    bw, latency = (links.inter_bw, links.inter_latency_s) if across_nodes else links.intra(kind)
    return volume(ranks) * size_bytes / bw + steps(ranks) * latency


def nccl_collective(kind: str, size_bytes: float, ranks: int, nodes: int, links: Links) -> tuple[float, str, str]:
    """(seconds, algorithm, protocol) of the fastest algorithm x protocol NCCL's cost model offers for one collective
    of `size_bytes` over `ranks` GPUs on `nodes` nodes: latency + size / algorithm bandwidth, where the algorithm
    bandwidth is the bus bandwidth times the protocol's factor and the algorithm's ratio (ring: n/steps; tree: 1/2)."""
    per_node = ranks / nodes
    bus = links.intra_bw if nodes == 1 else links.ring_inter_bw(per_node)
    log_nodes = int(math.log2(nodes))
    best = None
    for algorithm in (("ring", "tree") if kind == "all_reduce" else ("ring",)):
        for protocol in PROTOCOLS:
            if protocol == "LL128" and links.intra_hop != "nvlink":
                continue
            key = (algorithm, protocol)
            intra_us, net_us = NCCL_HOP_US[links.intra_hop][key], NCCL_HOP_US["net"][key]
            if algorithm == "ring":
                steps = RING[kind][1](ranks)
                crossings = min(steps, (2 * nodes if nodes > 1 else 0) if kind == "all_reduce" else nodes - 1)
                if nodes > 1:  # every step of a multi-node ring also posts to the network
                    intra_us = max(intra_us, NCCL_NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
                latency_us = NCCL_BASE_US[key] + (steps - crossings) * intra_us + crossings * net_us
                factor = {"LL": 1 / 4 if nodes > 1 or kind == "all_reduce" else 1 / 3,
                          "LL128": 0.7 if per_node < 2 else 0.92, "Simple": 1.0}[protocol]
                bw = bus * factor * ranks / steps
            else:
                latency_us = NCCL_BASE_US[key] + 2 * ((per_node - 1) * intra_us + log_nodes * net_us)
                factor = {"LL": 1 / 3.8, "LL128": 7 / 9 if nodes == 1 else 120 / 128, "Simple": 1.0}[protocol]
                size_class = int(math.log2(max(size_bytes / 64, 1)))
                correction = NCCL_TREE_CORRECTION[protocol][size_class] if size_class < 23 else 1.0
                bw = bus * 0.92 * factor * 0.5 * correction
            seconds = latency_us * 1e-6 + size_bytes / bw
            if best is None or seconds < best[0]:
                best = (seconds, algorithm, protocol)
    return best


# A kind the cluster's nccl-tests did not measure borrows another's efficiency: NCCL's ring all-gather and
# reduce-scatter move the same bytes over the same hops, and an all-reduce is the two in turn.
FABRIC_STAND_INS = {"all_reduce": ("reduce_scatter", "all_gather"), "all_gather": ("reduce_scatter", "all_reduce"),
                    "reduce_scatter": ("all_gather", "all_reduce")}


def _interpolate(points, x: float) -> float:
    """Linear between sorted (x, y) points, the nearest end's y outside them."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


@lru_cache(maxsize=64)
def _fabric_curves(links: Links) -> dict:
    """{(kind, across nodes): ((log2 nodes, ((log2 size, measured / modelled), ...)), ...)} from links.fabric, each
    point's model over the same links without it (repeated points averaged)."""
    model = replace(links, fabric=())
    ratios: dict = {}
    for kind, nodes, ranks, size, busbw in links.fabric:
        modelled = RING[kind][0](ranks) * size / nccl_collective(kind, size, ranks, nodes, model)[0]
        ratios.setdefault((kind, nodes > 1), {}).setdefault(nodes, {}).setdefault(size, []).append(busbw / modelled)
    return {key: tuple((math.log2(n), tuple((math.log2(s), sum(r) / len(r)) for s, r in sorted(sizes.items())))
                       for n, sizes in sorted(by_nodes.items()))
            for key, by_nodes in ratios.items()}


def fabric_efficiency(kind: str, size_bytes: float, nodes: int, links: Links) -> float:
    """What the cluster's nccl-tests measured over what NCCL's model gives (1 where nothing was measured): the
    fabric's own losses at scale - congestion, adaptive routing, stragglers in a long ring - that no cost model has.
    Linear in log2 of the size between the measured sizes at each measured node count, and in log2 of the nodes
    between node counts; beyond the measured range, the nearest measured size and node count. One node and several
    are apart (NVLink and the network), and a kind not measured borrows another's (FABRIC_STAND_INS)."""
    if not links.fabric:
        return 1.0
    curves = _fabric_curves(links)
    for measured in (kind, *FABRIC_STAND_INS[kind]):
        by_nodes = curves.get((measured, nodes > 1))
        if by_nodes:
            break
    else:
        return 1.0
    size = math.log2(size_bytes)
    return _interpolate([(n, _interpolate(sizes, size)) for n, sizes in by_nodes], math.log2(nodes))


# Which ranks a collective runs over: all of them, the GPUs of one node, or one GPU per node (HSDP's replicas).
GROUPS = ("world", "node", "replicas")


def group_span(group: str, ranks: int, gpus_per_node: int) -> tuple[int, bool, int]:
    """(ranks in the group, whether its ring crosses nodes - the world's does when it has more ranks than a node - and
    the nodes it spans: the world's ranks fill whole nodes, the replicas are one GPU per node)."""
    per_node = min(ranks, gpus_per_node)
    if group == "node":
        return per_node, False, 1
    if group == "replicas":
        return ranks // per_node, True, ranks // per_node
    return ranks, ranks > gpus_per_node, math.ceil(ranks / gpus_per_node)


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
    per: str  # "step" (once per optimizer step, in the last micro-batch) or "micro" (every micro-batch)
    overlaps: str  # the compute it runs beside: "forward", "backward" (of a micro-batch), "forward_backward", "none"
    what: str = ""  # what moves, for the docs and the tests
    group: str = "world"  # the ranks it runs over (GROUPS)
    units: int = 1  # issued in this many equal pieces, each beside one piece of the phase's compute (FSDP units,
    # DeepSpeed or DDP buckets): the first (or last) piece has nothing to hide under

    def hideable_s(self, seconds: float) -> float:
        """Of this collective's `seconds`, what compute can hide: a pipeline of `units` pieces, each beside its
        neighbour's compute (a gather issued one unit ahead, a reduction issued as its bucket fills), hides every
        piece but one - the first gather or the last reduction has nothing beside it."""
        return 0.0 if self.overlaps == "none" else seconds * (self.units - 1) / self.units


TOKEN_COUNT = "token count"


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
                n, _, _ = group_span(c.group, ranks, gpus_per_node or ranks)
                total += times * RING[c.kind][0](n) * c.size_bytes if n > 1 else 0.0
        return total

    def messages_per_step(self, grad_accum: int) -> dict:
        """{kind: bytes} of the full messages one optimizer step issues, host copies and the Trainer's token count
        (a scalar per rank) apart - what run/collectives.py counts in a real step (bytes_by_kind)."""
        out = {}
        for c in self.collectives:
            if c.kind in RING and c.what != TOKEN_COUNT:
                out[c.kind] = out.get(c.kind, 0) + c.size_bytes * (grad_accum if c.per == "micro" else 1)
        return out


def bucket_pieces(sizes: list[float], bucket: float, flush_before_overflow: bool = False) -> int:
    """Messages a bucketed reduction issues over tensors of these sizes, in the order their gradients arrive (the
    backward's: the reverse of the parameters'), and whatever is left at the end.
    DDP (bucket_cap_mb): a bucket takes each tensor and is sent once it holds `bucket` or more (torch's bucket
    assignment), so a large tensor rides with the small ones before it.
    DeepSpeed (reduce_bucket_size; `flush_before_overflow`): the bucket is sent before a gradient that would overflow
    it (stage_1_and_2/stage3 `reduce_independent_p_g_buckets_and_remove_grads`), so a tensor larger than the bucket
    goes alone and the small ones before it go alone too: 195 messages for gpt2-350m at the `auto` hidden² bucket,
    where DDP's rule would send 98 (counted: docs/strategies.md)."""
    pieces, filled = 0, 0.0
    for size in sizes:
        if flush_before_overflow and filled and filled + size > bucket:
            pieces, filled = pieces + 1, 0.0
        filled += size
        if not flush_before_overflow and filled >= bucket:
            pieces, filled = pieces + 1, 0.0
    return pieces + (1 if filled else 0)


# transformers' Trainer (average_tokens_across_devices, on by default in v5) all-gathers each rank's count of target
# tokens once per optimizer step (Trainer._get_num_items_in_batch) to normalise the loss: one int64 per rank,
# latency-bound, and a synchronisation point of its own.
TOKEN_COUNT_BYTES_PER_RANK = 8

POWERSGD_MIN_COMPRESSION_RATE = 2  # torch PowerSGDState's default: compress only where it saves more than 2x


def powersgd_matrices(tensor_shapes: list[tuple[int, ...]], rank: int):
    """(n, m, r', compressed) per gradient as torch's hook sees it: a (shape[0], rest) matrix, r' = min(n, m, rank),
    compressed where its P and Q factors, r'(n + m) elements, are more than POWERSGD_MIN_COMPRESSION_RATE times smaller
    (the others, 1-D tensors among them, go uncompressed)."""
    for dims in tensor_shapes:
        n, m = dims[0], math.prod(dims[1:])
        r = min(n, m, rank)
        yield n, m, r, r * (n + m) * POWERSGD_MIN_COMPRESSION_RATE < n * m


def powersgd_elements(tensor_shapes: list[tuple[int, ...]], rank: int) -> int:
    """Elements PowerSGD all-reduces per step after warm-up: each compressed matrix's P and Q factors, r'(n + m), and
    every other gradient whole (powersgd_matrices)."""
    return sum(r * (n + m) if compressed else n * m for n, m, r, compressed in powersgd_matrices(tensor_shapes, rank))


def powersgd_work(tensor_shapes: list[tuple[int, ...]], rank: int, element_bytes: int) -> tuple[float, float, float]:
    """(matmul FLOPs, matmul bytes, elementwise bytes) torch's powerSGD_hook spends per step after warm-up, over the
    gradients of these shapes (powersgd_matrices). Per bucket it adds the error feedback to the whole gradient (2 reads,
    a write) and keeps a copy (a read, a write); per compressed n x m matrix M it computes P = MQ and Q = M^T P (each
    reads M: 2nmr FLOPs), orthogonalises P (~2nr^2) and writes M = PQ^T back (2nmr); the uncompressed tensors are
    packed, divided and unpacked (3 reads, 3 writes); and it keeps the new error, copy - result (2 reads, a write).
    Elementwise work is 8 passes over every element."""
    flops = matmul_elements = every = uncompressed = 0.0
    for n, m, r, compressed in powersgd_matrices(tensor_shapes, rank):
        every += n * m
        if compressed:
            flops += 6 * n * m * r + 2 * n * r * r
            matmul_elements += 3 * n * m  # two reads of M and its write
        else:
            uncompressed += n * m
    return flops, matmul_elements * element_bytes, (8 * every + 6 * uncompressed) * element_bytes


def powersgd_compute_s(tensor_shapes: list[tuple[int, ...]], rank: int, element_bytes: int, flops_per_s: float,
                       bytes_per_s: float) -> float:
    """Seconds per step of powerSGD_hook's own compute on one GPU (powersgd_work), on the compute stream beside the
    backward: the elementwise passes at the memory bandwidth, the products at whichever of FLOPs and bytes binds
    (with rank r a product reads n·m elements for 2·n·m·r FLOPs: bandwidth-bound on every GPU at small r)."""
    flops, matmul_bytes, elementwise_bytes = powersgd_work(tensor_shapes, rank, element_bytes)
    return elementwise_bytes / bytes_per_s + max(flops / flops_per_s, matmul_bytes / bytes_per_s)


def comm_pattern(engine: str, zero_stage: int | None, *, param_bytes: float, grad_bytes: float,
                 ranks: int, offload_optimizer: bool = False, offload_params: bool = False,
                 powersgd_bytes: float | None = None, token_count_gather: bool = True,
                 shard_ranks: int | None = None, root_param_bytes: float = 0.0, root_leftover_bytes: float = 0.0,
                 units: int = 1,
                 reduce_buckets: int = 1, bucket_all_reduce: bool = True, persistent_param_bytes: float = 0.0,
                 regathered_param_bytes: float | None = None, norm_tensors: int = 0,
                 block_gather_bytes: float | None = None, float8_scales: int = 0,
                 sync_each_batch: bool = False) -> CommPattern:
    """The collectives of one strategy. `param_bytes`/`grad_bytes`: the whole model's parameters in the dtype they are
    gathered in, its gradients in the dtype they are reduced in. Shard sizes are per rank (size / ranks).
    `token_count_gather`: the Trainer's per-step all-gather of the loss normaliser (TOKEN_COUNT_BYTES_PER_RANK).
    `units`: the gathering units of fsdp (its blocks) and zero3 (its parameters above the persistence threshold:
    DeepSpeed gathers per parameter and prefetches at least the next); `reduce_buckets`: the pieces a gradient
    reduction is issued in as the backward fills them (bucket_pieces: DDP's 25 MB, DeepSpeed's reduce_bucket_size
    with overlap_comm; 1: not overlapped). `sync_each_batch` (accelerate's): ddp and fsdp reduce every micro-batch's
    gradients, not only the last's. Each engine's own arguments: its function below."""
    out = [Collective("all_gather", TOKEN_COUNT_BYTES_PER_RANK * ranks, "step", "none", TOKEN_COUNT)
           ] if token_count_gather else []
    if engine == "ddp":
        out += _ddp_collectives(grad_bytes, powersgd_bytes, reduce_buckets, sync_each_batch)
    elif engine == "fsdp":
        out += _fsdp_collectives(param_bytes, grad_bytes, shard_ranks, root_param_bytes, root_leftover_bytes, units,
                                 norm_tensors, block_gather_bytes, float8_scales, sync_each_batch)
    elif zero_stage == 3:
        out += _zero3_collectives(param_bytes, grad_bytes, units, reduce_buckets, persistent_param_bytes,
                                  regathered_param_bytes)
    elif zero_stage in (1, 2):
        out += _zero12_collectives(zero_stage, param_bytes, grad_bytes, reduce_buckets, bucket_all_reduce)
    else:
        raise ValueError(f"unknown engine {engine!r} / stage {zero_stage!r}")
    out += _offload_copies(param_bytes, grad_bytes, shard_ranks or ranks, offload_optimizer, offload_params, units)
    return CommPattern(tuple(c for c in out if c.size_bytes > 0 or c.what == TOKEN_COUNT))


def _ddp_collectives(grad_bytes: float, powersgd_bytes: float | None, reduce_buckets: int,
                     sync_each_batch: bool = False) -> list[Collective]:
    """DDP: the gradients' bucketed all-reduce during the last micro-batch's backward (no_sync before; every
    micro-batch's under sync_each_batch); under PowerSGD (`powersgd_bytes`: what it sends) three all-reduces per
    bucket - the uncompressed tensors, P, then Q (after P's orthogonalisation) - each waiting for the one before: not
    overlapped."""
    per = "micro" if sync_each_batch else "step"
    if powersgd_bytes is not None:
        return [Collective("all_reduce", powersgd_bytes, per, "none", "PowerSGD factors", units=3 * reduce_buckets)]
    return [Collective("all_reduce", grad_bytes, per, "backward", "gradients", units=reduce_buckets)]


def _fsdp_collectives(param_bytes: float, grad_bytes: float, shard_ranks: int | None, root_param_bytes: float,
                      root_leftover_bytes: float, units: int, norm_tensors: int,
                      block_gather_bytes: float | None = None, float8_scales: int = 0,
                      sync_each_batch: bool = False) -> list[Collective]:
    """FSDP2: parameters all-gathered for forward and again for backward, every micro-batch; gradients
    reduce-scattered in the last micro-batch's backward only (the Trainer accumulates under accelerate's no_sync, on
    FSDP2 set_requires_gradient_sync(False): unsharded gradients kept until the accumulation boundary), or in every
    micro-batch's under sync_each_batch (the shards accumulate). It gathers
    the next unit while this one computes (forward: issued ahead on its own stream; backward: explicit prefetch) and
    reduce-scatters each unit's gradients as its backward ends.
    `root_param_bytes`: the root unit's parameters - everything outside the transformer blocks (embeddings, the tied
    head, the final norm) - which FSDP2 does not reshard after the forward (the backward starts with them), so they are
    gathered once per micro-batch, the blocks twice (counted: docs/project.md). accelerate carves them into two units,
    each a message of its own in the open: the tail (final norm, embedding and tied head) and the model's own
    leftovers, `root_leftover_bytes` of them (GPT-2's position table, BLOOM's embedding norm). `shard_ranks`: HSDP -
    sharded over the `shard_ranks` GPUs of a node, replicated across nodes. `norm_tensors`: the parameter tensors
    whose gradient norms gradient clipping all-reduces in fp32 every step (torch's clip_grad_norm_ over DTensor
    shards; 0: no clipping). `block_gather_bytes`: what the blocks' gathers move when it is not their parameter
    bytes - under --fp8 torchao's float8 all-gather sends the converted weights one byte an element - and
    `float8_scales`: the weights whose float8 scales it all-reduces in fp32 once per step, after the optimizer
    (torchao's precompute_float8_dynamic_scale_for_fsdp, which accelerate registers)."""
    group = "node" if shard_ranks else "world"
    blocks = param_bytes - root_param_bytes
    gathered = blocks if block_gather_bytes is None else block_gather_bytes
    grads = grad_bytes / param_bytes  # gradient bytes per parameter byte
    per = "micro" if sync_each_batch else "step"  # the gradients' reductions
    out = [Collective("all_gather", gathered, "micro", "forward", "block parameters", group, units),
           Collective("all_gather", gathered, "micro", "backward", "block parameters (backward)", group, units),
           Collective("reduce_scatter", grads * blocks, per, "backward", "block gradients", group, units)]
    for name, size in (("root unit", root_param_bytes - root_leftover_bytes), ("root leftovers", root_leftover_bytes)):
        if size:
            out += [Collective("all_gather", size, "micro", "forward", f"{name} parameters (first: in the open)",
                               group),
                    Collective("reduce_scatter", grads * size, per, "backward",
                               f"{name} gradients (last: in the open)", group)]
    if norm_tensors:
        out.append(Collective("all_reduce", 4 * norm_tensors, "step", "none", "gradient norms (clipping)", group))
    if float8_scales:
        out.append(Collective("all_reduce", 4 * float8_scales, "step", "none", "float8 weight scales", group))
    if shard_ranks:  # HSDP: each rank's gradient shard all-reduced with the same shard on the other nodes
        out.append(Collective("all_reduce", grad_bytes / shard_ranks, per, "backward", "gradient shard", "replicas",
                              units))
    return out


def _zero3_collectives(param_bytes: float, grad_bytes: float, units: int, reduce_buckets: int,
                       persistent_param_bytes: float, regathered_param_bytes: float | None) -> list[Collective]:
    """ZeRO-3 ignores no_sync: parameters gathered for forward (and what was released, for backward), gradients
    reduce-scattered, every micro-batch. It never gathers its persistent parameters (under
    stage3_param_persistence_threshold) for compute - it all-gathers them once per step after the optimizer updates
    their partitions - and gathers again for the backward only `regathered_param_bytes` (the parameters
    stage3_max_reuse_distance released after the forward; None: all). Counted: docs/project.md."""
    gathered = param_bytes - persistent_param_bytes
    again = gathered if regathered_param_bytes is None else min(regathered_param_bytes, gathered)
    return [Collective("all_gather", gathered, "micro", "forward", "parameters", units=units),
            Collective("all_gather", again, "micro", "backward", "parameters released after the forward", units=units),
            Collective("reduce_scatter", grad_bytes, "micro", "backward", "gradients", units=reduce_buckets),
            Collective("all_gather", persistent_param_bytes, "step", "none", "persistent parameters")]


def _zero12_collectives(stage: int, param_bytes: float, grad_bytes: float, reduce_buckets: int,
                        bucket_all_reduce: bool) -> list[Collective]:
    """ZeRO-2 reduces every micro-batch as the backward fills its buckets (overlap_comm); ZeRO-1 at the accumulation
    boundary, after the backward. Both all-reduce each whole gradient bucket and keep their partition
    (`bucket_all_reduce`, DeepSpeed's use_multi_rank_bucket_allreduce, on by default) or reduce each slice to its
    owner, then all-gather the updated weights. Counted: docs/project.md."""
    kind, what = ("all_reduce", "gradients (whole buckets)") if bucket_all_reduce else (
        "reduce_scatter", "gradients (each slice reduced to its owner)")
    reduce = (Collective(kind, grad_bytes, "micro", "backward", what, units=reduce_buckets) if stage == 2
              else Collective(kind, grad_bytes, "step", "none", what))
    return [reduce, Collective("all_gather", param_bytes, "step", "none", "updated parameters")]


def _offload_copies(param_bytes: float, grad_bytes: float, held: int, offload_optimizer: bool, offload_params: bool,
                    units: int) -> list[Collective]:
    """The host copies of offload, per rank (`held`: the ranks one shard is divided over): the gradient partition to
    the host and the updated weights back, per step; each parameter partition to the device for forward and for
    backward, per micro-batch."""
    out = []
    if offload_optimizer:
        out += [Collective("d2h", grad_bytes / held, "step", "none"),
                Collective("h2d", param_bytes / held, "step", "none")]
    if offload_params:
        out.append(Collective("h2d", 2 * param_bytes / held, "micro", "forward_backward", units=units))
    return out


@dataclass
class StepTime:
    compute_s: float
    comm_s: float  # all communication, serialised
    exposed_s: float  # what overlap leaves on the critical path
    total_s: float
    straggler_s: float = 0.0  # waiting for the slowest rank (in total_s)


def exposed_s(timed: list[tuple[Collective, float]], micro_compute_s: float, backward_share: float,
              overlap: bool = True) -> float:
    """Seconds of one micro-batch's collectives (each with its seconds) that its compute leaves on the critical path.

    Per phase - the forward ((1 - backward_share) of the compute), the backward (backward_share), or either
    ("forward_backward") - the collectives' hideable pieces (Collective.hideable_s: all but one piece of a pipeline of
    `units`) hide under the compute beside them: all units' compute but one, (1 - 1/units) of the phase. All hidden
    together is never more than the micro-batch's compute. overlap=False: nothing hides."""
    total = sum(s for _, s in timed)
    if not overlap:
        return total
    windows = {"forward": (1 - backward_share) * micro_compute_s, "backward": backward_share * micro_compute_s,
               "forward_backward": micro_compute_s}
    hidden = 0.0
    for phase, window in windows.items():
        mine = [(c, s) for c, s in timed if c.overlaps == phase]
        if mine:
            units = max(c.units for c, _ in mine)
            hidden += min(sum(c.hideable_s(s) for c, s in mine), window * (1 - 1 / units))
    return total - min(hidden, micro_compute_s)


def step_time(pattern: CommPattern, *, micro_compute_s: float, grad_accum: int, ranks: int, gpus_per_node: int,
              links: Links, host_bw: float = 20e9, backward_share: float = 2 / 3, overlap: bool = True,
              step_sd_s: float = 0.0) -> StepTime:
    """Seconds per optimizer step: GAS micro-batches of compute, plus the communication compute cannot hide
    (exposed_s, per micro-batch; the per-step collectives run in the last micro-batch, beside its compute: DDP's
    all-reduce and FSDP's reduce-scatter after no_sync). A collective issued in `units` pieces pays the ring's
    latency once per piece and, inside a node, the ranks' meeting after the compute before it (Links.meet_s; the
    step's compute spread evenly over its pieces). "none" is always exposed. Host copies run at host_bw
    (bytes/s). overlap=False: nothing hides (a CPU run: gloo's collectives run on the cores that compute).
    step_sd_s: the per-step noise of one rank's step time; adds straggler_s(step_sd_s, ranks)."""
    spans = [group_span(c.group, ranks, gpus_per_node) for c in pattern.collectives]
    inside = [c.kind in RING and n > 1 and not across for c, (n, across, _) in zip(pattern.collectives, spans)]
    pieces = sum(c.units * (grad_accum if c.per == "micro" else 1)
                 for c, meets in zip(pattern.collectives, inside) if meets)
    gap = grad_accum * micro_compute_s / pieces if pieces else 0.0  # the compute before each, spread evenly
    timed = []
    for c, (n, across, nodes), meets in zip(pattern.collectives, spans, inside):
        if c.kind in ("h2d", "d2h"):
            s = c.size_bytes / host_bw
        else:  # each piece pays its own latency, and inside a node its meeting
            s = c.units * (collective_s(c.kind, c.size_bytes / c.units, n, gpus_per_node, links, across, nodes)
                           + (links.meet_s(c.kind, gap) if meets else 0.0))
        timed.append((c, s))
    micro = [(c, s) for c, s in timed if c.per == "micro"]
    comm = grad_accum * sum(s for _, s in micro) + sum(s for c, s in timed if c.per == "step")
    exposed = ((grad_accum - 1) * exposed_s(micro, micro_compute_s, backward_share, overlap)
               + exposed_s(timed, micro_compute_s, backward_share, overlap))
    compute = grad_accum * micro_compute_s
    wait = straggler_s(step_sd_s, ranks)
    return StepTime(compute, comm, exposed, compute + exposed + wait, wait)
