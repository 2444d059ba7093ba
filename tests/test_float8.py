"""--fp8: float8 matmuls in the decoder blocks (torchao through accelerate). On this CPU the code path runs with
torchao's emulation (--fp8_emulate): the layers are converted, the run trains as bf16 does within a stated tolerance,
resumes exactly and exports to plain transformers; a real float8 run is refused where the device has no float8 tensor
cores, and the engines, models and precisions without a float8 route are refused in one line before anything starts."""

import json

import pytest

from conftest import PARITY_STEPS, TINY, llama_parity, shared_train, train
from hfscale.formulas.precision import float8_device_refusal, float8_refusal

FP8 = ["--model", "tiny-llama", "--fp8", "--fp8_emulate"]
SAVE_STEP, FSDP_STEPS = 3, 6
FSDP_FP8 = [*FP8, "--count_collectives", "3", "--save_strategy", "steps", "--save_steps", str(SAVE_STEP),
            "--fingerprint_weights"]


def fp8_run() -> dict:
    """ddp on tiny-llama (2 processes, the Llama parity runs' data and batches), --fp8 emulated, PARITY_STEPS steps."""
    return shared_train("llama-fp8", "ddp", *FP8, steps=PARITY_STEPS)


def fsdp_fp8_run() -> dict:
    """fsdp on tiny-llama, --fp8 emulated, FSDP_STEPS steps, step 3's collectives counted, a checkpoint at SAVE_STEP,
    the final weights fingerprinted."""
    return shared_train("llama-fsdp-fp8", "fsdp", *FSDP_FP8, steps=FSDP_STEPS)


def test_float8_needs_float8_tensor_cores_or_emulation():
    """Decided from the device alone (faked here: no GPU is needed to check the rule)."""
    assert "this run is on the CPU" in float8_device_refusal(False, None, "cpu", emulate=False)
    a100 = float8_device_refusal(True, (8, 0), "NVIDIA A100-SXM4-80GB", emulate=False)
    assert "NVIDIA A100-SXM4-80GB has 8.0" in a100 and "8.9+" in a100
    assert float8_device_refusal(True, (8, 9), "NVIDIA L40S", emulate=False) is None  # Ada
    assert float8_device_refusal(True, (9, 0), "NVIDIA H100 80GB HBM3", emulate=False) is None
    assert float8_device_refusal(False, None, "cpu", emulate=True) is None


@pytest.mark.parametrize("engine,precision,expected", [
    ("ddp", "bf16", None),
    ("ddp", "fp16", "drop --fp16"),
    ("deepspeed", "bf16", "Transformer Engine or MS-AMP"),
    ("fsdp", "bf16", None),
])
def test_what_has_no_float8_route_is_refused(engine, precision, expected):
    reason = float8_refusal("tensorwise", precision, engine)
    assert reason is None if expected is None else expected in reason


def test_gpt2s_conv1d_projections_become_linear_layers_that_save_as_conv1d():
    """torchao converts nn.Linear; GPT-2 computes its projections in transformers' Conv1D (weight [in, out]). Swapped
    for nn.Linear ([out, in]) they compute the same, and the model's state dict - what checkpoints and exports hold -
    is exactly the plain model's: same keys, shapes and values, and loading it back restores the same weights."""
    import torch

    from hfscale.models import PRESETS, build_model
    from hfscale.run.float8 import converts, linear_projections

    plain, swapped = build_model(PRESETS["tiny"], 0), build_model(PRESETS["tiny"], 0)
    assert linear_projections(swapped) == 4 * PRESETS["tiny"].n_layer  # c_attn, attn.c_proj, c_fc, mlp.c_proj
    spec = PRESETS["tiny"].spec
    assert sum(converts(spec, name, m) for name, m in swapped.named_modules()) == 4 * PRESETS["tiny"].n_layer
    saved, expected = swapped.state_dict(), plain.state_dict()
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in expected)
    ids = torch.randint(0, PRESETS["tiny"].vocab, (2, 16))
    with torch.no_grad():
        assert torch.allclose(swapped(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)
        for p in swapped.parameters():
            p.zero_()
    swapped.load_state_dict(expected)
    assert all(torch.equal(swapped.state_dict()[k], expected[k]) for k in expected)


@pytest.mark.parametrize("argv,expected", [
    (["--fp8"], "--fp8 needs a GPU with float8 tensor cores"),
    (["--fp8", "--fp8_emulate", "--strategy", "zero2"], "--fp8 under DeepSpeed"),
    (["--fp8", "--fp8_emulate", "--fp16"], "--fp8 computes outside its float8 matmuls in bf16"),
    (["--fp8", "--fp8_emulate", "--fp8_recipe", "delayed"], "--fp8_recipe 'delayed'; choose one of: tensorwise"),
    (["--fp8_emulate"], "--fp8_emulate is read only with --fp8"),
])
def test_bad_float8_input_is_one_line_and_nothing_written(tmp_path, hfscale_cli, argv, expected):
    out = tmp_path / "out"
    proc = hfscale_cli(["train", "--model", "tiny-llama", "--max_steps", "1", "--output_dir", out, *argv])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.multiprocess
def test_the_blocks_train_in_float8_as_bf16_does():
    """The start-up proof: every linear layer of the blocks is torchao's Float8Linear, the head is not; the run says
    fp8 in its name and config. Its losses stay within 1e-3 of the fp32 ddp run on the same data (bf16 and fp32 agree
    to 1e-5 here; emulated float8 moved them by up to 2.4e-4 when measured) and differ from it: the casts are real."""
    res, ref = fp8_run(), llama_parity()["runs"]["ddp"]
    proof = res["strategy_check"]["float8"]
    layers = res["model"]["n_layer"] * 7  # q, k, v, o, gate, up, down
    assert (proof["float8_linears"], proof["high_precision"], proof["recipe"]) == (layers, ["lm_head"], "tensorwise")
    assert proof["emulated"] and res["config"]["float8"] == "tensorwise" and res["config"]["precision"] == "bf16"
    assert res["run_name"].endswith("-fp8") and "fp8 tensorwise (bf16 outside its matmuls)" in res["_stdout"]
    ours, theirs = [p["loss"] for p in res["loss_history"]], [p["loss"] for p in ref["loss_history"]]
    assert len(ours) == len(theirs) == PARITY_STEPS
    gaps = [abs(a / b - 1) for a, b in zip(ours, theirs)]
    assert max(gaps) < 1e-3 and max(gaps) > 1e-6, gaps
    assert ours[-1] < ours[0] - 0.2


@pytest.mark.multiprocess
def test_fsdp_gathers_the_float8_weights_in_float8():
    """fsdp in float8 (every rank builds the model: accelerate refuses torchao with cpu_ram_efficient_loading): the
    blocks' converted weights are sharded under torchao's float8-gathering subclass and gathered one byte an element,
    their scales all-reduced once per step - the bytes of plan/projection.pattern_of to the byte (the counted step's
    all-gathers: the blocks' in uint8, the root and the untied head's in bf16) - and the run trains."""
    from pathlib import Path

    from hfscale.plan.projection import pattern_of
    from hfscale.run.collectives import bytes_by_kind
    from hfscale.train import check_args

    res = fsdp_fp8_run()
    proof = res["strategy_check"]["float8"]
    assert proof["float8_all_gather"] and proof["float8_linears"] == res["model"]["n_layer"] * 7
    assert res["strategy_check"]["parameters"]["elements_local"] < res["model"]["params_model"]  # sharded
    plan = check_args([*TINY, *FSDP_FP8, "--strategy", "fsdp", "--output_dir", str(Path("unused"))])[3].plan
    plan = plan.but(world_size=2, processes_per_node=2)
    modelled = pattern_of(plan).messages_per_step(plan.gradient_accumulation_steps)
    for counted in res["communication"]["per_rank"]:
        assert bytes_by_kind(counted, 2) == modelled
        assert {c["dtype"] for c in counted if c["kind"] == "all_gather" and c["bytes"] >= 1024} == {"uint8", "bfloat16"}
    losses = [p["loss"] for p in res["loss_history"]]
    assert losses[-1] < losses[0]


@pytest.mark.multiprocess
def test_a_float8_run_resumes_exactly_and_exports_to_plain_transformers(tmp_path):
    """Dynamic scales keep no state between steps: the fsdp run in float8, resumed from its step-3 sharded checkpoint
    (its weights saved from under torchao's float8-gathering subclass), repeats the uninterrupted run's losses exactly.
    The weights stay nn.Linear's, so its last checkpoint exports to a plain transformers Llama with the same parameter
    names and no float8 tensors."""
    import torch
    from safetensors.torch import load_file

    from hfscale.run.export import export

    full = fsdp_fp8_run()
    checkpoint = f"{full['output_dir']}/checkpoint-{SAVE_STEP}"
    resumed = train(tmp_path / "resumed", "fsdp", *FSDP_FP8, "--resume_from_checkpoint", checkpoint,
                    steps=FSDP_STEPS)
    assert resumed["resumed_from"] == checkpoint and resumed["strategy_check"]["float8"]["float8_linears"] > 0
    assert [p["loss"] for p in resumed["loss_history"]] == [p["loss"] for p in full["loss_history"]]
    assert resumed["final_weights"] == full["final_weights"]  # every weight's sum, L1 and L2, to the last bit
    out = tmp_path / "exported"
    export(tmp_path / "resumed", out, "fp32")
    weights = load_file(out / "model.safetensors")
    assert "model.layers.0.mlp.down_proj.weight" in weights and all(t.dtype == torch.float32 for t in weights.values())
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama"
