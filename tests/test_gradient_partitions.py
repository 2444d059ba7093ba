"""Gradient sharding, per rank, measured by storage on the live engine with 2 processes and gradient accumulation 2:
after a micro-batch that is not the last of its step, ZeRO-1 holds every full gradient and ZeRO-2 only its
partition (what tells the two stages apart; DeepSpeed's self-reported stage is not evidence), and FSDP2 whole
gradients until the step's last micro-batch. The model has many similar tensors (8 layers, a 512-token vocabulary),
so the tensors cut by a partition's edges stay small; ZeRO-3 and FSDP are proven at the optimizer step (1/N) by
test_multiprocess.py's memory-estimate check. The gradients do not depend on the optimizer: zero1 steps with
adamw_8bit and zero2 with adafactor, so these runs are also those pairs' runs in the strategy x optimizer matrix
(conftest.partition_run)."""

import pytest

from conftest import PARTITION_OPTIM, partition_run

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def runs():
    return {s: partition_run(s) for s in PARTITION_OPTIM}


def test_zero1_accumulates_full_gradients_and_zero2_its_partition(runs):
    full = 4 * runs["zero1"]["model"]["params_model"]  # fp32 bytes of every gradient
    zero1 = runs["zero1"]["memory"]["gradients_accumulating_per_rank"]
    zero2 = runs["zero2"]["memory"]["gradients_accumulating_per_rank"]
    assert len(zero1) == len(zero2) == 2
    assert all(g == full for g in zero1), (zero1, full)
    assert all(0.45 * full < g < 0.6 * full for g in zero2), (zero2, full)  # 1/2, plus the tensors cut at the edges


def test_the_estimate_is_what_each_stage_holds(runs):
    """ZeRO-1's estimate is its full gradients (held through the backward and between micro-batches); ZeRO-2's is the
    whole-tensor partition of the rank that holds the most (formulas/memory.zero_gradient_buffer), equal to the bytes
    measured between micro-batches and at the optimizer step."""
    zero1, zero2 = runs["zero1"], runs["zero2"]
    assert zero1["estimate"]["gradients"] == max(zero1["memory"]["gradients_accumulating_per_rank"])
    measured = [max(zero2["memory"]["gradients_accumulating_per_rank"]),
                max(r["gradients"] for r in zero2["memory"]["model_states_per_rank"])]
    assert measured == [zero2["estimate"]["gradients"]] * 2
    # at the step, DeepSpeed's ZeRO-1 has reduced into the same partition buffer: the difference is the backward
    assert max(r["gradients"] for r in zero1["memory"]["model_states_per_rank"]) == zero2["estimate"]["gradients"]


def test_fsdp_accumulates_whole_gradients_and_the_estimate_counts_them(runs):
    """accelerate's no_sync on FSDP2 (set_requires_gradient_sync(False)) keeps whole, unsharded gradients until the
    last micro-batch reduce-scatters them: a full copy per rank between micro-batches, half at the step."""
    fsdp = runs["fsdp"]
    full = 4 * fsdp["model"]["params_model"]
    assert fsdp["memory"]["gradients_accumulating_per_rank"] == [full, full]
    assert all(0.45 * full < r["gradients"] < 0.55 * full for r in fsdp["memory"]["model_states_per_rank"])
    assert fsdp["estimate"]["gradients"] == full
