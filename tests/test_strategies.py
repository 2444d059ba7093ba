"""Strategy files, shipped configs and the strategy x optimizer table."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, probe

from hfscale.parallel.configs import config_dir
from hfscale.errors import HfscaleError
from hfscale.parallel.strategies import (INCOMPATIBLE, all_strategies, check_pair, get_strategy, load_deepspeed_config,
                                         matrix_markdown)

NAMES = ["ddp", "ddp_powersgd", "fsdp", "fsdp_hybrid", "fsdp_offload", "fsdp_tp", "tp", "zero1", "zero2", "zero2_offload",
         "zero3", "zero3_offload"]


def test_the_twelve_strategies_exist_under_one_name_each():
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
    # a launcher config alone says which strategy it is (accelerate launch --config_file, no --strategy)
    from hfscale.parallel.launch_env import config_strategy

    if s.engine != "deepspeed" and s.comm_hook is None:
        assert config_strategy(cfg) == (None if name == "ddp" else name)


def test_ds_configs_use_auto_for_trainer_filled_values():
    for path in config_dir("ds_configs").glob("*.json"):
        cfg = json.loads(path.read_text())
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
            assert cfg[key] == "auto", (path, key)


def test_the_refused_pairs_are_the_ones_the_libraries_reject():
    """Every pair the strategy table refuses fails in the library that would run it, tried directly
    (tests/probes/refused_pairs.py, one gloo process): FSDP2's and TP's DTensor parameters under Adafactor (and
    bitsandbytes' 8-bit kernels under TP), ZeRO-Offload with a client optimizer; beside them the allowed pairs of the same engines step. And the refusal names the pair and its
    reason, in one line (what `hfscale train` prints)."""
    seen = probe("refused_pairs")
    engine_of = {s: ("fsdp" if get_strategy(s).engine == "fsdp" else "tp" if get_strategy(s).tensor_parallel
                     else "zero2_offload") for s, _ in INCOMPATIBLE}
    for (strategy, optim), reason in INCOMPATIBLE.items():
        assert seen[f"{engine_of[strategy]} x {optim}"], (strategy, optim)  # the library fails it
        with pytest.raises(HfscaleError, match=f"strategy '{strategy}' cannot use optimizer '{optim}'"):
            check_pair(strategy, optim)
    assert "mixed torch.Tensor and DTensor" in seen["fsdp x adafactor"] and "DTensor" in INCOMPATIBLE[("fsdp", "adafactor")]
    assert "client provided optimizer" in seen["zero2_offload x adafactor"]
    assert "mixed torch.Tensor and DTensor" in seen["tp x adafactor"] and "DTensor" in seen["tp x adamw_8bit"]
    assert seen["fsdp x adamw"] is None and seen["zero2_offload x adamw"] is None  # the same engines step otherwise
    assert seen["tp x adamw"] is None
    assert matrix_markdown().count(" refused |") == len(INCOMPATIBLE)  # the generated docs table: one cell per pair
    assert matrix_markdown() in (REPO / "docs" / "strategies.md").read_text()  # the docs hold it as generated


def test_deepspeed_config_that_contradicts_strategy_is_refused(tmp_path):
    bad = tmp_path / "z.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    with pytest.raises(HfscaleError, match="stage is 2.*ZeRO-3"):
        load_deepspeed_config(bad, get_strategy("zero3"))
    bad.write_text("{not json")
    with pytest.raises(HfscaleError, match="malformed DeepSpeed JSON"):
        load_deepspeed_config(bad, get_strategy("zero3"))


def test_chained_comm_hook_finishes_before_ddp_goes_on():
    """On gloo, PowerSGD launches its P and Q all-reduces from future callbacks on a gloo thread; unless the hook
    has finished when DDP launches its next collective, two ranks can launch them in different orders (seen in CI:
    gloo 'Received data size doesn't match expected size'). The wrapped hook returns an already-finished future."""
    import threading

    import torch

    from hfscale.parallel.hooks import in_launch_order

    def slow_chain(state, bucket):  # a future completed later, from another thread, as gloo's are
        fut = torch.futures.Future()
        threading.Timer(0.05, fut.set_result, args=(torch.full((3,), float(bucket)),)).start()
        return fut

    assert not slow_chain(None, 1).done()
    fut = in_launch_order(slow_chain)(None, 7)
    assert fut.done() and fut.value().tolist() == [7.0, 7.0, 7.0]


def test_powersgd_on_gloo_registers_the_ordered_hook():
    """hfscale's PowerSGD wrapper is the hook DDP calls, with hfscale's state, and compresses past the warm-up
    (tests/probes/powersgd_hooks.py, its own gloo process)."""
    seen = probe("powersgd_hooks", "ordered")
    assert seen == {"hook": "hook_in_order", "state_registered": True, "iter": 4, "compressed": True,
                    "wrapper": "DistributedDataParallel", "compiled": False}


def test_compiled_ddp_is_seen_through_and_powersgd_registers_on_it():
    """ddp compiles by default on GPUs, and accelerate compiles after wrapping: OptimizedModule(DDP(model)). The
    start-up proof sees DDP through it and that the model is compiled; PowerSGD registers on the DDP inside."""
    from hfscale.parallel.verify import StrategyMismatch, check_compiled, check_wrapper

    seen = probe("powersgd_hooks", "compiled")
    assert seen == {"hook": "hook_in_order", "state_registered": True, "iter": 4, "compressed": True,
                    "wrapper": "DistributedDataParallel", "compiled": True}
    facts = {"wrapper": seen["wrapper"], "distributed_type": "MULTI_GPU", "compiled": True}
    check_wrapper(facts, get_strategy("ddp"), 8)
    check_compiled(facts, get_strategy("ddp"), torch_compile=True)
    with pytest.raises(StrategyMismatch, match="torch_compile is False but the model is compiled"):
        check_compiled(facts, get_strategy("ddp"), torch_compile=False)
    with pytest.raises(StrategyMismatch, match="torch_compile is True but the model is not compiled"):
        check_compiled({**facts, "compiled": False}, get_strategy("zero1"), torch_compile=True)


def test_every_form_of_compilation_counts_as_compiled():
    """Around the model, around its blocks (accelerate's regional compilation) and in place (nn.Module.compile(), as
    DeepSpeed's engine and regional compilation under DeepSpeed do); compiling is lazy, so nothing is generated."""
    import torch

    from hfscale.parallel.verify import is_compiled, uncompiled

    def model():
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))

    plain = model()
    assert not is_compiled(plain) and uncompiled(plain) is plain
    wrapped = torch.compile(plain)
    assert is_compiled(wrapped) and uncompiled(wrapped) is plain
    regional = model()
    regional[0] = torch.compile(regional[0])
    assert is_compiled(regional) and uncompiled(regional) is regional
    in_place = model()
    in_place[1].compile()
    assert is_compiled(in_place)


def test_offload_proofs_refuse_an_engine_that_does_not_offload():
    """The checks behind fsdp_offload/zero*_offload read the engines' own settings, not tensor devices."""
    from hfscale.parallel.verify import StrategyMismatch, check_optimizer_engine, check_wrapper

    fsdp_facts = {"wrapper": "FSDPGPT2LMHeadModel", "distributed_type": "FSDP",
                  "parameters": {"dtensor": True, "placements": ["[Shard(dim=0)]"], "mesh_shapes": ["[2]"]}}
    check_wrapper({**fsdp_facts, "fsdp_offload_policy": ["CPUOffloadPolicy"]}, get_strategy("fsdp_offload"), 2)
    with pytest.raises(StrategyMismatch, match="built with \\['OffloadPolicy'\\]"):
        check_wrapper({**fsdp_facts, "fsdp_offload_policy": ["OffloadPolicy"]}, get_strategy("fsdp_offload"), 2)
    with pytest.raises(StrategyMismatch, match="CPUOffloadPolicy"):
        check_wrapper({**fsdp_facts, "fsdp_offload_policy": ["CPUOffloadPolicy"]}, get_strategy("fsdp"), 2)
    check_optimizer_engine("deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam", get_strategy("zero2_offload"))
    with pytest.raises(StrategyMismatch, match="not DeepSpeed's DeepSpeedCPUAdam"):
        check_optimizer_engine("torch.optim.adamw.AdamW", get_strategy("zero3_offload"))
    with pytest.raises(StrategyMismatch, match="on the host"):
        check_optimizer_engine("deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam", get_strategy("zero2"))


def test_hsdp_layout_proof_tells_hybrid_from_full_shard():
    """fsdp_hybrid must run on a (nodes, processes per node) mesh as [Replicate(), Shard(0)] DTensors; a world-wide
    FSDP layout (or the reverse) is refused."""
    from hfscale.parallel.verify import StrategyMismatch, check_sharded, check_wrapper

    def facts(placements, mesh_shape, mesh=None):
        return {"wrapper": "FSDPGPT2LMHeadModel", "distributed_type": "FSDP", "fsdp_offload_policy": ["OffloadPolicy"],
                "mesh": mesh, "parameters": {"dtensor": True, "placements": [placements], "mesh_shapes": [mesh_shape]}}

    hybrid, fsdp = get_strategy("fsdp_hybrid"), get_strategy("fsdp")
    check_wrapper(facts("[Replicate(), Shard(dim=0)]", "[2, 4]", [2, 4]), hybrid, 8)
    check_wrapper(facts("[Shard(dim=0)]", "[8]"), fsdp, 8)
    with pytest.raises(StrategyMismatch, match="laid out"):
        check_wrapper(facts("[Shard(dim=0)]", "[8]", [2, 4]), hybrid, 8)
    with pytest.raises(StrategyMismatch, match="laid out"):
        check_wrapper(facts("[Replicate(), Shard(dim=0)]", "[4, 2]", [2, 4]), hybrid, 8)
    with pytest.raises(StrategyMismatch, match="laid out"):
        check_wrapper(facts("[Replicate(), Shard(dim=0)]", "[2, 4]", [2, 4]), fsdp, 8)
    check_sharded("parameters", 250, 1000, 4, hybrid)  # 1/4 per rank: sharded over a node's 4 processes
    with pytest.raises(StrategyMismatch, match="not sharded"):
        check_sharded("parameters", 500, 1000, 4, hybrid)


def test_the_wrapper_proof_knows_every_engine_and_tp():
    """Each engine's wrapper, and TP's: tp runs unwrapped (one TP group), every TP parameter as the plan says."""
    from hfscale.parallel.verify import StrategyMismatch, check_wrapper

    zero = {"wrapper": "DeepSpeedEngine", "distributed_type": "DEEPSPEED", "zero_stage": 2, "offload_optimizer": False,
            "offload_param": False}
    check_wrapper(zero, get_strategy("zero2"), 2)
    check_wrapper({"wrapper": "DistributedDataParallel", "distributed_type": "MULTI_CPU"}, get_strategy("ddp"), 2)
    with pytest.raises(StrategyMismatch, match="not DDP"):
        check_wrapper({"wrapper": "GPT2LMHeadModel", "distributed_type": "MULTI_CPU"}, get_strategy("ddp"), 2)
    tp = {"wrapper": "GPT2LMHeadModel", "distributed_type": "MULTI_CPU", "tensor_parallel": {"mismatches": []}}
    check_wrapper(tp, get_strategy("tp"), 2)
    with pytest.raises(StrategyMismatch, match="wrapped in DDP"):
        check_wrapper({**tp, "wrapper": "DistributedDataParallel"}, get_strategy("tp"), 2)
    with pytest.raises(StrategyMismatch, match=r"1 parameter\(s\) are not laid out as the TP plan says"):
        check_wrapper({**tp, "tensor_parallel": {"mismatches": ["lm_head.weight: Replicate()"]}}, get_strategy("tp"), 2)
    fsdp_tp = {"wrapper": "FSDPGPT2LMHeadModel", "distributed_type": "FSDP", "fsdp_offload_policy": ["OffloadPolicy"],
               "parameters": {"dtensor": True}, "tensor_parallel": {"mismatches": []}}
    check_wrapper(fsdp_tp, get_strategy("fsdp_tp"), 4)
    with pytest.raises(StrategyMismatch, match="not FSDP"):
        check_wrapper({**fsdp_tp, "distributed_type": "MULTI_CPU"}, get_strategy("fsdp_tp"), 4)


@pytest.mark.parametrize("nodes,per_node", [(1, 8), (4, 1), (1, 1), (0, 2)])
def test_hsdp_mesh_refuses_one_node_or_one_process_per_node(nodes, per_node):
    from hfscale.runplan import hsdp_mesh

    with pytest.raises(HfscaleError, match="needs 2\\+ nodes with 2\\+ processes each"):
        hsdp_mesh(nodes, per_node)
    assert hsdp_mesh(2, 8) == (2, 8)


def test_hsdp_mesh_comes_from_the_launcher_world_and_must_agree_with_its_parallelism_config(monkeypatch):
    """A run's plan takes WORLD_SIZE and LOCAL_WORLD_SIZE from the launcher; HSDP's mesh is (nodes, processes per node)
    and a launcher's own parallelism_config must agree with it."""
    from hfscale.models import PRESETS
    from hfscale.run.args import parse_args
    from hfscale.run.planning import plan_training

    def plan(strategy, world):
        monkeypatch.setenv("WORLD_SIZE", str(world))
        _, _, training, _ = parse_args(["--strategy", strategy])
        return plan_training(training, PRESETS["tiny"], 64)[1]

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    hybrid = plan("fsdp_hybrid", 8)
    assert (hybrid.mesh, hybrid.nodes, hybrid.shard_ranks) == ((2, 4), 2, 4) and plan("fsdp", 8).mesh is None
    with pytest.raises(HfscaleError, match="do not split into nodes of 4"):
        plan("fsdp_hybrid", 6)
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "8")  # the shipped YAML's 2 x 8 on a 2 x 4 job
    with pytest.raises(HfscaleError, match="dp_replicate 2 x dp_shard 8 x tp 1, but this job is dp_replicate 2 x dp_shard 4 x tp 1"):
        plan("fsdp_hybrid", 8)
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")
    assert plan("fsdp_hybrid", 8).mesh == (2, 4)


def test_who_builds_the_whole_model_follows_the_strategy_and_its_opt_outs():
    """fsdp* and zero3* build on rank 0 only unless the run turns it off (cpu_ram_efficient_loading,
    accelerate's zero3_init_flag); with zero3_init_flag off, transformers must not see the ZeRO-3 config while the
    model is built (it would build under zero.Init itself), and must see it again afterwards."""
    from types import SimpleNamespace

    from transformers.integrations.deepspeed import (HfDeepSpeedConfig, is_deepspeed_zero3_enabled,
                                                     unset_hf_deepspeed_config)

    from hfscale.run.construction import builds_whole, plain_construction, rank0_builds

    strategies = all_strategies()
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}})  # what TrainingArguments(deepspeed=...) sets
    try:
        for flag in (True, False):
            args = SimpleNamespace(hf_deepspeed_config=config, fsdp_config=None,
                                   deepspeed_plugin=SimpleNamespace(is_zero3_init_enabled=lambda flag=flag: flag))
            assert rank0_builds(args, strategies["zero3"]) is flag
            assert rank0_builds(args, strategies["zero3_offload"]) is flag
            assert not rank0_builds(args, strategies["zero2"]) and not rank0_builds(args, strategies["ddp"])
            with plain_construction(args, strategies["zero3"]):
                assert is_deepspeed_zero3_enabled() is flag
            assert is_deepspeed_zero3_enabled()
        for loading in (True, False):
            args = SimpleNamespace(fsdp_config={"cpu_ram_efficient_loading": loading}, deepspeed_plugin=None)
            assert rank0_builds(args, strategies["fsdp"]) is loading
        assert [s for s in strategies if strategies[s].rank0_builds] == [
            "fsdp", "fsdp_hybrid", "fsdp_offload", "fsdp_tp", "tp", "zero3", "zero3_offload"]
        # under TP each TP group's first rank (a node's first process) builds it, whatever accelerate's flag says;
        # process 0 alone otherwise
        for name in ("tp", "fsdp_tp"):
            args = SimpleNamespace(fsdp_config={"cpu_ram_efficient_loading": False}, deepspeed_plugin=None)
            assert rank0_builds(args, strategies[name])
            builders = [builds_whole(SimpleNamespace(**vars(args), process_index=g, local_process_index=g % 2),
                                     strategies[name]) for g in range(4)]
            assert builders == [True, False, True, False]
        args = SimpleNamespace(fsdp_config={"cpu_ram_efficient_loading": True}, deepspeed_plugin=None)
        assert [builds_whole(SimpleNamespace(**vars(args), process_index=g, local_process_index=g % 2),
                             strategies["fsdp"]) for g in range(4)] == [True, False, False, False]
        args = SimpleNamespace(fsdp_config=None, deepspeed_plugin=None, process_index=1, local_process_index=1)
        assert builds_whole(args, strategies["ddp"])
    finally:
        unset_hf_deepspeed_config()


def test_zero_offload_asks_py_cpuinfo_once_per_process(monkeypatch):
    """DeepSpeed's CPU Adam asks py-cpuinfo three times per rank (its op builder's -march and SIMD width, the
    optimizer's vendor); each answer costs a Python interpreter, so hfscale keeps the first."""
    import cpuinfo
    import cpuinfo.cpuinfo as module
    from deepspeed.ops.op_builder.cpu.cpu_adam import CPUAdamBuilder

    from hfscale.parallel.distributed import keep_cpu_info

    asked = []
    answer = json.dumps({"arch": "X86_64", "flags": ["avx2"], "vendor_id_raw": "GenuineIntel"})
    monkeypatch.setattr(module, "get_cpu_info_json", lambda: asked.append(1) or answer)  # the interpreter it starts
    monkeypatch.setattr(cpuinfo, "get_cpu_info", cpuinfo.get_cpu_info)  # put back after the test
    keep_cpu_info()
    keep_cpu_info()  # idempotent: set up once per process, whatever calls it
    builder = CPUAdamBuilder()
    assert (builder.cpu_arch(), builder.simd_width()) == ("-march=native", "-D__AVX256__")
    assert cpuinfo.get_cpu_info()["vendor_id_raw"] == "GenuineIntel" and len(asked) == 1


def test_a_run_without_deepspeed_never_imports_it():
    """accelerate unwraps a model (the Trainer's init, every save) by importing DeepSpeed whenever it is installed
    (~0.6 CPU-s per rank); hfscale's set-up has it ask only once deepspeed is imported, which a DeepSpeedEngine
    needs: a ddp model unwraps with no import, an engine still unwraps. In a fresh interpreter, as a rank."""
    code = """
import json, sys, torch
from accelerate.utils import extract_model_from_parallel
from hfscale.parallel.distributed import unwrap_without_importing_deepspeed
unwrap_without_importing_deepspeed(); unwrap_without_importing_deepspeed()
model = torch.nn.Linear(2, 2)
plain = extract_model_from_parallel(model) is model and "deepspeed" not in sys.modules
import deepspeed
engine = deepspeed.DeepSpeedEngine.__new__(deepspeed.DeepSpeedEngine)
torch.nn.Module.__init__(engine)
engine.module = model
print(json.dumps([plain, extract_model_from_parallel(engine) is model]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, True]


def test_a_run_without_a_launcher_binds_its_one_process_group_to_a_port_the_kernel_picks():
    """`hfscale train` (no launcher) is a one-process group whose TCPStore binds MASTER_PORT 0: the kernel picks a free
    port as it binds, so no other process can take it between a choice and the bind (two such runs side by side, or
    any listener or connection on the machine). In a fresh interpreter, as accelerate starts the group."""
    code = """
import json, os
import torch
from accelerate import PartialState
from hfscale.parallel.distributed import ensure_process_group_env
ensure_process_group_env()
state = PartialState(cpu=True)
import torch.distributed as dist
t = torch.ones(1); dist.all_reduce(t)
store = dist.distributed_c10d._get_default_store()
while not hasattr(store, "port"):
    store = store.underlying_store  # the group's PrefixStore over the TCPStore
port = store.port
print(json.dumps([os.environ["MASTER_PORT"], port > 0, state.num_processes, t.item()]))
"""
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                                "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == ["0", True, 1, 1.0]


def test_zero3_partitions_in_the_dtype_its_config_trains_in():
    import torch

    from hfscale.models import zero3_dtype

    assert zero3_dtype({"bf16": {"enabled": True}, "fp16": {"enabled": False}}) == torch.bfloat16
    assert zero3_dtype({"bf16": {"enabled": False}, "fp16": {"enabled": True}}) == torch.float16
    assert zero3_dtype({"bf16": {"enabled": False}}) == torch.float32 == zero3_dtype({})


def test_the_trainer_builds_the_optimizer_each_registry_entry_names(monkeypatch):
    """The optimizer class transformers' Trainer really builds from the name the registry hands it, per engine and
    route: torchao's AdamW8bit under fsdp* (DTensor states), bitsandbytes' elsewhere; torch's fused AdamW only on a
    GPU; transformers' Adafactor. Checked against transformers' own mapping, not the registry's table; and the
    --optim_args keys each reads, against what they change in the keywords it builds the optimizer with."""
    import torch
    from transformers import Trainer, TrainingArguments

    from hfscale.parallel.optimizers import OPTIMIZERS
    from hfscale.run.checks import OPTIM_ARGS_READ

    expected = {("adamw_8bit", "fsdp"): "torchao.optim.adam.AdamW8bit",
                ("adamw_8bit", None): "bitsandbytes.optim.adamw.AdamW",  # with optim_bits=8 (below)
                ("adamw", None): "torch.optim.adamw.AdamW", ("adafactor", None): "transformers.optimization.Adafactor"}
    model = torch.nn.Linear(4, 4)
    for on_gpu in (True, False):
        for name, optimizer in OPTIMIZERS.items():
            for engine in ("ddp", "fsdp", "deepspeed"):
                hf_name = optimizer.hf_name(on_gpu, engine)
                args = TrainingArguments(output_dir="/tmp/hfscale-never-written", optim=hf_name, use_cpu=True,
                                         report_to="none")
                cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
                built = f"{cls.__module__}.{cls.__qualname__}"
                assert built == expected.get((name, engine), expected[(name, None)]), (name, engine, built)
                assert kwargs.get("fused", False) is (name == "adamw" and on_gpu), (name, on_gpu, kwargs)
                if built.startswith("bitsandbytes"):
                    assert kwargs["optim_bits"] == 8
                # what --optim_args changes: exactly the keys run/checks.OPTIM_ARGS_READ says this optimizer reads
                args.optim_args = "beta1=0.5,eps=0.5,block_size=64,bf16_stochastic_round=true,scale_parameter=true"
                changed = {k for k, v in Trainer.get_optimizer_cls_and_kwargs(args, model)[1].items()
                           if kwargs.get(k) != v}
                assert changed == set(OPTIM_ARGS_READ.get(hf_name, ())), (name, engine, changed)


def test_tensor_parallel_layouts_are_refused_up_front_with_their_reason(monkeypatch):
    """tp is one node of 2+ (no data parallelism); fsdp_tp 2+ nodes of 2+ (TP inside a node, FSDP2 across); TP must
    divide the heads. Checked in the run's plan before anything starts, as `hfscale launch`/`slurm` check it."""
    from hfscale.models import PRESETS
    from hfscale.parallel.strategies import layout_refusal
    from hfscale.run.args import parse_args
    from hfscale.run.planning import plan_training

    tp, fsdp_tp = get_strategy("tp"), get_strategy("fsdp_tp")
    assert layout_refusal(tp, 4, 4) is None and layout_refusal(fsdp_tp, 8, 4) is None
    assert "runs on one node, got 2 nodes; use fsdp_tp across nodes" in layout_refusal(tp, 8, 4)
    assert "2+ processes per node" in layout_refusal(tp, 1, 1)
    assert "needs 2+ nodes" in layout_refusal(fsdp_tp, 4, 4)
    assert "do not split into nodes" in layout_refusal(fsdp_tp, 6, 4)

    def plan(strategy, world, per_node, model="tiny"):
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
        _, _, training, _ = parse_args(["--strategy", strategy])
        return plan_training(training, PRESETS[model], 64)[1]

    two_by_two = plan("fsdp_tp", 4, 2)  # the mesh, the data-parallel size and what FSDP shards over
    assert (two_by_two.tp, two_by_two.data_parallel_size, two_by_two.shard_ranks) == (2, 2, 2)
    assert two_by_two.parallel_sizes == {"dp_replicate": 1, "dp_shard": 2, "tp": 2}
    assert two_by_two.global_batch_size == 2 * two_by_two.per_device_train_batch_size  # TP ranks share a batch
    # each node's first process builds the model, its TP group's split scatters the slices: one copy a node
    assert two_by_two.strategy.rank0_builds and two_by_two.strategy.construction_shard_ranks(4, 2) == 2
    with pytest.raises(HfscaleError, match="does not divide the 4 attention heads"):
        plan("tp", 3, 3)
    with pytest.raises(HfscaleError, match="needs 2\\+ nodes"):
        plan("fsdp_tp", 2, 2)
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")  # a launcher's own TP size must be the node's
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "8")
    with pytest.raises(HfscaleError, match="tp 8, but this job is dp_replicate 1 x dp_shard 2 x tp 2"):
        plan("fsdp_tp", 4, 2)
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    assert plan("fsdp_tp", 4, 2).tp == 2


def test_a_launcher_environment_names_its_tensor_parallel_strategy(monkeypatch):
    from hfscale.parallel.launch_env import launcher_strategy

    for var in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "4")
    assert launcher_strategy() == "tp"
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert launcher_strategy() == "fsdp_tp"
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "1")
    assert launcher_strategy() == "fsdp"


def test_the_shipped_launcher_files_are_what_the_strategies_define(tmp_path, hfscale_cli):
    """accelerate_configs/ and ds_configs/ are written from strategies/*.yaml by `hfscale configs`: a committed file
    that differs (a hand edit, a strategy changed and not written) fails here, and `--check` names it; the code reads
    the strategy's own settings, which are the JSON's."""
    import json

    from hfscale.parallel import shipped

    files = shipped.shipped_files()
    assert len(files) == len(all_strategies()) + sum(bool(s.deepspeed_config) for s in all_strategies().values())
    assert shipped.stale_files(files) == []
    assert hfscale_cli(["configs", "--check"]).returncode == 0
    for s in all_strategies().values():
        if s.deepspeed_config:
            assert json.loads(s.deepspeed_config_path.read_text()) == s.shipped_deepspeed_config
    edited = tmp_path / "zero2.json"  # the check compares texts: any change to a file is one
    path = get_strategy("zero2").deepspeed_config_path
    edited.write_text(path.read_text().replace("500000000", "50000000", 1))
    assert shipped.stale_files({edited: files[path]}) == [edited]
    assert shipped.stale_files({tmp_path / "missing.json": files[path]}) == [tmp_path / "missing.json"]


def test_a_strategy_file_cannot_restate_what_its_stage_and_offload_give(tmp_path):
    """One home for the stage and the offload: a strategy's zero_optimization that sets them again is refused, and
    DeepSpeed settings on a strategy of another engine too."""
    from hfscale.parallel.strategies import _parse_strategy

    source = (config_dir("strategies") / "zero2.yaml").read_text()  # a valid file, then one key too many
    for bad, message in (("  stage: 3\n", "zero_optimization sets ['stage']"),
                         ("  offload_optimizer: {device: cpu}\n", "zero_optimization sets ['offload_optimizer']")):
        path = tmp_path / "zero2.yaml"
        path.write_text(source.replace("zero_optimization:\n", "zero_optimization:\n" + bad))
        with pytest.raises(HfscaleError, match=re.escape(message)):
            _parse_strategy(path)
    path = tmp_path / "ddp.yaml"
    path.write_text((config_dir("strategies") / "ddp.yaml").read_text() + "zero_optimization: {overlap_comm: true}\n")
    with pytest.raises(HfscaleError, match="for engine deepspeed"):
        _parse_strategy(path)

