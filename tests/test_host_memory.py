"""Models larger than one host: under fsdp and zero3 only rank 0 ever holds a whole fp32 copy of the model; ddp (and
zero3 with zero3_init_flag off) hold one on every rank. Measured, per rank, on a ~150M-parameter GPT-2 shape with 2
processes: the resident-set high-water marks over building the model, and from then until training begins (after the
engine has sharded it)."""

import pytest

from conftest import train

pytestmark = pytest.mark.multiprocess

# 12 layers x 1024 hidden x 16 heads over the tiny preset's 2048-token vocabulary: ~153M parameters, 0.61 GB in fp32
# (large beside the ~0.1 GB a process moves for anything else); its largest tensor (an MLP matrix, 16 MB) is what a
# rank holds beyond its shard while rank 0's weights arrive.
SHAPE = ["--n_layer", "12", "--hidden_size", "1024", "--n_head", "16", "--per_device_train_batch_size", "1",
         "--seq_len", "32"]
RUNS = {"ddp": {}, "fsdp": {}, "zero3": {}, "zero3-no-init": {"ACCELERATE_DEEPSPEED_ZERO3_INIT": "false"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("host-memory")
    results = {}
    for name, env in RUNS.items():
        with pytest.MonkeyPatch.context() as mp:
            # glibc hands freed tensors back to the kernel at once, so the resident set follows the tensors
            # (otherwise freed broadcast buffers stay in the heap and count; docs/estimate.md)
            mp.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
            for key, value in env.items():  # accelerate's zero3_init_flag, as `accelerate launch` exports it
                mp.setenv(key, value)
            results[name] = train(out / name, name.split("-")[0], *SHAPE, steps=1)
    return results


def full_copy(runs) -> int:
    full = 4 * runs["ddp"]["model"]["params_model"]  # bytes of one fp32 copy
    assert full > 0.6e9
    return full


def peaks(run: dict, window: str) -> list[int]:
    values = run["memory"][f"{window}_peak_bytes_per_rank"]
    assert len(values) == 2 and all(v is not None for v in values)
    return values


def test_every_ddp_rank_builds_the_whole_model(runs):
    full = full_copy(runs)
    assert all(peak > 0.95 * full for peak in peaks(runs["ddp"], "build")), (peaks(runs["ddp"], "build"), full)


def test_fsdp_shards_rank_0s_model_out_and_no_other_rank_holds_a_copy(runs):
    full = full_copy(runs)
    fsdp = peaks(runs["fsdp"], "construction")
    assert fsdp[0] > 0.95 * full, (fsdp, full)  # rank 0 builds it, then shards it out
    assert fsdp[1] < 0.7 * full, (fsdp, full)  # the other ranks only ever hold their half and one tensor in flight


def test_zero3_builds_partitioned_under_zero_init(runs):
    full = full_copy(runs)
    built = peaks(runs["zero3"], "build")
    assert built[0] > 0.95 * full, (built, full)  # rank 0 builds the model, then partitions it out
    assert built[1] < 0.7 * full, (built, full)  # rank 1: its partitions and one parameter in flight
    # DeepSpeed then adds its own per-rank states (fp32 masters, gradient partitions) but never a whole copy
    states = runs["zero3"]["memory"]["model_states_per_rank"][1]
    engine_states = states["parameters"] + states["master_weights"] + states["gradients"]
    assert peaks(runs["zero3"], "construction")[1] - engine_states < 0.3 * full, (states, full)


def test_zero3_init_flag_false_builds_the_whole_model_on_every_rank(runs):
    full = full_copy(runs)
    assert all(peak > 0.95 * full for peak in peaks(runs["zero3-no-init"], "build"))


@pytest.mark.parametrize("name", ["fsdp", "zero3", "zero3-no-init"])
def test_sharded_construction_keeps_the_weights_and_the_start_up_proof(runs, name):
    # the start-up proof ran on the sharded model and counted the whole of it
    assert runs[name]["model"]["params_model"] == runs["ddp"]["model"]["params_model"]
    assert runs[name]["strategy_check"]["parameters"]["elements_local"] < 0.55 * runs["ddp"]["model"]["params_model"]
    assert runs[name]["loss_history"][0]["loss"] == pytest.approx(runs["ddp"]["loss_history"][0]["loss"], rel=1e-5)
