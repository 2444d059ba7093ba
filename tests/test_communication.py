"""What the engines really send (hfscale/run/collectives.py, `--count_collectives`): counted from the c10d ops torch's
profiler records, in a real 2-process run, and held against the communication model (formulas/comm.py)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import bf16_args, bf16_result
from hfscale.formulas import comm
from hfscale.formulas.memory import block_numel
from hfscale.run.collectives import bytes_by_kind, collectives_of, tally


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


SMALL = 1024  # bytes: the Trainer's token counts, loss logging and grad-norm scalars are latency, not bandwidth


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_engines_send_what_the_model_says_to_the_byte(strategy):
    """The bf16 runs (conftest.BF16_RUNS: 2 processes, GAS 2, step 2 counted) against plan/project.pattern_of for the
    same plan. ddp: one gradient all-reduce per optimizer step (no_sync before the last micro-batch), fp32 under
    autocast. fsdp: the blocks gathered for the forward and again for the backward, the root unit (embeddings, tied
    head, final norm) once - FSDP2 keeps it unsharded from the forward into the backward - every micro-batch, in bf16;
    the gradients reduce-scattered once, at the accumulation boundary. Both with the 16-byte token-count gather."""
    from hfscale.plan.project import pattern_of
    from hfscale.train import check_args

    res = bf16_result(strategy)
    plan = check_args(bf16_args(strategy, Path("unused")))[3].plan.but(world_size=2, processes_per_node=2)
    modelled = pattern_of(plan).messages_per_step(plan.gradient_accumulation_steps, SMALL)
    token_count = {"kind": "all_gather", "dtype": "int64", "elements": 2,
                   "bytes": comm.TOKEN_COUNT_BYTES_PER_RANK * 2}  # the Trainer's, once per optimizer step at least
    assert res["communication"]["step"] == 2 and len(res["communication"]["per_rank"]) == 2
    for counted in res["communication"]["per_rank"]:
        assert bytes_by_kind(counted, SMALL) == modelled
        assert {c["dtype"] for c in counted if c["bytes"] and c["bytes"] >= SMALL} == (
            {"float32"} if strategy == "ddp" else {"bfloat16"})
        assert any({k: c[k] for k in token_count} == token_count for c in counted)
    params = res["model"]["params_model"]
    if strategy == "ddp":
        assert modelled == {"all_reduce": 4 * params}
    else:  # the root unit's share spared in the backward, and nothing else
        root = params - plan.shape.n_layer * block_numel(plan.shape)
        assert modelled == {"all_gather": 2 * 2 * (2 * params - root), "reduce_scatter": 2 * params}
