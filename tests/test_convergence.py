"""Convergence comparisons that show something: pretraining defaults make a from-scratch run learn, loss points sit at
the tokens the data loader really delivered, and the report compares runs per token and per second."""

import json
import sys

import pytest

from conftest import run
from hfscale.compare.convergence import compare_runs, first_reach, smooth, value_at
from hfscale.run.recipes import peak_learning_rate, pretraining_defaults

STEPS = 60  # ~11 s a run here; the three from-scratch runs are this file's CI time


def test_peak_learning_rate_follows_the_published_table():
    assert peak_learning_rate(125e6) == pytest.approx(6e-4)  # GPT-3 Small
    assert peak_learning_rate(1.3e9) == pytest.approx(2e-4)  # GPT-3 XL
    assert peak_learning_rate(175e9) == pytest.approx(0.6e-4) and peak_learning_rate(1e12) == pytest.approx(0.6e-4)
    assert peak_learning_rate(250e3) == pytest.approx(1e-3)  # test-sized models: higher
    assert 1.0e-4 < peak_learning_rate(7.07e9) < 1.2e-4  # bloom-7b1 lies between GPT-3 6.7B and 13B
    lrs = [peak_learning_rate(n) for n in (1e6, 1e8, 1e9, 1e10, 1e11)]
    assert lrs == sorted(lrs, reverse=True)
    assert pretraining_defaults(125e6, "adafactor", 1000)["weight_decay"] == 0.0
    # no beta2 in Adafactor's recipe: the Trainer builds it without betas, so a recipe value would claim a setting
    import torch
    from transformers import Trainer, TrainingArguments

    model = torch.nn.Linear(4, 4)
    for optim in ("adafactor", "adamw_torch"):
        args = TrainingArguments(output_dir="/tmp/hfscale-never-written", optim=optim, adam_beta2=0.5, use_cpu=True,
                                 report_to="none")
        reads_beta2 = 0.5 in Trainer.get_optimizer_cls_and_kwargs(args, model)[1].get("betas", ())
        assert reads_beta2 is ("adam_beta2" in pretraining_defaults(125e6, optim.removesuffix("_torch"), 1000))
    assert pretraining_defaults(125e6, "adamw", 100)["logging_steps"] == 2  # 50 points for a 100-step run


def test_flags_the_user_passes_win_over_the_recipe(tmp_path):
    from hfscale.train import check_args

    _, _, training, state = check_args(["--learning_rate", "5e-5", "--lr_scheduler_type", "linear", "--max_steps", "10"])
    assert training["learning_rate"] == 5e-5 and state.recipe["learning_rate"] == [5e-5, "flag"]
    assert training["lr_scheduler_type"] == "linear" and training["adam_beta2"] == 0.95
    assert state.recipe["adam_beta2"][1] == "default" and training["logging_steps"] == 1
    # the recipe's scheduler arguments are its cosine schedule's: another scheduler keeps the Trainer's (the cosine's
    # min_lr_rate once reached transformers' linear schedule, which refused it as the run started)
    assert state.recipe["lr_scheduler_kwargs"][1] == "trainer"
    import torch
    from transformers import get_scheduler

    for flags in (["--lr_scheduler_type", "linear"], ["--lr_scheduler_type", "cosine_with_min_lr"], []):
        training = check_args([*flags, "--max_steps", "10"])[2]
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=training["learning_rate"])
        get_scheduler(training["lr_scheduler_type"], optimizer, num_warmup_steps=1, num_training_steps=10,
                      scheduler_specific_kwargs=training.get("lr_scheduler_kwargs") or {})
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"weight_decay": 0.0, "max_steps": 10}))
    _, _, training, state = check_args([str(run_file)])
    assert training["weight_decay"] == 0.0 and state.recipe["weight_decay"] == [0.0, "flag"]
    assert training["learning_rate"] == pytest.approx(1e-3)


def test_curve_arithmetic():
    xs, ys = [0, 10, 20, 30], [8.0, 6.0, 5.0, 4.0]
    assert value_at(xs, ys, 15) == pytest.approx(5.5) and value_at(xs, ys, 31) is None
    assert first_reach(xs, ys, 5.5) == pytest.approx(15) and first_reach(xs, ys, 3.0) is None
    assert smooth([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # debiased: a flat curve stays flat
    fast = [{"tokens": x, "loss": y, "elapsed_s": x / 10} for x, y in zip(xs, ys)]
    slow = [{"tokens": x, "loss": y + 1, "elapsed_s": x / 5} for x, y in zip(xs[:3], ys[:3])]
    rows = {r.run: r for r in compare_runs([("g", "fast", fast), ("g", "slow", slow), ("other", "alone", fast)])}
    assert set(rows) == {"fast", "slow"}  # a group of one is compared with nothing
    assert rows["fast"].tokens_common == 20 and rows["fast"].loss_at_common == 5.0 and rows["slow"].loss_at_common == 6.0
    assert rows["fast"].target_loss == 6.0  # the group's highest final loss: every run reaches it
    assert rows["fast"].tokens_to_target == pytest.approx(10) and rows["slow"].tokens_to_target == pytest.approx(20)
    assert rows["slow"].seconds_to_target == pytest.approx(4.0)


def _train(out, *extra):
    proc = run([sys.executable, "-m", "hfscale", "train", *extra, "--output_dir", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), proc.stdout


@pytest.fixture(scope="module")
def from_scratch(tmp_path_factory):
    """The README's default run (tiny GPT-2, the embedded corpus) for 60 steps with nothing but --optim set."""
    root = tmp_path_factory.mktemp("scratch")
    # Adafactor with the Adam flag a sweep of adamw,adafactor would share: ignored by transformers, and said so
    return root, {o: _train(root / o, "--optim", o, "--max_steps", str(STEPS),
                            *(["--adam_beta2", "0.95"] if o == "adafactor" else []))
                  for o in ("adamw", "adafactor", "adamw_8bit")}


@pytest.mark.parametrize("optim", ["adamw", "adafactor", "adamw_8bit"])
def test_defaults_make_a_from_scratch_run_learn(from_scratch, optim):
    """Seen (deterministic fp32 on CPU): 7.64 -> 6.41 (adamw), 6.36 (adafactor), 6.41 (adamw_8bit) after 60 steps;
    with the Trainer's fine-tuning defaults (5e-5, linear, no warmup, beta2 0.999, no decay) the same run ends at 7.54."""
    results, stdout = from_scratch[1][optim]
    losses = [p["loss"] for p in results["loss_history"]]
    assert losses[0] > 7.4 and losses[-1] < losses[0] - 1.0, losses
    assert len(losses) >= 50  # dense enough to draw
    recipe = results["config"]["recipe"]
    assert recipe["lr_scheduler_type"] == ["cosine_with_min_lr", "default"] and recipe["warmup_steps"][1] == "default"
    assert "training recipe" in stdout  # printed at start; Adafactor reads no betas, so its recipe names none
    assert ("adam_beta2=0.95 (default)" in stdout) is ("adam_beta2" in recipe) is (optim != "adafactor")
    warning = "--adam_beta2: ignored by --optim adafactor, which transformers builds from --learning_rate and"
    assert (warning in stdout) is (optim == "adafactor")
    lrs = [p["lr"] for p in results["loss_history"]]
    assert max(lrs) == pytest.approx(results["config"]["learning_rate"], rel=0.05) and lrs[-1] < 0.2 * max(lrs)


def test_report_compares_optimizers_per_token_and_per_second(from_scratch):
    root, runs = from_scratch
    curves = {o: [p["loss"] for p in r["loss_history"]] for o, (r, _) in runs.items()}
    assert len({tuple(c) for c in curves.values()}) == 3  # three distinct curves
    out = root / "report"
    proc = run([sys.executable, "-m", "hfscale", "report", *(str(root / o) for o in runs), "--out", str(out),
                "--smooth", "0.6", "--days_at_gpus", "1", "--gpus_per_node", "1"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = (out / "convergence.md").read_text()
    assert sum(f"-{o}-tiny-" in table for o in runs) == 3 and "tiny · python-stdlib · seq 256" in table
    assert "projected days to target at 1 GPUs" in table and "not projected" not in table
    for name in ("loss_curves.png", "loss_vs_tokens.png", "loss_vs_time.png", "loss_vs_projected_days.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_projected_days_of_a_run_at_its_own_gpu_count_are_its_measured_days(from_scratch):
    """Projected to the GPU count it ran on, a run's loss points sit at tokens / its *measured* tokens/s: the
    projection's round trip (compute recovered from the measurement, communication added back) loses nothing."""
    from hfscale.compare.report import add_projected_days, collect
    from hfscale.formulas.comm import Links

    root, runs = from_scratch
    rows = collect([root / "adamw"])
    assert add_projected_days(rows, 1, 1, (Links(1e9, 1e9),) * 3) == []
    measured = runs["adamw"][0]["perf"]["tokens_per_s"]
    for point in rows[0].loss_history:
        assert point["projected_days"] == pytest.approx(point["tokens"] / measured / 86400, rel=1e-6)


def test_loss_points_sit_at_the_tokens_the_loader_delivered():
    """Runs with and without accumulation (the fp32 ddp parity run: MBS 4, GAS 1; the bf16 ddp run: MBS 2, GAS 2; 2
    processes each): their points are at the tokens the Trainer itself counted (include_num_input_tokens_seen gathers
    every input batch), MBS x GAS x processes x seq per step, at training seconds that only grow."""
    from conftest import bf16_result, parity_runs

    for res in (parity_runs()["runs"]["ddp"], bf16_result("ddp")):
        cfg, points = res["config"], res["loss_history"]
        per_step = cfg["per_device_train_batch_size"] * cfg["gradient_accumulation_steps"] * cfg["world_size"] * cfg["seq_len"]
        assert [p["tokens"] for p in points] == [p["tokens_counted"] for p in points]
        assert [p["tokens"] for p in points] == [p["step"] * per_step for p in points]
        assert all(b["elapsed_s"] > a["elapsed_s"] > 0 for a, b in zip(points, points[1:]))
    assert [bf16_result("ddp")["config"][k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps")] == [2, 2]
