"""The communication model and `hfscale project`: arithmetic that fails if the model is wrong, torch's own PowerSGD
hook as the source of its byte count, and bad input."""

import json
import sys

import pytest

from conftest import run
from hfscale.formulas import comm
from hfscale.formulas.metrics import param_count
from hfscale.parallel.strategies import get_strategy
from hfscale.plan.project import Baseline, project
from hfscale.run.models import PRESETS

SHAPE = PRESETS["bloom-7b1"]
FAST = comm.Links(intra_bw=1e30, inter_bw=1e30, intra_latency_s=0, inter_latency_s=0)
SLOW_INTER = comm.Links(intra_bw=150e9, inter_bw=3e9)


def _base(grad_accum: int, strategy="ddp", gpus=8) -> Baseline:
    # bloom-7b1, MBS 1, seq 2048, ~1.1 s per micro-batch on one node of 8 (about 150 TFLOPs of hardware FLOPs)
    return Baseline(SHAPE, strategy, 2048, 1, grad_accum, gpus, 8, "bf16", [1.1 * grad_accum] * 3, "test")


def _days(points):
    return {p.gpus: p.days for p in points}


def test_with_infinite_bandwidth_days_halve_when_gpus_double():
    for name in ("ddp", "zero1", "zero2", "zero3", "fsdp", "ddp_powersgd"):
        days = _days(project(_base(4, name), [get_strategy(name)], [8, 16, 32, 64], 8, (FAST,) * 3, 1e11, None))
        for n in (8, 16, 32):
            assert days[2 * n] == pytest.approx(days[n] / 2, rel=1e-9), name


def test_slow_inter_node_link_without_accumulation_makes_two_nodes_slower_and_gas_256_recovers():
    """The BigScience observation on bloom-7b: crossing nodes without gradient accumulation halved speed."""
    ddp = [get_strategy("ddp")]
    gas1 = _days(project(_base(1), ddp, [8, 16], 8, (SLOW_INTER,) * 3, 1e11, None))
    assert gas1[16] > gas1[8]  # 2 nodes take longer than 1 node for the same tokens
    gas256 = _days(project(_base(256), ddp, [8, 16], 8, (SLOW_INTER,) * 3, 1e11, None))
    assert gas256[16] == pytest.approx(gas256[8] / 2, rel=0.1)  # near-linear again (94% here)


def test_zero3_moves_one_and_a_half_times_zero1_per_micro_step():
    P = param_count(SHAPE)
    for ranks in (2, 8, 64):
        z1 = comm.comm_pattern("deepspeed", 1, param_bytes=2 * P, grad_bytes=2 * P, ranks=ranks)
        z3 = comm.comm_pattern("deepspeed", 3, param_bytes=2 * P, grad_bytes=2 * P, ranks=ranks)
        ddp = comm.comm_pattern("ddp", None, param_bytes=2 * P, grad_bytes=2 * P, ranks=ranks)
        assert z3.bytes_per_step(1, ranks) == pytest.approx(1.5 * z1.bytes_per_step(1, ranks))
        assert z1.bytes_per_step(1, ranks) == pytest.approx(ddp.bytes_per_step(1, ranks))  # 2(n-1)/n Ψ each
        # with accumulation ZeRO-1 (and DDP) still communicate once per step, ZeRO-3 every micro-step
        assert z3.bytes_per_step(16, ranks) == pytest.approx(16 * 1.5 * z1.bytes_per_step(16, ranks))


def test_ring_collective_time():
    links = comm.Links(intra_bw=100e9, inter_bw=10e9, intra_latency_s=1e-5, inter_latency_s=1e-4)
    assert comm.collective_s("all_reduce", 1e9, 8, 8, links) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9 + 14 * 1e-5)
    assert comm.collective_s("all_gather", 1e9, 16, 8, links) == pytest.approx(15 / 16 * 1e9 / 10e9 + 15 * 1e-4)
    assert comm.collective_s("reduce_scatter", 1e9, 1, 8, links) == 0.0


def test_powersgd_bytes_equal_the_real_hooks_factor_sizes(tmp_path):
    """torch's PowerSGD hook counts the elements it all-reduces (total_numel_after_compression): after warm-up,
    one step's count equals powersgd_elements of the model's tensors."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from hfscale.formulas.memory import parameter_tensors
    from hfscale.run.models import build_model

    shape = PRESETS["tiny"]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(build_model(shape, seed=0))
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        ids = torch.randint(0, shape.vocab, (2, 16))
        counts = []
        for _ in range(4):
            before = state.total_numel_after_compression
            model(input_ids=ids, labels=ids).loss.backward()
            counts.append(state.total_numel_after_compression - before)
        assert counts[-1] > 0
        assert counts[-1] == comm.powersgd_elements([t.shape for t in parameter_tensors(shape)], 2)
        assert counts[-1] < 0.5 * param_count(shape)  # it does compress
    finally:
        dist.destroy_process_group()


def test_project_command_writes_table_plot_and_json(tmp_path):
    out = tmp_path / "proj"
    proc = run([sys.executable, "-m", "hfscale", "project", "--model", "bloom-7b1", "--tflops_per_gpu", "150",
                "--seq_len", "2048", "--micro_batch_size", "1", "--grad_accum", "1", "--bf16", "--strategy", "ddp,zero1,zero3",
                "--gpus", "8,16,32,64", "--inter_bw", "3:12", "--out", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "projection.json").read_text())
    assert {p["strategy"] for p in report["points"]} == {"ddp", "zero1", "zero3"}
    for p in report["points"]:
        assert p["days_low"] <= p["days"] <= p["days_high"] and p["gpu_days"] == pytest.approx(p["days"] * p["gpus"])
    assert report["knee_gpus"]["zero3"] is not None  # without accumulation ZeRO-3 stops paying over 3-12 GB/s
    assert (out / "days_vs_gpus.png").read_bytes()[:4] == b"\x89PNG" and "| zero3 | 64 |" in (out / "projection.md").read_text()


@pytest.mark.parametrize("argv,expected", [
    (["/nonexistent/results.json"], "file not found"),
    (["--tflops_per_gpu", "0"], "--tflops_per_gpu must be positive"),
    (["--tflops_per_gpu", "100", "--gpus", "0,8"], "--gpus must be positive integers"),
    (["--tflops_per_gpu", "100", "--gpus", "12", "--gpus_per_node", "8"], "--gpus 12 is not a multiple of --gpus_per_node 8"),
    (["--tflops_per_gpu", "100", "--inter_bw", "-3"], "--inter_bw must be positive GB/s"),
    (["--tflops_per_gpu", "100", "--strategy", "zero9"], "unknown strategy 'zero9'"),
    ([], "nothing to project from"),
])
def test_project_refuses_bad_input_in_one_line(tmp_path, argv, expected):
    proc = run([sys.executable, "-m", "hfscale", "project", *argv, "--out", str(tmp_path / "out")], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_project_refuses_a_failed_or_malformed_results_file(tmp_path):
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps({"status": "OOM"}))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    for path, expected in ((failed, "did not finish (status 'OOM')"), (garbage, "malformed results file")):
        proc = run([sys.executable, "-m", "hfscale", "project", str(path)], cwd=tmp_path, timeout=120)
        assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
