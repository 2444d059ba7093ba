"""Helpers shared by the tests: run hfscale as real subprocesses (as a user would), on CPU, on a free port."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRAIN = str(REPO / "hfscale" / "train.py")
# Small enough for 2 cores: a 2-layer GPT-2, 64-token blocks, 4 samples per rank.
TINY = ["--model", "tiny", "--seq_len", "64", "--per_device_train_batch_size", "4", "--save_strategy", "no",
        "--learning_rate", "1e-3", "--logging_steps", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(tmp_cache: Path | None = None) -> dict:
    e = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    e.pop("WORLD_SIZE", None)
    return e


def run(cmd: list[str], timeout: int = 420, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def accelerate_launch(args: list[str], nproc: int = 2, config_file: str | None = None) -> list[str]:
    launcher = [sys.executable, "-m", "accelerate.commands.launch"]
    if config_file:
        launcher += ["--config_file", config_file]
    elif nproc > 1:  # without --multi_gpu a CPU machine gets one process whatever --num_processes says
        launcher += ["--multi_gpu"]
    return launcher + ["--num_processes", str(nproc), "--main_process_port", str(free_port()), TRAIN, *args]


def train(out: Path, strategy: str | None, *extra: str, nproc: int = 2, steps: int = 4, config_file=None) -> dict:
    """One real training run; returns its results.json (asserting it succeeded)."""
    args = [*TINY, "--max_steps", str(steps), "--output_dir", str(out), *extra]
    if strategy:
        args = ["--strategy", strategy, *args]
    proc = run(accelerate_launch(args, nproc, config_file))
    assert proc.returncode == 0, f"run failed ({strategy}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok"
    results["_stdout"] = proc.stdout
    return results


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")
