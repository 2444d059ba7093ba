"""The cluster's own nccl-tests (`hfscale project --nccl_tests`): logs read as nccl-tests writes them, NCCL's model
scaled to what they measured and interpolated between, and bad logs refused in one line."""

import json
from dataclasses import replace

import pytest

from hfscale.errors import HfscaleError
from hfscale.formulas import comm
from hfscale.plan.nccl_tests import read_nccl_tests

B200 = comm.Links(681e9, 43e9, collectives="nccl", nics_per_node=8)
GB = 2 ** 30


def nccl_log(binary: str, nodes: int, per_node: int, rows, *, label: bool = False, old: bool = False,
             start_line: bool = True, command: bool = False) -> str:
    """nccl-tests' stdout: (size_bytes, busbw GB/s[, wrong]) rows; `old`: an older header (no root, a max error where
    #wrong now counts); `label`: as `srun --label` prefixes each line; `command`: the command line echoed first."""
    lines = [f"+ srun ./build/{binary} -b 1G -e 8G -f 2 -g 1"] if command else []
    lines += ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807"]
    lines += [f"# Collective test starting: {binary}"] if start_line else []
    lines += [f"# nThread 1 nGpus 1 minBytes {rows[0][0]} maxBytes {rows[-1][0]} step: 2(factor) warmup iters: 5 "
              "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on gpu-{r // per_node:03d} device  {r % per_node} "
              "[0000:1b:00] NVIDIA B200" for r in range(nodes * per_node)]
    header = ("size count type redop time algbw busbw error time algbw busbw error" if old else
              "size count type redop root time algbw busbw #wrong time algbw busbw #wrong")
    lines += ["#", f"#{'out-of-place':>60}{'in-place':>35}", "#  " + header]
    n = nodes * per_node
    for size, busbw, *wrong in rows:
        wrong = (wrong or ["0"])[0]
        algbw = busbw * n / (n - 1)
        time_us = size / algbw / 1e3
        cells = [size, size // 4, "float", "none"] + ([] if old else [-1]) + [f"{time_us:.1f}", f"{algbw:.2f}",
                                                                              f"{busbw:.2f}", "2e-07" if old else wrong]
        lines.append("  " + "  ".join(str(c) for c in cells + cells[-4:]))
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0", "#"]
    lines += [f"# Collective test concluded: {binary}"] if start_line else []
    return "\n".join(f"{i % 3}: {line}" if label else line for i, line in enumerate(lines)) + "\n"


def fabric(points) -> comm.Links:
    return replace(B200, fabric=tuple(points))


def test_a_measured_point_is_timed_as_measured_and_the_model_carries_it_elsewhere():
    """At a measured node count and size a collective takes what nccl-tests measured; between, the efficiency
    (measured / modelled) is interpolated in log2 of the size and of the nodes; beyond, the nearest measured one."""
    points = [("all_gather", 8, 64, GB, 300e9), ("all_gather", 8, 64, 4 * GB, 320e9),
              ("all_gather", 32, 256, GB, 200e9), ("all_gather", 32, 256, 4 * GB, 280e9)]
    links = fabric(points)
    for kind, nodes, ranks, size, busbw in points:
        measured = (ranks - 1) / ranks * size / busbw
        assert comm.collective_s(kind, size, ranks, 8, links) == pytest.approx(measured, rel=1e-9)

    def efficiency(size, nodes):
        return comm.fabric_efficiency("all_gather", size, nodes, links)

    at = {(s, n): efficiency(s, n) for s in (GB, 4 * GB) for n in (8, 32)}
    assert at[(GB, 32)] < at[(4 * GB, 32)] < 1 and at[(GB, 32)] < at[(GB, 8)]  # the fabric's loss at scale
    middle = efficiency(2 * GB, 16)  # halfway in log2 of both
    assert middle == pytest.approx(sum(at.values()) / 4, rel=1e-9)
    assert efficiency(GB / 64, 2) == at[(GB, 8)] and efficiency(64 * GB, 256) == at[(4 * GB, 32)]
    # a reduce-scatter or an all-reduce not measured borrows the all-gather's; one node is NVLink, not the fabric
    assert comm.fabric_efficiency("reduce_scatter", GB, 32, links) == at[(GB, 32)]
    assert comm.fabric_efficiency("all_reduce", GB, 32, links) == at[(GB, 32)]
    assert comm.fabric_efficiency("all_gather", GB, 1, links) == 1.0
    assert comm.collective_s("all_gather", GB, 8, 8, links) == comm.collective_s("all_gather", GB, 8, 8, B200)
    assert comm.collective_s("all_gather", GB, 256, 8, links) > comm.collective_s("all_gather", GB, 256, 8, B200)


def test_a_fabric_point_must_be_whole_and_belongs_to_nccls_model():
    with pytest.raises(ValueError, match="fabric point"):
        fabric([("all_gather", 3, 16, GB, 300e9)])  # 16 ranks are not whole nodes of 3
    with pytest.raises(ValueError, match="fabric point"):
        fabric([("sendrecv", 2, 16, GB, 40e9)])
    with pytest.raises(ValueError, match="ring model has none"):
        replace(B200, collectives="ring", fabric=(("all_gather", 2, 16, GB, 300e9),))


def bandwidth_file(path, nodes: int, per_node: int, rows, backend: str = "nccl"):
    """What `hfscale bandwidth --worker --out` writes (the fields read here) from a group across `nodes` nodes."""
    ranks = nodes * per_node
    path.write_text(json.dumps({"ranks": ranks, "ranks_per_node": per_node, "nodes": nodes, "backend": backend,
                                "rows": [{"kind": k, "size_bytes": s, "time_s": 1.0, "busbw": b} for k, s, b in rows]}))
    return path


def test_logs_are_read_as_nccl_tests_writes_them(tmp_path):
    """Two runs in one file behind `srun --label`, an older header (no root column, a max error), and a log with no
    start line (older nccl-tests print none: the test as the file's name says it): each size's out-of-place bus
    bandwidth."""
    both = tmp_path / "suite.log"
    both.write_text(nccl_log("all_reduce_perf", 2, 8, [(GB, 300.0), (2 * GB, 310.5)], label=True)
                    + nccl_log("all_gather_perf", 2, 8, [(GB, 290.25)], label=True))
    old = tmp_path / "old.log"
    old.write_text(nccl_log("reduce_scatter_perf", 4, 8, [(GB, 250.0)], old=True))
    unnamed = tmp_path / "1_2_LOG_all_gather_env1_args1_job85317_iter1.txt"  # NVIDIA's dgxc-benchmarking names
    unnamed.write_text(nccl_log("all_gather_perf", 64, 8, [(2 * GB, 205.5)], start_line=False))
    ours = bandwidth_file(tmp_path / "bw-16n.json", 16, 8, [("reduce_scatter", GB, 280e9)])
    echoed = tmp_path / "suite-old.log"  # two runs of an older nccl-tests, each after its command line
    echoed.write_text(nccl_log("all_reduce_perf", 8, 8, [(GB, 270.0)], start_line=False, command=True)
                      + nccl_log("all_gather_perf", 8, 8, [(GB, 260.0)], start_line=False, command=True))
    points = read_nccl_tests([both, old, unnamed, ours, echoed], gpus_per_node=8)
    assert points == (("all_reduce", 2, 16, GB, 300e9), ("all_reduce", 2, 16, 2 * GB, 310.5e9),
                      ("all_gather", 2, 16, GB, 290.25e9), ("reduce_scatter", 4, 32, GB, 250e9),
                      ("all_gather", 64, 512, 2 * GB, 205.5e9), ("reduce_scatter", 16, 128, GB, 280e9),
                      ("all_reduce", 8, 64, GB, 270e9), ("all_gather", 8, 64, GB, 260e9))


@pytest.mark.parametrize("log,expected", [
    ("", "no nccl-tests results in it"),
    (nccl_log("sendrecv_perf", 2, 8, [(GB, 40.0)]), "a run of sendrecv_perf; hfscale reads all_reduce_perf"),
    (nccl_log("all_gather_perf", 2, 8, [(GB, 300.0)], start_line=False), "name the file after it"),
    (nccl_log("all_gather_perf", 2, 8, [(GB, 300.0, "3")]), "reports 3 wrong values"),
    (nccl_log("all_gather_perf", 2, 4, [(GB, 300.0)]), "measured 4 GPUs per node where the projection's nodes have 8"),
    (nccl_log("all_gather_perf", 2, 8, [(GB, 300.0)]).replace("#  Rank  3 ", "#  Rank 99 "), "lists every rank"),
    (nccl_log("all_gather_perf", 2, 8, [(GB, 300.0)]).replace("on gpu-001 device  7", "on gpu-002 device  7"),
     "is not the same number on each node"),
])
def test_a_bad_log_is_refused_in_one_line_naming_it(tmp_path, log, expected):
    path = tmp_path / "nccl.log"
    path.write_text(log)
    with pytest.raises(HfscaleError, match="--nccl_tests .*nccl.log") as refused:
        read_nccl_tests([path], gpus_per_node=8)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_a_bandwidth_file_counts_only_when_nccl_measured_it(tmp_path):
    """gloo's figures say nothing of NCCL's, and a results file or a run folder given after the flag (which takes
    every path after it) is named as such."""
    gloo = bandwidth_file(tmp_path / "bw.json", 2, 8, [("all_reduce", GB, 1e9)], backend="gloo")
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"status": "ok", "model": {}}))
    for path, expected in ((gloo, "measured over gloo, not NCCL"), (results, "a results file after --nccl_tests?"),
                           (tmp_path, "a run folder after --nccl_tests?")):
        with pytest.raises(HfscaleError, match="--nccl_tests ") as refused:
            read_nccl_tests([path], gpus_per_node=8)
        assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_project_scales_its_network_by_the_logs_and_says_so(tmp_path, hfscale_cli):
    """`hfscale project --nccl_tests`: the multi-node points slow by what the cluster lost against NCCL's model, the one
    node not at all, and the assumptions say what was measured; a missing log or the ring model is refused."""
    log = tmp_path / "ag.log"
    log.write_text(nccl_log("all_gather_perf", 2, 8, [(GB, 200.0), (4 * GB, 210.0)])
                   + nccl_log("all_gather_perf", 8, 8, [(GB, 150.0), (4 * GB, 160.0)]))
    argv = ["project", "--model", "bloom-7b1", "--tflops_per_gpu", "150", "--seq_len", "2048",
            "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1", "--bf16", "--strategy", "zero3",
            "--gpus", "8,64", "--intra_bw", "360", "--inter_bw", "40"]
    reports = {}
    for name, extra in (("model", []), ("measured", ["--nccl_tests", log])):
        proc = hfscale_cli([*argv, *extra, "--out", tmp_path / name])
        assert proc.returncode == 0, proc.stderr
        reports[name] = json.loads((tmp_path / name / "projection.json").read_text())
    speed = {name: {p["gpus"]: p["tokens_per_s"] for p in r["points"]} for name, r in reports.items()}
    assert speed["measured"][8] == speed["model"][8] and speed["measured"][64] < speed["model"][64]
    said = [a for a in reports["measured"]["assumptions"] if "--nccl_tests" in a]
    assert len(said) == 1 and "all_gather on 2-8 nodes, 1.07-4.29 GB" in said[0], said
    assert "(lowest on 8 nodes at 1.07 GB); beyond 8 nodes" in said[0], said
    assert not any("--nccl_tests" in a for a in reports["model"]["assumptions"])
    for extra, expected in ((["--nccl_tests", tmp_path / "none.log"], "cannot read it"),
                            (["--nccl_tests", log, "--collectives", "ring"], "drop one of them")):
        proc = hfscale_cli([*argv, *extra, "--out", tmp_path / "refused"])
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert expected in proc.stderr and not (tmp_path / "refused").exists()
