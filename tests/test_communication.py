"""What the engines really send (hfscale/run/collectives.py, `--count_collectives`): counted from the c10d ops torch's
profiler records, in a real 2-process run, and held against the communication model (formulas/comm.py)."""

from types import SimpleNamespace

import pytest

from conftest import train
from hfscale.formulas import comm
from hfscale.run.collectives import collectives_of, tally


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
    assert tally(counted + counted[:1])[0] == {"kind": "all_reduce", "dtype": "float32", "elements": 4160,
                                               "bytes": 16640, "count": 2}


@pytest.mark.multiprocess
def test_ddp_sends_what_the_model_says_once_per_step(tmp_path):
    """DDP with gradient accumulation 2 (fp32): one gradient all-reduce per optimizer step (no_sync before the last
    micro-batch) of every parameter in fp32, and the Trainer's token-count gather - the model's two collectives, to the
    byte. Everything else the loop sends is under 1 KB (loss logging)."""
    res = train(tmp_path / "ddp", "ddp", "--gradient_accumulation_steps", "2", "--count_collectives", "2", steps=3)
    params = res["model"]["params_model"]
    pattern = comm.comm_pattern("ddp", None, param_bytes=4 * params, grad_bytes=4 * params, ranks=2)
    modelled = {}
    for c in pattern.collectives:
        modelled[c.kind] = modelled.get(c.kind, 0) + c.size_bytes * (2 if c.per == "micro" else 1)
    assert res["communication"]["step"] == 2 and len(res["communication"]["per_rank"]) == 2
    for counted in res["communication"]["per_rank"]:
        sent = {}
        for c in counted:
            if c["bytes"] is not None and (c["bytes"] >= 1024 or (c["kind"], c["dtype"]) == ("all_gather", "int64")):
                sent[c["kind"]] = sent.get(c["kind"], 0) + c["bytes"] * c["count"]
        assert sent == modelled == {"all_reduce": 4 * params, "all_gather": comm.TOKEN_COUNT_BYTES_PER_RANK * 2}
        assert {c["dtype"] for c in counted if c["kind"] == "all_reduce" and c["bytes"] >= 1024} == {"float32"}
