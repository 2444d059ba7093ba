"""Parsing the training command line is pure: it decides, it does not start anything."""

import sys

import pytest

from conftest import env, run
from hfscale.errors import HfscaleError

PROBE = """
import os, sys
before = dict(os.environ)
from hfscale.train import check_args
model_args, data_args, training, state = check_args(sys.argv[1:])
from accelerate.state import PartialState
assert dict(os.environ) == before, sorted(set(os.environ.items()) ^ set(before.items()))
assert not PartialState._shared_state, "parsing created accelerate's state"
import torch.distributed as dist
assert not dist.is_initialized(), "parsing started a process group"
assert not hasattr(model_args, 'hfscale_optim') and 'hfscale_optim' not in training
print(state.plan.strategy.name, state.plan.optimizer.name, training['optim'], training['deepspeed'] is not None, training['use_cpu'])
"""


def test_parse_changes_no_environment_and_creates_no_state():
    # the second also names what is checked against libraries that set variables as they load (inductor, torchao)
    for strategy, optim, extra, expected in (
            ("zero3", "adamw_8bit", [], "zero3 adamw_8bit adamw_bnb_8bit True True"),
            ("fsdp", "adamw", ["--report_to", "all", "--torch_compile_mode", "max-autotune"],
             "fsdp adamw adamw_torch False True")):
        proc = run([sys.executable, "-c", PROBE, "--strategy", strategy, "--optim", optim, *extra], timeout=120,
                   environ={k: v for k, v in env().items() if k != "DS_ACCELERATOR"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split("\n")[-2] == expected


def test_help_gives_the_recipe_hfscale_applies_not_the_trainers_default(capsys):
    """`hfscale train --help` must not say 5e-05 is the learning rate when hfscale's run would use 3e-4."""
    import re

    import pytest

    from hfscale.run.args import _read_values
    from hfscale.run.recipes import apply_defaults

    with pytest.raises(SystemExit):
        _read_values(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for params, optim in ((350e6, "adamw"), (1.3e9, "adamw"), (124e6, "adafactor")):
        (_, _, training), _ = _read_values([])
        training["max_steps"] = 100
        _, recipe = apply_defaults(training, set(), params, optim)
        for name, (value, source) in recipe.items():
            assert source == "default"
            help_ = re.search(rf"--{name} \S+, --{name.replace('_', '-')} \S+ (.*?)(?= --\w+ [A-Z\[{{])", text).group(1)
            assert "hfscale's pretraining recipe" in help_, (name, help_)
            shown = {"lr_scheduler_kwargs": str(value).replace("'", '"'), "logging_steps": "max_steps / 50"}
            assert shown.get(name, f"{value:g}" if isinstance(value, float) else str(value)) in help_, (name, value, help_)


def test_a_comma_list_keeps_each_value_once_in_the_order_given():
    """`--strategy ddp,zero1,ddp` is two strategies: one row each in estimate/project, one run each in a sweep (a
    value named twice made two rows, or two runs of one run folder)."""
    from hfscale.flags import comma_list

    assert comma_list("ddp,zero1,ddp", "--strategy", valid=["ddp", "zero1"]) == ["ddp", "zero1"]
    assert comma_list("16, 8,16 ", "--gpus", int) == [16, 8]
    with pytest.raises(HfscaleError, match="--strategy 'ddp,' has an empty item"):
        comma_list("ddp,", "--strategy", valid=["ddp"])


def test_a_glob_among_the_data_files_is_the_files_it_matches(tmp_path, monkeypatch):
    """A run file or a quoted argument hands the pattern over unexpanded (before: "data file not found: d/*.txt");
    it is the sorted files it matches, and a pattern that matches none is refused naming it."""
    from hfscale.train import check_args

    for name in ("b.txt", "a.txt"):
        (tmp_path / name).write_text("some text to train on " * 50)
    monkeypatch.chdir(tmp_path)
    _, data_args, _, state = check_args(["--model", "tiny", "--train_files", "*.txt", "--validation_files", "a.*"])
    assert data_args.train_files == ["a.txt", "b.txt"] and data_args.validation_files == ["a.txt"]
    with pytest.raises(HfscaleError, match=r"^--train_files '\*.jsonl' matches no file$"):
        check_args(["--model", "tiny", "--train_files", "*.jsonl"])


def test_the_trainers_own_combination_checks_run_before_launch_and_never_refuse_a_good_run(monkeypatch):
    """TrainingArguments' checks of how its flags combine run in check_args on the flags alone (the refusals are in
    test_bad_input); a good combination passes, and a transformers whose checks read more than the flags (faked: an
    AttributeError) leaves them to the ranks instead of refusing here."""
    from transformers import TrainingArguments

    from hfscale.train import check_args

    good = ["--model", "tiny", "--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "4",
            "--load_best_model_at_end", "true"]
    assert check_args(good)[2]["load_best_model_at_end"] is True
    bad = ["--model", "tiny", "--load_best_model_at_end", "true"]  # saves by steps, never evaluates
    with pytest.raises(HfscaleError, match="requires the save and eval strategy to match"):
        check_args(bad)

    def reads_more(self):
        raise AttributeError("a flag this check does not build")

    monkeypatch.setattr(TrainingArguments, "_validate_args", reads_more)
    check_args(bad)  # left to the ranks, as before


@pytest.mark.parametrize("new, old", [(None, None), (True, None), (False, None), (None, True), (None, False),
                                      (True, True), (False, False)])
def test_the_plan_recomputes_activations_as_the_trainer_does(new, old, tmp_path):
    """--gradient_checkpointing is the Trainer's deprecated name of --activation_checkpointing, read only when the new
    name is not given: the plan (estimate, HFU, run name) decides as TrainingArguments itself does."""
    from transformers import TrainingArguments

    from hfscale.train import check_args

    argv = [*(["--activation_checkpointing", str(new).lower()] if new is not None else []),
            *(["--gradient_checkpointing", str(old).lower()] if old is not None else [])]
    plan = check_args([*argv, "--output_dir", str(tmp_path / "out")])[3].plan
    trainer_says = TrainingArguments(output_dir=str(tmp_path / "t"), activation_checkpointing=new,
                                     gradient_checkpointing=old, use_cpu=True).activation_checkpointing
    assert plan.activation_checkpointing is bool(trainer_says)
