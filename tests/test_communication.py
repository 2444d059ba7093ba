"""What the engines really send (hfscale/run/collectives.py, `--count_collectives`): counted from the c10d ops torch's
profiler records, in a real 2-process run, and held against the communication model (formulas/comm.py)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import SYNC_EACH_BATCH, bf16_args, bf16_result, fsdp_sync_result
from hfscale.formulas import comm
from hfscale.formulas.tensors import block_numel, parameter_tensors
from hfscale.run.collectives import bytes_by_kind, collectives_of, tally
from hfscale.parallel.strategies import get_strategy


def event(name, start, shapes, dtypes):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start), structured_input_shapes=shapes,
                           input_shapes=shapes, input_dtypes=dtypes)


def test_the_counter_reads_each_op_as_the_engine_issued_it():
    """Events as torch 2.13's profiler records them on gloo (seen in a 2-process run): a tensor-list op names no dtype,
    its backend event (on a worker thread, later) does; gloo carries a reduce-scatter out as an all-reduce."""
    events = [
        event("c10d::allreduce_", 0, [[[4160]], [], [], [], [], []], ["TensorList", "", "", "", "Scalar", "Scalar"]),
        event("gloo:all_reduce", 1, [[4160]], ["float"]),
        event("c10d::_allgather_base_", 2, [[2000], [1000], [], [], []],
              ["c10::BFloat16", "c10::BFloat16", "", "Scalar", "Scalar"]),
        event("gloo:all_gather", 3, [[1000]], ["c10::BFloat16"]),
        event("c10d::allgather_", 4, [[], [[1]], [], [], []], ["", "TensorList", "", "Scalar", "Scalar"]),
        event("c10d::_reduce_scatter_base_", 5, [[500], [1000], [], [], [], []],
              ["float", "float", "", "", "Scalar", "Scalar"]),
        event("gloo:all_reduce", 6, [[1000]], ["float"]),
        event("gloo:all_gather", 7, [[1]], ["long int"]),
        event("aten::add", 8, [[3], [3]], ["float", "float"]),
    ]
    counted = collectives_of(events, world_size=2)
    assert counted == [{"kind": "all_reduce", "dtype": "float32", "elements": 4160, "bytes": 16640},
                       {"kind": "all_gather", "dtype": "bfloat16", "elements": 2000, "bytes": 4000},
                       {"kind": "all_gather", "dtype": "int64", "elements": 2, "bytes": 16},
                       {"kind": "reduce_scatter", "dtype": "float32", "elements": 1000, "bytes": 4000}]
    # over a sub-group (HSDP's node), an all-gather's message is its output, not its input times the world
    sub = collectives_of(events[2:4], world_size=4)
    assert sub == [{"kind": "all_gather", "dtype": "bfloat16", "elements": 2000, "bytes": 4000}]
    assert tally(counted + counted[:1])[0] == {"kind": "all_reduce", "dtype": "float32", "elements": 4160,
                                               "bytes": 16640, "count": 2}


COUNTED = ["ddp", "fsdp", "fsdp_offload", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", COUNTED)
def test_the_engines_send_what_the_model_says_to_the_byte(strategy):
    """The bf16 runs (conftest.BF16_RUNS: 2 processes, GAS 2, activation checkpointing, step 3 counted) against
    plan/projection.pattern_of for the same plan, every message but the per-rank scalars. ddp: one fp32 gradient
    all-reduce per optimizer step (no_sync before the last micro-batch; fp32 under autocast). fsdp: the blocks
    gathered for the forward and again for the backward, the root unit (embeddings, tied head, final norm) once - FSDP2
    keeps it unsharded from the forward into the backward - every micro-batch; the gradients reduce-scattered once, at
    the accumulation boundary, and gradient clipping's per-tensor norms all-reduced in fp32. zero1/zero2: whole gradient buckets all-reduced (DeepSpeed's
    use_multi_rank_bucket_allreduce) once per step / every micro-batch, the updated weights all-gathered. zero3: every
    parameter above the persistence threshold gathered once per micro-batch (the tiny model is within
    stage3_max_reuse_distance, so the backward reuses the forward's), the persistent ones once per step after the
    optimizer, gradients reduce-scattered every micro-batch. Offload moves nothing more between ranks. All but DDP
    in bf16. (ddp_powersgd: its factors are all-reduced from gloo's worker threads, which the profiler does not see;
    their size is checked against torch's own hook in tests/test_project.py.)"""
    from hfscale.plan.projection import pattern_of
    from hfscale.train import check_args

    res = bf16_result(strategy)
    shipped = get_strategy(res["strategy"]).shipped_deepspeed_config  # the run records its buckets for `project`
    assert res["config"]["zero_optimization"] == (shipped["zero_optimization"] if shipped else None)
    # zero2's run takes its strategy from its launcher config; name it here
    args = [*bf16_args(strategy, Path("unused")), "--strategy", res["strategy"]]
    plan = check_args(args)[3].plan.but(world_size=2, processes_per_node=2)
    modelled = pattern_of(plan).messages_per_step(plan.gradient_accumulation_steps)
    token_count = {"kind": "all_gather", "dtype": "int64", "elements": 2,
                   "bytes": comm.TOKEN_COUNT_BYTES_PER_RANK * 2}  # the Trainer's, once per optimizer step at least
    assert res["communication"]["step"] == 3 and len(res["communication"]["per_rank"]) == 2
    for counted in res["communication"]["per_rank"]:
        assert bytes_by_kind(counted, 2) == modelled
        assert {c["dtype"] for c in counted if (c["bytes"] or 0) >= 1024} == (  # the parameters' and gradients'
            {"float32"} if strategy == "ddp" else {"bfloat16"})
        assert any({k: c[k] for k in token_count} == token_count for c in counted)
    params = res["model"]["params_model"]
    root = params - plan.shape.n_layer * block_numel(plan.shape)
    persistent = sum(t.numel for t in parameter_tensors(plan.shape)  # zero3.json's stage3_param_persistence_threshold
                     if t.numel <= plan.memory_layout.persistence_threshold)
    assert modelled == {"ddp": {"all_reduce": 4 * params},
                        "fsdp": {"all_gather": 2 * 2 * (2 * params - root), "reduce_scatter": 2 * params,
                                 "all_reduce": 4 * len(parameter_tensors(plan.shape))},  # clipping's norms
                        "zero1": {"all_reduce": 2 * params, "all_gather": 2 * params},
                        "zero2": {"all_reduce": 2 * 2 * params, "all_gather": 2 * params},
                        "zero3": {"all_gather": 2 * (2 * (params - persistent) + persistent),
                                  "reduce_scatter": 2 * 2 * params}}[strategy.removesuffix("_offload")]


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", COUNTED)
def test_the_engines_send_their_gradients_in_the_pieces_the_model_says(strategy):
    """How many messages the gradient reduction is issued in per optimizer step (each pays the ring's latency in the
    projection): DDP's buckets (torch's rule: a bucket sent once full), DeepSpeed's reduce_bucket_size buckets
    (DeepSpeed's rule: sent before a gradient that would overflow it - the tiny model's `auto` bucket is hidden² =
    4096 elements, smaller than most of its tensors), FSDP's units."""
    from hfscale.plan.projection import pattern_of
    from hfscale.train import check_args

    res = bf16_result(strategy)
    args = [*bf16_args(strategy, Path("unused")), "--strategy", res["strategy"]]
    plan = check_args(args)[3].plan.but(world_size=2, processes_per_node=2)
    gas = plan.gradient_accumulation_steps
    gradients = [c for c in pattern_of(plan).collectives if "gradients" in c.what]
    kinds = {c.kind for c in gradients}
    modelled = sum(c.units * (gas if c.per == "micro" else 1) for c in gradients)
    # ZeRO-1/2's bucket all-reduce cuts a bucket at the boundary between two ranks' partitions, and a cut piece larger
    # than reduce_bucket_size goes alone (stage_1_and_2 average_tensor/allreduce_and_scatter): up to world - 1 more
    # messages per reduction, which the model leaves out (a latency or two against a bucket's)
    reductions = sum(gas if c.per == "micro" else 1 for c in gradients)
    spare = (plan.world_size - 1) * reductions if res["strategy"] in ("zero1", "zero2", "zero2_offload") else 0
    if strategy in ("ddp", "zero1"):  # the tiny model in one of DDP's 25 MB buckets; ZeRO-1 at the boundary, whole
        assert kinds == {"all_reduce"} and modelled == 1
    else:  # cut by the engine: per block at least
        assert len(kinds) == 1 and modelled >= plan.shape.n_layer
    for counted in res["communication"]["per_rank"]:
        sent = sum(c["count"] for c in counted if c["kind"] in kinds and (c["elements"] or 0) > 2)
        assert modelled <= sent <= modelled + spare, (sent, modelled, kinds)


@pytest.mark.multiprocess
def test_fsdp_reducing_every_micro_batch_sends_and_holds_what_the_model_says():
    """Under accelerate's sync_each_batch (--accelerator_config gradient_accumulation_kwargs) the Trainer runs no
    micro-batch under no_sync: FSDP2 reduce-scatters every micro-batch's gradients (twice the bytes at GAS 2) and keeps
    only its shard between them, where no_sync keeps a whole copy (tests/test_gradient_partitions.py) - what the plan
    counts for it, to the byte and in memory, and the same training as the no_sync run up to bf16's rounding."""
    from hfscale.plan.projection import pattern_of
    from hfscale.train import check_args

    res = fsdp_sync_result()
    plan = check_args([*bf16_args("fsdp", Path("unused")), *SYNC_EACH_BATCH])[3].plan.but(world_size=2,
                                                                                         processes_per_node=2)
    assert plan.sync_each_batch and res["config"]["sync_each_batch"]
    modelled = pattern_of(plan).messages_per_step(plan.gradient_accumulation_steps)
    for counted in res["communication"]["per_rank"]:
        assert bytes_by_kind(counted, 2) == modelled
    assert modelled["reduce_scatter"] == 2 * 2 * res["model"]["params_model"]  # bf16, every one of 2 micro-batches
    full = 4 * res["model"]["params_model"]  # the fp32 gradients' bytes
    accumulating = res["memory"]["gradients_accumulating_per_rank"]
    assert all(0.45 * full < g < 0.55 * full for g in accumulating), (accumulating, full)
    assert res["estimate"]["gradients"] == max(r["gradients"] for r in res["memory"]["model_states_per_rank"])
    assert res["estimate"]["gradients"] == max(accumulating)
    ours, theirs = ([h["loss"] for h in r["loss_history"]] for r in (res, bf16_result("fsdp")))
    assert len(ours) == len(theirs) and max(abs(a / b - 1) for a, b in zip(ours, theirs)) < 5e-3
