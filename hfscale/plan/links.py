"""The links of the communication model (`hfscale project`, `hfscale report --days_at_gpus`, tune's 3D projection):
bus bandwidths and latencies given as flags (a LOW:HIGH range gives the band) or measured by `hfscale bandwidth`."""

import math
from pathlib import Path

from ..errors import HfscaleError
from ..files import load_json
from ..formulas.comm import COLLECTIVE_MODELS, HOPS, Links, fabric_efficiency
from ..formulas.metrics import GB
from .nccl_tests import read_nccl_tests

KINDS = ("all_reduce", "all_gather", "reduce_scatter")  # what `hfscale bandwidth` measures
DEFAULT_INTRA_GB_S, DEFAULT_INTER_GB_S = 150.0, 12.5  # assumed bus bandwidths per GPU when none is measured or given


def _bandwidths(text: str, flag: str, nics_per_node: int | None = None) -> tuple[float, float, float]:
    """'150' or '100:200' (GB/s) -> (typical, high, low) bytes/s; typical is the middle of a range. --inter_bw also
    takes the file `hfscale bandwidth --from_runs --out` writes: its figure and its band."""
    if flag == "inter_bw" and str(text).endswith(".json"):
        return read_inter_node_file(Path(text), nics_per_node)
    try:
        parts = [float(x) for x in str(text).split(":")]
    except ValueError:
        raise HfscaleError(f"--{flag} must be GB/s or LOW:HIGH GB/s, got {text!r}") from None
    if len(parts) not in (1, 2) or any(not (x > 0 and x != float("inf")) for x in parts):
        raise HfscaleError(f"--{flag} must be positive GB/s (or LOW:HIGH), got {text!r}")
    low, high = min(parts), max(parts)
    return (low + high) / 2 * GB, high * GB, low * GB


def add_link_flags(p) -> None:
    """The links of the communication model (`hfscale project`, `hfscale report --days_at_gpus`)."""
    p.add_argument("--gpus_per_node", type=int, default=8)
    p.add_argument("--intra_bw", default=f"{DEFAULT_INTRA_GB_S:g}", help="intra-node bus bandwidth per GPU, GB/s or "
                   f"LOW:HIGH (default {DEFAULT_INTRA_GB_S:g}, assumed)")
    p.add_argument("--inter_bw", default=f"{DEFAULT_INTER_GB_S:g}", help="inter-node bus bandwidth of one GPU's "
                   "network link (what nccl-tests' all_reduce_perf reports over one GPU per node), GB/s or LOW:HIGH, "
                   f"or a FILE.json from `hfscale bandwidth --from_runs` (default {DEFAULT_INTER_GB_S:g}, assumed)")
    p.add_argument("--nics_per_node", type=int, help="network links per node a ring across nodes can spread over: a "
                   "ring with p GPUs in each node runs at --inter_bw x min(p, this), NCCL's model (default: one per "
                   "GPU, as on DGX/HGX nodes)")
    p.add_argument("--collectives", choices=COLLECTIVE_MODELS, help="how a collective is timed: nccl (NCCL's own "
                   "cost model: ring or tree, LL/LL128/Simple, NVLink and network hop latencies; the default) or ring "
                   "(every ring step pays --intra/--inter_latency_us: gloo's way, the default for a --bandwidth_file "
                   "measured over gloo)")
    p.add_argument("--intra_hop", choices=HOPS, default="nvlink", help="what links the GPUs of a node, for NCCL's "
                   "hop latencies (default nvlink)")
    p.add_argument("--intra_latency_us", type=float, help=f"the ring model's latency per step inside a node (default "
                   f"{RING_LATENCY_US[0]:g})")
    p.add_argument("--inter_latency_us", type=float, help=f"the ring model's latency per step across nodes (default "
                   f"{RING_LATENCY_US[1]:g})")
    p.add_argument("--bandwidth_file", type=Path, help="measured by `hfscale bandwidth --out` (sets --intra_bw and the latency)")
    p.add_argument("--nccl_tests", type=Path, nargs="+", metavar="LOG", help="the cluster's own collectives: the "
                   "stdout of nccl-tests' all_reduce_perf, all_gather_perf or reduce_scatter_perf, or a FILE.json of "
                   "`hfscale bandwidth --worker --out` over NCCL, on one node or several (whole nodes of "
                   "--gpus_per_node); NCCL's model is scaled by measured / modelled at the nearest measured node count "
                   "and message size, the fabric's losses at scale that no cost model has")


LINK_FLAGS = ("--gpus_per_node", "--intra_bw", "--inter_bw", "--nics_per_node", "--collectives", "--intra_hop",
              "--intra_latency_us", "--inter_latency_us", "--bandwidth_file", "--nccl_tests")
RING_LATENCY_US = (5.0, 20.0)  # the ring model's assumed latency per step inside and across nodes


def links_from(opts) -> tuple[Links, Links, Links]:
    nics = getattr(opts, "nics_per_node", None)
    if nics is not None and nics < 1:
        raise HfscaleError(f"--nics_per_node must be a whole number >= 1, got {nics}")
    intra, inter = _bandwidths(opts.intra_bw, "intra_bw"), _bandwidths(opts.inter_bw, "inter_bw", nics)
    measured = read_bandwidth_file(opts.bandwidth_file) if opts.bandwidth_file else {}
    # gloo runs no NCCL algorithm: a file measured over it is timed the way it was fitted, step by step
    model = opts.collectives or ("ring" if measured.get("backend") == "gloo" else "nccl")
    given = [name for name in ("intra_latency_us", "inter_latency_us") if getattr(opts, name) is not None]
    if model == "nccl" and given:
        raise HfscaleError(f"--{given[0]} sets the ring model's latency per step; NCCL's model (--collectives nccl) "
                           "takes its hop latencies from NCCL's own table: pass --collectives ring to set them")
    logs = getattr(opts, "nccl_tests", None)
    if logs and model != "nccl":
        why = "--collectives ring" if opts.collectives else "a gloo --bandwidth_file's"
        raise HfscaleError(f"--nccl_tests scales NCCL's cost model by what the cluster's NCCL measured; the ring model "
                           f"({why}) has none of NCCL's algorithms to scale: drop one of them")
    fabric = read_nccl_tests(logs, getattr(opts, "gpus_per_node", None)) if logs else ()
    latencies = [RING_LATENCY_US[i] if getattr(opts, name) is None else getattr(opts, name)
                 for i, name in enumerate(("intra_latency_us", "inter_latency_us"))]
    for name, value in zip(("intra_latency_us", "inter_latency_us"), latencies):
        if not 0 <= value < float("inf"):
            raise HfscaleError(f"--{name} must be >= 0, got {value}")
    intra_lat, fits, meets = latencies[0] * 1e-6, (), ()
    if opts.bandwidth_file:
        if "fit" in measured:  # the latency-bandwidth line fitted over every size, per collective kind
            bw = measured["busbw_largest"]["all_reduce"]
            try:
                fits = tuple((kind, float(f["busbw"]), float(f["latency_s"])) for kind, f in measured["fit"].items())
            except (TypeError, KeyError, ValueError, AttributeError):
                fits = ()
            if not fits or not all(0 < b < float("inf") and 0 <= lat < float("inf") for _, b, lat in fits):
                raise HfscaleError(f"{opts.bandwidth_file}: malformed fit (each collective needs a positive busbw and "
                                   "a latency_s >= 0); write it again with `hfscale bandwidth --out`")
            bw, intra_lat = dict((k, (b, lat)) for k, b, lat in fits).get("all_reduce", (bw, intra_lat))
            meets = meeting_curves(measured, opts.bandwidth_file)
        else:  # an older file: its largest message's bandwidth and its smallest message's latency
            bw = measured["busbw_largest"]["all_reduce"]
            try:
                smallest = min((r for r in measured["rows"] if r["kind"] == "all_reduce"), key=lambda r: r["size_bytes"])
                intra_lat = float(smallest["time_s"]) / (2 * (int(measured["ranks"]) - 1))
            except (TypeError, KeyError, ValueError, ZeroDivisionError):
                intra_lat = -1.0
            if not 0 <= intra_lat < float("inf"):
                raise HfscaleError(f"{opts.bandwidth_file}: malformed rows (no all_reduce row with its time_s, or no "
                                   "ranks > 1); write it again with `hfscale bandwidth --out`")
        intra = (bw, bw, bw)
    return tuple(Links(intra[i], inter[i], intra_lat, latencies[1] * 1e-6, fits, meets, model, opts.intra_hop, nics,
                       fabric) for i in range(3))


def meeting_curves(measured: dict, path) -> tuple:
    """Links.intra_meets from a bandwidth file measured with --compute_ms: per kind, (gap, seconds) points in rising
    gap order; () when it has none (measured back to back)."""
    if "meet_s" not in measured:
        if measured.get("compute_s_between"):  # hfscale before 2026-11-26: fits timed after compute, meeting included
            raise HfscaleError(f"{path}: measured by an older `hfscale bandwidth --compute_ms`, whose fits include the "
                               "meeting after a whole step (now measured apart, per piece); write it again with "
                               "`hfscale bandwidth --compute_ms X --out`")
        return ()
    try:
        curves = tuple((kind, tuple(sorted((float(gap), float(s)) for gap, s in points)))
                       for kind, points in measured["meet_s"].items())
    except (TypeError, ValueError, AttributeError):
        curves = ()
    if not curves or not all(points and all(0 < gap < float("inf") and 0 <= s < float("inf") for gap, s in points)
                             for _, points in curves):
        raise HfscaleError(f"{path}: malformed meet_s (per collective, [gap_s > 0, seconds >= 0] points); write it "
                           "again with `hfscale bandwidth --compute_ms X --out`")
    return curves


def nics_phrase(nics_per_node: int | None) -> str:
    """How the printouts and refusals name a NIC count (None: one per GPU, the default)."""
    return "one per GPU" if nics_per_node is None else f"{nics_per_node} per node"


def collectives_line(links: Links) -> str:
    if links.collectives == "ring":
        return (f"collectives timed as rings: {links.intra_latency_s * 1e6:g}/{links.inter_latency_s * 1e6:g} us per "
                "step inside/across nodes, at the inter-node bandwidth once a ring leaves its node")
    return (f"collectives timed by NCCL's cost model (ring or tree, LL/LL128/Simple, the fastest; {links.intra_hop} "
            "hops inside a node, network hops across, at NCCL's latencies); a ring across nodes with p of its GPUs in "
            f"each node spreads over min(p, NICs) network links (NICs: {nics_phrase(links.nics_per_node)}), at most "
            "the intra-node bandwidth"
            + ("; inside a node as measured" if links.intra_fits else ""))


def fabric_line(links: Links) -> str | None:
    """What the cluster's nccl-tests (--nccl_tests) measured, against NCCL's model (None without them)."""
    if not links.fabric:
        return None
    parts = []
    for kind in dict.fromkeys(point[0] for point in links.fabric):
        points = [p for p in links.fabric if p[0] == kind]
        nodes, sizes = sorted({p[1] for p in points}), sorted({p[3] for p in points})
        ratios = sorted((fabric_efficiency(kind, p[3], p[1], links), p[1], p[3]) for p in points)
        where = f"{_span(nodes, '')} node{'s' if nodes[-1] > 1 else ''}, {_span([s / GB for s in sizes], ' GB', '.3g')}"
        low, at_nodes, at_size = ratios[0]
        parts.append(f"{kind} on {where}: {_span([low, ratios[-1][0]], '', '.2f')} of NCCL's model (lowest on "
                     f"{at_nodes} node{'s' if at_nodes > 1 else ''} at {at_size / GB:.3g} GB)")
    widest = max(p[1] for p in links.fabric)
    return ("the network as the cluster's nccl-tests measured it (--nccl_tests), NCCL's model scaled by measured / "
            "modelled: " + "; ".join(parts) + f"; beyond {widest} nodes, and past the sizes measured, the nearest "
            "measured figures")


def _span(values: list, unit: str, spec: str = "g") -> str:
    low, high = format(values[0], spec), format(values[-1], spec)
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def meeting_line(links: Links) -> str:
    if not links.intra_meets:
        return ("no meeting cost: the collectives inside a node are timed back to back (measure it with `hfscale "
                "bandwidth --compute_ms`)")
    longest = max(gap for _, curve in links.intra_meets for gap, _ in curve)
    return ("each piece inside a node also pays the ranks' meeting after the compute before it (the step's, spread "
            "evenly), as measured: " + ", ".join(f"{kind} {links.meet_s(kind, longest) * 1e6:.0f} us after "
                                                  f"{longest * 1e3:.3g} ms" for kind, _ in links.intra_meets))


def read_bandwidth_file(path) -> dict:
    """A file written by `hfscale bandwidth --out`: {"busbw_largest": {kind: bytes/s}, "nodes": ...}."""
    data = load_json(Path(path), "bandwidth file")
    bw = data.get("busbw_largest")
    if not isinstance(bw, dict) or not all(isinstance(bw.get(k), (int, float)) and not isinstance(bw[k], bool)
                                           and 0 < bw[k] < math.inf for k in KINDS):
        raise HfscaleError(f"{path}: not a bandwidth file (written by `hfscale bandwidth --out`): no positive, finite "
                           f"busbw_largest for {', '.join(KINDS)}")
    return data


def read_inter_node_file(path: Path, nics_per_node: int | None = None) -> tuple[float, float, float]:
    """(typical, high, low) bytes/s from a file `hfscale bandwidth --from_runs --out` wrote, solved under the same
    NIC count (one link's figure means nothing beside another count)."""
    data = load_json(path, "inter-node bandwidth file")
    if isinstance(data, dict) and data.get("nics_per_node") != nics_per_node:
        raise HfscaleError(f"{path}: solved for {nics_phrase(data.get('nics_per_node'))} network links, not "
                           f"{nics_phrase(nics_per_node)}: pass the same --nics_per_node to both commands")
    try:
        values = [float(data[k]) * GB for k in ("inter_bw_gb_s", "inter_bw_high_gb_s", "inter_bw_low_gb_s")]
    except (KeyError, TypeError, ValueError):
        values = []
    if len(values) != 3 or not all(0 < v < math.inf for v in values) or data.get("at_bound"):
        raise HfscaleError(f"{path}: not an inter-node bandwidth from two runs (write it with `hfscale bandwidth "
                           "--from_runs ONE_NODE MULTI_NODE --out FILE`; a run whose link hid under its compute "
                           "calibrates nothing)")
    return values[0], values[1], values[2]

