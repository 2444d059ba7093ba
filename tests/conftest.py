"""Helpers shared by the tests: run hfscale as real subprocesses (as a user would), on CPU, on a free port."""

import atexit
import json
import os
import shutil
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
