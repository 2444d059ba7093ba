"""Multi-node: the sbatch script `hfscale slurm` writes, run for real as 2 "nodes" on this machine.

The script is executed by bash as sbatch would, with `srun` and `scontrol` replaced by stand-ins: srun starts one copy
of its command per node with that node's own SLURM_NODEID/SLURM_PROCID, scontrol lists the allocation's hosts
(127.0.0.1). So the generated rank arithmetic and quoting is what runs - the batch shell itself has SLURM_NODEID=0,
as on a real first node: an unescaped `$SLURM_NODEID` would give both launchers rank 0 and the job would hang.
"""

import json
import os
import stat
import sys

import pytest

from conftest import TINY, env, run, train
from hfscale.parallel.distributed import free_port

pytestmark = pytest.mark.multiprocess

STEPS = 5
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


def _slurm(*argv) -> "subprocess.CompletedProcess":
    return run([sys.executable, "-m", "hfscale", "slurm", *map(str, argv)], timeout=120)


@pytest.fixture(scope="module")
def fake_slurm(tmp_path_factory):
    bin_dir = tmp_path_factory.mktemp("fake-slurm")
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return bin_dir


def _train_args(out) -> list[str]:
    return [*TINY, "--max_steps", str(STEPS), "--output_dir", str(out)]


def _run_job(script_path, fake_slurm, nodes: int):
    import subprocess

    job_env = {**env(), "PATH": f"{fake_slurm}{os.pathsep}{os.environ['PATH']}", "SLURM_NNODES": str(nodes),
               "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    return subprocess.run(["bash", str(script_path)], env=job_env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def single_node(tmp_path_factory):
    """The reference: the same run on one node with 2 processes (fp32, same seed)."""
    return train(tmp_path_factory.mktemp("one-node") / "run", "ddp", "--max_steps", str(STEPS), steps=STEPS)


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3", "fsdp"])
def test_two_node_job_from_the_generated_script_matches_one_node(strategy, tmp_path, fake_slurm, single_node):
    out = tmp_path / "run"
    gen = _slurm("--nodes", 2, "--gpus_per_node", 1, "--port", free_port(), "--python", sys.executable,
                 "--", "--strategy", strategy, *_train_args(out))
    assert gen.returncode == 0, gen.stderr
    script_path = tmp_path / "job.sbatch"
    script_path.write_text(gen.stdout)
    job = _run_job(script_path, fake_slurm, nodes=2)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok" and results["config"]["world_size"] == 2
    assert results["environment"]["nodes"] == 2 and results["environment"]["processes_per_node"] == 1
    assert results["strategy_check"]["world_size_torch"] == 2
    losses = [p["loss"] for p in results["loss_history"]]
    reference = [p["loss"] for p in single_node["loss_history"]]
    assert len(losses) == len(reference) == STEPS
    assert max(abs(a - b) / b for a, b in zip(losses, reference)) < 1e-4, (losses, reference)


def test_the_script_expands_the_machine_rank_on_each_node():
    gen = _slurm("--nodes", 4, "--gpus_per_node", 8, "--partition", "gpu", "--time", "20:00:00", "--constraint",
                 "v100-32g", "--dry-run", "--", "--strategy", "zero3", "--model", "bloom-7b1", "--bf16",
                 "--run_name", "a$b")
    assert gen.returncode == 0, gen.stderr
    text = gen.stdout
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert srun.startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c ")
    assert "--machine_rank \\$SLURM_NODEID" in srun and "--num_processes 32" in srun and "--num_machines 4" in srun
    assert "a\\$b" in srun  # a literal $ in a training flag survives the batch shell
    for line in ("#SBATCH --nodes=4", "#SBATCH --gres=gpu:8", "#SBATCH --partition=gpu", "#SBATCH --time=20:00:00",
                 "#SBATCH --constraint=v100-32g", "#SBATCH --hint=nomultithread", "#SBATCH --output=%x-%j.out",
                 "#SBATCH --job-name=hfscale-zero3-bloom-7b1"):
        assert line in text.splitlines()
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text


def test_launch_across_machines_passes_static_rendezvous_as_flags(tmp_path):
    """accelerate launch ignores rdzv_backend/same_network from a config file; DeepSpeed needs its standard launcher
    without pdsh; --num_processes is the total over the machines."""
    proc = run([sys.executable, "-m", "hfscale", "launch", "--num_machines", "2", "--num_processes", "4",
                "--machine_rank", "1", "--main_process_ip", "10.0.0.1", "--main_process_port", "29500", "--dry_run",
                "--strategy", "zero2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout.split()
    assert cmd[cmd.index("--num_processes") + 1] == "4" and cmd[cmd.index("--num_machines") + 1] == "2"
    assert cmd[cmd.index("--rdzv_backend") + 1] == "static" and "--same_network" in cmd
    assert cmd[cmd.index("--deepspeed_multinode_launcher") + 1] == "standard"
    assert cmd[cmd.index("--machine_rank") + 1] == "1"


@pytest.mark.parametrize("argv,expected", [
    (["--nodes", "0", "--gpus_per_node", "8"], "--nodes must be positive, got 0"),
    (["--nodes", "2", "--gpus_per_node", "-1"], "--gpus_per_node must be positive"),
    (["--nodes", "2", "--gpus_per_node", "8", "--port", "70000"], "--port must be between 1 and 65535"),
    (["--nodes", "2", "--gpus_per_node", "8", "--partition", "gpu big"], "is not one SLURM name"),
    (["--nodes", "2", "--gpus_per_node", "8", "--time", "tomorrow"], "is not a SLURM time limit"),
    (["--nodes", "2", "--gpus_per_node", "8", "--", "--strategy", "zero9"], "unknown strategy 'zero9'"),
])
def test_slurm_refuses_bad_input_in_one_line(argv, expected, tmp_path):
    proc = run([sys.executable, "-m", "hfscale", "slurm", *argv, "--out", str(tmp_path / "jobs")], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not (tmp_path / "jobs").exists()
