"""Parsing the training command line is pure: it decides, it does not start anything."""

import sys

from conftest import env, run

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
    for strategy, optim, expected in (("zero3", "adamw_8bit", "zero3 adamw_8bit adamw_bnb_8bit True True"),
                                      ("fsdp", "adamw", "fsdp adamw adamw_torch False True")):
        proc = run([sys.executable, "-c", PROBE, "--strategy", strategy, "--optim", optim], timeout=120,
                   environ={k: v for k, v in env().items() if k != "DS_ACCELERATOR"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split("\n")[-2] == expected
