"""Fit formulas/float8.py's achieved rates to a GPU's float8 layer timings (benchmarks/fp8_matmul.py's JSON).

The model times each layer's three matmuls and its float8 casts as a roofline (formulas/float8.linear_s); what it fits
here is what a datasheet does not say: the share of the bf16 and fp8 dense peaks large matmuls reach, and the cost of
a converted layer beyond its casts. The benchmark times one compiled call per layer, so each timing is also at least
its call's CPU dispatch (a floor, fitted beside them, bf16 and float8 apart): a whole-model step queues its launches
behind the GPU's work, so the planners use the rates and the per-layer cost, not the floors. Least squares on the
log of each time, by grid search (bf16 first: it has no float8 terms).

    python benchmarks/fit_float8.py benchmarks/results/h200_2026-11-28/fp8_matmul.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from hfscale.formulas.float8 import Roofline, device_roofline, linear_s  # noqa: E402
from hfscale.formulas.peaks import device_key  # noqa: E402

RECIPE = "tensorwise"  # what fp8_matmul.py converts with (torchtitan's default)
# The fit over benchmarks/results/h200_2026-11-28/fp8_matmul.json: each call's dispatch floor, seconds
DISPATCH_FLOOR_S = {"bf16": 540e-6, "fp8": 980e-6}


def device_of(data: dict) -> Roofline:
    """The timed GPU's roofline at the rates formulas/float8 holds (ACHIEVED: what the fit starts from)."""
    gpu = device_roofline(device_key(data["device"]))
    if gpu is None:
        raise SystemExit(f"{data['device']}: no float8 peak or memory bandwidth in formulas/peaks.py")
    return gpu


def timed_s(row: dict, recipe: str | None, gpu: Roofline, floors: dict) -> float:
    """What the benchmark's call takes by the model: the layer, or its dispatch floor."""
    return max(linear_s(row["tokens"], row["in"], row["out"], recipe, gpu), floors["fp8" if recipe else "bf16"])


def _sse(rows, key, recipe, gpu, floors) -> float:
    return sum(math.log(timed_s(r, recipe, gpu, floors) / r[key]) ** 2 for r in rows)


def fit(rows: list[dict], gpu: Roofline) -> tuple[Roofline, dict]:
    """(the roofline with the fitted rates and per-layer cost, the fitted floors)."""
    grid = [x / 100 for x in range(40, 96)]
    floors_us = range(100, 1501, 20)
    best = min((_sse(rows, "bf16_s", None, replace(gpu, bf16_efficiency=e), {"bf16": f * 1e-6}), e, f)
               for e in grid for f in floors_us)
    gpu = replace(gpu, bf16_efficiency=best[1])
    floors = {"bf16": best[2] * 1e-6}
    best = min((_sse(rows, "fp8_s", RECIPE, replace(gpu, fp8_efficiency=e, float8_layer_s=o * 1e-6),
                     {**floors, "fp8": f * 1e-6}), e, o, f)
               for e in grid for o in range(0, 401, 10) for f in floors_us)
    return replace(gpu, fp8_efficiency=best[1], float8_layer_s=best[2] * 1e-6), {**floors, "fp8": best[3] * 1e-6}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timings", help="fp8_matmul.py's JSON")
    opts = p.parse_args()
    data = json.load(open(opts.timings))
    gpu, floors = fit(data["rows"], device_of(data))
    print(f"{data['device']}: bf16 {gpu.bf16_efficiency:.2f} of peak, fp8 {gpu.fp8_efficiency:.2f}, "
          f"{gpu.float8_layer_s * 1e6:.0f} us per converted layer; dispatch floors "
          f"bf16 {floors['bf16'] * 1e6:.0f} us, fp8 {floors['fp8'] * 1e6:.0f} us")
    print(f"{'model':14} {'in':>6} {'out':>6} {'measured':>9} {'model':>6}")
    for r in data["rows"]:
        s = timed_s(r, None, gpu, floors) / timed_s(r, RECIPE, gpu, floors)
        print(f"{r['model']:14} {r['in']:6} {r['out']:6} {r['speedup']:9.2f} {s:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
