"""bf16 GEMM rates at the shapes the published record's 3D rows multiply by, per GPU: what the compute model's one
calibrated FLOPs rate leaves out (docs/project.md: its +13-19% rows run small per-GPU matmuls).

For every 3D row of benchmarks/published_record.json: the linear layers of one block on one TP rank
(formulas/precision.block_linears: QKV and the first MLP layer split by output columns, the attention output and the
last MLP layer by input rows), each at tokens = micro-batch x sequence / CP rows, timed as its three GEMMs - the
forward [T, in] x [in, out], the input's gradient [T, out] x [out, in] and the weight's [in, T] x [T, out]. Printed:
each distinct shape's TFLOPs, and per row the block's matmul rate (its layers' FLOPs over their summed times) beside
the set's baseline row's - the correction a shape-aware compute model would make, set against the row's error.

    python benchmarks/gemm_rates.py --out gemm_rates.json                            # on a GPU (minutes)
    python benchmarks/gemm_rates.py --device cpu --scale 64 --iters 1 --sets megatron-2021-table1   # the code path
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import published_record as record  # noqa: E402
from hfscale.files import atomic_write_text  # noqa: E402


def gemm_shapes(tokens: int, k: int, n: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of a linear layer's forward and its two backward GEMMs on `tokens` rows."""
    return [(tokens, k, n), (tokens, n, k), (k, tokens, n)]


def time_gemm(m: int, k: int, n: int, device: str, iters: int) -> float:
    """Seconds of one bf16 [m, k] x [k, n] matmul (mean of `iters` after warm-up)."""
    import torch

    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(2):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync()
    return (time.perf_counter() - t0) / iters


def row_layers(dataset: dict, row: dict, scale: int) -> tuple[int, list[tuple[int, int, int]]]:
    """(tokens, [(in, out, count)]) of one block on one TP rank of a 3D row, every size divided by `scale` (>= 1)."""
    from hfscale.formulas.precision import block_linears

    shape = record.shape_of(dataset, row)
    mbs = row.get("micro_batch", dataset.get("micro_batch_assumed", 1))
    tokens = max(1, mbs * dataset["model"]["seq"] // row.get("cp", 1) // scale)
    layers = [(max(1, k // scale), max(1, n // scale), c) for k, n, c in block_linears(shape, row["tp"])]
    return tokens, layers


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", help="comma list of the record's 3D sets (default: all of them)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--scale", type=int, default=1, help="divide every size by this (a CPU's check of the code path)")
    p.add_argument("--budget_s", type=float, default=float("inf"), help="stop timing new shapes after this long")
    p.add_argument("--out", help="write the shapes' and rows' figures here as JSON")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.scale < 1 or a.iters < 1:
        p.error(f"--scale and --iters must be at least 1, got {a.scale} and {a.iters}")

    data = json.loads(record.DATA.read_text())
    sets = [d for d in data["sets"] if d["family"] == "3D"]
    if a.sets:
        wanted = a.sets.split(",")
        unknown = [s for s in wanted if s not in {d["name"] for d in sets}]
        if unknown:
            p.error(f"unknown 3D set {unknown[0]!r}; choose from: {', '.join(d['name'] for d in sets)}")
        sets = [d for d in sets if d["name"] in wanted]
    t0, timed, rows = time.monotonic(), {}, []

    def rate(tokens: int, k: int, n: int) -> float | None:
        """Seconds of the layer's three GEMMs (None: past the budget)."""
        total = 0.0
        for m, kk, nn in gemm_shapes(tokens, k, n):
            if (m, kk, nn) not in timed:
                if time.monotonic() - t0 > a.budget_s:
                    return None
                timed[(m, kk, nn)] = time_gemm(m, kk, nn, a.device, a.iters)
                print(f"  [{m} x {kk}] x [{kk} x {nn}]: {2 * m * kk * nn / timed[(m, kk, nn)] / 1e12:8.1f} TFLOPs",
                      flush=True)
            total += timed[(m, kk, nn)]
        return total

    for dataset in sets:
        for i, row in enumerate(dataset["rows"]):
            tokens, layers = row_layers(dataset, row, a.scale)
            seconds = [rate(tokens, k, n) for k, n, _ in layers]
            if any(s is None for s in seconds):
                break
            flops = sum(6 * tokens * k * n * c for k, n, c in layers)
            rows.append({"set": dataset["name"], "row": i, "gpus": row["gpus"], "tp": row["tp"], "tokens": tokens,
                         "baseline": i == dataset["baseline"],
                         "tflops": flops / sum(s * c for s, (_, _, c) in zip(seconds, layers)) / 1e12})
    committed = json.loads((record.REPO / "hfscale" / "plan" / "published_record_checks.json").read_text())["rows"]
    errors = {}  # (set, row) -> the committed error: the record's rows in order, a set's in its own order
    for c in committed:
        errors[(c["set"], sum(1 for s, _ in errors if s == c["set"]))] = c["error"]
    print(f"{'set':40} {'GPUs':>5} {'TP':>3} {'tokens':>6} {'TFLOPs':>8} {'x base':>7} {'model error':>11}")
    for r in rows:
        base = next((b for b in rows if b["set"] == r["set"] and b["baseline"]), None)
        r["over_baseline"] = r["tflops"] / base["tflops"] if base else None
        r["model_error"] = errors.get((r["set"], r["row"]))
        ratio = "" if r["over_baseline"] is None else f"{r['over_baseline']:7.3f}"
        error = "" if r["model_error"] is None else f"{r['model_error']:+11.1%}"
        print(f"{r['set']:40} {r['gpus']:5d} {r['tp']:3d} {r['tokens']:6d} {r['tflops']:8.1f} {ratio:>7} {error}")
    print("(a row whose matmuls run below its baseline's (x base < 1) is one the one-rate model over-projects: its "
          "error would shrink by about that factor)")
    if a.out:
        import torch

        device = torch.cuda.get_device_name() if a.device == "cuda" else a.device
        atomic_write_text(a.out, json.dumps({"device": device, "scale": a.scale, "rows": rows,
                                             "gemms": [{"m": m, "k": k, "n": n, "seconds": s}
                                                       for (m, k, n), s in timed.items()]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
