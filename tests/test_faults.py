"""Checkpoints under faults, every strategy, 2 processes: SIGKILL at a random step after a checkpoint, resume with
`--resume_from_checkpoint latest`, and get exactly the uninterrupted run's losses on exactly the same samples.
An interrupted save (a checkpoint directory without its completion marker) is never resumed from.

The uninterrupted run is each strategy's bf16 run (conftest.BF16_RUNS: gradient accumulation 2, activation
checkpointing, a checkpoint every 4 steps, per-batch digests), which other tests read too; the killed run is the same
command. FSDP2 and DeepSpeed, which save through their own sharded writers, are killed for real (KILLED), zero1 is
stopped by SLURM's signal (STOPPED); the others resume from what a killed run leaves, taken from the uninterrupted
run: its complete checkpoints up to the kill step, which the same command wrote (a launch is what CI's time goes to).
Two strategies are not resumed apart: zero2, whose optimizer and checkpoint are zero1's (DeepSpeed's stage-1/2 ZeRO
optimizer, whose stage only changes when gradients are partitioned), resumed here from a real stop; and ddp, whose
checkpoint is the Trainer's own, which ddp_powersgd's resume reads with the hook's error feedback on top. bf16 on CPU is deterministic and a checkpoint
restores everything a step depends on (weights, fp32 masters, optimizer and scheduler state, RNG, data position,
PowerSGD's error feedback), so "the same" means equal to the last bit: the tolerance is 0 for every strategy but the
ZeRO-Offload ones (see TOLERANCE)."""

import json
import os
import random
import shutil
import zlib
from pathlib import Path

import pytest

from conftest import BF16_SAVE_STEPS, PARITY_STEPS, bf16_command, bf16_result, run, run_and_kill

pytestmark = pytest.mark.multiprocess

STRATEGIES = ["ddp_powersgd", "fsdp", "fsdp_offload", "zero1", "zero2_offload", "zero3", "zero3_offload"]
STEPS, SAVE_EVERY = PARITY_STEPS, BF16_SAVE_STEPS
# Same kernels, same order: resumed losses equal the uninterrupted ones exactly - except after ZeRO-Offload's resume,
# where DeepSpeed's CPU Adam reloads its fp32 partition and the losses agree only to rounding, which grows with the
# steps after the resume (what was seen, and how: docs/reliability.md).
TOLERANCE = {"zero2_offload": 1e-5, "zero3_offload": 1e-5}
KILLED = {"fsdp", "zero3"}  # the sharded writers
# Stopped by SIGUSR1 (SLURM's warning before a time limit, run/stopping.py), sent to the whole process tree as SLURM
# sends it to a job step: zero1's run goes through `hfscale launch`, whose launcher ignores it
STOPPED = {"zero1"}


def launch(strategy, out, *extra, timeout=420):
    cmd, cwd = bf16_command(strategy, out, *extra)
    proc = run(cmd, timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def losses(results) -> dict[int, float]:
    return {p["step"]: p["loss"] for p in results["loss_history"]}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_killed_run_resumes_exactly(tmp_path, strategy):
    # reproducible, and a strategy's own whatever the list holds; vary it by hand
    seed = int(os.environ.get("HFSCALE_FAULT_SEED", zlib.crc32(strategy.encode())))
    kill_at = random.Random(seed).randint(SAVE_EVERY + 1, STEPS - 1)  # after the first checkpoint, before the end
    print(f"{strategy}: killed after step {kill_at} (HFSCALE_FAULT_SEED={seed})")
    faulty_dir = tmp_path / "faulty"
    reference = bf16_result(strategy)

    if strategy in KILLED:
        run_and_kill(*bf16_command(strategy, faulty_dir), kill_at)
        killed = json.loads((faulty_dir / "results.json").read_text())
        assert killed["status"] == "running"  # the results file is intact (atomic writes), not half a JSON document
    elif strategy in STOPPED:  # SIGUSR1 once step `signalled` is logged: saved and stopped at the next logging step
        signalled = min(kill_at, STEPS - 3)
        printed = run_and_kill(*bf16_command(strategy, faulty_dir), signalled, stop=True)
        stopped = json.loads((faulty_dir / "results.json").read_text())
        assert stopped["status"] == "stopped", printed[-3000:]
        kill_at = stopped["stopped"]["step"]
        assert signalled < kill_at < STEPS and stopped["steps"] == kill_at, (signalled, kill_at)
        assert stopped["stopped"]["checkpoint"] == str(faulty_dir / f"checkpoint-{kill_at}")
        assert (faulty_dir / f"checkpoint-{kill_at}" / "hfscale_checkpoint.json").is_file()
        assert f"stopped on SIGUSR1 at step {kill_at}, its checkpoint saved" in printed
        assert not (faulty_dir / "_hfscale.lock").exists()  # the folder is let go as the run ends
    else:  # what the kill leaves: the same command's complete checkpoints up to the kill step
        for step in range(SAVE_EVERY, kill_at + 1, SAVE_EVERY):
            shutil.copytree(Path(reference["output_dir"]) / f"checkpoint-{step}", faulty_dir / f"checkpoint-{step}")
    complete = sorted(int(p.name.split("-")[1]) for p in faulty_dir.glob("checkpoint-*")
                      if (p / "hfscale_checkpoint.json").is_file())
    assert complete and complete[-1] <= kill_at, (kill_at, complete)
    # A save killed before every rank finished: a later checkpoint directory without the completion marker.
    interrupted = faulty_dir / f"checkpoint-{STEPS + SAVE_EVERY}"
    shutil.copytree(faulty_dir / f"checkpoint-{complete[-1]}", interrupted)
    (interrupted / "hfscale_checkpoint.json").unlink()
    # A complete checkpoint damaged since (a copy cut short): its marker lists every file's size; `latest` passes it
    damaged = shutil.copytree(faulty_dir / f"checkpoint-{complete[-1]}", faulty_dir / f"checkpoint-{STEPS + 2 * SAVE_EVERY}")
    listed = json.loads((damaged / "hfscale_checkpoint.json").read_text())["files"]
    assert listed == {p.relative_to(damaged).as_posix(): p.stat().st_size for p in damaged.rglob("*")
                      if p.is_file() and p.name != "hfscale_checkpoint.json"}
    biggest = max(listed, key=listed.get)
    (damaged / biggest).write_bytes((damaged / biggest).read_bytes()[:listed[biggest] // 2])

    launch(strategy, faulty_dir, "--resume_from_checkpoint", "latest")
    resumed = json.loads((faulty_dir / "results.json").read_text())
    start = complete[-1]
    assert resumed["status"] == "ok" and resumed["steps"] == STEPS
    assert resumed["resumed_from"] == str(faulty_dir / f"checkpoint-{start}")
    assert not interrupted.exists() and list(faulty_dir.glob(f"incomplete-checkpoint-{STEPS + SAVE_EVERY}-*"))
    assert not damaged.exists() and list(faulty_dir.glob(f"damaged-checkpoint-{STEPS + 2 * SAVE_EVERY}-*"))

    after = [s for s in range(start + 1, STEPS + 1)]
    ref_loss, res_loss = losses(reference), losses(resumed)
    for step in after:
        drift = abs(res_loss[step] - ref_loss[step]) / abs(ref_loss[step])
        assert drift <= TOLERANCE.get(strategy, 0.0), (strategy, kill_at, step, drift)
    assert {s: ref_loss[s] for s in range(1, start + 1)} == {s: res_loss[s] for s in range(1, start + 1)}
    # Same samples on every rank after the resume: none skipped, none repeated.
    for rank, (ref_batches, res_batches) in enumerate(zip(reference["batch_digests"], resumed["batch_digests"])):
        assert [b for b in ref_batches if b[0] > start] == res_batches, (strategy, rank)
    # Every checkpoint's save time and size are measured.
    assert all(c["save_s"] > 0 and c["size_gb"] > 0 for c in resumed["checkpoints"])

    # The final checkpoint exports to a plain HF model with the training model's logits (and no optimizer state);
    # the run's folder stands for it, past the interrupted and damaged saves set aside
    # (in this process: `hfscale export` is this function behind its argument parser)
    from hfscale.run.export import export

    exported = tmp_path / "exported"
    assert export(faulty_dir, exported, "fp32") == faulty_dir / f"checkpoint-{STEPS}"
    assert {p.name for p in exported.iterdir()} >= {"config.json", "model.safetensors"}
    from hfscale.errors import HfscaleError

    inside = faulty_dir / f"checkpoint-{STEPS}" / "model"  # into the checkpoint it reads: refused, nothing written
    with pytest.raises(HfscaleError, match=f"^{inside} is inside the checkpoint {faulty_dir / f'checkpoint-{STEPS}'}"):
        export(faulty_dir, inside, "fp32")
    assert not inside.exists()
    # A checkpoint whose weight files were truncated later (a full disk, a copy cut short) is one line, nothing written

    cut = shutil.copytree(faulty_dir / f"checkpoint-{STEPS}", tmp_path / "cut")
    weights = [p for pattern in ("model*.safetensors", "**/*optim_states.pt", "pytorch_model_fsdp_*/*.distcp")
               for p in cut.glob(pattern)]
    assert weights, sorted(p.name for p in cut.rglob("*"))
    for path in weights:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(HfscaleError, match=r"cut: its file \S+ is [\d,]+ bytes but was [\d,]+ when it was saved"):
        export(cut, tmp_path / "never", "fp32")
    # a marker that lists no files (written before hfscale listed them): the engine's own reading error, named
    marker = json.loads((cut / "hfscale_checkpoint.json").read_text())
    (cut / "hfscale_checkpoint.json").write_text(json.dumps({k: v for k, v in marker.items() if k != "files"}))
    with pytest.raises(HfscaleError, match="cut: cannot read its weights"):
        export(cut, tmp_path / "never", "fp32")
    assert not (tmp_path / "never").exists()
    assert not [p for p in exported.iterdir() if "optim" in p.name or p.suffix in (".pt", ".bin", ".pth")]
    import torch
    from transformers import AutoModelForCausalLM

    from hfscale.parallel.fingerprint import probe_ids

    # Computed as the engine computed them: the run's logits are bf16 (ddp: autocast over fp32 weights; FSDP2 and
    # DeepSpeed: a bf16 module whose weights are the exported fp32 masters rounded)
    model = AutoModelForCausalLM.from_pretrained(exported)
    ids = probe_ids(resumed["model"]["vocab"])
    with torch.no_grad():
        if strategy.startswith("ddp"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(input_ids=ids).logits
        else:
            logits = model.to(torch.bfloat16)(input_ids=ids).logits
    logits = logits[0, :4, :8].float().flatten()
    assert torch.allclose(logits, torch.tensor(resumed["probe_logits"]), rtol=0, atol=1e-5), strategy
