"""Multi-node: the sbatch script `hfscale slurm` writes, run for real as 2 "nodes" on this machine.

The script is executed by bash as sbatch would, with `srun` and `scontrol` replaced by stand-ins: srun starts one copy
of its command per node with that node's own SLURM_NODEID/SLURM_PROCID, scontrol lists the allocation's hosts
(127.0.0.1). So the generated rank arithmetic and quoting is what runs - the batch shell itself has SLURM_NODEID=0,
as on a real first node: an unescaped `$SLURM_NODEID` would give both launchers rank 0 and the job would hang.
HSDP (fsdp_hybrid) runs the same way as 2 nodes x 2 processes (conftest.hsdp_job).
"""

import os
import sys
from pathlib import Path

import pytest

from conftest import (HSDP_MBS, HSDP_STEPS, PARITY_STEPS, TINY, assert_figures_count_the_loaders, env, hsdp_job,
                      parity_runs, run, slurm, slurm_train)

pytestmark = pytest.mark.multiprocess

STEPS = PARITY_STEPS


def _train_args(out) -> list[str]:
    return [*TINY, "--max_steps", str(STEPS), "--output_dir", str(out)]


@pytest.fixture()
def single_node():
    """The reference: the same run on one node with 2 processes (fp32, same seed): the parity suite's ddp run."""
    return parity_runs()["runs"]["ddp"]


# The script's launch takes one of two routes (launching.strategy_launch): torch's (torchrun across nodes; ddp, fsdp, and
# HSDP and fsdp_tp, whose 2 x 2 jobs below and in test_tensor_parallel.py match the same one-node ddp run) and
# DeepSpeed's (its `standard` multi-node launcher; every ZeRO stage takes it), run here. Each job is ~20 CPU-s of CI.
@pytest.mark.parametrize("strategy", ["zero3"])
def test_two_node_job_from_the_generated_script_matches_one_node(strategy, tmp_path, fake_slurm, single_node):
    results = slurm_train(fake_slurm, tmp_path, strategy, 2, 1, _train_args(tmp_path / "run"))
    assert results["status"] == "ok" and results["config"]["world_size"] == 2
    assert results["environment"]["nodes"] == 2 and results["environment"]["processes_per_node"] == 1
    assert results["strategy_check"]["world_size_torch"] == 2
    losses = [p["loss"] for p in results["loss_history"]]
    reference = [p["loss"] for p in single_node["loss_history"]]
    assert len(losses) == len(reference) == STEPS
    assert max(abs(a - b) / b for a, b in zip(losses, reference)) < 1e-4, (losses, reference)


def test_hsdp_shards_within_a_node_replicates_across_nodes_and_trains_as_ddp(single_node):
    """fsdp_hybrid on 2 simulated nodes x 2 processes: parameters are (Replicate(), Shard(0)) DTensors on a (2, 2)
    mesh, every rank holds half of them (a node's share, not a world-wide quarter), and losses, gradient norms and
    final weights match ddp on one node within 1e-4 over 20 steps (the same 8 samples a step: MBS 2 on 4 ranks, the
    reference's MBS 4 on 2)."""
    from hfscale.compare.parity import compare
    from hfscale.run.results import Results

    res = hsdp_job()
    assert res["strategy"] == "fsdp_hybrid" and res["config"]["world_size"] == 4
    assert_figures_count_the_loaders(res)
    assert res["environment"]["nodes"] == 2 and res["environment"]["processes_per_node"] == 2
    check = res["strategy_check"]
    assert check["mesh"] == [2, 2] and check["world_size_torch"] == 4
    assert check["parameters"]["placements"] == ["[Replicate(), Shard(dim=0)]"]
    assert check["parameters"]["mesh_shapes"] == ["[2, 2]"]
    full = 4 * res["model"]["params_model"]  # fp32 bytes of one whole copy
    ranks = res["memory"]["model_states_per_rank"]
    assert len(ranks) == 4
    for rank in ranks:  # a node's 2 processes split the model; ZeRO-like world sharding would leave ~1/4
        assert 0.4 < rank["parameters"] / full < 0.6 and 0.4 < rank["optimizer_states"] / (2 * full) < 0.6, ranks
    assert res["config"]["global_batch_size"] == single_node["config"]["global_batch_size"] == 8
    results = [Results.from_dict({k: v for k, v in r.items() if not k.startswith("_")}) for r in (single_node, res)]
    verdict = compare(*results, "fsdp_hybrid", "adamw", 1e-4, None)
    assert verdict.weights_max_rel is not None and verdict.grad_norm_max_rel is not None
    assert verdict.verdict == "pass" and verdict.steps == HSDP_STEPS, verdict


def test_slurm_writes_one_script_per_strategy(tmp_path):
    """`--strategy zero1,zero3 --out DIR`: one job script each, each launching its own strategy."""
    gen = slurm("--nodes", 2, "--gpus_per_node", 8, "--cpus_per_task", 16, "--strategy", "zero1,zero3", "--out",
                tmp_path / "jobs", "--", "--model", "tiny-llama")
    assert gen.returncode == 0, gen.stderr
    scripts = {p.name: p.read_text() for p in (tmp_path / "jobs").iterdir()}
    assert sorted(scripts) == ["hfscale-zero1-tiny-llama.sbatch", "hfscale-zero3-tiny-llama.sbatch"]
    for strategy in ("zero1", "zero3"):
        srun = next(line for line in scripts[f"hfscale-{strategy}-tiny-llama.sbatch"].splitlines()
                    if line.startswith("srun "))
        assert f"--strategy {strategy}" in srun and "--model tiny-llama" in srun


def test_the_script_expands_the_machine_rank_on_each_node():
    gen = slurm("--nodes", 4, "--gpus_per_node", 8, "--partition", "gpu", "--time", "20:00:00", "--constraint",
                 "v100-32g", "--dry-run", "--", "--strategy", "zero3", "--model", "bloom-7b1", "--bf16",
                 "--run_name", "a$b", launched=True)
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
    # no --cpus_per_task: the cluster's default for a task, said once
    assert "warning: no --cpus_per_task: each node's launcher and its 8 processes" in gen.stderr
    # given, srun asks for it too: since Slurm 22.05 it does not inherit #SBATCH --cpus-per-task
    gen = slurm("--nodes", 4, "--gpus_per_node", 8, "--cpus_per_task", 64, "--dry-run", "--", "--strategy", "zero3",
                "--train_files", "/cluster/corpus.txt")  # the cluster's file, not this machine's: not looked for here
    assert gen.returncode == 0 and gen.stderr == "", gen.stderr
    assert "--train_files /cluster/corpus.txt" in next(line for line in gen.stdout.splitlines() if line.startswith("srun"))
    assert "#SBATCH --cpus-per-task=64" in gen.stdout.splitlines()
    assert next(line for line in gen.stdout.splitlines() if line.startswith("srun ")).startswith(
        "srun --ntasks-per-node=1 --cpus-per-task=64 --kill-on-bad-exit=1 bash -c ")


@pytest.mark.parametrize("status,requeued", [("stopped", True), ("ok", False), ("fail", False), (None, False)])
def test_a_requeue_job_goes_back_in_the_queue_only_when_its_run_stopped_on_the_warning(status, requeued, tmp_path):
    """`hfscale slurm --requeue 300`: SLURM warns every rank 300 s before the limit (SIGUSR1; what the run does with it
    is tests/test_faults.py's zero1 case, through the same `hfscale launch`), the run resumes from its latest
    checkpoint, and the script requeues the job exactly when the run's results say it stopped on the warning. Run
    here with an srun that leaves the results a run would and an scontrol that notes what it was asked."""
    out = tmp_path / "my run"
    gen = slurm("--nodes", 2, "--gpus_per_node", 8, "--time", "2-00:00:00", "--requeue", 300, "--", "--strategy",
                "zero1", "--output_dir", out)
    assert gen.returncode == 0, gen.stderr
    lines = gen.stdout.splitlines()
    assert "#SBATCH --requeue" in lines and "#SBATCH --open-mode=append  # each requeued start adds to the log" in lines
    assert any(line.startswith("#SBATCH --signal=USR1@300 ") for line in lines)
    srun = next(line for line in lines if line.startswith("srun "))
    assert srun.endswith("--resume_from_checkpoint latest\"") and f"--output_dir '{out}'" in srun
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    results = "" if status is None else f"mkdir -p '{out}'; echo '{{\"status\": \"{status}\"}}' > '{out}/results.json'"
    for name, text in (("srun", f"#!/bin/bash\n{results}\n"),
                       ("scontrol", f"#!/bin/bash\necho \"$@\" >> '{tmp_path}/scontrol.log'\necho 127.0.0.1\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(gen.stdout)
    job = run(["bash", str(tmp_path / "job.sbatch")], timeout=60,
              environ={**env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
                       "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_NNODES": "2"})
    assert job.returncode == 0, job.stderr
    asked = (tmp_path / "scontrol.log").read_text().splitlines()
    assert asked[0].startswith("show hostnames")
    assert asked[1:] == (["requeue 4242"] if requeued else [])


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


def test_a_launch_on_one_machine_leaves_its_port_to_accelerate(tmp_path):
    """`--main_process_port 0`: accelerate's launcher picks a free port after its imports, just before torchrun binds
    it (a port picked by the caller would stay unbound for seconds, for any other process to take); a port the user
    names is kept."""
    proc = run([sys.executable, "-m", "hfscale", "launch", "--num_processes", "2", "--dry_run", "--strategy", "zero2"],
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout.split()
    assert cmd[cmd.index("--main_process_port") + 1] == "0"
    proc = run([sys.executable, "-m", "hfscale", "launch", "--num_processes", "2", "--main_process_port", "29511",
                "--dry_run", "--strategy", "zero2"], cwd=tmp_path)
    cmd = proc.stdout.split()
    assert proc.returncode == 0 and cmd.count("--main_process_port") == 1, proc.stderr
    assert cmd[cmd.index("--main_process_port") + 1] == "29511"


@pytest.mark.parametrize("argv,expected", [
    (["--nodes", "0", "--gpus_per_node", "8"], "--nodes must be positive, got 0"),
    (["--nodes", "2", "--gpus_per_node", "-1"], "--gpus_per_node must be positive"),
    (["--nodes", "2", "--gpus_per_node", "8", "--port", "70000"], "--port must be between 1 and 65535"),
    (["--nodes", "2", "--gpus_per_node", "8", "--partition", "gpu big"], "is not one SLURM name"),
    (["--nodes", "2", "--gpus_per_node", "8", "--time", "tomorrow"], "is not a SLURM time limit"),
    (["--nodes", "2", "--gpus_per_node", "8", "--time", "20:75:00"], "is not a SLURM time limit"),
    (["--nodes", "2", "--gpus_per_node", "8", "--", "--strategy", "zero9"], "unknown strategy 'zero9'"),
    (["--nodes", "2", "--gpus_per_node", "8", "--", "--seq_len", "-3"], "--seq_len must be positive, got -3"),
    (["--nodes", "1", "--gpus_per_node", "8", "--", "--strategy", "fsdp_hybrid"], "got 1 node(s) x 8 process(es)"),
    (["--nodes", "4", "--gpus_per_node", "1", "--", "--strategy", "fsdp_hybrid"], "got 4 node(s) x 1 process(es)"),
    (["--nodes", "2", "--gpus_per_node", "8", "--strategy", "zero1,zero2", "--out", "jobs", "--", "--output_dir",
      "runs/a"],
     "--strategy zero1,zero2 with one --output_dir: every job would run in that folder"),
    (["--nodes", "2", "--gpus_per_node", "8", "--strategies", "zero1,zero2", "--out", "jobs"],
     "--strategies is now --strategy (the Trainer's name; lists are comma-separated values of it)"),
    (["--nodes", "2", "--gpus_per_node", "8", "--strategy", "zero1,zero4", "--out", "jobs"],
     "unknown strategy 'zero4'"),
    (["--nodes", "2", "--gpus_per_node", "8", "--strategy", "zero1", "--", "--strategy", "zero3"],
     "--strategy zero1 (slurm's) and --strategy zero3 (the training flags') disagree"),
    (["--nodes", "2", "--gpus_per_node", "8", "--requeue", "0", "--", "--output_dir", "a"],
     "--requeue must be a positive number of seconds, got 0"),
    (["--nodes", "2", "--gpus_per_node", "8", "--time", "4", "--requeue", "300", "--", "--output_dir", "a"],
     "--requeue 300 warns before the job starts: --time 4 is 240 s"),  # SLURM's "4": minutes
    (["--nodes", "2", "--gpus_per_node", "8", "--time", "1-00", "--requeue", "300"],
     "--requeue needs the run's --output_dir after --"),
    (["--nodes", "2", "--gpus_per_node", "8", "--requeue", "300", "--", "--output_dir", "a",
      "--resume_from_checkpoint", "a/checkpoint-8"], "--resume_from_checkpoint a/checkpoint-8 would start every one"),
])
def test_slurm_refuses_bad_input_in_one_line(argv, expected, tmp_path, hfscale_cli):
    proc = hfscale_cli(["slurm", "--out", tmp_path / "jobs", *argv], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("argv", [
    ["train"],  # one process, no launcher
    ["launch", "--num_processes", "2"],  # one node
    ["launch", "--num_machines", "2", "--num_processes", "2", "--machine_rank", "0", "--dry_run"],
])
def test_hsdp_without_two_nodes_of_two_is_refused_in_one_line(argv, tmp_path, hfscale_cli):
    out = tmp_path / "run"
    proc = hfscale_cli([*argv, "--strategy", "fsdp_hybrid", *TINY, "--max_steps", "1", "--output_dir", out], cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "needs 2+ nodes with 2+ processes each" in lines[0], proc.stderr
    assert not out.exists()


def test_hsdp_checkpoint_resumes_exactly(tmp_path, fake_slurm):
    """fsdp_hybrid saves sharded checkpoints on its 2-D mesh; a job resumed from step 10 continues with exactly the
    losses of the uninterrupted one (fp32, same kernels)."""
    reference = hsdp_job()
    checkpoint = Path(reference["output_dir"]) / "checkpoint-10"
    resumed = slurm_train(fake_slurm, tmp_path, "fsdp_hybrid", 2, 2,
                          [*TINY, *HSDP_MBS, "--max_steps", str(HSDP_STEPS), "--output_dir", str(tmp_path / "resumed"),
                           "--resume_from_checkpoint", str(checkpoint)])
    assert resumed["resumed_from"] == str(checkpoint)
    assert [p["step"] for p in resumed["loss_history"]] == list(range(1, HSDP_STEPS + 1))
    assert [p["loss"] for p in resumed["loss_history"]] == [p["loss"] for p in reference["loss_history"]]


def test_every_process_gets_its_share_of_the_cpus_whatever_the_strategy(tmp_path):
    """accelerate sets OMP_NUM_THREADS to 1 on its DDP/FSDP routes and leaves it unset on DeepSpeed's (a lone
    process then runs on every core): through hfscale's launcher one process of ddp and of zero2_offload has the
    same threads, the CPUs / processes per node; a user's OMP_NUM_THREADS stands."""
    from hfscale.launching import TRAIN_SCRIPT, strategy_launch
    from hfscale.run.launcher import cpu_threads_per_process, share_the_cpus

    probe = tmp_path / "threads.py"
    probe.write_text("import os, torch\nprint('threads', os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())\n")
    unset = {k: v for k, v in env().items() if k != "OMP_NUM_THREADS"}
    cpus, seen = len(os.sched_getaffinity(0)), {}
    for strategy in ("ddp", "zero2_offload"):
        cmd = strategy_launch(["--strategy", strategy], 1)
        cmd[cmd.index(TRAIN_SCRIPT)] = str(probe)
        proc = run(cmd, timeout=120, environ=unset)
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[strategy] = next(line for line in proc.stdout.splitlines() if line.startswith("threads"))
    assert set(seen.values()) == {f"threads {cpus} {cpus}"}, seen
    assert [cpu_threads_per_process(c, p) for c, p in ((96, 8), (2, 4), (16, 3), (0, 1))] == [12, 1, 5, 1]
    # accelerate's own flags only (before the script): 16 processes over 2 machines of 16 CPUs
    environ = {}
    share_the_cpus(["--num_processes", "16", "--num_machines=2", "train.py", "--num_processes", "1"], environ)
    assert environ == {"OMP_NUM_THREADS": str(cpu_threads_per_process(cpus, 8))}
    malformed = {}
    share_the_cpus(["--num_processes", "two", "train.py"], malformed)
    assert malformed == {}  # left to accelerate's parser to refuse
    mine = {"OMP_NUM_THREADS": "3"}
    share_the_cpus(["--num_processes", "1", "train.py"], mine)
    assert mine == {"OMP_NUM_THREADS": "3"}
