"""hfscale's projection against the published record: throughput measured at cluster scale (8 to 3,072 GPUs).

Each set of `benchmarks/published_record.json` is one recipe measured at several sizes (or accumulations), with its
configuration and its source. Its baseline row calibrates the compute (the FLOPs per GPU it achieved once the modelled
communication and optimizer step are taken out), and every row of the set is then projected from it with the model
`hfscale project` uses - the 3D layouts by formulas/parallel3d, ZeRO and the other data-parallel strategies by
formulas/comm through plan/projection, or, for a set whose engine communicates otherwise, by the `collectives` it
describes (engine_pattern) - over the system's links timed by NCCL's cost model, scaled by the system's own nccl-tests
where the record has them (`fabric`). Prints the error per row (projected / published - 1), the mean |error| per
strategy family and over every row; the baseline rows are left out of the means (they match by construction), and so
are the rows of a set marked `left_out` (printed with its reason).

    python benchmarks/published_record.py
    python benchmarks/published_record.py --out hfscale/plan/published_record_checks.json   # what project prints
"""

import argparse
import json
import sys
from math import ceil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = REPO / "benchmarks" / "published_record.json"


def links_of(system: dict):
    """The system's links under NCCL's model, scaled by its own nccl-tests where the record has them (`fabric`)."""
    from hfscale.formulas.comm import Links

    return Links(system["intra_busbw_gb_s"] * 1e9, system["inter_busbw_gb_s"] * 1e9, collectives="nccl",
                 nics_per_node=system.get("nics_per_node"), fabric=fabric_of(system))


def fabric_of(system: dict) -> tuple:
    """Links.fabric from a system's published nccl-tests tables: {kind: {nodes: [busbw GB/s per size]}}."""
    tables = system.get("fabric", {})
    return tuple((kind, int(nodes), int(nodes) * system["gpus_per_node"], size, busbw * 1e9)
                 for kind in ("all_reduce", "all_gather", "reduce_scatter") if kind in tables
                 for nodes, row in tables[kind].items() for size, busbw in zip(tables["size_bytes"], row))


def shape_of(dataset: dict, row: dict):
    """The row's model: a preset the set names (a Llama), or the shape its row gives (layers, hidden, heads) in the
    set's family (GPT-2's unless it says; a Llama's MLP size, key/value heads and untied head from the set)."""
    from hfscale.formulas.metrics import ModelShape
    from hfscale.models.resolve import resolve_shape

    model = dataset["model"]
    if "preset" in model:
        return resolve_shape(model["preset"])
    return ModelShape(model.get("family", "gpt2"), row["layers"], row["hidden"], row["heads"], model["vocab"],
                      model["seq"], ffn=model.get("ffn"), n_kv_head=model.get("kv_heads"), tied=model.get("tied"))


def published_tflops(dataset: dict, row: dict, device: str | None = None) -> float:
    """The row's TFLOPs per GPU in the record's convention: as printed (per GPU, or the aggregate over its GPUs), or
    from the speed it printed in another form (published_tokens_per_s_per_gpu)."""
    from hfscale.formulas.parallel3d import hardware_flops_per_sequence

    if "tflops_per_gpu" in row:
        return row["tflops_per_gpu"]
    if "aggregate_pflops" in row:
        return row["aggregate_pflops"] * 1e3 / row["gpus"]
    seq = dataset["model"]["seq"]
    return (published_tokens_per_s_per_gpu(dataset, row, device) / seq
            * hardware_flops_per_sequence(shape_of(dataset, row), seq, recompute_of(dataset, row)) / 1e12)


def published_tokens_per_s_per_gpu(dataset: dict, row: dict, device: str | None = None) -> float:
    """Tokens/s per GPU from whichever speed a source printed: per GPU, in total, as a step time over the global
    batch, as sequences/s, as compute-days to 100B tokens, or as MFU (hfscale's model FLOPs per token - 3 x the
    forward, Korthikanti et al.'s 72 l h^2 (1 + s/6h + V/12lh) for GPT - at the dense peak of `device`, a
    formulas/peaks key, in the set's precision)."""
    from hfscale.formulas.metrics import training_flops_per_sequence
    from hfscale.formulas.peaks import PEAK_TFLOPS

    seq, gpus = dataset["model"]["seq"], row["gpus"]
    if "tokens_per_s_per_gpu" in row:
        return row["tokens_per_s_per_gpu"]
    if "tokens_per_s" in row:
        return row["tokens_per_s"] / gpus
    if "step_s" in row:
        return seq * row["global_batch"] / row["step_s"] / gpus
    if "sequences_per_s" in row:
        return row["sequences_per_s"] * seq / gpus
    if "days_100b" in row:
        return 100e9 / (row["days_100b"] * 86400) / gpus
    if "mfu" in row and device is not None:
        peak = PEAK_TFLOPS[device][dataset["precision"]] * 1e12
        model, _ = training_flops_per_sequence(shape_of(dataset, row), seq, False)
        return row["mfu"] * peak / (model / seq)
    raise ValueError(f"{dataset['name']}: a row at {gpus} GPUs prints no speed hfscale reads (tflops_per_gpu, "
                     "aggregate_pflops, tokens_per_s_per_gpu, tokens_per_s, step_s, sequences_per_s, days_100b, mfu)")


def recompute_of(dataset: dict, row: dict) -> str:
    """The row's activation recomputation: its own, where a 3D set compares granularities, else the set's."""
    return row.get("recompute", dataset["recompute"])


def _bisect(tflops_at, target: float) -> float:
    """The FLOPs per second per GPU at which tflops_at(rate) gives the target (it rises with the rate)."""
    low, high = 1e12, 1e16
    for _ in range(200):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if tflops_at(mid) < target else (low, mid)
    return (low * high) ** 0.5


def project_3d(dataset: dict, links, gpus_per_node: int, device: str) -> list[float]:
    """TFLOPs per GPU of every row's 3D layout, at the rate that gives the baseline row its published figure (the
    busiest stage's Adam step timed apart at the GPU's memory bandwidth, as the data-parallel projection times it)."""
    from hfscale.formulas import parallel3d as p3d
    from hfscale.formulas.peaks import MEMORY_BW_GB_S

    seq = dataset["model"]["seq"]

    def tflops(row: dict, rate: float) -> float:
        mbs = row.get("micro_batch", dataset.get("micro_batch_assumed"))  # the row's own, where the source gives it
        cp, vp = row.get("cp", 1), row.get("vp", 1)  # context parallel, model chunks a GPU (interleaved)
        grid = p3d.Grid(row["tp"], row["pp"], row["gpus"] // (row["tp"] * row["pp"] * cp), cp=cp, vp=vp)
        run = p3d.GridRun(shape_of(dataset, row), grid, seq, mbs, row["global_batch"] // (mbs * grid.dp),
                          dataset["precision"], recompute_of(dataset, row))
        step = p3d.grid_step_time(run, flops_per_s=rate, links=links, gpus_per_node=gpus_per_node,
                                  memory_bw=MEMORY_BW_GB_S[device] * 1e9)
        flops = p3d.hardware_flops_per_sequence(run.shape, seq, run.recompute) * run.global_batch
        return flops / step.total_s / row["gpus"] / 1e12

    base = dataset["rows"][dataset["baseline"]]
    rate = _bisect(lambda r: tflops(base, r), published_tflops(dataset, base, device))
    return [tflops(row, rate) for row in dataset["rows"]]


def engine_pattern(dataset: dict, plan):
    """What a row moves: hfscale's pattern for the plan, or - for a set whose engine communicates otherwise than
    hfscale's strategy (its `collectives`) - what that engine issues: each collective of the whole model's
    `bytes_per_param`, once a `step` or every `micro`-batch, beside the compute it `overlaps` ("none": after the
    backward, nothing hides it), in `pieces` - or in buckets of `bucket_params` ({"min", "per_rank"}: Megatron's
    max(min, per_rank x ranks) parameters a bucket)."""
    from hfscale.formulas.comm import Collective, CommPattern
    from hfscale.formulas.metrics import param_count
    from hfscale.plan.projection import pattern_of

    described = dataset.get("collectives")
    if described is None:
        return pattern_of(plan)
    params = param_count(plan.shape)
    out = []
    for c in described:
        bucket = c.get("bucket_params")
        pieces = c.get("pieces") or ceil(params / max(bucket["min"], bucket["per_rank"] * plan.world_size))
        out.append(Collective(c["kind"], c["bytes_per_param"] * params, c["per"], c["overlaps"], c.get("what", ""),
                              units=pieces))
    return CommPattern(tuple(out))


def project_data_parallel(dataset: dict, links, gpus_per_node: int, device: str) -> list[float]:
    """TFLOPs per GPU of every row under the set's strategy (hfscale's projection: the baseline row's compute with its
    own exposed communication taken out, at the same FLOPs rate for every row's micro-batch)."""
    from hfscale.formulas.parallel3d import hardware_flops_per_sequence
    from hfscale.parallel.optimizers import get_optimizer
    from hfscale.parallel.strategies import get_strategy
    from hfscale.plan.baseline import Baseline
    from hfscale.plan.projection import micro_compute_s, step_of
    from hfscale.runplan import RunPlan

    seq = dataset["model"]["seq"]
    optimizer = get_optimizer(dataset.get("optimizer", "adamw"))  # the step the model times apart (AdamW unless named)

    def plan_of(row: dict) -> RunPlan:
        strategy = get_strategy(dataset["strategy"])
        data_parallel = row["gpus"] // strategy.tp_size(row["gpus"], gpus_per_node)  # fsdp_tp: one rank a node
        micro = row["global_batch"] // (row["micro_batch"] * data_parallel)
        return RunPlan(strategy, optimizer, shape_of(dataset, row), seq,
                       per_device_train_batch_size=row["micro_batch"], gradient_accumulation_steps=micro,
                       world_size=row["gpus"], processes_per_node=gpus_per_node, precision=dataset["precision"],
                       activation_checkpointing=recompute_of(dataset, row) != "none", float8=dataset.get("float8"))

    def flops_per_sample(row: dict) -> float:  # the source's convention (published_record.json: flops_convention)
        return hardware_flops_per_sequence(shape_of(dataset, row), seq, recompute_of(dataset, row))

    base_row = dataset["rows"][dataset["baseline"]]
    base_plan = plan_of(base_row)
    s = flops_per_sample(base_row) * base_row["global_batch"] / (published_tflops(dataset, base_row, device) * 1e12
                                                                 * base_row["gpus"])
    base = Baseline(base_plan, [s] * 3, dataset["name"], device=device)
    compute = micro_compute_s(base_plan, base, s, links, engine_pattern(dataset, base_plan))
    rate = flops_per_sample(base_row) * base_row["micro_batch"] / compute
    out = []
    for row in dataset["rows"]:
        plan = plan_of(row)
        step = step_of(plan, base, flops_per_sample(row) * row["micro_batch"] / rate, links,
                       engine_pattern(dataset, plan))
        out.append(flops_per_sample(row) * row["global_batch"] / step.total_s / row["gpus"] / 1e12)
    return out


def evaluate(data: dict) -> list[dict]:
    """One entry per published row: its set, family, GPUs, published and projected TFLOPs per GPU, and the error."""
    from hfscale.formulas.peaks import device_key

    rows = []
    for dataset in data["sets"]:
        system = data["systems"][dataset["system"]]
        links, per_node = links_of(system), system["gpus_per_node"]
        device = device_key(system["device"])
        projected = (project_3d(dataset, links, per_node, device) if dataset["family"] == "3D" else
                     project_data_parallel(dataset, links, per_node, device))
        for i, (row, tflops) in enumerate(zip(dataset["rows"], projected)):
            published = published_tflops(dataset, row, device)
            rows.append({"set": dataset["name"], "family": dataset["family"], "gpus": row["gpus"],
                         "params_b": row["params_b"], "published_tflops": round(published, 2),
                         "projected_tflops": round(tflops, 2), "error": round(tflops / published - 1, 4),
                         "baseline": i == dataset["baseline"], "left_out": "left_out" in dataset})
    return rows


def nccl_tests(data: dict) -> list[tuple[dict, float]]:
    """(row, the bus bandwidth NCCL's model gives it in GB/s) for every published nccl-tests row."""
    from hfscale.formulas.comm import Links, nccl_collective

    tests = data.get("nccl_tests", {})
    out = []
    for row in tests.get("rows", []):
        intra = row.get("intra_busbw_gb_s", tests["intra_busbw_gb_s"])  # the row's own GPUs' NVLink, where it says
        links = Links(intra * 1e9, row["link_gb_s"] * 1e9, collectives="nccl", nics_per_node=row["nics_per_node"])
        ranks, size = row["nodes"] * row["gpus_per_node"], row["size_bytes"]
        seconds = nccl_collective("all_reduce", size, ranks, row["nodes"], links)[0]
        out.append((row, 2 * (ranks - 1) / ranks * size / seconds / 1e9))
    return out


def summary(rows: list[dict]) -> dict:
    """{family or "all": {"mean_abs_error", "max_abs_error", "rows"}} over the projected rows (neither a baseline nor
    left out)."""
    out = {}
    for family in sorted({r["family"] for r in rows}) + ["all"]:
        errors = [abs(r["error"]) for r in rows
                  if not r["baseline"] and not r.get("left_out") and family in (r["family"], "all")]
        out[family] = {"mean_abs_error": round(sum(errors) / len(errors), 4), "max_abs_error": round(max(errors), 4),
                       "rows": len(errors)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, help="write the rows and the summary here (JSON)")
    opts = parser.parse_args()
    from hfscale.files import atomic_write_text, load_json

    data = load_json(opts.data, "published record")
    rows = evaluate(data)
    print(f"{'set':40} {'GPUs':>5} {'params':>7} {'published':>9} {'projected':>9} {'error':>7}")
    for r in rows:
        mark = "  (baseline)" if r["baseline"] else "  (left out of the means)" if r["left_out"] else ""
        print(f"{r['set']:40} {r['gpus']:5d} {r['params_b']:6g}B {r['published_tflops']:9.1f} "
              f"{r['projected_tflops']:9.1f} {r['error']:+7.1%}{mark}")
    totals = summary(rows)
    for family, s in totals.items():
        print(f"{family:>8}: mean |error| {s['mean_abs_error']:.1%}, worst {s['max_abs_error']:.1%} over {s['rows']} rows")
    print("\nnccl-tests all_reduce_perf across nodes (measured / NCCL's model at one link's line rate):")
    for row, model in nccl_tests(data):
        print(f"  {row['nodes']} nodes x {row['gpus_per_node']}, {row['nics_per_node']} x {row['link_gb_s']:g} GB/s "
              f"links: {row['busbw_gb_s']:g} / {model:.1f} GB/s = {row['busbw_gb_s'] / model:.2f}")
    if opts.out:
        atomic_write_text(opts.out, json.dumps({"rows": rows, "summary": totals}, indent=1) + "\n")


if __name__ == "__main__":
    main()
