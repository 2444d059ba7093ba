"""The GPU route, decided on a CPU machine with a faked device (issue 11): every decision hfscale makes differently on
GPUs is made here with torch.cuda monkeypatched, and each test fails without its fix. The decisions themselves live
in hfscale/parallel/distributed.py (docs/strategies.md, "CPU and GPU routes")."""

import os

import pytest

from conftest import REPO
from hfscale.errors import HfscaleError


def route_plan(strategy: str, on_cuda: bool, world: int = 2, per_node: int = 2):
    """The RunPlan of a tiny run of `strategy` on `world` processes, on the GPU or the CPU route."""
    from hfscale.models import PRESETS
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.runplan import RunPlan

    return RunPlan(get_strategy(strategy), get_optimizer("adamw"), PRESETS["tiny"], 64, world_size=world,
                   processes_per_node=per_node, device_type="cuda" if on_cuda else "cpu")


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
    from hfscale.launching import strategy_launch

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


@pytest.mark.parametrize("argv", [
    ["sweep", "--num_processes", "1,2", "--out", "runs/sweep"],
    ["tune", "--model", "tiny", "--num_processes", "2", "--out", "runs/tune"],
    ["parity", "--num_processes", "2", "--out", "runs/parity"],
    ["launch", "--num_processes", "2", "--dry_run"],
], ids=lambda argv: argv[0])
def test_more_processes_than_gpus_are_refused_before_anything_is_written(argv, gpus, hfscale_cli, tmp_path):
    """A sweep, tune or parity whose runs would each be refused as they start (after the first ones had run) is one
    line before anything starts or is written."""
    gpus(1)
    proc = hfscale_cli(argv, cwd=tmp_path)
    assert proc.returncode == 2 and "2 processes per node but this node sees 1 GPU(s)" in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())


def test_a_run_file_launches_with_its_strategys_shipped_config(gpus, hfscale_cli, tmp_path):
    """`hfscale launch run.yaml` reads the strategy from the file (before: ddp's launcher config for any file)."""
    gpus(0)
    (tmp_path / "run.yaml").write_text("strategy: zero2\nmax_steps: 2\n")
    proc = hfscale_cli(["launch", "--dry_run", "run.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "accelerate_configs/zero2.yaml" in proc.stdout and "ds_configs/zero2.json" in proc.stdout


def test_sweep_and_parity_launch_each_strategy_with_its_shipped_config(gpus, monkeypatch, tmp_path):
    """Without --config_file a user's default accelerate config (mixed precision, gpu_ids) would leak into every run."""
    import subprocess

    from hfscale import launching as launch

    gpus(0)  # 2 processes: a CPU machine's launch (a 1-GPU host would refuse it, as it should)

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

    for var in ("ACCELERATE_USE_FSDP", "FSDP_OFFLOAD_PARAMS"):  # recorded, so the test leaves the environment as
        monkeypatch.setenv(var, "")  # it found it (delenv of an unset variable records nothing, and every later
        monkeypatch.delenv(var)  # launch in the session would inherit what setup_processes exports)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    gpus(2)
    assert setup_processes(route_plan("fsdp", True)) == {} and "FSDP_OFFLOAD_PARAMS" not in os.environ
    setup_processes(route_plan("fsdp_offload", True))
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
    """--use_cpu on a GPU host is a CPU run: the CPU optimizer, the gloo/DeepSpeed-on-CPU set-up, no fp16, and a plan
    without the CUDA-only memory terms."""
    from hfscale.parallel import distributed
    from hfscale.parallel.distributed import on_accelerator, setup_processes
    from hfscale.train import check_args

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    gpus(8)
    assert on_accelerator(use_cpu=False) and not on_accelerator(use_cpu=True)
    _, _, gpu_kw, gpu_state = check_args([])
    _, _, cpu_kw, cpu_state = check_args(["--use_cpu"])
    assert (gpu_kw["optim"], cpu_kw["optim"]) == ("adamw_torch_fused", "adamw_torch")  # the fused kernel is CUDA's
    assert (gpu_state.plan.device_type, cpu_state.plan.device_type) == ("cuda", "cpu")
    gpu_mem, cpu_mem = gpu_state.plan.memory(), cpu_state.plan.memory()
    assert cpu_mem.device_total == cpu_mem.allocated and cpu_mem.activation_calibration == "cpu"  # no CUDA terms
    assert gpu_mem.device_total == int(gpu_mem.allocated * 1.05 + 1e9) and gpu_mem.activation_calibration != "cpu"
    with pytest.raises(HfscaleError, match="--fp16 needs a GPU"):
        check_args(["--fp16", "--use_cpu"])
    for var, value in (("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("DS_ACCELERATOR", "")):
        monkeypatch.setenv(var, value)  # restored after the test; no process group is started here
    monkeypatch.delenv("DS_ACCELERATOR")
    monkeypatch.setattr(distributed, "configure_state_for_cpu_deepspeed", lambda: "the CPU DeepSpeed route")
    assert setup_processes(route_plan("zero1", False)) == {"accelerator_config": "the CPU DeepSpeed route"}
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    assert setup_processes(route_plan("zero1", True)) == {}  # the GPU route is left to the libraries


def test_tune_plans_its_trials_on_the_route_they_take(gpus):
    """tune's trials run here: on a GPU host with --use_cpu among the training flags they are CPU runs, estimated
    without the CUDA terms (the runtime allowance, the allocator margin), as each trial's own plan is."""
    from hfscale.flags import bool_flag
    from hfscale.plan.tune import build_parser, candidates

    assert bool_flag(["--use_cpu"], "--use_cpu") and bool_flag(["--use_cpu", "--bf16"], "--use_cpu")
    assert bool_flag(["--use_cpu=true"], "--use_cpu") and not bool_flag(["--use_cpu", "False"], "--use_cpu")
    assert not bool_flag(["--bf16"], "--use_cpu")
    gpus(2)
    opts = build_parser().parse_args(["--model", "tiny", "--strategy", "ddp", "--optim", "adamw", "--num_processes",
                                      "2", "--per_device_train_batch_size", "4"])
    on_gpu = {c.run.name: c.estimate_gb for c in candidates(opts, [])[0]}
    on_cpu = {c.run.name: c.estimate_gb for c in candidates(opts, ["--use_cpu"])[0]}
    assert on_gpu.keys() == on_cpu.keys() and all(on_gpu[n] > on_cpu[n] + 0.9 for n in on_gpu)  # the 1 GB runtime


def test_a_sweep_or_tune_trial_is_refused_as_its_run_would_be_before_anything_launches(gpus, monkeypatch, tmp_path):
    """A trial is its run's own plan (train.check_args on its processes): refused by the same refusal() - heads TP does
    not divide, the fused loss under TP, which the pair and layout tables alone let through - and on a GPU judged by
    the same memory verdict against the device's memory; a trial that fits launches."""
    from conftest import TINY
    from hfscale import launching
    from hfscale.launching import RunSpec, decided_without_launch

    def decided(strategy, *flags, processes=2):
        return decided_without_launch(RunSpec(strategy, "adamw", processes, 4, 1, False), tmp_path, [*TINY, *flags])

    gpus(0)
    assert decided("ddp") is None and decided("tp") is None  # tiny's 4 heads split over 2
    heads = decided("tp", "--n_head", "1", "--hidden_size", "64")
    assert heads["status"] == "refused" and "heads" in heads["error"]
    fused = decided("tp", "--fused_linear_cross_entropy")
    assert fused["status"] == "refused" and "fused" in fused["error"]
    assert "needs 2+ nodes" in decided("fsdp_hybrid")["error"]  # one node: the layout, as before
    gpus(2)
    monkeypatch.setattr(launching, "visible_device_memory", lambda: 10 * 2**30)
    assert decided("ddp") is None
    monkeypatch.setattr(launching, "visible_device_memory", lambda: 2**20)  # 1 MiB: nothing fits
    small = decided("ddp")
    assert small["status"] == "refused" and small["error"].startswith("estimate: needs")


def test_a_bf16_checkpoint_loads_as_fp32_masters(tmp_path):
    """transformers 5 loads a checkpoint in its stored dtype: a bf16 checkpoint would train in pure bf16 under DDP
    (and the precision check, reading an unset policy as float32, would pass). hfscale loads fp32 masters, and the
    check now reads DDP's own parameters."""
    import torch

    from hfscale.parallel.strategies import get_strategy
    from hfscale.parallel.verify import StrategyMismatch, check_precision
    from hfscale.models import PRESETS, build_model, load_pretrained

    build_model(PRESETS["tiny"], seed=0).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model, _ = load_pretrained(str(tmp_path / "bf16"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    ddp = route_plan("ddp", False).but(precision="bf16").dtypes
    check_precision({"parameters": {"dtypes": ["float32"]}}, get_strategy("ddp"), ddp)
    with pytest.raises(StrategyMismatch, match="DDP trains \\['bfloat16'\\] weights"):
        check_precision({"parameters": {"dtypes": ["bfloat16"]}}, get_strategy("ddp"), ddp)


def test_the_clock_waits_for_the_gpu_before_a_checkpoint_save(monkeypatch, tmp_path):
    """On a GPU the step's kernels are still queued when the Trainer calls on_step_end; if a save follows, they would
    drain inside the save and be excluded as pause time. The Meter synchronises at steps a save or evaluation
    follows (as the Trainer's own flow callback has decided by then), and only there."""
    import torch
    from transformers import TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState

    from hfscale.run.measure import MeasureCallback, Meter
    from hfscale.run.results import Results, RunRecord

    synced = []
    state = TrainerState()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(state.global_step))
    meter = Meter(route_plan("ddp", True, world=1, per_node=1), token_budget=1e9, peak_tflops=None, warmup_steps=1)
    args = TrainingArguments(output_dir=str(tmp_path), save_strategy="steps", save_steps=2, eval_strategy="no",
                             logging_steps=100, use_cpu=True, report_to="none")
    handler = CallbackHandler([DefaultFlowCallback(), MeasureCallback(meter, RunRecord(tmp_path, Results(), False), None,
                                                                      True)],
                              None, None, None, None)
    state.max_steps, state.save_steps, state.logging_steps, state.eval_steps = 5, 2, 100, 100  # as Trainer.train sets
    meter.begin(0)
    for step in range(1, 5):
        state.global_step = step
        handler.on_step_end(args, state, TrainerControl())
    assert synced == [1, 2, 4]  # the end of warm-up, then the steps a save follows


def test_each_logging_interval_records_the_gpus_clock_on_the_gpu_route_only(monkeypatch, tmp_path):
    """perf_history keeps the SM clock at the end of each interval on a GPU (a power-limited card runs the same step
    slower: docs/metrics.md); where NVML cannot be read, and on a CPU, the interval is recorded without it."""
    import torch
    from transformers import TrainingArguments
    from transformers.trainer_callback import TrainerControl, TrainerState

    from hfscale.run.measure import MeasureCallback, Meter
    from hfscale.run.results import Results, RunRecord

    clocks, asked = [1755, RuntimeError("NVML: not supported")], []

    def clock_rate(*args):
        clock = clocks[len(asked)]
        asked.append(clock)
        if isinstance(clock, Exception):
            raise clock
        return clock

    monkeypatch.setattr(torch.cuda, "clock_rate", clock_rate)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    histories = {}
    for on_gpu in (True, False):
        meter = Meter(route_plan("ddp", on_gpu, world=1, per_node=1), token_budget=1e9, peak_tflops=None,
                      warmup_steps=1)
        record = RunRecord(tmp_path, Results(), False)
        callback = MeasureCallback(meter, record, None, True)
        for step in ((5, 10) if on_gpu else (5,)):
            callback.on_log(args, TrainerState(global_step=step), TrainerControl(), logs={"perf/s_per_iter": 0.1})
        histories[on_gpu] = record.results.perf_history
    assert histories[True] == [{"step": 5, "s_per_iter": 0.1, "sm_mhz": 1755}, {"step": 10, "s_per_iter": 0.1}]
    assert histories[False] == [{"step": 5, "s_per_iter": 0.1}] and len(asked) == 2  # the CPU route never asks


def test_the_precision_recorded_is_the_one_the_run_computes_in(gpus, monkeypatch):
    """--torch_compile on Ampere+ makes transformers switch TF32 on (training_args.py: enable_tf32(True) when
    torch_compile and no precision flag), and ACCELERATE_MIXED_PRECISION from a user's accelerate config turns autocast
    on; recording fp32 for either would divide by the fp32 peak and report an MFU several times too high."""
    import torch

    from hfscale.parallel.distributed import tf32_matmuls
    from hfscale.runplan import compute_precision

    assert compute_precision(False, False, "bf16", None, False) == "bf16"  # the environment's autocast
    assert compute_precision(False, False, "no", None, True) == "tf32"  # torch_compile's TF32
    assert compute_precision(False, False, "no", None, False) == "fp32"
    assert compute_precision(True, False, "no", None, True) == "bf16"
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"  # what transformers' enable_tf32 does on torch >= 2.9
        assert tf32_matmuls(on_cuda=True) and not tf32_matmuls(on_cuda=False)  # a CPU never computes in TF32
    finally:
        matmul.fp32_precision = before
    assert not tf32_matmuls(on_cuda=True)


def test_inductor_autotuning_reads_the_precision_transformers_set():
    """transformers turns TF32 on through torch.backends.fp32_precision (the new API); torch then refuses the legacy
    getter that inductor's autotuning cache reads, and --torch_compile_mode max-autotune-no-cudagraphs failed at the
    first compiled step on an H100 (2026-11-27). Restated, the getter answers and the setting is unchanged."""
    import torch
    from torch._inductor.codecache import PersistentCache

    from hfscale.parallel.distributed import restate_matmul_precision

    backends = torch.backends
    every = (backends, backends.cudnn, backends.mkldnn, backends.cuda.matmul, backends.cudnn.conv, backends.cudnn.rnn,
             backends.mkldnn.matmul, backends.mkldnn.conv, backends.mkldnn.rnn)  # parents first: they set their leaves
    kept, legacy = [(b, b.fp32_precision) for b in every], torch.get_float32_matmul_precision()
    try:
        backends.fp32_precision = "tf32"  # transformers' enable_tf32(True) on torch >= 2.9
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            PersistentCache().lookup([], "mm", "inputs", None)  # inductor's autotuning cache, as it failed
        restate_matmul_precision()
        assert PersistentCache().lookup([], "mm", "inputs", None) == {}
        assert torch.get_float32_matmul_precision() == "high"
        assert {b.fp32_precision for b in every} == {"tf32"}  # what torch computes in is unchanged
        restate_matmul_precision()  # readable already: nothing to do
        assert torch.get_float32_matmul_precision() == "high"
    finally:  # the legacy getter's answer too, then every backend's own setting
        torch.set_float32_matmul_precision(legacy)
        for backend, precision in kept:
            backend.fp32_precision = precision
    assert [b.fp32_precision for b in every] == [p for _, p in kept]
    assert torch.get_float32_matmul_precision() == legacy


def test_optimizer_states_are_checked_after_the_first_step_that_ran(monkeypatch):
    """fp16 with dynamic loss scaling skips the first steps as overflows (DeepSpeed starts at 2^16): no states exist
    after step 1, and checking them there refused correct offload, 8-bit and Adafactor runs."""
    from types import SimpleNamespace

    import torch

    from hfscale.parallel.verify import StrategyMismatch
    from hfscale.run.callbacks import MAX_SKIPPED_STEPS, StrategyCallback

    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.AdamW([param])
    plan = route_plan("zero2", True, world=1, per_node=1)
    trainer = SimpleNamespace(optimizer=optimizer, plan=plan, powersgd_state=None)
    callback = StrategyCallback(trainer, total_params=4, powersgd=None, record=None)
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
                                             plan=plan, powersgd_state=None),
                             total_params=2, powersgd=None, record=None)
    with pytest.raises(StrategyMismatch, match="has not stepped"):
        stuck.on_step_end(None, SimpleNamespace(global_step=MAX_SKIPPED_STEPS), None)


def test_hsdp_mesh_reaches_accelerate_on_the_gpu_route_and_hfscale_on_the_cpu_route(gpus, monkeypatch):
    """GPU: the TrainingArguments get ParallelismConfig(dp_replicate=nodes, dp_shard=per node), which accelerate
    builds the 2-D mesh from. CPU: accelerate raises on a ParallelismConfig in a MULTI_CPU state, so the launcher's
    ACCELERATE_USE_PARALLELISM_CONFIG is dropped and hooks.force_fsdp_state sets the mesh (tests/test_multinode.py)."""
    from hfscale.parallel.distributed import setup_processes

    for var, value in (("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "8"), ("LOCAL_RANK", "0"), ("DS_ACCELERATOR", ""),
                       ("ACCELERATE_USE_PARALLELISM_CONFIG", "true"), ("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2"),
                       ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "8")):
        monkeypatch.setenv(var, value)  # restored after the test; no process group is started here
    gpus(8)
    config = setup_processes(route_plan("fsdp_hybrid", True, world=16, per_node=8))["parallelism_config"]
    assert (config.dp_replicate_size, config.dp_shard_size) == (2, 8) and config.dp_replicate_enabled
    assert os.environ["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"  # the GPU route leaves the launcher's choice
    assert setup_processes(route_plan("fsdp_hybrid", False, world=16, per_node=8)) == {}
    assert "ACCELERATE_USE_PARALLELISM_CONFIG" not in os.environ


def test_hfscales_barriers_name_their_gpu(monkeypatch):
    """NCCL's barrier() guesses the device (and warns at every call) unless it is given device_ids: hfscale's own
    barriers (the end of a run, each checkpoint save) pass the GPU this rank drives; gloo's take none."""
    import torch
    import torch.distributed as dist

    from hfscale.parallel.distributed import barrier

    calls = []
    monkeypatch.setattr(dist, "barrier", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for backend in ("nccl", "gloo"):
        monkeypatch.setattr(dist, "get_backend", lambda backend=backend: backend)
        barrier()
    assert calls == [{"device_ids": [3]}, {}]


@pytest.mark.parametrize("backend,own_group", [("nccl", True), ("gloo", False), ("cpu:gloo,cuda:nccl", False)])
def test_the_stop_signal_is_agreed_on_over_the_host_on_both_routes(backend, own_group, monkeypatch):
    """SIGUSR1's agreement (run/stopping.py) all-reduces a host number: over the world group where it carries host
    tensors (gloo: the CPU route, FSDP2's cpu:gloo,cuda:nccl), over a gloo group of its own under NCCL, never a device
    tensor (a read of one would make the GPU wait). One stop at the first logging step after the signal, on every
    rank; none at the step --count_collectives records."""
    import signal as signals

    import torch.distributed as dist
    from transformers import TrainerControl, TrainerState

    from hfscale.run import stopping

    made, reduced = [], []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda: backend)
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: made.append(kwargs) or "host group")
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op, group: reduced.append((tensor.device.type, group)))
    stopper = stopping.StopOnSignal(counted_step=4)
    state, control = TrainerState(), TrainerControl()
    stopper.on_train_begin(None, state, control)
    assert made == ([{"backend": "gloo"}] if own_group else [])
    previous = signals.getsignal(signals.SIGUSR1)
    stopper.install()
    try:
        signals.raise_signal(signals.SIGUSR1)
    finally:
        stopper.uninstall()
    assert signals.getsignal(signals.SIGUSR1) == previous
    for step, should_log in ((3, False), (4, True), (5, True)):
        state.global_step, control.should_log = step, should_log
        stopper.on_step_end(None, state, control)
        assert control.should_training_stop == (step == 5) and control.should_save == (step == 5), step
    stopper.on_epoch_end(None, state, control)  # step 5 ends the epoch too: one agreement per step
    assert reduced == [("cpu", "host group" if own_group else dist.group.WORLD)] and stopper.stopped_at == 5


def test_the_console_line_is_short_and_the_full_set_goes_to_the_record():
    """14 perf/* keys printed at every logging step could not be read: the console shows loss, lr, grad norm,
    tokens/s, TFLOPs/GPU, MFU and memory; the end-of-training metrics line is printed as the Trainer made it."""
    from hfscale.run.trainer import console_logs

    logs = {"loss": 7.1, "grad_norm": 1.2, "learning_rate": 1e-3, "epoch": 0.5, "tokens": 512, "elapsed_s": 1.0,
            "perf/s_per_iter": 0.1, "perf/tokens_per_s": 5120.0, "perf/tokens_per_s_per_gpu": 2560.0,
            "perf/samples_per_s": 80.0, "perf/tflops_per_gpu": 1.5, "perf/tflops_per_gpu_hardware": 1.6,
            "perf/tflops_per_gpu_bigscience": 1.4, "perf/mfu": 0.4, "perf/hfu": 0.42, "perf/days_to_budget": 226.0,
            "perf/gpu_days_to_budget": 452.0, "memory/step_peak_gb": 3.2, "memory/step_delta_gb": 1.1}
    assert console_logs(logs) == {"loss": 7.1, "grad_norm": 1.2, "lr": 1e-3, "tokens_per_s": 5120.0,
                                  "tflops_per_gpu": 1.5, "mfu": 0.4, "mem_gb": 3.2, "epoch": 0.5}
    final = {"train_runtime": 3.0, "train_loss": 7.0}
    assert console_logs(final) == final


def test_ddp_compiles_by_default_on_a_gpu_and_says_how_to_turn_it_off(gpus, monkeypatch):
    """torch.compile was measured to pay for ddp on an H100 (1.9x the tokens/s): on by default there, off on a CPU,
    off when the user says so, and off for strategies no GPU session has measured compiled yet."""
    from hfscale.run.summary import format_summary
    from hfscale.run.results import Results
    from hfscale.train import check_args

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    gpus(1)
    assert check_args([])[2]["torch_compile"] and check_args([])[3].plan.torch_compile
    assert not check_args(["--torch_compile", "false"])[2]["torch_compile"]
    assert not check_args(["--strategy", "zero1"])[2]["torch_compile"]
    assert not check_args(["--use_cpu"])[2]["torch_compile"]
    results = Results.from_dict({"status": "ok", "run_name": "r", "model": {"name": "tiny", "params_model": 1e6},
                                 "config": {"world_size": 1, "torch_compile": True, "token_budget": 1e11},
                                 "environment": {"device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}})
    assert "compiled (--torch_compile false for eager)" in format_summary(results)


def test_a_run_with_no_timed_step_says_why():
    """A run no longer than its untimed warm-up (--max_steps 2 at the default 2) has no speed: the summary says so
    and how to time every step, rather than a bare "n/a over 0 steps"."""
    from hfscale.run.results import Results
    from hfscale.run.summary import format_summary

    results = Results.from_dict({"status": "ok", "run_name": "r", "model": {"name": "tiny", "params_model": 1e6},
                                 "config": {"world_size": 1, "token_budget": 1e11},
                                 "perf": {"measured_steps": 0, "warmup_steps": 2}})
    assert "over 0 steps (none after the 2 untimed: --perf_warmup_steps 0 times every step)" in format_summary(results)


def test_a_compile_mode_or_backend_alone_compiles_and_the_plan_says_so():
    """transformers compiles whenever --torch_compile_mode or --torch_compile_backend is named: the plan (estimate,
    summary, results) must say compiled too - before, a run said "eager" while its start-up proof found it compiled."""
    from hfscale.train import check_args

    for named in (["--torch_compile_mode", "default"], ["--torch_compile_backend", "aot_eager"]):
        _, _, training, state = check_args(["--use_cpu", *named])
        assert training["torch_compile"] and state.plan.torch_compile, named
    assert not check_args(["--use_cpu"])[3].plan.torch_compile


def test_a_gpu_run_leaves_more_first_steps_untimed_unless_told(gpus, monkeypatch):
    """On a GPU steps 3-5 paid a one-off cost in every run measured (one H200): the GPU route leaves 5 steps untimed,
    half of a run shorter than 10, at least 2; the CPU route and the user's --perf_warmup_steps are untouched."""
    from hfscale.train import check_args

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    gpus(1)
    warmup = lambda *flags: check_args(["--max_steps", *flags])[2]["perf_warmup_steps"]  # noqa: E731
    assert [warmup("20"), warmup("8"), warmup("5"), warmup("3")] == [5, 4, 2, 2]
    assert warmup("20", "--perf_warmup_steps", "3") == 3 and warmup("20", "--perf_warmup_steps", "0") == 0
    assert warmup("20", "--use_cpu") == 2
    gpus(0)
    assert warmup("20") == 2


def test_a_powersgd_run_times_only_the_steps_it_compressed(monkeypatch):
    """PowerSGD's hook all-reduces uncompressed for its first max(--powersgd_warmup_steps, 2) steps (torch's
    start_powerSGD_iter): those stay untimed on either route, so a ddp_powersgd run reports PowerSGD's speed, not
    DDP's or a mix of the two (the published run held out of docs/project.md's record was timed across that switch).
    The user's --perf_warmup_steps still wins."""
    from hfscale.train import check_args

    monkeypatch.setenv("WORLD_SIZE", "2")
    warmup = lambda strategy, *flags: check_args(  # noqa: E731
        ["--strategy", strategy, "--use_cpu", "--max_steps", "30", *flags])[2]["perf_warmup_steps"]
    assert warmup("ddp_powersgd") == 10  # strategies/ddp_powersgd.yaml's warm-up
    assert warmup("ddp_powersgd", "--powersgd_warmup_steps", "4") == 4
    assert warmup("ddp_powersgd", "--powersgd_warmup_steps", "0") == 2  # torch compresses from step 3 at the earliest
    assert warmup("ddp_powersgd", "--powersgd_warmup_steps", "4", "--perf_warmup_steps", "1") == 1
    assert warmup("ddp") == 2


def test_the_tp_mesh_reaches_accelerate_the_same_way_on_both_routes(gpus, monkeypatch):
    """tp / fsdp_tp: no ParallelismConfig goes to the TrainingArguments on either route (the launcher's is dropped once
    checked); after the accelerator exists, hooks.use_tensor_parallel_state gives it the mesh the model was split on -
    all of it for tp (so accelerate leaves the model unwrapped), the data-parallel part for fsdp_tp (so accelerate's
    FSDP2 TP preparation, broken against transformers 5, never runs) - whatever sizes the launcher exported."""
    from types import SimpleNamespace

    from accelerate.parallelism_config import ParallelismConfig

    from hfscale.parallel.distributed import setup_processes
    from hfscale.parallel.hooks import use_tensor_parallel_state

    for var, value in (("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "8"), ("LOCAL_RANK", "0"), ("DS_ACCELERATOR", ""),
                       ("ACCELERATE_USE_PARALLELISM_CONFIG", "true"), ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2"),
                       ("PARALLELISM_CONFIG_TP_SIZE", "8")):
        monkeypatch.setenv(var, value)  # restored after the test; no process group is started here
    gpus(8)
    for on_cuda in (True, False):
        monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
        assert "parallelism_config" not in setup_processes(route_plan("fsdp_tp", on_cuda, world=16, per_node=8))
        assert "ACCELERATE_USE_PARALLELISM_CONFIG" not in os.environ
    mesh = object()  # stands for the (dp_shard, tp) device mesh distributed.tensor_parallel_config builds
    for dp_shard, want_tp in ((2, 1), (1, 8)):  # fsdp_tp on 2 nodes of 8; tp on one node of 8
        config = ParallelismConfig(dp_replicate_size=1, dp_shard_size=dp_shard, tp_size=8, cp_size=1, sp_size=1)
        config.device_mesh = mesh
        accelerator, model = SimpleNamespace(state=SimpleNamespace()), SimpleNamespace()
        use_tensor_parallel_state(accelerator, config, model)
        given = accelerator.state.parallelism_config
        assert (given.dp_shard_size, given.tp_size) == (dp_shard, want_tp) and given.device_mesh is mesh
        assert accelerator.state.device_mesh is mesh and model._tp_size == 8


def _bump(tensor):
    return tensor.add_(1.0)


def test_an_optimizer_step_compiles_on_the_gpu_route_or_when_asked():
    """torchao's AdamW8bit torch.compiles its step: kept on the GPU route and under --torch_compile; otherwise, on
    the CPU route, the step runs eagerly (`parallel/distributed.eager_optimizer_step`, from
    `HfscaleTrainer.create_optimizer`), with the same result."""
    from types import SimpleNamespace

    import torch

    from hfscale.parallel.distributed import eager_optimizer_step

    compiles = []

    def backend(graph, example_inputs):
        compiles.append(graph)
        return graph.forward

    try:
        for on_cuda, torch_compile, expected_compiles in ((True, False, 1), (False, True, 1), (False, False, 0)):
            torch._dynamo.reset()
            compiles.clear()
            param = torch.zeros(3)
            optimizer = SimpleNamespace(step=lambda: torch.compile(_bump, backend=backend, fullgraph=True)(param))
            assert eager_optimizer_step(optimizer, on_cuda, torch_compile) is not expected_compiles
            assert eager_optimizer_step(optimizer, on_cuda, torch_compile) is False  # wrapped once at most
            optimizer.step()
            assert len(compiles) == expected_compiles and param.tolist() == [1.0, 1.0, 1.0]
        assert eager_optimizer_step(SimpleNamespace(), False, False) is False  # a DeepSpeed JSON's (DummyOptim)
    finally:
        torch._dynamo.reset()


def test_the_trainer_loop_makes_no_host_sync_per_micro_batch_on_either_route(gpus, monkeypatch):
    """Two Trainer defaults stop a GPU host at every micro-batch (hfscale/run/host_syncs.py): the NaN filter reads each
    loss, and accelerate copies each batch with a blocking copy (a stream synchronize). hfscale turns the filter off on
    both routes and makes the copies non-blocking on the GPU route, where pinned memory backs them; the CPU route
    copies nothing and pins nothing, so its accelerate settings stay the Trainer's (no warning about the pair). The
    user's own flags win."""
    from hfscale.run.args import build_training_arguments
    from hfscale.train import check_args

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for visible in (1, 0):
        gpus(visible)
        kw = check_args([])[2]
        assert kw["logging_nan_inf_filter"] is False
        assert kw["accelerator_config"] == ({"non_blocking": True} if visible else None)
        assert kw["dataloader_pin_memory"]  # non-blocking copies come from pinned memory
        mine = check_args(["--logging_nan_inf_filter", "true", "--accelerator_config", '{"non_blocking": false}'])[2]
        assert mine["logging_nan_inf_filter"] is True
        assert mine["accelerator_config"] == ({"non_blocking": False} if visible else '{"non_blocking": false}')
        # other accelerate settings keep the GPU route's non-blocking copies
        other = check_args(["--accelerator_config", '{"split_batches": false}'])[2]["accelerator_config"]
        assert other == ({"non_blocking": True, "split_batches": False} if visible else '{"split_batches": false}')
    args = build_training_arguments({**kw, "output_dir": None})  # the CPU route's (a faked GPU cannot be built on)
    assert not args.accelerator_config.non_blocking and not args.logging_nan_inf_filter and not args.dataloader_pin_memory


def test_the_host_memory_refusal_counts_what_each_route_keeps_in_host_ram():
    """A CPU node holds every model state of its processes, and their steps' activations; a GPU node only the
    offloaded states. The refusal fires exactly where those exceed the host's RAM - the activations counted less the
    estimate's error, so that a run the estimate merely doubts still starts."""
    import math

    from hfscale.run.planning import STEP_PEAK_ERROR, check_host_memory

    cpu, gpu, offload = route_plan("ddp", False), route_plan("ddp", True), route_plan("zero3_offload", True)
    mem = cpu.memory()
    states = mem.model_states  # ddp: nothing offloaded, all on the "device"
    assert cpu.host_states_per_node(mem) == 2 * states and gpu.host_states_per_node(gpu.memory()) == 0
    off = offload.memory()
    assert off.host_offload > 0 and offload.host_states_per_node(off) == 2 * off.host_offload
    steps = cpu.host_step_peaks_per_node(mem)
    assert steps == 2 * mem.step_peak > 0 and gpu.host_step_peaks_per_node(gpu.memory()) == 0
    least = math.ceil(2 * states + steps / (1 + STEP_PEAK_ERROR))
    check_host_memory(cpu, least)  # just fits
    with pytest.raises(HfscaleError, match="the model states and the steps' activations need at least .* GB on this "
                                           "CPU node .* lower --per_device_train_batch_size"):
        check_host_memory(cpu, least - 1)
    with pytest.raises(HfscaleError, match="the model states alone need .* GB on this CPU node"):
        check_host_memory(cpu, 2 * states - 1)
    check_host_memory(gpu, 1)  # a GPU run without offload keeps no states in host RAM
    with pytest.raises(HfscaleError, match="GB in host memory"):
        check_host_memory(offload, 2 * off.host_offload - 1)
