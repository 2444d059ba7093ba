"""Sweep/report/parity/import-logs logic that needs no training: log import against the BigScience formula by hand,
outcome classification, parity judgement, report table and plots."""

import csv
import io
import json
import re
import statistics
import sys

import pytest

from conftest import REPO, hfscale_here, run
from hfscale.errors import HfscaleError
from hfscale.run.outcome import classify
from hfscale.compare.megatron import import_log
from hfscale.compare.megatron_log import parse_log, parse_name
from hfscale.compare.parity import compare, weights_deviation
from hfscale.compare.plots import wide_range
from hfscale.compare.report import COLUMNS, write_report
from hfscale.compare.sweep import SweepSpec, expand
from hfscale.launching import RunSpec, stub_results
from hfscale.formulas.comm import Links
from hfscale.plan.baseline import baseline_from_megatron_log
from hfscale.run.results import Results, write_results

DATA = REPO / "tests" / "data"
GOOD_LOG = DATA / "61B-megatron-mbs-2-pp16-dp-1-gas-512-200977.out"
OOM_LOG = DATA / "61B-megatron-mbs-4-pp16-dp-1-gas-256-200978.out"
FAIL_LOG = DATA / "61B-megatron-mbs-1-pp16-dp-1-gas-512-200979.out"


def imported(path, **kw) -> dict:
    """An imported log's results record, as results.json holds it."""
    return import_log(path, **kw).to_dict()


def hfscale(*args, launched: bool = True):
    """`hfscale ARGS` as the console command, or in this process (conftest.hfscale_here)."""
    if not launched:
        return hfscale_here(*args)
    return run([sys.executable, "-m", "hfscale", *map(str, args)], timeout=120)


# ---- import-logs -----------------------------------------------------------------------------------------------

def test_log_names_in_the_bigscience_style():
    assert parse_name(GOOD_LOG.name) == {"mbs": 2, "gas": 512, "pp": 16, "dp": 1, "params": 61_000_000_000, "size": "61B"}
    assert parse_name("1B3-tp-2-pp2-dp-8-mbs-4-gas-16.out")["params"] == 1_300_000_000  # BigScience's 1B3 = 1.3B
    assert parse_name("1B3-tp-2-pp2-dp-8-mbs-4-gas-16.out")["tp"] == 2
    assert parse_name("350M-dp-8.out") == {"dp": 8, "params": 350_000_000, "size": "350M"}


def test_imported_log_matches_the_bigscience_formula_by_hand():
    times_ms = [float(line.split("elapsed time per iteration (ms):")[1].split("|")[0])
                for line in GOOD_LOG.read_text().splitlines() if "elapsed time per iteration" in line]
    s_per_iter = statistics.mean(times_ms[1:]) / 1000  # the first interval includes start-up: skipped
    record = imported(GOOD_LOG, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1)
    assert record["status"] == "ok"
    assert record["config"]["world_size"] == 16 and record["config"]["global_batch_size"] == 512
    assert record["perf"]["s_per_iter"] == pytest.approx(s_per_iter)
    # params x 4 x 2 x seq x GBS / (s/it x GPUs x 1e12), F = 4 with activation checkpointing
    assert record["perf"]["tflops_per_gpu_bigscience"] == pytest.approx(61e9 * 4 * 2 * 2048 * 512 / (s_per_iter * 16 * 1e12))
    assert record["perf"]["tokens_per_s"] == pytest.approx(512 * 2048 / s_per_iter)
    assert [p["loss"] for p in record["loss_history"]] == [10.91, 9.84, 8.97, 8.42, 8.05]
    no_ckpt = imported(GOOD_LOG, gpus=None, seq_len=2048, params=None, checkpointing=False, skip_first=1)
    assert no_ckpt["perf"]["tflops_per_gpu_bigscience"] == pytest.approx(record["perf"]["tflops_per_gpu_bigscience"] * 3 / 4)


def test_log_without_iterations_is_a_failed_row():
    fail = imported(FAIL_LOG, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1)
    oom = imported(OOM_LOG, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1)
    assert (fail["status"], oom["status"]) == ("fail", "OOM")
    assert "out of memory" in oom["error"]
    assert parse_log("nothing here")["iteration_s"] == []


HEADER_LOG = DATA / "104B-megatron-mbs-1-pp16-dp-1-gas-2048-300001.out"  # TP 4, ramp-up, Megatron-DeepSpeed


def test_the_logs_own_header_wins_over_its_file_name_and_ramp_up_is_left_out():
    """The file name has no TP (so it reads as TP 1, DP 1, 16 GPUs); the header says 64 GPUs = TP 4 x PP 16 x DP 1,
    seq 2048, checkpointing, a batch ramp-up from 16 to 2048, and DeepSpeed."""
    warnings = []
    record = imported(HEADER_LOG, gpus=None, seq_len=None, params=None, checkpointing=None, skip_first=1,
                        warnings=warnings)
    cfg, perf = record["config"], record["perf"]
    assert (cfg["world_size"], cfg["tp"], cfg["pp"], cfg["dp"]) == (64, 4, 16, 1)
    assert record["strategy"] == "megatron-deepspeed-tp4-pp16" and cfg["global_batch_size"] == 2048
    assert cfg["rampup_batch_size"] and cfg["seq_len"] == 2048 and cfg["activation_checkpointing"] is True
    # only iterations at GBS 2048 count (3 of them), the first of those skipped: (110 + 112) / 2 s
    assert perf["iterations_averaged"] == 2 and perf["s_per_iter"] == pytest.approx(111.0)
    assert perf["tflops_per_gpu_bigscience"] == pytest.approx(104e9 * 4 * 2 * 2048 * 2048 / (111.0 * 64 * 1e12))
    assert warnings == []  # the name says nothing the log contradicts
    flagged = imported(HEADER_LOG, gpus=32, seq_len=1024, params=None, checkpointing=False, skip_first=1,
                         warnings=warnings)
    assert flagged["config"]["world_size"] == 64 and flagged["config"]["seq_len"] == 2048  # the log wins
    assert len(warnings) == 3 and all(w.startswith(HEADER_LOG.name) for w in warnings)


# what launchers put before every line: srun --label, torchrun --tee (older and newer), a timestamp, srun around
# torchrun; and a log written on Windows
LINE_PREFIXES = ["12: ", "[default3]:", "[rank3]: ", "[2024-05-01 10:00:00] ", "3: [default3]:", "\r"]


@pytest.mark.parametrize("prefix", LINE_PREFIXES)
def test_a_log_whose_lines_carry_a_launchers_prefix_imports_as_the_bare_log(tmp_path, prefix):
    lines = HEADER_LOG.read_text().splitlines()
    log = tmp_path / HEADER_LOG.name
    log.write_bytes(("\r\n".join(lines) if prefix == "\r" else "\n".join(prefix + line for line in lines)).encode())
    bare, prefixed = (imported(path, gpus=None, seq_len=None, params=None, checkpointing=None, skip_first=1)
                      for path in (HEADER_LOG, log))
    assert prefixed["config"]["world_size"] == 64  # from the header: the file name alone says 16
    for key in ("strategy", "model", "config", "perf", "loss_history", "status"):
        assert prefixed[key] == bare[key], key


def _iteration(step: int, ms: float, loss: float, gbs: int = 512) -> str:
    return (f" iteration {step:8d}/  292968 | consumed samples: {step * gbs:10d} | elapsed time per iteration (ms): "
            f"{ms:.1f} | learning rate: 6.000E-05 | global batch size: {gbs:5d} | lm loss: {loss:.6E} | loss scale: 4096.0 |")


def _good_log_times() -> list[float]:
    return [float(line.split("(ms):")[1].split("|")[0]) / 1000 for line in GOOD_LOG.read_text().splitlines()
            if "(ms):" in line]


@pytest.mark.parametrize("dress", [
    lambda line: line + "\r",  # written on Windows, or through a terminal
    lambda line: f"\x1b[32m{line}\x1b[0m",  # a colouring logger
    lambda line: f"[2021-10-10 10:00:00] 3: {line}",  # a timestamp and srun --label's rank
], ids=["crlf", "ansi-colours", "timestamp-and-rank"])
def test_a_log_reads_the_same_whatever_each_line_is_dressed_in(tmp_path, dress):
    log = tmp_path / GOOD_LOG.name
    log.write_text("\n".join(dress(line) for line in GOOD_LOG.read_text().splitlines()) + "\n")
    args = {"gpus": None, "seq_len": None, "params": None, "checkpointing": None, "skip_first": 1}
    plain, dressed = imported(GOOD_LOG, **args), imported(log, **args)
    assert dressed["config"] == plain["config"] and dressed["perf"] == plain["perf"]
    assert dressed["loss_history"] == plain["loss_history"] and plain["config"]["world_size"] == 16


def test_an_empty_log_is_one_line(tmp_path):
    log = tmp_path / GOOD_LOG.name
    log.write_text("\n \n")
    with pytest.raises(HfscaleError, match=f"{log.name}: the log is empty"):
        import_log(log, gpus=None, seq_len=None, params=None, checkpointing=None, skip_first=1)


CP_LOG = """\
using world size: 16, data-parallel size: 4, context-parallel size: 2, hierarchical context-parallel sizes: None, \
tensor-model-parallel size: 2, encoder-tensor-model-parallel size: 0, pipeline-model-parallel size: 1, \
encoder-pipeline-model-parallel size: 0
------------------------ arguments ------------------------
  global_batch_size ............................... 64
  hidden_size ..................................... 4096
  micro_batch_size ................................ 1
  num_attention_heads ............................. 32
  num_layers ...................................... 32
  seq_length ...................................... 8192
-------------------- end of arguments ---------------------
"""
CP_ITERATION = (" [2024-05-14 10:00:{s:02d}] iteration {step:8d}/     100 | consumed samples: {samples:12d} | elapsed time per "
                "iteration (ms): 3200.0 | throughput per GPU (TFLOP/s/GPU): 421.0 | learning rate: 1.500000E-05 | global "
                "batch size:    64 | lm loss: 9.8 | loss scale: 1.0 | grad norm: 4.1 | num zeros: 0.0 |")


def test_a_context_parallel_log_counts_its_data_parallel_degree_without_the_cp_gpus(tmp_path):
    """Megatron-LM's context parallelism splits each sequence over CP GPUs: DP = world / (TP x PP x CP), here 16 /
    (2 x 1 x 2) = 4 (read as 8 before, with half the true accumulation). Its throughput is the log's, and it projects
    as the layout it ran: its own step at its own size, exactly (the rate is solved from it); a log of the
    interleaved schedule names its model chunks."""
    log = tmp_path / "7B-cp.out"
    log.write_text(CP_LOG + "\n".join(CP_ITERATION.format(s=i, step=10 * i, samples=640 * i) for i in (1, 2, 3)) + "\n")
    record = imported(log, gpus=None, seq_len=None, params=None, checkpointing=None, skip_first=1)
    cfg = record["config"]
    assert (cfg["world_size"], cfg["tp"], cfg["pp"], cfg["dp"], cfg["context_parallel"]) == (16, 2, 1, 4, 2)
    assert cfg["gradient_accumulation_steps"] == 64 // (1 * 4) and record["strategy"] == "megatron-tp2-pp1-cp2"
    assert record["perf"]["tokens_per_s"] == pytest.approx(64 * 8192 / 3.2)
    write_results(tmp_path / "imported", Results.from_dict(record))
    rows = write_report([tmp_path / "imported"], tmp_path / "report", with_plots=False)[0]
    assert "TP 2 PP 1 CP 2 DP 4" in rows[0].notes, rows[0].notes
    proc = hfscale("project", tmp_path / "imported" / "results.json", "--gpus", "16,32", "--json", launched=False)
    assert proc.returncode == 0, proc.stderr
    points = {p["gpus"]: p for p in json.loads(proc.stdout)["points"]}
    assert {p["strategy"] for p in points.values()} == {"megatron-tp2-pp1-cp2"}
    assert points[16]["layout"] == "tp2-pp1-cp2-dp4" and points[16]["s_per_iter"] == pytest.approx(3.2, rel=1e-6)
    # Megatron prints the chunk count, or (older) the layers a chunk holds: 32 layers / PP 2 / 4 a chunk = VP 4
    assert not record["config"]["flash_attention"] and not record["config"]["distributed_optimizer"]  # it names neither
    assert record["config"]["dropout"] is None  # nor its dropout: Megatron's default, whose masks the layers keep
    links = [Links(300e9, 25e9, collectives="nccl")] * 3
    plain = baseline_from_megatron_log(tmp_path / "imported" / "results.json", links, 8, None)[0]
    assert plain.dropout and plain.plan.attention == "eager"  # what its projected layouts keep: masks and scores
    for argument in ("virtual_pipeline_model_parallel_size ..... 4", "num_layers_per_virtual_pipeline_stage .. 4"):
        interleaved = tmp_path / f"7B-vp-{argument[:3]}.out"
        interleaved.write_text(log.read_text().replace("  seq_length", f"  {argument}\n"
                                                       "  attention_backend ..... AttnBackend.auto\n"
                                                       "  use_distributed_optimizer ..... True\n"
                                                       "  hidden_dropout ..... 0.0\n  attention_dropout ... 0.0\n"
                                                       "  seq_length")
                               .replace("pipeline-model-parallel size: 1", "pipeline-model-parallel size: 2")
                               .replace("data-parallel size: 4", "data-parallel size: 2"))
        record = imported(interleaved, gpus=None, seq_len=None, params=None, checkpointing=None, skip_first=1)
        assert record["strategy"] == "megatron-tp2-pp2-vp4-cp2" and record["config"]["virtual_pipeline"] == 4
        assert record["config"]["flash_attention"] and record["config"]["distributed_optimizer"]
        assert record["config"]["dropout"] == 0.0
    write_results(tmp_path / "interleaved", Results.from_dict(record))
    fused = baseline_from_megatron_log(tmp_path / "interleaved" / "results.json", links, 8, None)[0]
    assert not fused.dropout and fused.plan.attention == "flash_attention_2"
    rows = write_report([tmp_path / "interleaved"], tmp_path / "report-vp", with_plots=False)[0]
    assert "TP 2 PP 2 VP 4 CP 2 DP 2" in rows[0].notes, rows[0].notes


@pytest.mark.parametrize("edit,expected", [
    (("(ms): 709876.2", "(ms): 0.0"), "iteration 20: elapsed time per iteration 0 ms, not a time"),
    (("(ms): 709876.2", "(ms): nan"), "iteration 20: elapsed time per iteration nan ms, not a time"),
    (("(ms): 709876.2", "(ms): 1e999"), "iteration 20: elapsed time per iteration inf ms, not a time"),
    (("global batch size:   512 | lm loss: 9.84", "global batch size:   0 | lm loss: 9.84"),
     "iteration 20: global batch size 0"),
    (("world size: 16,", "world size: 0,"), "the log's header says world 0; a size must be at least 1"),
    (("tensor-model-parallel size: 1,", "tensor-model-parallel size: 0,"), "the log's header says tp 0"),
    (("(ms): 709876.2", "(ms): 709.876.2"), "iteration 20: elapsed time per iteration (ms) '709.876.2' is not a number"),
    (("lm loss: 9.840000E+00", "lm loss: 9.84.0"), "iteration 20: lm loss '9.84.0' is not a number"),
    (("grad norm: 1.234", "grad norm: ."), "iteration 10: grad norm '.' is not a number"),
], ids=["zero-time", "nan-time", "overflowing-time", "zero-batch", "zero-world", "zero-tp", "time-not-a-number",
        "loss-not-a-number", "grad-norm-not-a-number"])
def test_a_damaged_value_in_a_log_is_named_not_divided_by(tmp_path, edit, expected):
    """A hand-edited or damaged log: a value that is not a number, a time that is no positive, finite number of
    milliseconds, or a size of 0, is one line naming it - before, a 0 ms iteration was a ZeroDivisionError, '1.2.3' a
    ValueError (tracebacks both), a 0 in the header a silent default."""
    text = GOOD_LOG.read_text()
    assert edit[0] in text
    log = tmp_path / GOOD_LOG.name
    log.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(HfscaleError, match=f"^{log.name}: " + re.escape(expected)):
        import_log(log, gpus=None, seq_len=None, params=None, checkpointing=None, skip_first=1)


@pytest.mark.parametrize("header", [True, False], ids=["requeued", "restarted-without-header"])
def test_a_log_appended_by_a_restart_skips_each_launchs_start_up_and_keeps_the_later_loss(tmp_path, header):
    """GOOD_LOG (iterations 10-50), then the job requeued from its checkpoint of step 30: its first iteration carries
    the new launch's start-up, and steps 40 and 50 are trained again. A launch that prints no header is found by the
    iteration count going back."""
    again = [_iteration(40, 900_000.0, 8.5), _iteration(50, 700_000.0, 8.1), _iteration(60, 702_000.0, 7.9)]
    log = tmp_path / GOOD_LOG.name
    head = GOOD_LOG.read_text().splitlines()[:3] if header else []
    log.write_text(GOOD_LOG.read_text() + "\n".join([*head, *again]) + "\n")
    record = imported(log, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1)
    measured = _good_log_times()[1:] + [700.0, 702.0]  # the first iteration of each launch is left out
    assert record["perf"]["s_per_iter"] == pytest.approx(statistics.mean(measured))
    assert record["perf"]["iterations_averaged"] == 6 and record["perf"]["launches"] == 2
    assert [(p["step"], p["loss"]) for p in record["loss_history"]] == [
        (10, 10.91), (20, 9.84), (30, 8.97), (40, 8.5), (50, 8.1), (60, 7.9)]
    assert record["config"]["world_size"] == 16
    if header:  # the row's Notes, through the command once
        proc = hfscale("import-logs", log, "--out", tmp_path / "out", launched=False)
        assert proc.returncode == 0 and "6 iterations of 2 launches" in proc.stdout, proc.stdout + proc.stderr


def test_an_imported_curve_has_tokens_seconds_and_the_validation_loss_as_a_run_has(tmp_path):
    """Tokens from the consumed samples x seq_len; seconds from each logged iteration time x its interval (the first
    line's: the log interval the arguments state); validation lines as the eval curve, the test set's left out."""
    lines = ["using world size: 16, data-parallel-size: 1, tensor-model-parallel size: 1, pipeline-model-parallel "
             "size: 16", "  log_interval .................................... 5", "  seq_length ...... 1024",
             _iteration(5, 2000.0, 9.0), _iteration(10, 1000.0, 8.0),
             " validation loss at iteration 10 | lm loss value: 7.900000E+00 | lm loss PPL: 2.697E+03 |",
             _iteration(20, 1100.0, 7.0),
             " validation loss at iteration 20 on validation set | lm loss value: 6.900000E+00 | lm loss PPL: 992.3 |",
             " validation loss at iteration 20 on test set | lm loss value: 6.950000E+00 | lm loss PPL: 1043.1 |"]
    log = tmp_path / "1B3-megatron-gas-1.out"
    log.write_text("\n".join(lines) + "\n")
    record = imported(log, gpus=None, seq_len=None, params=None, checkpointing=True, skip_first=1)
    assert [(p["step"], p["tokens"], p["elapsed_s"], p["lr"]) for p in record["loss_history"]] == [
        (5, 5 * 512 * 1024, 5 * 2.0, 6e-05), (10, 10 * 512 * 1024, 10 + 5 * 1.0, 6e-05),
        (20, 20 * 512 * 1024, pytest.approx(15 + 10 * 1.1), 6e-05)]
    assert [(p["step"], p["loss"], p["perplexity"], p["tokens"], p["elapsed_s"]) for p in record["eval_history"]] == [
        (10, 7.9, 2697.0, 10 * 512 * 1024, 15.0), (20, 6.9, 992.3, 20 * 512 * 1024, pytest.approx(26.0))]
    # the same curves in TensorBoard, under a run's tags, beside hfscale's runs
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for _ in range(2):  # imported again: the events are replaced, not doubled
        proc = hfscale("import-logs", log, "--out", tmp_path / "tb", launched=False)
        assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "tb" / log.stem).glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(tmp_path / "tb" / log.stem))
    events.Reload()

    def scalars(tag):
        return [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(tag)]

    losses, evals = record["loss_history"], record["eval_history"]
    assert scalars("train/loss") == [(p["step"], p["loss"]) for p in losses]
    assert scalars("train/lr") == [(p["step"], p["lr"]) for p in losses]
    assert scalars("train_by_tokens/loss") == [(p["tokens"], p["loss"]) for p in losses]
    assert scalars("train_by_time_ms/loss") == [(int(p["elapsed_s"] * 1000), p["loss"]) for p in losses]
    assert scalars("eval/perplexity") == [(p["step"], p["perplexity"]) for p in evals]
    assert scalars("eval_by_tokens/loss") == [(p["tokens"], p["loss"]) for p in evals]
    from hfscale.compare.megatron import thinned

    points = list(range(12_001))  # a long log's curve in TensorBoard: every 3rd point and the last, ~4,000
    assert thinned(points, 5000) == list(range(0, 12_001, 3)) and thinned(points[:-1], 5000)[-1] == 11_999
    assert thinned(points[:5000], 5000) == points[:5000]
    # without a stated log interval, a launch's first line counts the steps between its first two lines
    bare = tmp_path / "bare" / log.name
    bare.parent.mkdir()
    bare.write_text("\n".join(line for line in lines if "log_interval" not in line) + "\n")
    again = imported(bare, gpus=None, seq_len=None, params=None, checkpointing=True, skip_first=1)
    assert again["loss_history"][0]["elapsed_s"] == 5 * 2.0


@pytest.mark.parametrize("said", ["throughput per GPU (TFLOP/s/GPU): {:.1f}", "TFLOPs: {:.2f}"],
                         ids=["megatron-lm", "megatron-deepspeed"])
def test_the_logs_own_tflops_are_averaged_over_the_measured_iterations_and_noted(tmp_path, said):
    """Megatron's own TFLOPs per GPU (its formula, not BigScience's) beside the table's: averaged over the iterations
    the speed is (the first of each launch left out), named in the Notes."""
    lines = [_iteration(step, ms, loss) + f" {said.format(tflops)} |"
             for step, ms, loss, tflops in ((10, 900.0, 9.0, 300.0), (20, 700.0, 8.0, 400.0), (30, 700.0, 7.5, 410.0))]
    log = tmp_path / "61B-megatron-pp16-dp-1.out"
    log.write_text("\n".join(lines) + "\n")
    record = imported(log, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1)
    assert record["perf"]["tflops_per_gpu_reported"] == pytest.approx(405.0)
    if said.startswith("TFLOPs"):  # the row's Notes, through the command once
        proc = hfscale("import-logs", log, "--out", tmp_path / "out", launched=False)
        assert proc.returncode == 0 and "the log says 405.0 TFLOPs/GPU" in proc.stdout, proc.stdout + proc.stderr
    assert imported(GOOD_LOG, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1)[
        "perf"]["tflops_per_gpu_reported"] is None  # a log that prints none: nothing made up


def test_a_restart_on_other_sizes_measures_only_the_launches_from_it_with_a_warning(tmp_path):
    log = tmp_path / GOOD_LOG.name
    resized = ["using world size: 32, data-parallel-size: 2, tensor-model-parallel size: 1, pipeline-model-parallel "
               "size: 16", _iteration(60, 500_000.0, 7.9), _iteration(70, 380_000.0, 7.8), _iteration(80, 382_000.0, 7.7)]
    log.write_text(GOOD_LOG.read_text() + "\n".join(resized) + "\n")
    warnings = []
    record = imported(log, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1, warnings=warnings)
    cfg = record["config"]
    assert (cfg["world_size"], cfg["dp"], cfg["pp"]) == (32, 2, 16)
    assert record["perf"]["s_per_iter"] == pytest.approx(381.0) and record["perf"]["iterations_averaged"] == 2
    assert [p["step"] for p in record["loss_history"]] == [10, 20, 30, 40, 50, 60, 70, 80]  # the whole curve
    assert len(warnings) == 2 and "launch 2 of 2 changed world 16 -> 32, dp 1 -> 2" in warnings[0]
    assert "the file name says dp 1, the log says 2" in warnings[1]


def test_a_newer_megatron_lm_header_says_no_recomputation_its_precision_and_vocabulary(tmp_path):
    """Megatron-LM prints every argument, None included: recompute_granularity None is no recomputation (F = 3, where
    a log that says nothing keeps BigScience's F = 4), bf16 True the precision, padded_vocab_size the vocabulary."""
    args = {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 512, "num_layers": 32, "hidden_size": 4096,
            "num_attention_heads": 32, "padded_vocab_size": 128256, "bf16": True, "recompute_granularity": None}
    lines = ["using world size: 64, data-parallel size: 8, context-parallel size: 1, tensor-model-parallel size: 4, "
             "pipeline-model-parallel size: 2", "------------------------ arguments ------------------------",
             *[f"  {key} {'.' * (40 - len(key))} {value}" for key, value in sorted(args.items())],
             "-------------------- end of arguments ---------------------",
             *[f" [2024-05-01 10:0{i}:00] iteration {10 * i:8d}/    1000 | consumed samples: {5120 * i:12d} | elapsed "
               f"time per iteration (ms): {10000 + i:.1f} | learning rate: 1.0E-05 | global batch size:   512 | lm loss: "
               f"{8 - i / 10:.6E} | loss scale: 1.0 | grad norm: 2.3 | number of skipped iterations:   0 |"
               for i in (1, 2, 3)]]
    log = tmp_path / "8B-megatron-lm.out"
    log.write_text("\n".join(lines) + "\n")
    record = imported(log, gpus=None, seq_len=None, params=None, checkpointing=None, skip_first=1)
    cfg = record["config"]
    assert (cfg["world_size"], cfg["tp"], cfg["pp"], cfg["dp"], cfg["seq_len"]) == (64, 4, 2, 8, 4096)
    assert cfg["activation_checkpointing"] is False and cfg["precision"] == "bf16" and record["model"]["vocab"] == 128256
    s_per_iter = (10002 + 10003) / 2 / 1000
    assert record["perf"]["tflops_per_gpu_bigscience"] == pytest.approx(8e9 * 3 * 2 * 4096 * 512 / (s_per_iter * 64 * 1e12))


def test_every_imported_row_names_its_log_file(tmp_path):
    proc = hfscale("import-logs", GOOD_LOG, HEADER_LOG, "--out", tmp_path / "meg", launched=False)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "megatron" in line]
    assert len(rows) == 2 and all(any(f.name in row for f in (GOOD_LOG, HEADER_LOG)) for row in rows)
    assert "Megatron-DeepSpeed log, TP 4 PP 16 DP 1" in proc.stdout and "after ramp-up" in proc.stdout


def test_import_logs_cli_and_bad_log_name(tmp_path):
    proc = hfscale("import-logs", GOOD_LOG, OOM_LOG, "--out", tmp_path / "meg")
    assert proc.returncode == 0, proc.stderr
    assert "| OOM |" in proc.stdout and "megatron-tp1-pp16" in proc.stdout
    # every row names its log, the failed ones too
    oom_row = next(line for line in proc.stdout.splitlines() if "| OOM |" in line)
    assert f"{OOM_LOG.name}: Megatron log, OOM:" in oom_row and GOOD_LOG.name in proc.stdout
    bad = tmp_path / "mystery.out"
    bad.write_text("elapsed time per iteration (ms): 100.0\n")
    proc = hfscale("import-logs", GOOD_LOG, bad, "--out", tmp_path / "meg2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--params" in proc.stderr
    assert not (tmp_path / "meg2").exists()  # every log is parsed before anything is written


def test_parity_of_all_leaves_out_what_cannot_run_on_its_processes():
    """`--strategy all` on one process: PowerSGD (needs 2+), HSDP and fsdp_tp (need nodes) and tp (its own batch) are
    left out, as the pairs the strategy table refuses are; the others are launched after ddp."""
    proc = hfscale_here("parity", "--strategy", "all", "--num_processes", "1", "--dry_run")
    assert proc.returncode == 0, proc.stderr
    launched = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("  launch ")]
    assert launched == ["ddp", "fsdp", "fsdp_offload", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"]


# ---- outcomes of launched runs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rc,log,results,timed_out,expected", [
    (0, "", "ok", False, "ok"),
    (None, "", None, True, "timeout"),
    (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", "fail", False, "OOM"),
    (1, "RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory", None, False, "OOM"),
    (1, "exitcode  : -9 (pid: 12)\nSignal 9 (SIGKILL) received by PID 12", None, False, "OOM"),
    # the other ways the stack says it: a kernel's own allocation, cuBLAS's handle, NCCL's buffers, ROCm
    (1, "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", None, False, "OOM"),
    (1, "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "fail", False, "OOM"),
    (1, "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with "
        "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nLast error:\nCuda failure 'out of memory'", None, False, "OOM"),
    (1, "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB", "fail", False, "OOM"),
    (1, "hfscale: error: unknown strategy 'zero4'; choose one of: ddp", None, False, "refused"),
    (1, "ValueError: something broke", "fail", False, "fail"),
    (0, "", "running", False, "fail"),  # exit 0 without finishing is not a success
    (0, "", "stopped", False, "stopped"),  # saved and stopped on SIGUSR1 (run/stopping.py): not final, run again
])
def test_outcome_classification(rc, log, results, timed_out, expected):
    status, error = classify(rc, log, results, timed_out)
    assert status == expected
    assert (error is None) == (expected == "ok")


def test_sweep_expands_the_cross_product_and_checks_names():
    spec = SweepSpec(strategy=["ddp", "zero3"], optim=["adamw", "adafactor"], num_processes=[1, 2],
                     activation_checkpointing=[False, True])
    runs = expand(spec)
    assert len(runs) == 2 * 2 * 2 * 2 and len({r.name for r in runs}) == len(runs)
    assert RunSpec("zero3", "adamw", 2, 4, 8, True).name == "zero3-adamw-np2-mbs4-gas8-ac"
    with pytest.raises(Exception, match="unknown strategy 'zero4'"):
        SweepSpec(strategy=["zero4"])
    with pytest.raises(Exception, match="positive integers"):
        SweepSpec(num_processes=[0])
    with pytest.raises(Exception, match="sweep axis"):
        SweepSpec(train_args=["--strategy", "ddp"])


# ---- parity judgement ------------------------------------------------------------------------------------------

def _run(losses, weights=None, status="ok"):
    return Results.from_dict({"status": status, "loss_history": [{"loss": v, "grad_norm": 1.0 + v / 10} for v in losses],
                              "final_weights": weights or {"w": [0.0, 10.0, 1.0]}})


def test_parity_judges_exact_and_lossy_strategies():
    ref = _run([7.0, 6.5, 6.0])
    same = compare(ref, _run([7.0, 6.5, 6.0]), "zero2", "adamw", 1e-4, None)
    assert same.verdict == "pass" and same.loss_max_rel == 0.0 and same.weights_max_rel == 0.0
    off = compare(ref, _run([7.0, 6.5, 6.001]), "zero2", "adamw", 1e-4, None)
    assert off.verdict == "FAIL" and off.loss_max_rel == pytest.approx(0.001 / 6.0)
    moved = compare(ref, _run([7.0, 6.5, 6.0], {"w": [0.01, 10.0, 1.0]}), "fsdp", "adamw", 1e-4, None)
    assert moved.verdict == "FAIL" and moved.weights_max_rel == pytest.approx(0.001)  # sum error / L1
    lossy = compare(ref, _run([7.0, 6.6, 6.2]), "ddp_powersgd", "adamw", 1e-4, None)
    assert lossy.verdict == "info" and lossy.lossy and "PowerSGD" in lossy.explanation
    assert compare(ref, _run([7.0, 6.6, 6.2]), "ddp_powersgd", "adamw", 1e-4, 0.1).verdict == "pass"
    # Adafactor scales each tensor's update by its own RMS: under DeepSpeed's flat partitions, another update
    flat = compare(ref, _run([7.0, 6.6, 6.2]), "zero2", "adafactor", 1e-4, None)
    assert flat.verdict == "info" and flat.lossy and "flat 1-D partitions" in flat.explanation
    assert compare(ref, _run([7.0, 6.6, 6.2]), "ddp", "adafactor", 1e-4, None).verdict == "FAIL"  # whole tensors: exact
    assert compare(ref, _run([7.0]), "zero1", "adamw", 1e-4, None).verdict == "error"  # curves must line up
    assert compare(ref, _run([], status="OOM"), "zero3", "adamw", 1e-4, None).verdict == "error"
    assert weights_deviation({"a": [0, 1, 1]}, {"b": [0, 1, 1]}) == float("inf")


# ---- report ----------------------------------------------------------------------------------------------------

def _hfscale_row(out, strategy, gpus, tokens_per_s, status="ok"):
    write_results(out, Results.from_dict({
        "status": status, "error": None if status == "ok" else "Tried to allocate 20 GiB", "run_name": out.name,
        "strategy": strategy, "optim": "adamw", "model": {"name": "gpt2-124m", "params_model": 124_439_808},
        "config": {"world_size": gpus, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
                   "global_batch_size": 8 * gpus, "seq_len": 1024, "activation_checkpointing": True, "precision": "bf16"},
        "environment": {"device_type": "cuda"},
        "perf": {"s_per_iter": 8 * gpus * 1024 / tokens_per_s, "tokens_per_s": tokens_per_s,
                 "tflops_per_gpu_bigscience": 100.0, "mfu": 0.4} if status == "ok" else {},
        "memory": {"peak_allocated_gb": 30.5, "peak_rss_gb": 4.0}, "loss_history": [{"step": 1, "loss": 7.0}, {"step": 2, "loss": 6.0}]}))


def test_a_schema_1_results_file_of_an_earlier_run_is_read_in_the_trainers_names(tmp_path):
    """A committed schema-1 file (a projection round's 1-process run, benchmarks/results/projection_2026-11-26/): its
    micro_batch_size, grad_accum and checkpointing read as per_device_train_batch_size, gradient_accumulation_steps
    and activation_checkpointing; the report's row has its MBS and GAS; written back it is schema 2."""
    from hfscale.compare.report import collect
    from hfscale.run.results import SCHEMA_VERSION, read_results

    one = json.loads((REPO / "benchmarks/results/projection_2026-11-26/zero1-np2-round0.json").read_text())["one"]
    assert one["schema_version"] == 1 and {"micro_batch_size", "grad_accum", "checkpointing"} <= set(one["config"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps({"status": "ok", **one}))
    config = read_results(tmp_path / "run").config
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps, config.activation_checkpointing) \
        == (one["config"]["micro_batch_size"], one["config"]["grad_accum"], one["config"]["checkpointing"])
    assert not {"micro_batch_size", "grad_accum", "checkpointing"} & set(config.extra)
    row = collect([tmp_path / "run" / "results.json"])[0]
    assert (row.mbs, row.gas) == (one["config"]["micro_batch_size"], one["config"]["grad_accum"])
    write_results(tmp_path / "again", read_results(tmp_path / "run"))
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["schema_version"] == SCHEMA_VERSION == 2
    assert again["config"]["per_device_train_batch_size"] == one["config"]["micro_batch_size"]
    (tmp_path / "future").mkdir()
    (tmp_path / "future" / "results.json").write_text(json.dumps({"status": "ok", "schema_version": 3}))
    with pytest.raises(HfscaleError, match="results schema version 3; this hfscale reads versions 1 and 2"):
        read_results(tmp_path / "future")


def test_a_run_without_its_world_size_is_a_row_and_no_point_on_the_gpu_axis(tmp_path):
    """A results file whose config is gone (null: trimmed by hand, say) is still a row; the days-vs-GPUs plot leaves
    it out - it has no GPU count to stand at (before: a TypeError from matplotlib's ticks)."""
    runs = tmp_path / "runs"
    _hfscale_row(runs / "ddp-8", "ddp", 8, 400_000.0)
    _hfscale_row(runs / "zero1-8", "zero1", 8, 350_000.0)
    path = runs / "zero1-8" / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "config": None}))
    rows, written = write_report([runs], tmp_path / "report")
    assert sorted(r.strategy for r in rows) == ["ddp", "zero1"] and tmp_path / "report" / "days_vs_gpus.png" in written
    assert next(r for r in rows if r.strategy == "zero1").gpus is None


def test_report_table_csv_plots_and_html(tmp_path):
    runs = tmp_path / "runs"
    _hfscale_row(runs / "ddp-8", "ddp", 8, 400_000.0)
    _hfscale_row(runs / "zero3-8", "zero3", 8, 300_000.0)
    _hfscale_row(runs / "zero3-16", "zero3", 16, 550_000.0)
    _hfscale_row(runs / "ddp-16", "ddp", 16, 0, status="OOM")
    write_results(runs / "megatron" / GOOD_LOG.stem,
                  import_log(GOOD_LOG, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1))
    rows, written = write_report([runs], tmp_path / "report", html=True)
    assert len(rows) == 5
    table = (tmp_path / "report" / "report.md").read_text().splitlines()
    assert table[0] == "| " + " | ".join(COLUMNS) + " |"
    oom = next(line for line in table if "| OOM |" in line)
    assert "| ddp |" in oom and "OOM: Tried to allocate" in oom
    ddp8 = next(r for r in rows if r.run == "ddp-8")
    assert ddp8.days == pytest.approx(100e9 / 400_000 / 86400)  # days/100B column
    ddp8_line = next(line for line in table if line.startswith("| 8 |") and "| ddp |" in line)
    assert "| 100.0 |" in ddp8_line  # TFLOPs with one decimal always, as the BigScience tables print them
    parsed = list(csv.DictReader(io.StringIO((tmp_path / "report" / "report.csv").read_text())))
    assert {r["status"] for r in parsed} == {"ok", "OOM"} and len(parsed) == 5
    assert next(r for r in parsed if r["run"] == "ddp-8")["tflops_per_gpu_bigscience"] == "100.0"  # same rule
    # the imported log's curve has tokens and seconds: it joins the loss plots against both
    plots = ("days_vs_gpus.png", "loss_curves.png", "loss_vs_tokens.png", "loss_vs_time.png", "memory.png",
             "throughput.png")
    for name in plots:
        assert (tmp_path / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    html = (tmp_path / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(plots) and "<td>OOM</td>" in html
    # the 61B log's 10M-52M tokens alone: a linear axis; beside a tiny run's 1.3k-16k: a log one
    tokens = [p["tokens"] for r in rows for p in r.loss_history if p.get("tokens")]
    assert len(tokens) == 5 and not wide_range(tokens) and wide_range([1280, 16384, *tokens])
    assert not wide_range([1, 2, 50]) and not wide_range([0, 0.0]) and not wide_range([])
    assert not list((tmp_path / "report").glob(".*"))  # no temporary files left behind


def test_tp_runs_sit_beside_megatron_logs_in_one_table(tmp_path):
    """hfscale's TP runs carry their TP/PP/DP in the notes, as imported Megatron logs do, in the same table."""
    runs = tmp_path / "runs"
    _hfscale_row(runs / "fsdp_tp-16", "fsdp_tp", 16, 500_000.0)
    results = Results.from_dict(json.loads((runs / "fsdp_tp-16" / "results.json").read_text()))
    results.config.tp, results.config.dp, results.config.pp = 8, 2, 1
    write_results(runs / "fsdp_tp-16", results)
    write_results(runs / "megatron" / HEADER_LOG.stem,
                  import_log(HEADER_LOG, gpus=None, seq_len=2048, params=None, checkpointing=True, skip_first=1))
    write_report([runs], tmp_path / "report")
    table = (tmp_path / "report" / "report.md").read_text().splitlines()
    ours = next(line for line in table if "| fsdp_tp |" in line)
    theirs = next(line for line in table if "megatron-deepspeed-tp4" in line)
    assert "TP 8 PP 1 DP 2" in ours and "TP 4 PP 16 DP" in theirs


def test_a_float8_run_says_fp8_in_the_table(tmp_path):
    """An --fp8 run records precision bf16 (what it computes in outside its float8 matmuls) and its recipe: the
    report's notes name it fp8, so it is not read as a bf16 run beside one."""
    runs = tmp_path / "runs"
    for name, recipe in (("ddp-fp8", "tensorwise"), ("ddp-bf16", None)):
        _hfscale_row(runs / name, "ddp", 8, 500_000.0)
        results = Results.from_dict(json.loads((runs / name / "results.json").read_text()))
        results.config.precision, results.config.float8 = "bf16", recipe
        write_results(runs / name, results)
    write_report([runs], tmp_path / "report")
    rows = [line for line in (tmp_path / "report" / "report.md").read_text().splitlines() if "| ddp |" in line]
    assert sorted(line.rsplit("|", 2)[1].strip() for line in rows) == ["act. ckpt, bf16", "act. ckpt, fp8 tensorwise"]


@pytest.mark.parametrize("key,value,expected", [
    ("loss_history", "abc", 'loss_history is "abc", not a list'),
    ("loss_history", [1, 2], "loss_history holds 1, not an object"),
    ("loss_history", [{"step": 1, "loss": "low"}], "loss_history entry's loss is \"low\", not a number"),
    ("config", [1], "config is [1], not an object"),
    ("perf", {"s_per_iter": "fast"}, 'perf.s_per_iter is "fast", not a number or null'),
    ("model", {"n_layer": True}, "model.n_layer is true, not a number or null"),
    ("steps", "12", 'steps is "12", not a number or null'),
    ("status", 3, "status is 3, not a string"),
    # a figure no run measures: a report plotted it on a log axis, or divided by it (before: a matplotlib warning)
    ("perf", {"tokens_per_s": -5}, "perf.tokens_per_s is -5, not a positive number"),
    ("perf", {"mfu": float("inf")}, "perf.mfu is Infinity, not a positive number"),
    ("config", {"world_size": 0}, "config.world_size is 0, not a positive number"),
])
def test_a_results_key_of_the_wrong_kind_is_refused_in_one_line(tmp_path, key, value, expected):
    """Every reader (report, project, tune, parity) reads through Results: a declared key holding the wrong kind of
    JSON value is named when the file is read, never a traceback deeper in a reader."""
    from hfscale.errors import HfscaleError
    from hfscale.run.results import read_results

    _hfscale_row(tmp_path / "runs" / "ddp-8", "ddp", 8, 400_000.0)
    path = tmp_path / "runs" / "ddp-8" / "results.json"
    good = json.loads(path.read_text())
    path.write_text(json.dumps({**good, key: value}))
    with pytest.raises(HfscaleError) as refused:
        read_results(path)
    assert str(refused.value) == f"{path}: not a results file ({expected})"
    if key == "loss_history" and isinstance(value, str):  # the command a user runs, once: the same line
        proc = hfscale("report", tmp_path / "runs")
        assert proc.returncode == 2 and proc.stderr.strip() == f"hfscale: error: {refused.value}", proc.stderr
        assert not (tmp_path / "runs" / "report").exists()
    path.write_text(json.dumps({**good, "schema_version": 99}))  # a later hfscale's file: named, with the versions
    with pytest.raises(HfscaleError, match=f"^{path}: results schema version 99; this hfscale reads versions 1 and 2$"):
        read_results(path)
    diverged = {**good, "loss_history": [{"step": 1, "loss": float("nan")}]}  # a diverged loss is still a number
    assert Results.from_dict(json.loads(json.dumps(diverged))).loss_history[0]["loss"] != 0


def test_report_refuses_what_is_not_a_results_file(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    proc = hfscale("report", tmp_path / "bad")
    assert proc.returncode == 2 and "not a results file" in proc.stderr and "Traceback" not in proc.stderr
    proc = hfscale("report", tmp_path / "empty-nothing-here")
    assert proc.returncode == 2 and "no such run or sweep directory" in proc.stderr
    assert not (tmp_path / "bad" / "report").exists()


def test_a_run_refused_before_launch_keeps_its_size_in_the_report(tmp_path):
    from hfscale.formulas.metrics import param_count
    from hfscale.models import build_model, resolve_shape

    spec = RunSpec("zero2_offload", "adamw_8bit", 2, 4, 1, False)
    fixed = ["--model", "tiny", "--n_layer", "3"]
    write_results(tmp_path / "runs" / spec.name, stub_results(spec, "refused", "cannot use optimizer", fixed))
    rows, _ = write_report([tmp_path / "runs"], tmp_path / "report")
    shape = resolve_shape("tiny", n_layer=3)
    real = sum(p.numel() for p in build_model(shape, seed=0).parameters())
    assert rows[0].status == "refused" and rows[0].params == param_count(shape) == real
    assert stub_results(spec, "refused", None, ["--model_name_or_path", "gpt2"]).model.params_model is None


def test_repeats_run_round_by_round_and_the_report_shows_each_configurations_median_and_spread(tmp_path, monkeypatch):
    """`hfscale sweep --repeats 3`: every configuration once per round (its measurements spread over the sweep's time,
    not back to back), each repeat its own run and results file; the report merges a configuration's repeats into one
    row at the median speed, with the spread and the repeats that failed. The launches are faked: what a run writes
    is the train script's business (tests/test_sweep.py launches real ones)."""
    from hfscale import launching as launch
    from hfscale.compare import sweep

    speeds = iter([0.10, 0.20, 0.14, 0.30, 0.12, None])  # s/it in launch order; None: zero1's third repeat fails
    launched = []

    def fake_run_training(train_args, run_dir, nproc, timeout_s):
        launched.append(run_dir.name)
        s = next(speeds)
        if s is None:
            return launch.Outcome("fail", 1, 1.0, "RuntimeError: boom", "")
        strategy = train_args[train_args.index("--strategy") + 1]
        _hfscale_row(run_dir, strategy, 2, 8 * 2 * 1024 / s)
        return launch.Outcome("ok", 0, 1.0, None, "")

    monkeypatch.setattr(launch, "run_training", fake_run_training)
    out = tmp_path / "sw"
    sweep.main(["--strategy", "ddp,zero1", "--num_processes", "1", "--repeats", "3", "--out", str(out), "--",
                "--model", "tiny", "--max_steps", "2"])
    base = {s: f"{s}-adamw-np1-mbs4-gas1" for s in ("ddp", "zero1")}
    assert launched == [f"{base[s]}-r{k}" for k in (1, 2, 3) for s in ("ddp", "zero1")]  # round by round
    assert [json.loads((out / name / "results.json").read_text())["sweep"]["repeat"] for name in launched] == [1, 1, 2, 2, 3, 3]
    rows, _ = write_report([out], tmp_path / "report", with_plots=False)
    by_run = {r.run: r for r in rows}
    assert set(by_run) == set(base.values())  # one row per configuration
    ddp, zero1 = by_run[base["ddp"]], by_run[base["zero1"]]
    assert ddp.runs == 3 and ddp.s_per_iter == pytest.approx(0.12) and ddp.s_per_iter_range == pytest.approx((0.10, 0.14))
    assert "3 repeats: s/it 0.1–0.14 (±17%)" in ddp.notes  # half the range, against the median
    assert zero1.s_per_iter == pytest.approx(0.30)  # of two that finished, the slower middle one
    assert "2 of 3 ok (fail): s/it 0.2–0.3 (±17%)" in zero1.notes
    parsed = {r["run"]: r for r in csv.DictReader(io.StringIO((tmp_path / "report" / "report.csv").read_text()))}
    assert parsed[base["ddp"]]["runs"] == "3" and float(parsed[base["ddp"]]["s_per_iter_slowest"]) == pytest.approx(0.14)
    with pytest.raises(HfscaleError, match="sweep repeats must be a positive integer, got 0"):
        SweepSpec(repeats=0)
    # a configuration no repeat of which finished (here: refused before launching, once per round) is one row too
    for k in (1, 2):
        write_results(out / f"zero2_offload-adafactor-np2-mbs4-gas1-r{k}",
                      stub_results(RunSpec("zero2_offload", "adafactor", 2, 4, 1, False, k), "refused", "no CPU Adam", []))
    refused = next(r for r in write_report([out], tmp_path / "report", with_plots=False)[0] if r.status == "refused")
    assert refused.run == "zero2_offload-adafactor-np2-mbs4-gas1" and refused.runs == 2
    assert refused.notes == "2 repeats, none ok (refused); refused: no CPU Adam"
