"""--fp8 in the planners: `estimate` drops autocast's copies of the converted weights and adds one layer's float8
operands, `project` scales a bf16 run's compute by the float8 step model on a GPU that has float8 tensor cores, and
`tune` tries float8 where the device has it and the model says it pays. Each refuses what has no float8 route in one
line, nothing written."""

import json

import pytest

from hfscale.formulas.activations import ACTIVATION_COEFFICIENTS, activation_mode, activations
from hfscale.formulas.float8 import device_roofline, float8_step
from hfscale.formulas.precision import block_linears, float8_operand_bytes
from hfscale.models.resolve import resolve_shape

LLAMA_8B = ["--model", "llama-3.1-8b", "--seq_len", "2048", "--per_device_train_batch_size", "4"]


def test_float8_activations_drop_autocasts_copies_of_the_converted_weights():
    """Under DDP's autocast a bf16 linear keeps a bf16 copy of its weight for the backward (the fitted 'weight
    matrices' term); a float8 layer casts its fp32 weight itself and keeps none. Kept bytes fall by exactly that term
    over the converted matrices; the peak adds one layer's float8 operands."""
    shape = resolve_shape("llama-3.1-8b")
    mode = activation_mode("llama", "sdpa", "autocast_bf16", False)
    plain = activations(shape, 2048, 2, mode, "cuda")
    fp8 = activations(shape, 2048, 2, mode, "cuda", float8=True)
    converted = shape.n_layer * sum(c * k * n for k, n, c in block_linears(shape))
    weight_copy = ACTIVATION_COEFFICIENTS["cuda"][mode][5]
    assert weight_copy > 1.9  # two bytes a weight element: the fit found autocast's bf16 copies
    assert plain.kept - fp8.kept == pytest.approx(weight_copy * converted, rel=1e-6)
    extra = float8_operand_bytes(2 * 2048, block_linears(shape))
    assert (fp8.peak - fp8.kept) - (plain.peak - plain.kept) == pytest.approx(extra, abs=2)
    tokens, h, f = 2 * 2048, 4096, 14336  # the gate/up backward: its input, its output's gradient twice, its weight
    assert extra == tokens * h + 2 * tokens * f + h * f
    # under TP a rank converts and multiplies by its slices: autocast's copies of half the matrices are dropped, and
    # one layer's float8 operands are those of its slices
    tp_plain, tp_fp8 = (activations(shape, 2048, 2, mode, "cuda", tp=2, float8=f) for f in (False, True))
    assert tp_plain.kept - tp_fp8.kept == pytest.approx(weight_copy * converted / 2, rel=1e-6)
    tp_extra = (tp_fp8.peak - tp_fp8.kept) - (tp_plain.peak - tp_plain.kept)
    assert tp_extra == pytest.approx(tokens * h + 2 * tokens * f / 2 + h * f / 2, abs=2)
    bf16 = activation_mode("llama", "sdpa", "bf16", False)  # no autocast: no weight copies to drop
    assert activations(shape, 2048, 2, bf16, "cuda").kept == activations(shape, 2048, 2, bf16, "cuda", float8=True).kept


def test_estimate_fp8_refuses_the_engines_without_a_float8_route(hfscale_cli):
    proc = hfscale_cli(["estimate", *LLAMA_8B, "--strategy", "all", "--gpus", "8", "--device", "H100-80GB", "--fp8"])
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "fp8 (tensorwise: the blocks' linear layers; bf16 elsewhere)" in out
    assert "| ddp | adamw | 4 |" in out and "| zero3 | adamw | | | | | | | | | | refused | |" in out
    assert "refused zero3 x adamw: --fp8 under DeepSpeed" in out and "| fsdp | adamw | 4 |" in out


def _project(hfscale_cli, *argv) -> dict:
    proc = hfscale_cli(["project", *LLAMA_8B, "--tflops_per_gpu", "400", "--device", "H100-80GB", "--gpus", "1,8",
                        "--json", *argv])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_project_fp8_scales_the_measured_compute_by_the_step_model(hfscale_cli):
    """On one GPU (no communication) the fp8 step is the bf16 one's micro-batch times formulas/float8's factor, with
    the optimizer's step, which float8 does not touch, as it was; at 8 GPUs DDP's all-reduce is what it was (it
    reduces the same fp32 gradients), so the fp8 step is shorter by the same seconds of compute less what hides less.
    ZeRO and FSDP have no float8 route: left out, and said."""
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.plan.projection import optimizer_step_s
    from hfscale.runplan import RunPlan

    bf16 = _project(hfscale_cli, "--bf16", "--strategy", "ddp")
    fp8 = _project(hfscale_cli, "--fp8", "--strategy", "ddp,zero2")
    step = float8_step(resolve_shape("llama-3.1-8b"), 2048, 4, "tensorwise", device_roofline("h100"))
    one = [p for p in fp8["points"] if p["gpus"] == 1][0]
    optimizer = optimizer_step_s(RunPlan(get_strategy("ddp"), get_optimizer("adamw"), resolve_shape("llama-3.1-8b"),
                                         2048, per_device_train_batch_size=4, precision="bf16"), "h100")
    assert optimizer > 0.05  # 8B parameters' fused AdamW: 28 bytes each at 3.35 TB/s
    measured = [p for p in bf16["points"] if p["gpus"] == 1][0]["s_per_iter"]
    assert one["s_per_iter"] == pytest.approx((measured - optimizer) * step.compute_factor + optimizer, rel=1e-9)
    assert step.pays and {p["strategy"] for p in fp8["points"]} == {"ddp"}
    said = "\n".join(fp8["assumptions"])
    assert f"compute x{step.compute_factor:.2f} of the measured bf16 run's" in said
    assert "not projected with --fp8: zero2 (e.g. --fp8 under DeepSpeed" in said
    small = _project(hfscale_cli, "--fp8", "--strategy", "ddp", "--model", "smollm2-360m")
    assert "float8 does NOT pay here" in "\n".join(small["assumptions"])


@pytest.mark.parametrize("argv,expected", [
    (["--device", "A100-80GB", "--fp8"], "--fp8: the baseline ran on the a100, which has no float8 tensor cores"),
    (["--device", "H100-80GB", "--fp8", "--fp16"], "--fp8 computes outside its float8 matmuls in bf16"),
    (["--device", "H100-80GB", "--fp8", "--strategy", "zero3"], "--fp8 under DeepSpeed"),
    (["--device", "H100-80GB", "--fp8", "--strategy", "megatron", "--tp", "2"], "--fp8 with megatron: the 3D layouts"),
    (["--device", "H100-80GB", "--fp8_recipe", "rowwise"], "--fp8_recipe rowwise is read only with --fp8"),
    (["--device", "H100-80GB", "--fp8", "--fp8_recipe", "delayed"], "unknown float8 recipe (--fp8_recipe) 'delayed'"),
])
def test_project_fp8_bad_input_is_one_line_and_nothing_written(tmp_path, hfscale_cli, argv, expected):
    proc = hfscale_cli(["project", *LLAMA_8B, "--tflops_per_gpu", "300", "--gpus", "8", "--out", tmp_path / "out",
                        *argv])
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "out").exists()


def _dry_run(hfscale_cli, *argv) -> tuple[int, str, str]:
    proc = hfscale_cli(["tune", "--seq_len", "2048", "--num_processes", "2", "--strategy", "ddp,zero2",
                        "--optim", "adamw", "--activation_checkpointing", "false", "--dry_run", *argv])
    return proc.returncode, proc.stdout, proc.stderr


def test_tune_tries_float8_where_the_device_has_it_and_it_pays(hfscale_cli):
    """auto: float8 trials beside the bf16 ones on an H100, none on an A100. On this CPU a float8 trial is refused
    unless the training flags emulate it; then the step model prunes the trials it says are slower than bf16 (the
    small model's, and the 3B's at MBS 1) and keeps the rest; zero2 has no float8 route."""
    code, out, _ = _dry_run(hfscale_cli, "--model", "smollm2-360m", "--device", "A100-80GB")
    assert code == 0 and "-fp8" not in out
    code, out, _ = _dry_run(hfscale_cli, "--model", "smollm2-360m", "--device", "H100-80GB")
    assert code == 0 and "| ddp-adamw-np2-mbs1-gas1-fp8 | refused |" in out and "this run is on the CPU" in out
    code, out, _ = _dry_run(hfscale_cli, "--model", "llama-3.2-3b", "--device", "H200-141GB", "--bf16",
                            "--per_device_train_batch_size", "1,4", "--", "--fp8_emulate")
    assert code == 0, out
    assert "| ddp-adamw-np2-mbs1-gas1-fp8 | pruned |" in out and "--fp8 does not pay here: compute x1." in out
    assert "| ddp-adamw-np2-mbs4-gas1-fp8 | planned |" in out
    assert "| zero2-adamw-np2-mbs4-gas1-fp8 | refused |" in out
    assert "pruned (0 by the memory estimate, 1 as float8 slower than bf16)" in out


def test_tune_refuses_float8_that_cannot_run_or_never_pays(hfscale_cli):
    code, _, err = _dry_run(hfscale_cli, "--model", "smollm2-360m", "--device", "H100-80GB", "--strategy",
                            "ddp", "--fp8", "true", "--per_device_train_batch_size", "1", "--", "--fp8_emulate")
    assert code == 2 and "every trial left is float8, and slower than bf16" in err
    code, _, err = _dry_run(hfscale_cli, "--model", "smollm2-360m", "--device", "H100-80GB", "--", "--fp8")
    assert code == 2 and "--fp8 is set by hfscale tune" in err


def test_a_float8_trial_trains_with_fp8():
    from hfscale.launching import RunSpec

    run = RunSpec("ddp", "adamw", 2, 4, 1, False, fp8=True)
    assert run.name == "ddp-adamw-np2-mbs4-gas1-fp8" and "--fp8" in run.train_args(["--max_steps", "3"])
    assert "--fp8" not in RunSpec("ddp", "adamw", 2, 4, 1, False).train_args([])


@pytest.mark.parametrize("capability,name,expected", [
    ((8, 0), "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB has 8.0"),
    ((9, 0), "NVIDIA H100 80GB HBM3", None),
])
def test_tune_asks_the_local_gpu_whether_its_float8_trials_can_run(monkeypatch, capability, name, expected):
    """On the GPU route (faked here) a float8 trial runs where the local GPU has float8 tensor cores, whatever --device
    names: its compute capability decides, as the trial's own start-up check would."""
    from types import SimpleNamespace

    from hfscale.plan import tune

    monkeypatch.setattr(tune, "device_capability", lambda: (capability, name))
    opts = SimpleNamespace(device="H100-80GB")
    reason = tune.float8_trial_refusal(opts, [], "cuda", device_roofline("h100"))
    assert reason is None if expected is None else expected in reason
    assert "has no float8 tensor cores" in tune.float8_trial_refusal(SimpleNamespace(device="A100-80GB"), [], "cuda",
                                                                     None)


def test_project_fp8_starts_from_a_bf16_run_only():
    """The step model is float8 against bf16: a run measured in fp32 or tf32 (a results file's precision) is refused,
    one measured with float8 projects as it ran, and another float8 recipe than its own is refused."""
    from hfscale.errors import HfscaleError
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.plan.baseline import Baseline
    from hfscale.plan.projection import with_float8
    from hfscale.runplan import RunPlan

    plan = RunPlan(get_strategy("ddp"), get_optimizer("adamw"), resolve_shape("llama-3.1-8b"), 2048, precision="tf32")
    with pytest.raises(HfscaleError, match="this one computed in tf32"):
        with_float8(Baseline(plan, [1.0] * 3, "run", device="h100"), "tensorwise")
    measured = Baseline(plan.but(precision="bf16", float8="tensorwise"), [1.0] * 3, "run", device="h100")
    assert with_float8(measured, "tensorwise") is measured and measured.compute_factor == 1.0
    with pytest.raises(HfscaleError, match="trained with float8 recipe tensorwise"):
        with_float8(measured, "rowwise")
