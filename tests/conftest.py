"""Helpers shared by the tests: run hfscale as real subprocesses (as a user would), on CPU, on a free port."""

import atexit
import contextlib
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (derandomize: each test's seed comes from its name) and keep no
# example database between runs, so a test passes or fails for its code, never for its draw. A hunt under fresh
# draws: HYPOTHESIS_PROFILE=stress pytest tests/test_fuzz_args.py --hypothesis-seed N (docs/verification.md).
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("stress", derandomize=False, database=None, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The suite is the same on a GPU host as on a CPU one: every run it launches, and every decision made in this process,
# takes the CPU route (set before torch is imported). The GPU route is tested with a faked device
# (tests/test_gpu_route.py); real GPU figures come from benchmarks/gpu_suite.py.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

# Nothing reaches the Hub: these machines have no route to it, and a name the Hub would be asked about (a fuzzed
# --model_name_or_path) waited out huggingface_hub's retries, about 23 s each (71 s of test_fuzz_args once a test
# before it had imported huggingface_hub without this; its own setenv came too late, the library reads it at import).
# Set before anything imports huggingface_hub, and inherited by every run; tests/test_hub.py turns it off for its own.
os.environ["HF_HUB_OFFLINE"] = "1"

# One fresh folder per test session, made by the first process (pytest, or pytest-xdist's controller) and inherited
# by its workers: the data cache, set before hfscale is imported - no test passes on tokenizers or packed blocks an
# older checkout built (~/.cache/hfscale is left alone), and within the session the runs share it, as a user's do -
# and the runs several tests read (shared_run). No test times this machine: speed is measured by benchmarks/, whose
# recorded measurements the tests replay.
if "HFSCALE_TEST_SESSION_DIR" not in os.environ:
    os.environ["HFSCALE_TEST_SESSION_DIR"] = tempfile.mkdtemp(prefix="hfscale-test-session-")
    atexit.register(shutil.rmtree, os.environ["HFSCALE_TEST_SESSION_DIR"], ignore_errors=True)
SESSION_DIR = Path(os.environ["HFSCALE_TEST_SESSION_DIR"])
os.environ["HFSCALE_CACHE_DIR"] = str(SESSION_DIR / "cache")

from hfscale.launching import launch_command  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# Small enough for 2 cores: a 2-layer GPT-2, 64-token blocks, 4 samples per rank.
TINY = ["--model", "tiny", "--seq_len", "64", "--per_device_train_batch_size", "4", "--save_strategy", "no",
        "--learning_rate", "1e-3", "--logging_steps", "1"]


def env() -> dict:
    e = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    e.pop("WORLD_SIZE", None)
    return e


def run(cmd: list[str], timeout: int = 420, cwd: Path = REPO, environ: dict | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run` of a command and everything it starts: in its own session, whose every process is killed if
    the command outlives `timeout` (a failure naming it) or the test is interrupted (pytest-timeout, Ctrl-C). A
    launcher killed alone would leave its ranks running, holding the output pipes (communicate waits for them) and,
    mid-build, torch's extension lock."""
    started, cpu = time.monotonic(), _children_cpu_s()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env() if environ is None else environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout} s: {' '.join(map(str, cmd))}\n{out[-2000:]}\n{err[-3000:]}")
    except BaseException:
        _kill_session(proc)
        raise
    _log_launch(cmd, time.monotonic() - started, _children_cpu_s() - cpu)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every waited-for descendant: launcher, ranks, compilers
    return usage.ru_utime + usage.ru_stime


def _log_launch(cmd: list, wall_s: float, cpu_s: float) -> None:
    """With HFSCALE_TEST_LAUNCHES=FILE, one JSON line per launch (the test, wall and CPU seconds, the command): where
    the suite's time goes, which is launches (docs/verification.md). A worker runs one launch at a time, so the CPU
    its children used meanwhile is the launch's."""
    path = os.environ.get("HFSCALE_TEST_LAUNCHES")
    if path:
        with open(path, "a") as log:  # append mode, one write per line: the two workers cannot interleave
            log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST"), "wall_s": round(wall_s, 2),
                                  "cpu_s": round(cpu_s, 2), "cmd": " ".join(map(str, cmd))}) + "\n")


def _kill_session(proc: subprocess.Popen) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def probe(name: str, *args: str) -> dict:
    """Run tests/probes/<name>.py in its own gloo world and return its JSON. Its port, appended, is 0: the probe's store
    (a one-process world's own, or the one a multi-process probe serves to its workers before starting them) binds a
    port the kernel picks as it binds."""
    proc = run([sys.executable, str(REPO / "tests" / "probes" / f"{name}.py"), *args, "0"], timeout=300,
               environ={**env(), "DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the folder is not a package): its functions, without running its main."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path  # a script puts the repository first on the path, for when it runs on its own
    return module


accelerate_launch = launch_command  # plain `accelerate launch --multi_gpu` (no config), as the README starts a run


def train(out: Path, strategy: str | None, *extra: str, nproc: int = 2, steps: int = 4, config_file=None,
          hfscale_launch: bool = False) -> dict:
    """One real training run; returns its results.json (asserting it succeeded). With hfscale_launch, through
    `hfscale launch` started outside the repository (the shipped configs must be found from anywhere)."""
    cmd, cwd = train_command(out, strategy, *extra, nproc=nproc, steps=steps, config_file=config_file,
                             hfscale_launch=hfscale_launch)
    proc = run(cmd, cwd=cwd)
    assert proc.returncode == 0, f"run failed ({strategy}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok"
    results["_stdout"], results["_stderr"] = proc.stdout, proc.stderr
    return results


def train_command(out: Path, strategy: str | None, *extra: str, nproc: int = 2, steps: int = 4, config_file=None,
                  hfscale_launch: bool = False) -> tuple[list[str], Path]:
    """(command, working directory) of `train`'s run."""
    args = [*TINY, "--max_steps", str(steps), "--output_dir", str(out), *extra]
    if strategy:
        args = ["--strategy", strategy, *args]
    if hfscale_launch:
        return [sys.executable, "-m", "hfscale", "launch", "--num_processes", str(nproc), *args], out.parent
    return accelerate_launch(args, nproc, config_file), REPO


def run_and_kill(cmd: list[str], cwd: Path, kill_at_step: int, stop: bool = False) -> str:
    """Start a training run and SIGKILL its whole process tree once rank 0 has logged `kill_at_step` losses, as a node
    failure would (stop: send every process SIGUSR1 instead, as SLURM warns a job step, and let the run end). Returns
    what it printed."""
    import signal

    import psutil

    from hfscale.run.outcome import kill_tree

    proc = subprocess.Popen(cmd, cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    logged, deadline, seen = 0, time.time() + 300, []
    for line in proc.stdout:
        seen.append(line)
        logged += "{'loss'" in line  # a progress bar can share the line
        if logged >= kill_at_step or time.time() > deadline:
            break
    if stop:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for process in tree:
            process.send_signal(signal.SIGUSR1)
        seen += proc.stdout.readlines()
        assert proc.wait(timeout=120) == 0, "".join(seen[-40:])
    else:
        kill_tree(proc.pid, grace_s=0)
        proc.wait(timeout=60)
    assert logged >= kill_at_step, f"the run ended before step {kill_at_step}:\n{''.join(seen[-30:])}"
    return "".join(seen)


def assert_figures_count_the_loaders(res: dict) -> None:
    """A run's figures against what its data loaders really handed out: the tokens of one rank per tensor-parallel
    group (torch's own mesh coordinate), summed and divided by the optimizer steps, are the tokens of a step - which
    tokens/s x s/it must equal, and the results' DP must count those groups. The plan is not asked."""
    fed, perf = res["tokens_fed"], res["perf"]
    groups = [tokens for tokens, tp_rank in zip(fed["per_rank"], fed["tp_rank"]) if tp_rank == 0]
    per_step = sum(groups) / fed["steps"]
    assert perf["tokens_per_s"] * perf["s_per_iter"] == pytest.approx(per_step, rel=1e-9), (perf, fed)
    assert perf["tokens_per_step"] == per_step and perf["samples_per_s"] * perf["s_per_iter"] == pytest.approx(
        per_step / res["config"]["seq_len"], rel=1e-9)
    config = res["config"]
    assert config["dp"] == len(groups) and config["dp"] * config["tp"] == config["world_size"]
    assert perf["tokens_per_s_per_gpu"] * res["config"]["world_size"] == pytest.approx(perf["tokens_per_s"], rel=1e-9)


def assert_trains_as(res: dict, ref: dict, steps: int) -> None:
    """The same model as `ref` (ddp's run of the same 8 samples a step): losses, gradient norms and final weights
    within 1e-4 over `steps` fp32 steps, and the reference learned (not two untrained copies agreeing)."""
    losses = [h["loss"] for h in ref["loss_history"]]
    assert len(res["loss_history"]) == len(losses) == steps
    for key in ("loss", "grad_norm"):
        got, want = [h[key] for h in res["loss_history"]], [h[key] for h in ref["loss_history"]]
        assert max(abs(a - b) / b for a, b in zip(got, want)) <= 1e-4, (key, got, want)
    assert res["final_weights"].keys() == ref["final_weights"].keys()
    for name, (ref_sum, ref_l1, ref_l2) in ref["final_weights"].items():
        total, l1, l2 = res["final_weights"][name]
        assert abs(total - ref_sum) / ref_l1 <= 1e-4 and abs(l1 - ref_l1) / ref_l1 <= 1e-4, name
        assert abs(l2 - ref_l2) / ref_l2 <= 1e-4, name
    assert losses[-1] < losses[0] - 0.05


# ---- runs several tests read, in any worker ---------------------------------------------------------------------------

def shared_run(key: str, make, recipe=None) -> dict:
    """A run that several tests read, made once per session by whichever test (in whichever pytest-xdist worker) asks
    first - a test asking meanwhile waits for it - and kept under the session folder: `make(folder)` makes it and
    returns what the readers get (JSON-serialisable: results, logs). A `make` that fails leaves nothing behind, so the
    next test asking tries again (and fails the same way).

    `recipe` (JSON-serialisable) says what `make` runs: a key names one run, so a caller asking for the same key with
    another recipe fails whatever the order the tests ran in - otherwise whichever asked first would decide, for
    every reader, how the run was made (the run's length, its flags), and a check could pass or fail by scheduling."""
    import fcntl

    folder = SESSION_DIR / "shared-runs"
    folder.mkdir(exist_ok=True)
    done = folder / f"{key}.json"
    asked = json.loads(json.dumps(recipe, default=str))
    with open(folder / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            made = make(folder / key)
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps({"recipe": asked, "made": made}))
            tmp.replace(done)
        stored = json.loads(done.read_text())
    assert stored["recipe"] == asked, f"shared run {key!r} was made as {stored['recipe']}, not as asked: {asked}"
    return stored["made"]


def shared_train(key: str, strategy, *extra, **kw) -> dict:
    """`train` as a shared run: its results (with the launch's _stdout/_stderr) under `key`."""
    import inspect

    call = inspect.signature(train).bind(None, strategy, *extra, **kw)
    call.apply_defaults()  # a step count given or left to its default names the same run
    return shared_run(key, lambda folder: train(folder, strategy, *extra, **kw),
                      recipe={name: value for name, value in call.arguments.items() if name != "out"})


# Every strategy in bf16, 20 steps, with gradient accumulation, activation checkpointing, checkpoints every
# BF16_SAVE_STEPS, per-batch digests and step 3's collectives counted (test_communication.py): these runs prove bf16
# reaches every engine (test_multiprocess.py) and are the
# uninterrupted references of the fault tests (test_faults.py), which kill and resume the same command. MBS 2 x GAS 2
# steps the same 4 samples per rank as the fp32 parity runs' MBS 4, so their curves can be compared too.
PARITY_STEPS = 20
BF16_SAVE_STEPS = 4
BF16_COMMON = ["--bf16", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
               "--activation_checkpointing", "--save_strategy", "steps", "--save_steps", str(BF16_SAVE_STEPS),
               "--record_batches", "--fingerprint_weights", "--include_num_input_tokens_seen", "true",
               "--count_collectives", "3"]  # step 3: after DDP's bucket rebuild (a broadcast, at step 2)
# strategy -> (run key, --strategy (None: from the launcher config), extra flags, launched how)
BF16_RUNS = {"ddp": ("ddp-bf16", "ddp", []), "fsdp": ("fsdp-bf16", "fsdp", []), "zero1": ("zero1-bf16", "zero1", []),
             "zero3": ("zero3-bf16", "zero3", []),
             "zero2_offload": ("zero2_offload", "zero2_offload", []), "zero3_offload": ("zero3_offload", "zero3_offload", []),
             "fsdp_offload": ("fsdp_offload", "fsdp_offload", []),
             "ddp_powersgd": ("powersgd", "ddp_powersgd", ["--powersgd_warmup_steps", "3", "--powersgd_rank", "2"]),
             "zero2": ("cfg-zero2", None, [])}  # zero2 from the launcher config alone (accelerate_configs/zero2.yaml)


def bf16_args(strategy: str, output_dir: Path) -> list[str]:
    """The training flags of a strategy's bf16 run (TINY first: the later flags win)."""
    _, name, extra = BF16_RUNS[strategy]
    return [*(["--strategy", name] if name else []), *TINY, *BF16_COMMON, *extra, "--max_steps", str(PARITY_STEPS),
            "--output_dir", str(output_dir)]


def bf16_config_file(strategy: str) -> str | None:
    return str(REPO / "accelerate_configs" / "zero2.yaml") if BF16_RUNS[strategy][1] is None else None


def bf16_command(strategy: str, output_dir: Path, *extra: str) -> tuple[list[str], Path]:
    """(command, working directory) of a strategy's bf16 run, as its reference was launched: zero1 through `hfscale
    launch` started outside the repository, zero2 from its launcher config alone, the others by `accelerate launch`."""
    args = [*bf16_args(strategy, output_dir), *extra]
    if strategy == "zero1":
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        return [sys.executable, "-m", "hfscale", "launch", "--num_processes", "2", *args], output_dir.parent
    return launch_command(args, 2, bf16_config_file(strategy)), REPO


def bf16_result(strategy: str) -> dict:
    key, name, _ = BF16_RUNS[strategy]

    def make(folder):
        cmd, cwd = bf16_command(strategy, folder)
        proc = run(cmd, cwd=cwd)
        assert proc.returncode == 0, f"run failed ({strategy} bf16):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        results = json.loads((folder / "results.json").read_text())
        assert results["status"] == "ok"
        return {**results, "_stdout": proc.stdout, "_stderr": proc.stderr}

    return shared_run(key, make)


# accelerate's gradient_accumulation_kwargs.sync_each_batch, as a run takes it
SYNC_EACH_BATCH = ["--accelerator_config", '{"gradient_accumulation_kwargs": {"sync_each_batch": true}}']


def fsdp_sync_result() -> dict:
    """fsdp's bf16 run (its flags and launch) reducing every micro-batch's gradients (SYNC_EACH_BATCH)."""
    def make(folder):
        cmd, cwd = bf16_command("fsdp", folder, *SYNC_EACH_BATCH)
        proc = run(cmd, cwd=cwd)
        assert proc.returncode == 0, f"fsdp, sync_each_batch:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        results = json.loads((folder / "results.json").read_text())
        assert results["status"] == "ok"
        return results

    return shared_run("fsdp-bf16-sync", make)


def parity_runs() -> dict:
    """One `hfscale parity` over the sharded strategies (it runs ddp as the reference), fp32, 20 steps, every step
    logged, final weights gathered: {"proc": {returncode, stdout, stderr}, "report": parity.json, "runs": {strategy:
    results}}. The CI parity check, and the fp32 reference of several others."""
    def make(folder):
        fixed = [a for i, a in enumerate(TINY) if "--logging_steps" not in (a, TINY[i - 1])]
        fixed += ["--include_num_input_tokens_seen", "true"]  # the Trainer's own token count, for the tokens/s check
        proc = run([sys.executable, "-m", "hfscale", "parity", "--strategy", ",".join(PARITY_STRATEGIES), "--max_steps",
                    str(PARITY_STEPS), "--num_processes", "2", "--out", str(folder), "--", *fixed], timeout=1500)
        assert (folder / "parity.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
        runs = {s: launched_run(folder / s) for s in ["ddp", *PARITY_STRATEGIES]}
        return {"proc": {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr},
                "report": json.loads((folder / "parity.json").read_text()), "runs": runs, "folder": str(folder)}

    return shared_run("parity", make)


PARITY_STRATEGIES = ["zero1", "zero2", "zero3", "fsdp"]

# The Llama family's runs: ddp (the reference), ZeRO-3 and FSDP2 (the two engines that shard the model itself) through
# `hfscale parity`, and tp (its grouped-query heads split) at the same 8 samples a step, saving its last step
LLAMA = ["--model", "tiny-llama", *TINY[2:]]
LLAMA_STRATEGIES = ["zero3", "fsdp_offload"]  # FSDP2 with its CPU offload policy; plain fsdp: test_multiprocess


def llama_parity() -> dict:
    """`hfscale parity` of zero3 and fsdp_offload against ddp on tiny-llama (GQA, an untied head), fp32, PARITY_STEPS steps,
    weights fingerprinted: {"proc", "report": parity.json, "runs": {strategy: results}}."""
    def make(folder):
        fixed = [a for i, a in enumerate(LLAMA) if "--logging_steps" not in (a, LLAMA[i - 1])]
        proc = run([sys.executable, "-m", "hfscale", "parity", "--strategy", ",".join(LLAMA_STRATEGIES), "--max_steps",
                    str(PARITY_STEPS), "--num_processes", "2", "--out", str(folder), "--", *fixed], timeout=900)
        assert (folder / "parity.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
        return {"proc": {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr},
                "report": json.loads((folder / "parity.json").read_text()),
                "runs": {s: launched_run(folder / s) for s in ["ddp", *LLAMA_STRATEGIES]}}

    return shared_run("llama-parity", make)


def llama_pair_run(strategy: str, optim: str, model: str = "tiny-llama") -> dict:
    """A 3-step run of one strategy x optimizer pair on a Llama-shaped tiny model (tests/test_llama.py's LLAMA_PAIRS;
    ddp_powersgd x adafactor on tiny-phi3 and zero1 x adamw_8bit on tiny-smollm3 are also those pairs' runs in the
    strategy x optimizer matrix)."""
    extra = ["--powersgd_warmup_steps", "2"] if strategy == "ddp_powersgd" else []
    key = f"{model.removeprefix('tiny-')}-{strategy}-{optim}"
    return shared_train(key, strategy, "--model", model, "--optim", optim, *extra, steps=3)


def llama_tp_command(out: Path) -> tuple[list[str], Path]:
    """tp on tiny-llama, 2 processes: one TP group at MBS 8 (the 8 samples the parity runs' ddp sees), saving at
    steps TP_SAVE_STEP and PARITY_STEPS (whole HF weights: export and resume read them). TINY's flags, these win."""
    return train_command(out, "tp", "--model", "tiny-llama", "--per_device_train_batch_size", "8", "--save_strategy",
                         "steps", "--save_steps", str(TP_SAVE_STEP), "--fingerprint_weights", steps=PARITY_STEPS)


def llama_tp_run() -> dict:
    """The uninterrupted run of llama_tp_command."""
    def make(folder):
        cmd, cwd = llama_tp_command(folder)
        proc = run(cmd, cwd=cwd)
        assert proc.returncode == 0, f"run failed (tp, tiny-llama):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return {**json.loads((folder / "results.json").read_text()), "_stdout": proc.stdout, "_stderr": proc.stderr}

    return shared_run("llama-tp", make)


# DeepSpeed JIT-compiles its CPU Adam (the offload strategies' optimizer) the first time a process on this machine needs
# it (~1 min on 2 cores), holding torch's build lock - a bare lock file - meanwhile. Left to the runs, a fresh machine
# builds it while the other worker's runs compete for the cores and every offload run waits, and a run killed mid-build
# (a timeout) leaves the lock behind: every later offload run then waits for it forever. So the session's first process
# builds it once, before any test starts; no other process of this session exists yet, so a lock found now is stale.
# The build lives in the environment's own folder (TORCH_EXTENSIONS_DIR, inherited by every run), not in the user's
# ~/.cache/torch_extensions: a build there is another checkout's or another session's, whose lock may be live.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
BUILD_CPU_ADAM = """
import os
from torch.utils import cpp_extension
from deepspeed.accelerator import get_accelerator

builder = get_accelerator().create_op_builder("CPUAdamBuilder")
lock = os.path.join(cpp_extension._get_build_directory(builder.name, verbose=False), "lock")
if os.path.exists(lock):
    print(f"removing a stale build lock left by a killed process: {lock}")
    os.remove(lock)
builder.load(verbose=False)
"""


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller built it
        return
    proc = subprocess.run([sys.executable, "-c", BUILD_CPU_ADAM], env={**env(), "DS_ACCELERATOR": "cpu"},
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise pytest.UsageError(f"DeepSpeed's CPU Adam did not build:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


# Tests that read the same runs go to one worker: the files whose tests all read one set of runs (a module fixture, or
# `shared_run`s that another file may read too). The key is the file; every other test is scheduled on its own (a
# `shared_run` is made once, by whichever worker asks first). (pytest-xdist's own xdist_group marks stopped grouping
# with pytest 9.2, pytest-xdist#1386: this scheduler reads nothing but the test ids.)
SHARED_RUNS = {"test_convergence.py": "convergence", "test_gradient_partitions.py": "gradient_partitions",
               "test_host_memory.py": "host_memory", "test_sweep.py": "sweep", "test_tune.py": "tune"}


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunsScheduling(LoadScopeScheduling):
        """Work units: one per SHARED_RUNS group, one per other test; the units with the most tests go first."""

        def _split_scope(self, nodeid: str) -> str:
            return SHARED_RUNS.get(Path(nodeid.split("::", 1)[0]).name, nodeid)

    return SharedRunsScheduling(config, log)


@contextlib.contextmanager
def restored_environment():
    """os.environ as it was, whatever the code inside sets or removes (libraries included)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        if os.environ != saved:
            os.environ.clear()
            os.environ.update(saved)


@pytest.fixture(autouse=True)
def restore_process_state():
    """Every test leaves the process as it found it: the environment (which every later launch inherits, so a variable
    left behind - say ACCELERATE_USE_FSDP, or FSDP_CPU_RAM_EFFICIENT_LOADING that transformers exports while building
    FSDP TrainingArguments - would silently change every run after it), the working directory, Python's garbage
    collector (enabled, nothing frozen: a training run started in-process sets both), no process group, and no
    torch function mode left entered.
    Restored here for the libraries a test calls as well as for the test itself."""
    import gc

    import torch.distributed as dist

    cwd = os.getcwd()
    collector = gc.isenabled(), gc.get_freeze_count()
    with restored_environment():
        yield
    os.chdir(cwd)
    left = gc.isenabled(), gc.get_freeze_count()
    if left != collector:
        gc.unfreeze()
        gc.enable()
        pytest.fail(f"the test left the garbage collector (enabled, frozen objects) = {left}; it found {collector}")
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("the test left a torch.distributed process group initialized")
    import torch

    modes = torch._C._len_torch_function_stack()  # a TorchFunctionMode (say run/host_syncs.HostReads) left entered
    if modes:
        while torch._C._len_torch_function_stack():
            torch._C._pop_torch_function_stack()
        pytest.fail(f"the test left {modes} torch function mode(s) on the stack")


class ReachedLaunch(AssertionError):
    pass


@pytest.fixture()
def hfscale_cli(monkeypatch):
    """`hfscale ARGV` in this process: the console script's own entry point, exit code and stderr, without paying the
    libraries' import (seconds) for every case. For refusals made before anything starts: a case that gets as far as
    setting up processes or exec'ing accelerate fails here and belongs with the launched cases (`run`). The console
    script's own refusals, as a process: test_bad_input.py."""
    from hfscale.parallel import distributed

    def reached(*args, **kwargs):
        raise ReachedLaunch("got past the up-front checks: launch this case as a real process")

    monkeypatch.setattr(distributed, "setup_processes", reached)
    monkeypatch.setattr(os, "execv", reached)

    def call(argv: list, cwd: Path | None = None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        return hfscale_here(*argv)

    return call


# ---- SLURM on one machine: the script `hfscale slurm` writes, run by bash with stand-ins for srun and scontrol ------
FAKE_SRUN = """#!/bin/bash
# srun stand-in: one copy of the command per node, each with its own SLURM_NODEID / SLURM_PROCID
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((node=0; node<SLURM_NNODES; node++)); do
  SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" & pids+=($!)
done
status=0; for p in "${pids[@]}"; do wait "$p" || status=$?; done; exit $status
"""
FAKE_SCONTROL = """#!/bin/bash
for ((i=0; i<SLURM_NNODES; i++)); do echo 127.0.0.1; done
"""


def hfscale_here(*argv) -> subprocess.CompletedProcess:
    """`hfscale ARGV` run in this process, as `run` returns a launch of it: its exit code, stdout and stderr. For
    refusals made before anything starts (`hfscale_cli`) and the commands that only read and write files (`slurm`,
    `import-logs`), where a launch is ~2 CPU-s of imports; each such command is also launched once as the console
    command a user types."""
    import io

    from hfscale import cli

    argv = [str(a) for a in argv]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def slurm(*argv, launched: bool = False) -> subprocess.CompletedProcess:
    """`hfscale slurm ARGV`: in this process, or `launched` as the console command."""
    if launched:
        return run([sys.executable, "-m", "hfscale", "slurm", *map(str, argv)], timeout=120)
    return hfscale_here("slurm", *argv)


def fake_slurm_bin(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return bin_dir


@pytest.fixture(scope="session")
def fake_slurm(tmp_path_factory):
    return fake_slurm_bin(tmp_path_factory.mktemp("fake-slurm"))


def run_slurm_job(script_path, fake_slurm, nodes: int) -> subprocess.CompletedProcess:
    job_env = {**env(), "PATH": f"{fake_slurm}{os.pathsep}{os.environ['PATH']}", "SLURM_NNODES": str(nodes),
               "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    return run(["bash", str(script_path)], timeout=600, environ=job_env)


def static_rendezvous_port() -> int:
    """A free port for a job whose launchers all get it up front (a static rendezvous: a SLURM script's nodes), drawn
    below the kernel's ephemeral range: seconds pass between the draw and the bind by the job's first agent, and a
    port the kernel hands out (bind to port 0, every outgoing connection, as another run's ranks make to their peers)
    could be taken in between. Free when drawn: it binds."""
    try:
        first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32768  # Linux's default range starts there
    draw = random.SystemRandom()  # not the random module's seeded state, which the tests' own draws may set
    for _ in range(100):
        port = draw.randrange(max(1024, first_ephemeral - 8192), first_ephemeral)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port among 100 drawn below {first_ephemeral}")


def slurm_train(fake_slurm, workdir: Path, strategy: str, nodes: int, gpus_per_node: int, train_args: list[str]) -> dict:
    """Generate the sbatch script for one training run, run it as `nodes` nodes, return its results.json (asserting
    it succeeded). train_args must name the --output_dir."""
    gen = slurm("--nodes", nodes, "--gpus_per_node", gpus_per_node, "--port", static_rendezvous_port(),
                "--python", sys.executable, "--", "--strategy", strategy, *train_args)
    assert gen.returncode == 0, gen.stderr
    script = workdir / f"{strategy}-{nodes}x{gpus_per_node}.sbatch"
    script.write_text(gen.stdout)
    job = run_slurm_job(script, fake_slurm, nodes=nodes)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-5000:]
    out = Path(train_args[train_args.index("--output_dir") + 1])
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok"
    results["_stdout"], results["_stderr"] = job.stdout, job.stderr
    return results


# HSDP's 2 x 2 job steps the parity runs' global batch: MBS 2 on each of its 4 ranks is the 8 samples a step of the
# parity suite's ddp run (2 ranks x MBS 4), its reference, for as many steps.
HSDP_STEPS = PARITY_STEPS
HSDP_MBS = ["--per_device_train_batch_size", "2"]


def hsdp_8bit_job() -> dict:
    """fsdp_hybrid x adamw_8bit (torchao's AdamW8bit on the 2-D mesh), 2 "nodes" x 2 processes, 3 steps, on tiny-llama:
    the strategy x optimizer matrix's run of that pair."""
    def make(folder):
        folder.mkdir(parents=True, exist_ok=True)
        return slurm_train(fake_slurm_bin(folder / "bin"), folder, "fsdp_hybrid", 2, 2,
                           [*TINY, "--model", "tiny-llama", "--optim", "adamw_8bit", "--max_steps", "3",
                            "--output_dir", str(folder / "run")])

    return shared_run("hsdp-2x2-8bit", make)


def hsdp_job() -> dict:
    """fsdp_hybrid on 2 "nodes" x 2 processes, from the script `hfscale slurm` generates (fp32, MBS 2, 20 steps, weights
    fingerprinted, a checkpoint at step 10; its folder is `output_dir`): shared by the multi-node checks and the
    strategy x optimizer matrix, in whichever worker asks first."""
    def make(folder):
        folder.mkdir(parents=True, exist_ok=True)
        saving = [a for a in TINY if a not in ("--save_strategy", "no")] + ["--save_strategy", "steps", "--save_steps", "10"]
        return slurm_train(fake_slurm_bin(folder / "bin"), folder, "fsdp_hybrid", 2, 2,
                           [*saving, *HSDP_MBS, "--max_steps", str(HSDP_STEPS), "--fingerprint_weights", "--output_dir",
                            str(folder / "run")])

    return shared_run("hsdp-2x2", make)


# ---- runs that several files read, each also one pair of the strategy x optimizer matrix (test_multiprocess.py) ------
# A check that does not depend on the optimizer runs with the optimizer of a pair no other test runs, so one launch
# proves both: ZeRO's gradient partitions (test_gradient_partitions.py; fsdp x adafactor is refused) and the ZeRO-3 runs
# of the models larger than a host (test_host_memory.py).
PARTITION_SHAPE = ["--n_layer", "8", "--vocab_size", "512", "--seq_len", "32", "--gradient_accumulation_steps", "2"]
PARTITION_OPTIM = {"zero1": "adamw_8bit", "zero2": "adafactor", "fsdp": "adamw"}


def partition_run(strategy: str) -> dict:
    """zero1, zero2 or fsdp on 2 processes, 2 steps of 2 accumulated micro-batches, 8 layers, a 512-token vocabulary."""
    return shared_train(f"partitions-{strategy}", strategy, *PARTITION_SHAPE, "--optim", PARTITION_OPTIM[strategy],
                        steps=2)


# 12 layers x 768 hidden x 12 heads over the tiny preset's 2048-token vocabulary: ~87M parameters, 0.35 GB in fp32
# (large beside the ~0.07 GB a process moves for anything else); its largest tensor (an MLP matrix, 9 MB) is what a
# rank holds beyond its shard while rank 0's weights arrive. (At 1024 hidden, 0.61 GB, the four runs took 1.3x the
# time - every byte of a copy is paged in, initialised and stepped - for the same fractions of a copy within 0.02;
# only DeepSpeed's fixed ~0.07 GB beyond its zero3 states is a larger fraction of the smaller copy: 0.20 against 0.13.)
# A ~79M-parameter Llama (0.31 GB in fp32): grouped-query attention (4 key/value heads), Llama's own MLP width (2048),
# an untied head and rotary buffers, which no state dict holds and the sharded builds must still give every rank
# (run/construction.share_rank0_buffers)
HOST_SHAPE = ["--model", "tiny-llama", "--n_layer", "12", "--hidden_size", "768", "--n_head", "12",
              "--num_key_value_heads", "4", "--ffn_hidden_size", "2048", "--per_device_train_batch_size", "1",
              "--seq_len", "32"]
# run -> (strategy, optimizer, environment): zero3's zero3_init_flag as `accelerate launch` exports it. ddp steps with
# adafactor, whose states are a few MB where AdamW's are two more copies to page in (ddp x adamw is the parity run's).
HOST_RUNS = {"ddp": ("ddp", "adafactor", {}), "fsdp": ("fsdp", "adamw", {}), "zero3": ("zero3", "adafactor", {}),
             "zero3-no-init": ("zero3", "adamw_8bit", {"ACCELERATE_DEEPSPEED_ZERO3_INIT": "false"}),
             "tp": ("tp", "adamw", {})}
# ddp's run starts from an empty data cache, as a machine's first run does: its rank 0 tokenizes and packs the corpus
# before the build (~5 s more), and its build must still measure a whole copy (run/memory.release_freed_memory)
COLD_CACHE_RUNS = {"ddp"}


def host_memory_run(name: str) -> dict:
    """One step of the ~87M-parameter shape on 2 processes, for the resident-set high-water marks per rank."""
    strategy, optim, environ = HOST_RUNS[name]

    def make(folder):
        with pytest.MonkeyPatch.context() as mp:
            # glibc hands freed tensors back to the kernel at once, so the resident set follows the tensors
            # (otherwise freed broadcast buffers stay in the heap and count; docs/estimate.md)
            mp.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
            # No huge pages on request (glibc.malloc.hugetlb=1): 131 CPU-s for the four runs against 150 once, but on
            # 2026-11-27 the zero3 run took 30-36 CPU-s with them and 24-26 without, the difference the kernel's (THP
            # defrag "madvise" may compact memory before each requested huge page); the same high-water marks.
            for key, value in environ.items():
                mp.setenv(key, value)
            cache = ["--cache_dir", str(folder.with_name(f"{folder.name}-cache"))] if name in COLD_CACHE_RUNS else []
            return train(folder, strategy, *HOST_SHAPE, "--optim", optim, *cache, steps=1)

    return shared_run(f"host-memory-{name}", make)


# ---- `hfscale sweep` and `hfscale tune` (test_sweep.py, test_tune.py): their trials are real 2-process runs, and two of
# them are pairs of the strategy x optimizer matrix (ddp x adafactor, zero1 x adafactor)
_MBS = TINY.index("--per_device_train_batch_size")
SWEEP_FIXED = [*TINY[:_MBS], *TINY[_MBS + 2:], "--max_steps", "3"]  # the micro-batch is a sweep axis (default 4)
SWEEP = ["--strategy", "ddp,zero2_offload", "--optim", "adamw,adafactor", "--num_processes", "2"]


def sweep(out, *args, fixed=SWEEP_FIXED, timeout=900) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "hfscale", "sweep", "--out", str(out), *args, "--", *fixed], timeout=timeout)


def swept() -> dict:
    """Three sweeps into one folder: ddp and zero2_offload x adamw and adafactor (one pair refused before launch); a
    zero1 run that cannot finish in 4 s; fsdp_hybrid on one node, and a ddp run handed a DeepSpeed JSON (every flag is
    right; not for this strategy), both refused before launch by the checks the run itself would make as it starts.
    {"out", "returncodes", "stderr", "index": the rows of sweep.json right after the third sweep}."""
    def make(folder):
        folder.mkdir(parents=True, exist_ok=True)
        main = sweep(folder, *SWEEP)
        # a run that cannot finish in 4 s however fast the machine starts it: a million steps
        hung = sweep(folder, "--strategy", "zero1", "--num_processes", "2", "--timeout", "4",
                     fixed=[*SWEEP_FIXED, "--max_steps", "1000000"])
        refused = sweep(folder, "--strategy", "ddp,fsdp_hybrid", "--num_processes", "1", "--per_device_train_batch_size",
                        "3", fixed=[*SWEEP_FIXED, "--deepspeed", str(REPO / "ds_configs" / "zero1.json")])
        index = json.loads((folder / "sweep.json").read_text())["runs"]  # before any test sweeps again
        return {"out": str(folder), "returncodes": [p.returncode for p in (main, hung, refused)],
                "stderr": main.stderr[-3000:], "index": {row["run"]: row["status"] for row in index}}

    return shared_run("sweep", make)


def launched_run(folder: Path) -> dict:
    """A run that `hfscale sweep`, `tune` or `parity` launched, as `train` returns one: its results.json, and its
    launch.log (both streams) as _stdout."""
    return {**json.loads((folder / "results.json").read_text()), "_stdout": (folder / "launch.log").read_text(),
            "_stderr": ""}


def swept_run(name: str) -> dict:
    """One run of the first sweep."""
    return launched_run(Path(swept()["out"]) / name)


# 0.1 GB per "GPU": the estimate fits micro-batch 4 (~0.015 GB) and not 64 (~0.17 GB) for the tiny model - on this CPU
# machine without the CUDA context allowance, which a CPU run does not have.
TUNE = ["--model", "tiny", "--seq_len", "64", "--num_processes", "2", "--strategy", "zero1,zero2_offload,megatron-deepspeed",
        "--optim", "adamw,adafactor", "--per_device_train_batch_size", "4,64", "--activation_checkpointing", "false",
        "--device_memory_gb", "0.1"]
TRIAL_ARGS = ["--max_steps", "5", "--save_strategy", "no", "--logging_steps", "1"]


def tuned() -> dict:
    """`hfscale tune` over zero1, zero2_offload and a 3D layout x adamw, adafactor x micro-batch 4, 64:
    {"out", "report": tune.json}."""
    def make(folder):
        proc = run([sys.executable, "-m", "hfscale", "tune", *TUNE, "--out", str(folder), "--", *TRIAL_ARGS], timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return {"out": str(folder), "report": json.loads((folder / "tune.json").read_text())}

    return shared_run("tune", make)


def tune_trial(name: str) -> dict:
    return launched_run(Path(tuned()["out"]) / "trials" / name)


# ---- tensor parallelism: tp on one node of 2, fsdp_tp on 2 "nodes" x 2 (TP inside a node, FSDP2 across) ------------
# Both step the parity runs' global batch (8 samples: ddp's 2 ranks x MBS 4) in fp32 for PARITY_STEPS, so their losses,
# gradient norms and final weights compare with the parity suite's ddp run; each saves a checkpoint at TP_SAVE_STEP.
TP_SAVE_STEP = 10


def _tp_args(out: Path, mbs: int) -> list[str]:
    saving = [a for a in TINY if a not in ("--save_strategy", "no")]
    return [*saving, "--per_device_train_batch_size", str(mbs), "--save_strategy", "steps", "--save_steps",
            str(TP_SAVE_STEP), "--max_steps", str(PARITY_STEPS), "--fingerprint_weights", "--output_dir", str(out)]


def tp_fp8_run() -> dict:
    """tp on 2 processes (one TP group, MBS 8: the 8 samples ddp's two ranks see) in float8 (--fp8, emulated): GPT-2's
    Conv1D projections swapped for nn.Linear, converted, then split; a checkpoint at TP_SAVE_STEP."""
    return shared_run("tp-fp8", lambda folder: train(folder, "tp", "--fp8", "--fp8_emulate", "--per_device_train_batch_size",
                                                     "8", "--save_strategy", "steps", "--save_steps", str(TP_SAVE_STEP),
                                                     "--fingerprint_weights", steps=PARITY_STEPS))


def fsdp_tp_job(*extra: str, steps: int | None = None, key: str = "fsdp_tp-2x2") -> dict:
    """fsdp_tp on 2 "nodes" x 2 processes from the generated sbatch script (MBS 4 on each of the 2 data-parallel
    groups); `extra` flags and fewer `steps` for the strategy x optimizer runs."""
    def make(folder):
        folder.mkdir(parents=True, exist_ok=True)
        args = _tp_args(folder / "run", 4) + list(extra)
        if steps is not None:
            args += ["--max_steps", str(steps)]
        return slurm_train(fake_slurm_bin(folder / "bin"), folder, "fsdp_tp", 2, 2, args)

    return shared_run(key, make, recipe={"extra": extra, "steps": steps})
