"""The GPU route, decided on a CPU machine with a faked device (issue 11): every decision hfscale makes differently on
GPUs is made here with torch.cuda monkeypatched, and each test fails without its fix. The decisions themselves live
in hfscale/parallel/distributed.py (docs/strategies.md, "CPU and GPU routes")."""

import os

import pytest

from conftest import REPO
from hfscale.errors import HfscaleError


@pytest.fixture()
def gpus(monkeypatch):
    """fake(n): this machine sees n CUDA devices (0: none)."""
    import torch

    def fake(n: int):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    return fake


def _value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_a_node_never_gets_more_processes_than_gpus(gpus):
    """accelerate reads --num_processes as the total over all machines; each node must see a GPU per process."""
    from hfscale.launch import strategy_launch

    gpus(1)
    with pytest.raises(HfscaleError, match="2 processes per node but this node sees 1 GPU"):
        strategy_launch(["--strategy", "ddp"], 2)  # sweep --nprocs 2 on a 1-GPU box
    gpus(4)
    with pytest.raises(HfscaleError, match="8 processes per node but this node sees 4 GPU"):
        strategy_launch(["--strategy", "zero3"], None, str(REPO / "accelerate_configs" / "zero3.yaml"))  # its 8
    gpus(8)
    cmd = strategy_launch(["--strategy", "zero1"], None, machines=4)  # hfscale launch --num_machines 4
    assert _value(cmd, "--num_processes") == "32" and _value(cmd, "--num_machines") == "4"
    with pytest.raises(HfscaleError, match="does not split over 4 machines"):
        strategy_launch(["--strategy", "zero1"], 30, machines=4)
    gpus(0)
    assert _value(strategy_launch(["--strategy", "ddp"], 3), "--num_processes") == "3"  # CPU: gloo, any number


def test_sweep_and_parity_launch_each_strategy_with_its_shipped_config(monkeypatch, tmp_path):
    """Without --config_file a user's default accelerate config (mixed precision, gpu_ids) would leak into every run."""
    import subprocess

    from hfscale import launch

    seen = []

    class Stop(Exception):
        pass

    def popen(cmd, **kwargs):
        seen.append(cmd)
        raise Stop
    monkeypatch.setattr(subprocess, "Popen", popen)
    for strategy in ("fsdp_offload", "zero2_offload"):
        with pytest.raises(Stop):
            launch.run_training(["--strategy", strategy], tmp_path / strategy, 2, None)
    assert _value(seen[0], "--config_file") == str(REPO / "accelerate_configs" / "fsdp_offload.yaml")
    assert _value(seen[1], "--config_file") == str(REPO / "accelerate_configs" / "zero2_offload.yaml")
    assert _value(seen[1], "--deepspeed_config_file") == str(REPO / "ds_configs" / "zero2_offload.json")


def test_fsdp_offload_gets_its_cpu_backend_on_every_launch_route(gpus, monkeypatch):
    """accelerate (state.py, PartialState) initialises "cuda:nccl,cpu:gloo" only when ACCELERATE_USE_FSDP and
    FSDP_OFFLOAD_PARAMS are in the environment - which only its launcher exports from an FSDP config; torchrun,
    `python`, a --multi_gpu launch would give plain nccl, and the gradient-norm all-reduce of CPU-offloaded shards
    fails. setup_processes exports them for fsdp_offload itself."""
    from hfscale.parallel.distributed import setup_processes
    from hfscale.parallel.strategies import get_strategy

    for var in ("ACCELERATE_USE_FSDP", "FSDP_OFFLOAD_PARAMS"):  # recorded, so the test leaves the environment as
        monkeypatch.setenv(var, "")  # it found it (delenv of an unset variable records nothing, and every later
        monkeypatch.delenv(var)  # launch in the session would inherit what setup_processes exports)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    gpus(2)
    assert setup_processes(get_strategy("fsdp")) == {} and "FSDP_OFFLOAD_PARAMS" not in os.environ
    setup_processes(get_strategy("fsdp_offload"))
    assert os.environ["ACCELERATE_USE_FSDP"] == "true" and os.environ["FSDP_OFFLOAD_PARAMS"] == "true"
    import accelerate.state as state_module

    source = open(state_module.__file__).read()  # the condition this relies on, in the installed accelerate
    assert 'os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true"' in source
    assert 'self.backend = "cuda:nccl,cpu:gloo"' in source


def test_world_size_without_local_rank_is_refused_on_a_gpu_machine(gpus, monkeypatch):
    """WORLD_SIZE set without LOCAL_RANK (a hand-made environment, not a launcher): transformers sees n_gpu > 1 in
    one process and wraps the model in nn.DataParallel, which no strategy means."""
    from hfscale.parallel.distributed import ensure_process_group_env
    from hfscale.parallel.verify import StrategyMismatch, check_wrapper
    from hfscale.parallel.strategies import get_strategy

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    gpus(4)
    with pytest.raises(HfscaleError, match="WORLD_SIZE is set but LOCAL_RANK is not"):
        ensure_process_group_env()
    with pytest.raises(StrategyMismatch, match="DataParallel"):
        check_wrapper({"wrapper": "DataParallel", "distributed_type": "NO"}, get_strategy("ddp"), 1)


def test_use_cpu_on_a_gpu_machine_takes_the_cpu_route(gpus, monkeypatch):
    """--use_cpu on a GPU host is a CPU run: the CPU optimizer, the gloo/DeepSpeed-on-CPU set-up, no fp16."""
    from hfscale.parallel.distributed import on_accelerator, setup_processes
    from hfscale.parallel.strategies import get_strategy
    from hfscale.run.args import parse_args

    from hfscale.parallel import distributed

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    gpus(8)
    assert on_accelerator(use_cpu=False) and not on_accelerator(use_cpu=True)
    _, _, gpu_kw, _ = parse_args([])
    _, _, cpu_kw, _ = parse_args(["--use_cpu"])
    assert (gpu_kw["optim"], cpu_kw["optim"]) == ("adamw_torch_fused", "adamw_torch")  # the fused kernel is CUDA's
    with pytest.raises(HfscaleError, match="--fp16 needs a GPU"):
        parse_args(["--fp16", "--use_cpu"])
    for var, value in (("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("DS_ACCELERATOR", "")):
        monkeypatch.setenv(var, value)  # restored after the test; no process group is started here
    monkeypatch.delenv("DS_ACCELERATOR")
    monkeypatch.setattr(distributed, "configure_state_for_cpu_deepspeed", lambda: "the CPU DeepSpeed route")
    assert setup_processes(get_strategy("zero1"), use_cpu=True) == {"accelerator_config": "the CPU DeepSpeed route"}
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    assert setup_processes(get_strategy("zero1"), use_cpu=False) == {}  # the GPU route is left to the libraries


def test_a_bf16_checkpoint_loads_as_fp32_masters(tmp_path):
    """transformers 5 loads a checkpoint in its stored dtype: a bf16 checkpoint would train in pure bf16 under DDP
    (and the precision check, reading an unset policy as float32, would pass). hfscale loads fp32 masters, and the
    check now reads DDP's own parameters."""
    import torch

    from hfscale.parallel.strategies import get_strategy
    from hfscale.parallel.verify import StrategyMismatch, check_precision
    from hfscale.run.models import PRESETS, build_model, load_pretrained

    build_model(PRESETS["tiny"], seed=0).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model, _ = load_pretrained(str(tmp_path / "bf16"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    check_precision({"parameters": {"dtypes": ["float32"]}}, get_strategy("ddp"), bf16=True, fp16=False)
    with pytest.raises(StrategyMismatch, match="DDP trains \\['bfloat16'\\] weights"):
        check_precision({"parameters": {"dtypes": ["bfloat16"]}}, get_strategy("ddp"), bf16=True, fp16=False)


def test_the_clock_waits_for_the_gpu_before_a_checkpoint_save(monkeypatch, tmp_path):
    """On a GPU the step's kernels are still queued when the Trainer calls on_step_end; if a save follows, they would
    drain inside the save and be excluded as pause time. The Meter synchronises at steps a save or evaluation
    follows (as the Trainer's own flow callback has decided by then), and only there."""
    import torch
    from transformers import TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState

    from hfscale.run.measure import MeasureCallback, Meter
    from hfscale.run.models import PRESETS
    from hfscale.run.results import RunRecord

    synced = []
    state = TrainerState()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(state.global_step))
    meter = Meter(PRESETS["tiny"], micro_batch=1, grad_accum=1, gpus=1, seq=64, checkpointing=False,
                  token_budget=1e9, peak_tflops=None, warmup_steps=1, on_cuda=True)
    args = TrainingArguments(output_dir=str(tmp_path), save_strategy="steps", save_steps=2, eval_strategy="no",
                             logging_steps=100, use_cpu=True, report_to="none")
    handler = CallbackHandler([DefaultFlowCallback(), MeasureCallback(meter, RunRecord(tmp_path, {}, False), None, True)],
                              None, None, None, None)
    state.max_steps, state.save_steps, state.logging_steps, state.eval_steps = 5, 2, 100, 100  # as Trainer.train sets
    meter.begin(0)
    for step in range(1, 5):
        state.global_step = step
        handler.on_step_end(args, state, TrainerControl())
    assert synced == [1, 2, 4]  # the end of warm-up, then the steps a save follows


def test_the_precision_recorded_is_the_one_the_run_computes_in(gpus, monkeypatch):
    """--torch_compile on Ampere+ makes transformers switch TF32 on (training_args.py: enable_tf32(True) when
    torch_compile and no precision flag), and ACCELERATE_MIXED_PRECISION from a user's accelerate config turns autocast
    on; recording fp32 for either would divide by the fp32 peak and report an MFU several times too high."""
    import torch

    from hfscale.parallel.distributed import run_precision, tf32_matmuls

    assert run_precision(False, False, "bf16", None, False) == "bf16"  # the environment's autocast
    assert run_precision(False, False, "no", None, True) == "tf32"  # torch_compile's TF32
    assert run_precision(False, False, "no", None, False) == "fp32" and run_precision(True, False, "no", None, True) == "bf16"
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"  # what transformers' enable_tf32 does on torch >= 2.9
        assert tf32_matmuls(on_cuda=True) and not tf32_matmuls(on_cuda=False)  # a CPU never computes in TF32
    finally:
        matmul.fp32_precision = before
    assert not tf32_matmuls(on_cuda=True)


def test_optimizer_states_are_checked_after_the_first_step_that_ran(monkeypatch):
    """fp16 with dynamic loss scaling skips the first steps as overflows (DeepSpeed starts at 2^16): no states exist
    after step 1, and checking them there refused correct offload, 8-bit and Adafactor runs."""
    from types import SimpleNamespace

    import torch

    from hfscale.parallel.strategies import get_strategy
    from hfscale.parallel.verify import StrategyMismatch
    from hfscale.run.trainer import MAX_SKIPPED_STEPS, StrategyCallback

    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.AdamW([param])
    trainer = SimpleNamespace(optimizer=optimizer, strategy=get_strategy("zero2"), powersgd_state=None)
    callback = StrategyCallback(trainer, optim="adamw", total_params=4, powersgd=None, launcher_world_size=1,
                                on_accelerator=True, record=None)
    checked = []
    monkeypatch.setattr(callback, "_check_optimizer_states", lambda: checked.append("states"))
    monkeypatch.setattr(callback, "_measure_model_states", lambda: checked.append("bytes"))
    step = SimpleNamespace(global_step=1)
    callback.on_step_end(None, step, None)  # step 1 skipped by the loss scaler: nothing to check yet
    assert checked == []
    param.grad = torch.ones(4)
    optimizer.step()  # step 2 ran
    step.global_step = 2
    callback.on_step_end(None, step, None)
    callback.on_step_end(None, SimpleNamespace(global_step=3), None)
    assert checked == ["states", "bytes"]  # once, after the first real step
    stuck = StrategyCallback(SimpleNamespace(optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]),
                                             strategy=get_strategy("zero2"), powersgd_state=None),
                             optim="adamw", total_params=2, powersgd=None, launcher_world_size=1,
                             on_accelerator=True, record=None)
    with pytest.raises(StrategyMismatch, match="has not stepped"):
        stuck.on_step_end(None, SimpleNamespace(global_step=MAX_SKIPPED_STEPS), None)


def test_hsdp_mesh_reaches_accelerate_on_the_gpu_route_and_hfscale_on_the_cpu_route(gpus, monkeypatch):
    """GPU: the TrainingArguments get ParallelismConfig(dp_replicate=nodes, dp_shard=per node), which accelerate
    builds the 2-D mesh from. CPU: accelerate raises on a ParallelismConfig in a MULTI_CPU state, so the launcher's
    ACCELERATE_USE_PARALLELISM_CONFIG is dropped and hooks.force_fsdp_state sets the mesh (tests/test_multinode.py)."""
    from hfscale.parallel.distributed import setup_processes
    from hfscale.parallel.strategies import get_strategy

    for var, value in (("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "8"), ("LOCAL_RANK", "0"), ("DS_ACCELERATOR", ""),
                       ("ACCELERATE_USE_PARALLELISM_CONFIG", "true"), ("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2"),
                       ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "8")):
        monkeypatch.setenv(var, value)  # restored after the test; no process group is started here
    gpus(8)
    config = setup_processes(get_strategy("fsdp_hybrid"))["parallelism_config"]
    assert (config.dp_replicate_size, config.dp_shard_size) == (2, 8) and config.dp_replicate_enabled
    assert os.environ["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"  # the GPU route leaves the launcher's choice
    assert setup_processes(get_strategy("fsdp_hybrid"), use_cpu=True) == {}
    assert "ACCELERATE_USE_PARALLELISM_CONFIG" not in os.environ
