"""The inter-node link from a user's own runs (`hfscale bandwidth --from_runs ONE_NODE MULTI_NODE`): the same recipe
measured on one node and on several gives the bus bandwidth per GPU between nodes at which the projection's model
takes the multi-node run's measured step time, from the one-node run's compute. `hfscale project --inter_bw FILE` then
uses it for every strategy, with the band the multi-node run's own spread gives."""

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import HfscaleError
from ..files import atomic_write_text
from ..formulas.comm import Links
from ..formulas.metrics import GB
from .baseline import Baseline, baseline_from_results
from .links import nics_phrase
from .projection import micro_compute_s, pattern_of, step_of

# what makes two runs one recipe: everything but the nodes (and so the world size)
RECIPE = ("strategy", "optimizer", "shape", "seq_len", "per_device_train_batch_size", "gradient_accumulation_steps",
          "precision", "activation_checkpointing", "torch_compile", "processes_per_node", "device_type",
          "fused_linear_cross_entropy", "float8", "sync_each_batch")
_LOWEST, _HIGHEST = 1e6, 1e13  # bytes/s searched: 1 MB/s to 10 TB/s per GPU


@dataclass(frozen=True)
class InterNode:
    """Bytes/s per GPU: the typical figure and its band (from the multi-node run's fastest and slowest intervals)."""

    bw: float
    low: float
    high: float
    at_bound: str | None = None  # "fast": the model's compute alone is as slow as the run (any faster link fits)


def recipe_difference(one: Baseline, many: Baseline) -> str | None:
    """Why two measured runs are not one recipe on one node and on more (None when they are)."""
    for name in RECIPE:
        a, b = getattr(one.plan, name), getattr(many.plan, name)
        if a != b:
            shown = (lambda x: x.name) if name in ("strategy", "optimizer") else (lambda x: x)
            return f"not the same recipe: {name} {shown(a)} against {shown(b)}"
    if one.plan.nodes != 1:
        return f"the first run must be on one node, it ran on {one.plan.nodes}"
    if many.plan.nodes < 2:
        return f"the second run must be on 2 or more nodes, it ran on {many.plan.nodes}"
    return None


def multi_node_step(one: Baseline, many: Baseline, intra: Links) -> Callable[[float], float]:
    """The model's step time of the multi-node run's layout at an inter-node bandwidth, from the one-node run's
    compute (solved once: it does not depend on the link between nodes)."""
    compute = micro_compute_s(one.plan, one, one.s_per_iter[0], intra)
    pattern = pattern_of(many.plan, many.powersgd_rank)
    return lambda bw: step_of(many.plan, one, compute, replace(intra, inter_bw=bw), pattern).total_s


def solve_inter_bw(step: Callable[[float], float], s_per_iter: float) -> tuple[float, str | None]:
    """The inter-node bus bandwidth at which `step` takes `s_per_iter` (bisection in log space: the step time falls
    as the link gets faster), and whether it is pinned at the searched range's end."""
    if step(_HIGHEST) >= s_per_iter:
        return _HIGHEST, "fast"  # the run is as fast as its compute: the link hides under it, any faster one fits
    if step(_LOWEST) <= s_per_iter:
        return _LOWEST, "slow"
    low, high = _LOWEST, _HIGHEST
    for _ in range(80):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if step(mid) > s_per_iter else (low, mid)
    return (low * high) ** 0.5, None


def inter_node_from_runs(one_path: Path, many_path: Path, intra: Links) -> InterNode:
    one, many = baseline_from_results(one_path), baseline_from_results(many_path)
    reason = recipe_difference(one, many)
    if reason:
        raise HfscaleError(f"{one_path} and {many_path}: {reason}")
    if one.plan.device_type != "cuda":  # runs over gloo: no NCCL algorithm, every ring step pays its latency
        intra = replace(intra, collectives="ring")
    step = multi_node_step(one, many, intra)
    typical, bound = solve_inter_bw(step, many.s_per_iter[0])
    slowest_run, _ = solve_inter_bw(step, many.s_per_iter[2])  # the slowest interval: the lowest link
    fastest_run, _ = solve_inter_bw(step, many.s_per_iter[1])
    return InterNode(typical, min(slowest_run, typical), max(fastest_run, typical), bound)


def write_inter_node(path: Path, link: InterNode, runs: list[str], nics_per_node: int | None = None) -> None:
    """The file `hfscale project --inter_bw FILE` reads (links.read_inter_node_file): one network link's figure, under
    the NIC count it was solved with (project refuses the file beside another)."""
    atomic_write_text(path, json.dumps({"inter_bw_gb_s": link.bw / GB, "inter_bw_low_gb_s": link.low / GB,
                                        "inter_bw_high_gb_s": link.high / GB, "at_bound": link.at_bound,
                                        "nics_per_node": nics_per_node, "from_runs": runs}, indent=1) + "\n")


def describe(link: InterNode, nics_per_node: int | None = None) -> str:
    if link.at_bound == "fast":
        return ("the multi-node run is as fast as the one-node run's compute: the link hides under it, so it is at "
                f"least as fast as any the model can tell apart (>= {link.bw / GB:,.0f} GB/s); nothing to calibrate")
    if link.at_bound == "slow":
        return f"the multi-node run is slower than even a {link.bw / GB:g} GB/s link explains: check that it ran alone"
    return (f"inter-node bus bandwidth per GPU's network link (NICs: {nics_phrase(nics_per_node)}): "
            f"{link.bw / GB:.3g} GB/s (band "
            f"{link.low / GB:.3g}:{link.high / GB:.3g} "
            f"from the multi-node run's fastest and slowest intervals); hfscale project --inter_bw "
            f"{link.low / GB:.3g}:{link.high / GB:.3g}, or --inter_bw FILE with --out FILE")
