"""Helpers shared by the tests: run hfscale as real subprocesses (as a user would), on CPU, on a free port."""

import atexit
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# One fresh data cache per test session, set before hfscale is imported: no test passes on tokenizers or packed blocks
# an older checkout built (~/.cache/hfscale is left alone); within the session the runs share it, as a user's do.
os.environ["HFSCALE_CACHE_DIR"] = tempfile.mkdtemp(prefix="hfscale-test-cache-")
atexit.register(shutil.rmtree, os.environ["HFSCALE_CACHE_DIR"], ignore_errors=True)

from hfscale.launch import launch_command  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# Small enough for 2 cores: a 2-layer GPT-2, 64-token blocks, 4 samples per rank.
TINY = ["--model", "tiny", "--seq_len", "64", "--per_device_train_batch_size", "4", "--save_strategy", "no",
        "--learning_rate", "1e-3", "--logging_steps", "1"]


def env() -> dict:
    e = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    e.pop("WORLD_SIZE", None)
    return e


def run(cmd: list[str], timeout: int = 420, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


accelerate_launch = launch_command  # plain `accelerate launch --multi_gpu` (no config), as the README starts a run


def train(out: Path, strategy: str | None, *extra: str, nproc: int = 2, steps: int = 4, config_file=None,
          hfscale_launch: bool = False) -> dict:
    """One real training run; returns its results.json (asserting it succeeded). With hfscale_launch, through
    `hfscale launch` started outside the repository (the shipped configs must be found from anywhere)."""
    args = [*TINY, "--max_steps", str(steps), "--output_dir", str(out), *extra]
    if strategy:
        args = ["--strategy", strategy, *args]
    if hfscale_launch:
        proc = run([sys.executable, "-m", "hfscale", "launch", "--num_processes", str(nproc), *args], cwd=out.parent)
    else:
        proc = run(accelerate_launch(args, nproc, config_file))
    assert proc.returncode == 0, f"run failed ({strategy}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok"
    results["_stdout"], results["_stderr"] = proc.stdout, proc.stderr
    return results


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


_LAUNCHER_VARS = ("ACCELERATE_", "FSDP_", "DS_", "PARALLELISM_CONFIG_", "WORLD_SIZE", "LOCAL_RANK", "RANK", "MASTER_")


@pytest.fixture(autouse=True)
def no_launcher_environment_leaks():
    """Every launch a later test makes inherits this process's environment: a test that leaves a launcher variable
    behind (say ACCELERATE_USE_FSDP) silently changes every run after it. Fail the test that leaks instead."""
    before = {k: v for k, v in os.environ.items() if k.startswith(_LAUNCHER_VARS)}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith(_LAUNCHER_VARS)}
    assert after == before, f"the test left launcher variables changed: {set(after.items()) ^ set(before.items())}"


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


def slurm(*argv) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "hfscale", "slurm", *map(str, argv)], timeout=120)


@pytest.fixture(scope="session")
def fake_slurm(tmp_path_factory):
    bin_dir = tmp_path_factory.mktemp("fake-slurm")
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return bin_dir


def run_slurm_job(script_path, fake_slurm, nodes: int) -> subprocess.CompletedProcess:
    job_env = {**env(), "PATH": f"{fake_slurm}{os.pathsep}{os.environ['PATH']}", "SLURM_NNODES": str(nodes),
               "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    return subprocess.run(["bash", str(script_path)], env=job_env, capture_output=True, text=True, timeout=600)


def slurm_train(fake_slurm, workdir: Path, strategy: str, nodes: int, gpus_per_node: int, train_args: list[str]) -> dict:
    """Generate the sbatch script for one training run, run it as `nodes` nodes, return its results.json (asserting
    it succeeded). train_args must name the --output_dir."""
    from hfscale.parallel.distributed import free_port

    gen = slurm("--nodes", nodes, "--gpus_per_node", gpus_per_node, "--port", free_port(), "--python", sys.executable,
                "--", "--strategy", strategy, *train_args)
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


HSDP_STEPS = 20


@pytest.fixture(scope="session")
def hsdp_8bit_job(runs_dir, fake_slurm):
    """fsdp_hybrid x adamw_8bit (torchao's AdamW8bit on the 2-D mesh), 2 "nodes" x 2 processes, 3 steps: the
    strategy x optimizer matrix's run of that pair."""
    workdir = runs_dir / "hsdp-8bit-job"
    workdir.mkdir(exist_ok=True)
    return slurm_train(fake_slurm, workdir, "fsdp_hybrid", 2, 2,
                       [*TINY, "--optim", "adamw_8bit", "--max_steps", "3", "--output_dir", str(runs_dir / "hsdp-2x2-8bit")])


@pytest.fixture(scope="session")
def hsdp_job(runs_dir, fake_slurm):
    """fsdp_hybrid on 2 "nodes" x 2 processes, from the script `hfscale slurm` generates (fp32, 20 steps, weights
    fingerprinted, a checkpoint at step 10): shared by the multi-node checks and the strategy x optimizer matrix."""
    out = runs_dir / "hsdp-2x2"
    saving = [a for a in TINY if a not in ("--save_strategy", "no")] + ["--save_strategy", "steps", "--save_steps", "10"]
    return slurm_train(fake_slurm, runs_dir, "fsdp_hybrid", 2, 2,
                       [*saving, "--max_steps", str(HSDP_STEPS), "--fingerprint_weights", "--output_dir", str(out)])
