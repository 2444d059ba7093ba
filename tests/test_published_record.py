"""The projection against the published record (benchmarks/published_record.py over benchmarks/published_record.json):
no row's error grows past what the benchmark reported when it was committed (hfscale/plan/published_record_checks.json,
which `hfscale project` prints from), and the transcription is consistent."""

import json

import pytest

from conftest import REPO, load_benchmark
from hfscale.formulas.metrics import param_count

RECORD = load_benchmark("published_record")
DATA = json.loads(RECORD.DATA.read_text())
COMMITTED = json.loads((REPO / "hfscale" / "plan" / "published_record_checks.json").read_text())
SLACK = 0.005  # half a percentage point: arithmetic, not noise (the model is pure)


def test_the_transcription_is_consistent():
    """Each row's shape gives its parameter count, and its TFLOPs x GPUs the aggregate the source printed."""
    for dataset in DATA["sets"]:
        for row in dataset["rows"]:
            params = param_count(RECORD.shape_of(dataset, row)) / 1e9
            assert params == pytest.approx(row["params_b"], rel=0.03), (dataset["name"], row)  # 1.65 is printed 1.7
            if "aggregate_pflops" in row:
                assert row["tflops_per_gpu"] * row["gpus"] / 1e3 == pytest.approx(row["aggregate_pflops"], rel=0.01)
            if "tokens_per_s" in row:  # the total the source printed, per GPU
                assert row["tokens_per_s_per_gpu"] * row["gpus"] == pytest.approx(row["tokens_per_s"], rel=1e-4)
            if "step_s" in row:  # the step time the source printed, over its global batch
                tokens = dataset["model"]["seq"] * row["global_batch"] / row["step_s"]
                assert row["tokens_per_s_per_gpu"] * row["gpus"] == pytest.approx(tokens, rel=1e-4)
            if "days_100b" in row:  # compute-days to 100B tokens, the seeds' figure
                tokens = 100e9 / (row["days_100b"] * 86400)
                assert row["tokens_per_s_per_gpu"] * row["gpus"] == pytest.approx(tokens, rel=1e-4)
            if "sequences_per_s" in row:
                tokens = row["sequences_per_s"] * dataset["model"]["seq"]
                assert row["tokens_per_s_per_gpu"] * row["gpus"] == pytest.approx(tokens, rel=1e-4)
            if "mfu" in row:  # the model FLOPs utilisation the source printed, on an A100 (312 TFLOPs)
                l, h, s, v = row["layers"], row["hidden"], dataset["model"]["seq"], dataset["model"]["vocab"]
                per_token = 72 * l * h * h * (1 + s / (6 * h) + v / (12 * h * l))  # Korthikanti et al.'s model FLOPs
                assert row["tokens_per_s_per_gpu"] * per_token == pytest.approx(row["mfu"] * 312e12, rel=1e-4)
            if "micro_batch" in row:  # a whole number of micro-batches per data-parallel rank
                data_parallel = row["gpus"] // (row.get("tp", 1) * row.get("pp", 1) * row.get("cp", 1))
                assert row["global_batch"] % (row["micro_batch"] * data_parallel) == 0


def test_a_speed_printed_in_any_form_reads_as_the_same_tflops():
    """A source prints its speed as TFLOPs per GPU or in total, tokens/s per GPU or in total, a step time, sequences/s,
    compute-days to 100B tokens or MFU: with the per-GPU figure the record derived left out, every other form a row
    carries gives the same TFLOPs per GPU (a set that prints only one of them needs nothing derived)."""
    from hfscale.formulas.peaks import device_key

    forms = ("tokens_per_s", "step_s", "sequences_per_s", "days_100b", "mfu", "aggregate_pflops")
    checked = set()
    for dataset in DATA["sets"]:
        device = device_key(DATA["systems"][dataset["system"]]["device"])
        for row in dataset["rows"]:
            derived = RECORD.published_tflops(dataset, row, device)
            for form in (f for f in forms if f in row):
                alone = {k: v for k, v in row.items() if k not in ("tflops_per_gpu", "tokens_per_s_per_gpu")
                         and (k == form or k not in forms)}
                # to the source's printed precision (4.4 PFLOP/s over 32 GPUs for 137 TFLOPs)
                assert RECORD.published_tflops(dataset, alone, device) == pytest.approx(derived, rel=0.01), (form, row)
                checked.add(form)
    assert checked == set(forms)
    with pytest.raises(ValueError, match="prints no speed hfscale reads"):
        RECORD.published_tflops(DATA["sets"][0], {"gpus": 8})


def test_every_engine_description_is_one_the_step_model_reads():
    """A set's `collectives` (an engine that is not hfscale's strategy): each a ring collective the model times, once a
    step or every micro-batch, beside a phase of the compute or none, in pieces or Megatron's buckets. Every ZeRO-1 set
    carries one but those whose `engine` is hfscale's own: the others ran Megatron's distributed optimizer, not
    DeepSpeed's ZeRO-1, which hfscale's zero1 is."""
    from hfscale.formulas.comm import RING

    described = {d["name"]: d["collectives"] for d in DATA["sets"] if "collectives" in d}
    for name, collectives in described.items():
        for c in collectives:
            assert c["kind"] in RING and c["per"] in ("step", "micro"), (name, c)
            assert c["overlaps"] in ("forward", "backward", "forward_backward", "none"), (name, c)
            assert c["bytes_per_param"] in (2, 4) and (c.get("pieces") or c["bucket_params"]["min"] > 0), (name, c)
    assert all(d["name"] in described or d.get("engine", "").endswith(f"hfscale's {d['strategy']}")
               for d in DATA["sets"] if d["family"] == "ZeRO-1")
    assert not any(d["name"] in described for d in DATA["sets"] if "engine" in d)


def test_no_rows_error_grows_past_the_committed_one():
    rows = RECORD.evaluate(DATA)
    committed = COMMITTED["rows"]  # row by row, in the record's order (a set's layouts may share a GPU count)
    assert [(r["set"], r["gpus"]) for r in rows] == [(c["set"], c["gpus"]) for c in committed]
    for r, c in zip(rows, committed):
        assert abs(r["error"]) <= abs(c["error"]) + SLACK, r
        assert r["error"] == 0 if r["baseline"] else True  # the baseline row calibrates: it matches by construction
    totals = RECORD.summary(rows)
    # the goal: mean |error| <= 10% per family, none beyond 25%
    assert all(s["mean_abs_error"] <= 0.10 and s["max_abs_error"] <= 0.25 for s in totals.values()), totals
    assert set(totals) == {"3D", "DDP", "PowerSGD", "ZeRO-1", "ZeRO-3", "FSDP", "all"}


def test_zero3_at_1536_gpus_needs_nccls_hierarchical_rings():
    """The ZeRO-3 175B row on 1536 GPUs (micro-batch 1): with every ring step paying the inter-node latency it came out
    22% slow; NCCL's model crosses the network only between nodes."""
    from dataclasses import replace

    dataset = next(d for d in DATA["sets"] if d["name"] == "megatron-2021-table2-zero3-175b")
    system = DATA["systems"][dataset["system"]]
    links = RECORD.links_of(system)
    nccl = RECORD.project_data_parallel(dataset, links, 8, "a100")[-1]
    ring = RECORD.project_data_parallel(dataset, replace(links, collectives="ring"), 8, "a100")[-1]
    published = dataset["rows"][-1]["tflops_per_gpu"]
    assert abs(nccl / published - 1) < 0.10 < abs(ring / published - 1)


def test_the_3d_band_is_the_records_3d_rows():
    """The band `hfscale project` draws around 3D layouts spans the published record's 3D rows as committed."""
    from hfscale.plan.projection import grid_model_error

    ratios = [1 + r["error"] for r in COMMITTED["rows"] if r["family"] == "3D" and not r["baseline"]]
    assert grid_model_error() == (min(ratios), max(ratios)) and min(ratios) < 1 < max(ratios)


def test_project_prints_the_check_for_the_strategies_it_projects():
    from hfscale.plan.project import published_line

    zero3, psgd = COMMITTED["summary"]["ZeRO-3"], COMMITTED["summary"]["PowerSGD"]
    line = published_line(["zero3", "ddp_powersgd", "zero2"])
    assert f"zero3 mean |error| {zero3['mean_abs_error']:.1%} (worst {zero3['max_abs_error']:.1%}" in line
    assert f"ddp_powersgd mean |error| {psgd['mean_abs_error']:.1%} (worst {psgd['max_abs_error']:.1%}" in line
    assert "zero2 not yet checked" in line
    # the rows held out of a family's means are said beside them: the class a user projects may be one of them
    held = [r["error"] for r in COMMITTED["rows"] if r["family"] == "PowerSGD" and r["left_out"] and not r["baseline"]]
    assert held and f"{len(held)} more held out, worst {max(held, key=abs):+.0%}" in line.split("ddp_powersgd")[1]


def test_nccls_model_lands_on_the_published_nccl_tests_runs_across_nodes():
    """nccl-tests across nodes of 8 A100: the model at one link's line rate lands within 25% above and 5% below every
    published all-reduce bus bandwidth - four links give ~4x one, as the runs did (86 against 24 GB/s)."""
    checked = RECORD.nccl_tests(DATA)
    assert len(checked) == len(DATA["nccl_tests"]["rows"]) >= 4
    for row, model_busbw in checked:
        assert 0.75 <= row["busbw_gb_s"] / model_busbw <= 1.05, (row["source"], model_busbw)
    one, four = sorted(model for row, model in checked if "issue 1048" in row["source"])
    assert 3.5 < four / one < 4.1  # the runs: 86 / 24


def test_fsdp_flat_across_64_h100_needs_a_nodes_links_together():
    """MosaicML's MPT-13B under FSDP (MBS 2, no checkpointing) keeps ~4,800 tokens/s per GPU from 8 to 64 H100: its
    gathers move ~100 GB a GPU per 0.85 s step, more than one 400 Gb/s link carries. NCCL's model, each node's ring
    over its 8 links, projects it within 1.5%; one link per node's ring would lose over half."""
    from dataclasses import replace

    dataset = next(d for d in DATA["sets"] if d["name"] == "mosaicml-2023-mpt-13b-h100")
    links = RECORD.links_of(DATA["systems"][dataset["system"]])
    rails = RECORD.project_data_parallel(dataset, links, 8, "h100")
    one = RECORD.project_data_parallel(dataset, replace(links, nics_per_node=1), 8, "h100")
    for row, projected, single in zip(dataset["rows"][1:], rails[1:], one[1:]):
        published = RECORD.published_tflops(dataset, row)
        assert abs(projected / published - 1) < 0.015 and single / published - 1 < -0.4


def test_ddp_across_64_dgx2h_is_its_engines_one_fp16_all_reduce_after_the_backward():
    """NVIDIA's BERT-large on 64 DGX-2H (GAS 1 at sequence 128): its engine all-reduces one flat fp16 buffer after the
    backward, 33 ms that nothing hides on a 0.3 s step. The set's `collectives` project that within 3%; as torch DDP
    (fp32 buckets overlapped with the backward) the row would come out ~10% fast."""
    dataset = next(d for d in DATA["sets"] if d["name"] == "nvidia-2019-bert-large-ddp-seq128")
    links = RECORD.links_of(DATA["systems"][dataset["system"]])
    engine = RECORD.project_data_parallel(dataset, links, 16, "v100")[-1]
    as_ddp = RECORD.project_data_parallel({k: v for k, v in dataset.items() if k != "collectives"}, links, 16,
                                          "v100")[-1]
    published = RECORD.published_tflops(dataset, dataset["rows"][-1])
    assert abs(engine / published - 1) < 0.03 and as_ddp / published - 1 > 0.08


def test_zero1_under_pressure_the_hidden_collectives_cost_what_the_clusters_own_collectives_cost():
    """Together AI's Nemotron-4 15B on 256 B200 at 1, 2, 4 and 5 micro-batches a step (Megatron's distributed
    optimizer, its collectives under the backward and the next forward). At the cluster's own nccl-tests (its ring
    loses up to a quarter of NCCL's model at 32 nodes for GB messages) every row lands within 3.5%; at NCCL's model
    alone the collectives hide, and the row where they weigh most (one micro-batch, their profile's 53% NCCL) came out
    16% fast."""
    from dataclasses import replace

    dataset = next(d for d in DATA["sets"] if d["name"] == "together-2026-b200-nemotron4-15b-fp8")
    links = RECORD.links_of(DATA["systems"][dataset["system"]])
    assert links.fabric
    for fabric, check in ((links.fabric, lambda e: all(abs(x) < 0.035 for x in e)),
                          ((), lambda e: 0.10 < e[0] < 0.25 and e == sorted(e, reverse=True))):
        projected = RECORD.project_data_parallel(dataset, replace(links, fabric=fabric), 8, "b200")
        rows = sorted((row["global_batch"] // (row["micro_batch"] * row["gpus"]),
                       tflops / RECORD.published_tflops(dataset, row) - 1)
                      for row, tflops in zip(dataset["rows"], projected) if row["gpus"] == 256)
        assert [m for m, _ in rows] == [1, 2, 4, 5] and check([e for _, e in rows]), (bool(fabric), rows)


def test_fsdp_at_64_nodes_exposes_what_the_clusters_ring_lost_at_that_scale():
    """Llama 3 70B under Megatron FSDP on 8 to 74 nodes of B200: a layer's 1.8 GB gather and 3.5 GB reduce-scatter
    hide under its compute at NCCL's model (+16% and +20% at 64 and 74 nodes); at the cluster's nccl-tests (2 GB
    all_gather 318 GB/s on 8 nodes, 205 on 64) they outgrow it and every row lands within 5%."""
    from dataclasses import replace

    dataset = next(d for d in DATA["sets"] if d["name"] == "together-2026-b200-llama3-70b-fsdp")
    links = RECORD.links_of(DATA["systems"][dataset["system"]])
    measured = RECORD.project_data_parallel(dataset, links, 8, "b200")
    modelled = RECORD.project_data_parallel(dataset, replace(links, fabric=()), 8, "b200")
    errors = [(a / RECORD.published_tflops(dataset, row) - 1, b / RECORD.published_tflops(dataset, row) - 1)
              for row, a, b in zip(dataset["rows"], measured, modelled)]
    assert all(abs(fabric) < 0.05 for fabric, _ in errors) and all(model > 0.15 for _, model in errors[-2:]), errors


def test_the_405b_proxies_need_the_interleaved_schedule():
    """NVIDIA's Llama 3.1 405B recipe cuts the model to 7, 21 and 42 layers on PP 1, 3 and 3 below 576 GPUs: projected
    from the full model's PP 9, interleaved over 7 chunks, they land within 2% but on PP 1 (+5%); charged 1F1B's
    whole bubble instead (8 slots of 63 where the run had 8/7), they come out 7-13% fast."""
    dataset = next(d for d in DATA["sets"] if d["name"] == "nvidia-dgxc-2024-llama3.1-405b-bf16")
    plain = {**dataset, "rows": [{k: v for k, v in row.items() if k != "vp"} for row in dataset["rows"]]}
    errors = {name: {r["gpus"]: r["error"] for r in RECORD.evaluate({**DATA, "sets": [d]})}
              for name, d in (("interleaved", dataset), ("1F1B", plain))}
    assert all(abs(errors["interleaved"][gpus]) < 0.02 for gpus in (96, 192, 1152, 2304))
    assert all(errors["1F1B"][gpus] > errors["interleaved"][gpus] + 0.05 for gpus in (32, 96, 192))


def test_the_gemm_rate_benchmark_times_every_3d_rows_block_on_one_tp_rank(tmp_path, capsys):
    """benchmarks/gemm_rates.py (the GPU measurement the shape-blind compute model waits for), its code path on this
    CPU at 1/256 of the sizes: a block's layers on one TP rank per row, each as its three GEMMs, beside the row's
    committed error; an unknown set is one line."""
    gemm = load_benchmark("gemm_rates")
    out = tmp_path / "gemm.json"
    assert gemm.main(["--device", "cpu", "--scale", "256", "--iters", "1", "--sets", "bloom-2022-176b-layouts",
                      "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    dataset = next(d for d in DATA["sets"] if d["name"] == "bloom-2022-176b-layouts")
    assert [r["row"] for r in report["rows"]] == list(range(len(dataset["rows"])))
    assert [r["over_baseline"] for r in report["rows"] if r["baseline"]] == [1.0]
    errors = [c["error"] for c in COMMITTED["rows"] if c["set"] == dataset["name"]]
    assert [r["model_error"] for r in report["rows"]] == errors
    tp8 = report["rows"][0]  # its QKV on a rank of TP 8: 3h/8 output columns
    assert tp8["tp"] == 8 and {(g["m"], g["k"], g["n"]) for g in report["gemms"]} >= set(
        gemm.gemm_shapes(tp8["tokens"], 14336 // 256, 3 * 14336 // 8 // 256))
    with pytest.raises(SystemExit):
        gemm.main(["--device", "cpu", "--sets", "no-such-set"])
    assert "unknown 3D set 'no-such-set'" in capsys.readouterr().err
