"""`hfscale sweep` for real (2-process runs through accelerate launch): failures become rows, an interrupted sweep
resumes, and `hfscale report` turns the directory into a table with the failed rows kept."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SWEEP, SWEEP_FIXED, hfscale_here, run, sweep, swept as swept_runs

pytestmark = pytest.mark.multiprocess


@pytest.fixture()
def swept():
    """The three sweeps into one folder (conftest.swept), made once per session: its ddp x adafactor run is also that
    pair's run in the strategy x optimizer matrix."""
    made = swept_runs()
    return Path(made["out"]), made


def test_sweep_runs_the_cross_product_and_keeps_failures_as_rows(swept):
    out, made = swept
    assert made["returncodes"] == [0, 0, 0], made["stderr"]
    # sweep.json describes the latest sweep
    assert made["index"] == {"ddp-adamw-np1-mbs3-gas1": "refused", "fsdp_hybrid-adamw-np1-mbs3-gas1": "refused"}
    results = {d.name: json.loads((d / "results.json").read_text()) for d in out.iterdir() if (d / "results.json").is_file()}
    assert {name: r["status"] for name, r in results.items()} == {
        "ddp-adamw-np2-mbs4-gas1": "ok", "ddp-adafactor-np2-mbs4-gas1": "ok", "zero2_offload-adamw-np2-mbs4-gas1": "ok",
        "zero2_offload-adafactor-np2-mbs4-gas1": "refused",  # the strategy table refuses it before launching
        "zero1-adamw-np2-mbs4-gas1": "timeout", "ddp-adamw-np1-mbs3-gas1": "refused",
        "fsdp_hybrid-adamw-np1-mbs3-gas1": "refused"}  # one node: refused before launching
    ok = results["zero2_offload-adamw-np2-mbs4-gas1"]
    assert ok["config"]["world_size"] == 2 and ok["perf"]["tokens_per_s"] > 0 and ok["optim"] == "adamw"
    assert "DeepSpeedCPUAdam" in ok["strategy_check"]["optimizer_states"]["optimizer"]
    assert "CPU Adam" in results["zero2_offload-adafactor-np2-mbs4-gas1"]["error"]
    # the run's own start-up checks (its plan: train.check_args), made by the sweep before it launches anything
    assert "--deepspeed is for the zero* strategies" in results["ddp-adamw-np1-mbs3-gas1"]["error"]
    assert "'fsdp_hybrid' is fsdp" in results["fsdp_hybrid-adamw-np1-mbs3-gas1"]["error"]  # the first of its two
    for name in ("zero2_offload-adafactor-np2-mbs4-gas1", "fsdp_hybrid-adamw-np1-mbs3-gas1", "ddp-adamw-np1-mbs3-gas1"):
        assert not (out / name / "launch.log").exists()  # nothing was launched
    # the timed-out run's whole process tree is gone
    left = subprocess.run(["pgrep", "-f", str(out / "zero1-adamw")], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_interrupted_sweep_skips_what_finished(swept):
    out = swept[0]
    before = {p: p.stat().st_mtime_ns for p in out.glob("*/results.json")}
    again = sweep(out, *SWEEP, timeout=120)
    assert again.returncode == 0
    assert again.stdout.count("(already done)") == 4
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/results.json")} == before


def test_a_sweep_of_other_flags_into_the_folder_is_refused_before_anything_runs(swept):
    """A run's name says its axes, not the flags every run shares: a sweep (or a tune) of another model or sequence
    into a folder of finished runs would take them as its own, already done. Refused in one line, dry run or not,
    nothing written; the same flags are still the resumed sweep (test_interrupted_sweep_skips_what_finished)."""
    out = swept[0]  # three sweeps, each of its own flags and its own runs (conftest.swept): allowed
    first = [f"{s}-{o}-np2-mbs4-gas1" for s in ("ddp", "zero2_offload") for o in ("adamw", "adafactor")]
    assert all(json.loads((out / run / "results.json").read_text())["sweep"]["fixed"] == SWEEP_FIXED for run in first)
    assert json.loads((out / "zero1-adamw-np2-mbs4-gas1" / "results.json").read_text())["sweep"]["fixed"] == [
        *SWEEP_FIXED, "--max_steps", "1000000"]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    other = [a if a != "64" else "32" for a in SWEEP_FIXED]  # --seq_len 32
    assert other != SWEEP_FIXED
    for dry in ([], ["--dry_run"]):
        proc = hfscale_here("sweep", "--out", out, *SWEEP, *dry, "--", *other)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        line, = proc.stderr.strip().splitlines()
        assert line.startswith(f"hfscale: error: {out}/ddp-adamw-np2-mbs4-gas1 is a run of other training flags (")
        assert "--seq_len 64" in line and "--seq_len 32" in line and "give another --out, or remove it" in line
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_a_dry_run_says_what_the_sweep_would_do_and_does_nothing(swept):
    """On the swept folder with zero3 added: the finished runs are skipped, the refused pair is refused again
    (--retry_failed decides it anew), each zero3 run is its launch command with zero3's shipped files; nothing is
    written or started."""
    out = swept[0]
    before = {p: p.stat().st_mtime_ns for p in out.glob("*/results.json")}  # (the other tests write the index, reports)
    axes = ["--strategy", "ddp,zero2_offload,zero3", *SWEEP[2:]]
    proc = hfscale_here("sweep", "--out", out, *axes, "--retry_failed", "--dry_run", "--", *SWEEP_FIXED)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[1]: line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ") and
            not line.startswith("    ")}
    assert rows == {"ddp-adamw-np2-mbs4-gas1": "ok", "ddp-adafactor-np2-mbs4-gas1": "ok",
                    "zero2_offload-adamw-np2-mbs4-gas1": "ok", "zero2_offload-adafactor-np2-mbs4-gas1": "refused",
                    "zero3-adamw-np2-mbs4-gas1": "launch", "zero3-adafactor-np2-mbs4-gas1": "launch"}
    assert proc.stdout.count("(already done)") == 3 and "CPU Adam" in proc.stdout
    commands = [line.split() for line in proc.stdout.splitlines() if line.startswith("    ")]
    assert len(commands) == 2 and all("accelerate_configs/zero3.yaml" in " ".join(c) and "ds_configs/zero3.json"
                                      in " ".join(c) and c[c.index("--num_processes") + 1] == "2" for c in commands)
    assert {c[c.index("--output_dir") + 1] for c in commands} == {str(out / "zero3-adamw-np2-mbs4-gas1"),
                                                                  str(out / "zero3-adafactor-np2-mbs4-gas1")}
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/results.json")} == before and not list(out.glob("zero3-*"))


def test_report_of_a_sweep_keeps_failed_rows(swept):
    out = swept[0]
    proc = run([sys.executable, "-m", "hfscale", "report", str(out), "--html"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = (out / "report" / "report.md").read_text().splitlines()
    assert len(table) == 2 + 7
    assert sum("| timeout |" in line for line in table) == 1 and sum("| refused |" in line for line in table) == 3
    assert all(p.stat().st_size > 1000 for p in (out / "report").glob("*.png"))
    assert {p.name for p in (out / "report").glob("*.png")} == {"days_vs_gpus.png", "loss_curves.png", "memory.png",
                                                                 "throughput.png", "loss_vs_tokens.png", "loss_vs_time.png"}
