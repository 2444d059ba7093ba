"""Evaluation: where validation text comes from (decided before anything is written), and an eval loss that equals
the mean token cross-entropy a plain transformers model computes on the same text, with 2 processes."""

import sysconfig
from pathlib import Path

import pytest

from conftest import train
from hfscale.errors import HfscaleError
from hfscale.run.args import DataArguments
from hfscale.run.data import DEFAULT_VALIDATION_PERCENTAGE, validation_plan


def test_validation_plan_decisions(tmp_path):
    val = tmp_path / "val.txt"
    val.write_text("some text\n")
    assert validation_plan(DataArguments(), evaluating=False) is None
    assert validation_plan(DataArguments(), evaluating=True) == {"percentage": DEFAULT_VALIDATION_PERCENTAGE}
    assert validation_plan(DataArguments(validation_split_percentage=10), evaluating=False) == {"percentage": 10}
    assert validation_plan(DataArguments(validation_files=[str(val)]), evaluating=True) == {"files": [str(val)]}
    hub = DataArguments(dataset="wikitext", dataset_config="wikitext-2-raw-v1", validation_split="validation")
    assert validation_plan(hub, evaluating=True) == {"split": "validation"}
    for bad, message in (
        (DataArguments(validation_split_percentage=-1), "between 0 and 100"),
        (DataArguments(validation_split="validation"), "names a split of a Hub --dataset"),
        (DataArguments(dataset="wikitext", streaming=True), "a streamed dataset cannot hold out a percentage"),
        (DataArguments(validation_files=[str(val)], validation_split_percentage=5), "give one of"),
    ):
        with pytest.raises(HfscaleError, match=message):
            validation_plan(bad, evaluating=True)


def test_eval_steps_alone_set_the_schedule_they_belong_to():
    """`--eval_steps N` without `--eval_strategy`: an evaluation every N steps on the default held-out share (the
    Trainer's default schedule, "no", ignored them without a word); an explicit `--eval_strategy no` still wins."""
    from hfscale.train import check_args

    _, _, training, state = check_args(["--eval_steps", "2", "--max_steps", "4"])
    assert (training["eval_strategy"], training["eval_steps"]) == ("steps", 2)
    assert state.validation == {"percentage": DEFAULT_VALIDATION_PERCENTAGE}
    _, _, training, state = check_args(["--eval_steps", "2", "--eval_strategy", "no", "--max_steps", "4"])
    assert str(getattr(training["eval_strategy"], "value", training["eval_strategy"])) == "no"
    assert state.validation is None


def _corpus(tmp_path: Path) -> tuple[Path, Path]:
    """Training and validation text from different standard-library modules, one document per line."""
    def lines(names):
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        return [line.strip() for n in names for line in (stdlib / n).read_text().splitlines() if line.strip()]

    train_file, val_file = tmp_path / "train.txt", tmp_path / "val.txt"
    train_file.write_text("\n".join(lines(["argparse.py", "textwrap.py"])) + "\n")
    val_file.write_text("\n".join(lines(["shlex.py"])) + "\n")
    return train_file, val_file


@pytest.mark.multiprocess
def test_eval_loss_is_the_mean_token_cross_entropy_of_the_validation_text(tmp_path):
    """A 2-process run evaluates every 5 steps on --validation_files and saves its final weights; the test packs the
    validation file itself (lines + EOS, cut into 64-token blocks) and computes the loss with the saved model."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    train_file, val_file = _corpus(tmp_path)
    out = tmp_path / "run"
    cache = tmp_path / "cache"  # its own: the tokenizer trained on train.txt is the only one there
    results = train(out, "ddp", "--train_files", str(train_file), "--validation_files", str(val_file),
                    "--cache_dir", str(cache),
                    "--eval_strategy", "steps", "--eval_steps", "5", "--save_strategy", "steps", "--save_steps", "10",
                    "--save_only_model", "true", "--per_device_eval_batch_size", "3", "--gc_freq", "3", steps=10)
    # Python's collector on the schedule: young collections at steps 3, 6, 9 only, a full one after each evaluation
    collector = results["perf"]["gc"]
    assert collector["scheduled"] == 3 and collector["training"][:2] == [0, 3] and collector["training"][2] >= 2
    evals = results["eval_history"]
    assert [e["step"] for e in evals] == [5, 10] and evals[1]["loss"] < evals[0]["loss"]
    assert evals[1]["perplexity"] == pytest.approx(2.718281828459045 ** evals[1]["loss"], rel=1e-9)
    assert evals[1]["tokens"] == 10 * 4 * 2 * 64  # steps x MBS x ranks x seq
    assert results["config"]["validation"] == {"files": [str(val_file)]}
    assert "eval loss" in results["_stdout"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out))
    acc.Reload()
    assert [e.value for e in acc.Scalars("eval/loss")] == pytest.approx([e["loss"] for e in evals], rel=1e-6)
    assert [e.step for e in acc.Scalars("eval_by_tokens/loss")] == [e["tokens"] for e in evals]
    assert "eval/perplexity" in acc.Tags()["scalars"]

    [tokenizer_dir] = [p for p in cache.glob("tokenizer-bpe*") if p.is_dir()]
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = []
    for line in val_file.read_text().splitlines():
        ids += tokenizer(line, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    blocks = torch.tensor([ids[i:i + 64] for i in range(0, len(ids) // 64 * 64, 64)])
    assert len(blocks) >= 6  # more blocks than ranks x eval batch: the gather across ranks is exercised
    model = GPT2LMHeadModel.from_pretrained(str(out / "checkpoint-10")).eval()
    with torch.no_grad():
        losses = [model(input_ids=b[None], labels=b[None]).loss.item() for b in blocks]
    assert evals[1]["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_the_best_model_metrics_are_what_an_evaluation_reports():
    """--metric_for_best_model is checked before launch against EVAL_METRICS (a typo was the Trainer's KeyError at the
    first evaluation, after training up to it): those names are what an evaluation's metrics hold - hfscale's
    token-weighted loss, the perplexity its log adds, and the Trainer's timings."""
    import time

    import numpy as np
    from transformers.trainer_utils import EvalPrediction, speed_metrics

    from hfscale.run.checks import EVAL_METRICS
    from hfscale.run.trainer import HfscaleTrainer, token_weighted_eval_loss

    stats = np.array([[6.0, 3.0], [2.0, 1.0]])  # per block: summed cross-entropy, predicted tokens
    metrics = {f"eval_{k}": v for k, v in token_weighted_eval_loss(EvalPrediction(stats, None)).items()}
    metrics.update(speed_metrics("eval", time.time(), num_samples=2, num_steps=1))
    logged = []
    from types import SimpleNamespace

    fake = HfscaleTrainer.__new__(HfscaleTrainer)  # its log() alone: no model, no accelerator
    fake.__dict__.update(meter=None, step_memory=None, _clock_start=None, _eval_start=None,
                         state=SimpleNamespace(global_step=2), plan=SimpleNamespace(tokens_per_step=64))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("transformers.Trainer.log", lambda self, logs, *a, **k: logged.append(dict(logs)))
        HfscaleTrainer.log(fake, metrics)
    assert {k.removeprefix("eval_") for k in logged[0] if k.startswith("eval_")} == set(EVAL_METRICS)
    assert metrics["eval_loss"] == 2.0
