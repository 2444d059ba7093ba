"""The cluster's own collectives (`hfscale project --nccl_tests LOG ...`): nccl-tests' stdout, or what `hfscale
bandwidth --worker --out` measured over NCCL across the nodes, read into Links.fabric points - the bus bandwidth each
collective reached per message size at the nodes it ran on - which scale NCCL's cost model where the fabric loses what
no model has (formulas/comm.fabric_efficiency).

A log is what `all_reduce_perf`, `all_gather_perf` or `reduce_scatter_perf` prints (nccl-tests 2.x, one run or
several in a row, `srun --label` prefixes allowed): the collective from its "# Collective test starting:" line (or the
command line echoed before it, or the file's name: all_gather_perf.log, NVIDIA's 1_2_LOG_all_gather_..._iter1.txt),
the ranks and nodes from its device list ("#  Rank  N ... on HOST device D"), and each size's out-of-place bus
bandwidth, the column the header names busbw."""

import re
from pathlib import Path

from ..errors import HfscaleError
from ..files import load_json
from ..formulas.comm import RING

PERF = {f"{kind}_perf": kind for kind in RING}
PERF_NAMES = {name.replace("_", ""): f"{name}_perf"
              for name in (*RING, "alltoall", "sendrecv", "broadcast", "hypercube")}
_LABEL = re.compile(r"^\s*\d+:\s?")  # srun --label
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
_BINARY = re.compile(r"([a-z]+(?:_[a-z]+)*_perf)")  # all_gather_perf, in "./build/all_gather_perf -b 8"
# a test as a file names it: all_gather_perf.log, allgather-16n.txt, NVIDIA's 1_2_LOG_all_gather_env1_..._iter1.txt
_FILE_NAMED = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|send_?recv|broadcast|hypercube)",
                         re.IGNORECASE)


def _runs(text: str, path: Path) -> list[dict]:
    """[{"binary", "ranks": {rank: host}, "rows": [(size, busbw GB/s, wrong)]}] in the order the log ran them. A run
    without nccl-tests' start line takes the last `*_perf` its log names before it (the command line), else the
    file's name."""
    runs, run, column, counts_wrong, named = [], None, None, True, None
    for raw in text.splitlines():
        line = _LABEL.sub("", raw, count=1).strip()  # a results row's first number is never followed by ':'
        if start := _START.match(line):
            run, column = {"binary": start.group(1), "ranks": {}, "rows": []}, None
            runs.append(run)
            continue
        if not line.startswith("#") and (binary := _BINARY.search(line)):
            named = binary.group(1)
        begins = line.startswith("# nThread") or (run is None and _RANK.match(line))
        if begins and (run is None or run["ranks"] or run["rows"]):  # a run printed without a start line
            run, column = {"binary": named, "ranks": {}, "rows": []}, None
            runs.append(run)
        if run is None:
            continue
        if rank := _RANK.match(line):
            run["ranks"][int(rank.group(1))] = rank.group(2)
        elif line.startswith("#") and "busbw" in line.split():
            header = line.lstrip("#").split()
            column = header.index("busbw")
            counts_wrong = header[column + 1:column + 2] == ["#wrong"]  # older nccl-tests: a max "error"
        elif column is not None and line[:1].isdigit():
            fields = line.split()
            try:
                size, busbw = int(fields[0]), float(fields[column])
                wrong = fields[column + 1] if counts_wrong else "0"
            except (ValueError, IndexError):
                continue
            run["rows"].append((size, busbw, wrong))
    from_file = _FILE_NAMED.search(path.name)
    file_binary = PERF_NAMES[from_file.group(1).lower().replace("_", "")] if from_file else None
    for run in runs:
        run["binary"] = run["binary"] or file_binary
    return [run for run in runs if run["rows"] or run["ranks"]]


def read_nccl_tests(paths: list[Path], gpus_per_node: int | None = None) -> tuple:
    """Links.fabric points ((kind, nodes, ranks, size_bytes, busbw bytes/s), ...) from nccl-tests logs; one line naming
    the file and the problem for anything else (HfscaleError). gpus_per_node: the projection's nodes, which the logs
    must have measured (a ring with fewer GPUs in each node spreads over fewer of its links)."""
    points = []
    for path in paths:
        path = Path(path)
        if path.is_dir():  # the flag takes every path after it: a run folder given after it lands here
            raise HfscaleError(f"--nccl_tests {path}: a folder, not a log (a run folder after --nccl_tests? give it "
                               "before the flag)")
        if path.suffix == ".json":
            points += _bandwidth_file(path, gpus_per_node)
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            raise HfscaleError(f"--nccl_tests {path}: cannot read it ({e.strerror or e})") from None
        runs = _runs(text, path)
        if not runs or not any(run["rows"] for run in runs):
            raise HfscaleError(f"--nccl_tests {path}: no nccl-tests results in it (the stdout of all_reduce_perf, "
                               "all_gather_perf or reduce_scatter_perf, with its '#  Rank ... on HOST' lines and a "
                               "busbw column)")
        for run in runs:
            if run["binary"] is None:
                raise HfscaleError(f"--nccl_tests {path}: which test ran is not in it (no 'Collective test starting' "
                                   "line, no command line naming it): name the file after it, e.g. all_gather_perf.log")
            kind = PERF.get(run["binary"])
            if kind is None:
                raise HfscaleError(f"--nccl_tests {path}: a run of {run['binary']}; hfscale reads {', '.join(PERF)} "
                                   "(the collectives its strategies issue)")
            ranks, hosts = len(run["ranks"]), set(run["ranks"].values())
            if ranks < 2 or sorted(run["ranks"]) != list(range(ranks)):
                raise HfscaleError(f"--nccl_tests {path}: its {run['binary']} run lists {ranks} rank(s) "
                                   f"{sorted(run['ranks'])[:4]}...; a log lists every rank 0..n-1 it ran on (n >= 2)")
            if ranks % len(hosts):
                raise HfscaleError(f"--nccl_tests {path}: {ranks} ranks over {len(hosts)} nodes is not the same number "
                                   "on each node; measure whole nodes")
            _same_nodes(path, ranks // len(hosts), gpus_per_node)
            for size, busbw, wrong in run["rows"]:
                if wrong not in ("0", "N/A"):
                    raise HfscaleError(f"--nccl_tests {path}: {run['binary']} at {size} bytes reports {wrong} wrong "
                                       "values; a run that fails its own check measures nothing")
                if size > 0 and busbw > 0:
                    points.append((kind, len(hosts), ranks, float(size), busbw * 1e9))
    if not points:
        raise HfscaleError(f"--nccl_tests: no message above 0 bytes with a bus bandwidth above 0 in "
                           f"{', '.join(str(p) for p in paths)}")
    return tuple(points)


def _same_nodes(path: Path, measured: int, gpus_per_node: int | None) -> None:
    if gpus_per_node is not None and measured != gpus_per_node:
        raise HfscaleError(f"--nccl_tests {path}: measured {measured} GPUs per node where the projection's nodes have "
                           f"{gpus_per_node} (--gpus_per_node): measure the nodes as the run will use them")


def _bandwidth_file(path: Path, gpus_per_node: int | None) -> list:
    """The points of a file `hfscale bandwidth --worker --out` wrote from a group launched across the nodes (its
    rows: each collective's mean time per size, as nccl-tests times them), measured over NCCL."""
    data = load_json(path, "bandwidth file")
    try:
        ranks, per_node, backend = int(data["ranks"]), int(data["ranks_per_node"]), data["backend"]
        rows = [(r["kind"], float(r["size_bytes"]), float(r["busbw"])) for r in data["rows"]]
    except (KeyError, TypeError, ValueError):
        raise HfscaleError(f"--nccl_tests {path}: neither an nccl-tests log nor a file of `hfscale bandwidth --out` "
                           "(a results file after --nccl_tests? give it before the flag)") from None
    if backend != "nccl":
        raise HfscaleError(f"--nccl_tests {path}: measured over {backend}, not NCCL: its figures say nothing of "
                           "NCCL's (use it as --bandwidth_file)")
    malformed = not rows or any(k not in RING or s <= 0 or b <= 0 for k, s, b in rows)
    if ranks < 2 or per_node < 1 or ranks % per_node or malformed:
        raise HfscaleError(f"--nccl_tests {path}: malformed (ranks {ranks} over nodes of {per_node}, rows of a kind in "
                           f"{', '.join(RING)} with a size and a bus bandwidth above 0); write it again with "
                           "`hfscale bandwidth --out`")
    _same_nodes(path, per_node, gpus_per_node)
    return [(kind, ranks // per_node, ranks, size, busbw) for kind, size, busbw in rows]
