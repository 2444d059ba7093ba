"""Strategy files, shipped configs and the strategy x optimizer table."""

import json

import pytest
import yaml

from hfscale.configs import config_dir
from hfscale.errors import HfscaleError
from hfscale.strategies import (INCOMPATIBLE, OPTIMIZERS, all_strategies, check_pair, get_strategy,
                                load_deepspeed_config, matrix_markdown)

NAMES = ["ddp", "ddp_powersgd", "fsdp", "fsdp_offload", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"]


def test_the_nine_strategies_exist_under_one_name_each():
    assert sorted(all_strategies()) == sorted(NAMES)
    for name in NAMES:
        assert (config_dir("accelerate_configs") / f"{name}.yaml").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_accelerate_config_matches_strategy(name):
    s = get_strategy(name)
    cfg = yaml.safe_load(s.accelerate_config_path.read_text())
    expected = {"ddp": "MULTI_GPU", "fsdp": "FSDP", "deepspeed": "DEEPSPEED"}[s.engine]
    assert cfg["distributed_type"] == expected
    if s.engine == "deepspeed":
        # accelerate refuses DeepSpeed fields (mixed_precision, zero_stage, ...) beside a deepspeed_config_file
        assert "mixed_precision" not in cfg and "zero_stage" not in cfg["deepspeed_config"]
        ds_file = cfg["deepspeed_config"]["deepspeed_config_file"]
        assert ds_file == f"ds_configs/{s.deepspeed_config}"
        load_deepspeed_config(s.deepspeed_config_path, s)  # stage and offload agree with the strategy
    if s.engine == "fsdp":
        assert cfg["fsdp_config"]["fsdp_version"] == 2
        assert cfg["fsdp_config"]["fsdp_offload_params"] == s.offloads_state("parameters")


def test_ds_configs_use_auto_for_trainer_filled_values():
    for path in config_dir("ds_configs").glob("*.json"):
        cfg = json.loads(path.read_text())
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
            assert cfg[key] == "auto", (path, key)


def test_every_pair_is_ok_or_refused_with_a_reason():
    for s in NAMES:
        for o in OPTIMIZERS:
            if (s, o) in INCOMPATIBLE:
                with pytest.raises(HfscaleError, match=f"{s}.*{o}"):
                    check_pair(s, o)
            else:
                check_pair(s, o)
    table = matrix_markdown()
    assert table.count(" refused |") == len(INCOMPATIBLE)  # one table cell per refused pair
    assert "| zero1 | ok | ok | ok |" in table


def test_deepspeed_config_that_contradicts_strategy_is_refused(tmp_path):
    bad = tmp_path / "z.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    with pytest.raises(HfscaleError, match="stage is 2.*ZeRO-3"):
        load_deepspeed_config(bad, get_strategy("zero3"))
    bad.write_text("{not json")
    with pytest.raises(HfscaleError, match="malformed DeepSpeed JSON"):
        load_deepspeed_config(bad, get_strategy("zero3"))
