"""What torchao's float8 training buys per linear layer, against bf16, at the shapes of the presets' blocks.

Each layer of a block (its projections, at the preset's hidden, key/value and MLP widths) runs forward and backward
on `--tokens` rows (micro-batch x sequence), once as a bf16 `nn.Linear` and once converted by torchao's
`convert_to_float8_training` (dynamic tensorwise scaling, torchtitan's default), both compiled. Printed: the time of
each, the speedup per layer and per block (the sum of its layers' times, each layer counted as often as a block runs
it). The question it answers for `project`/`tune`: below which layer width FP8 does not pay.

    python benchmarks/fp8_matmul.py --out fp8_matmul.json        # on a Hopper GPU
    python benchmarks/fp8_matmul.py --device cpu --emulate --models tiny-llama --tokens 256 --iters 2   # the code path
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from hfscale.files import atomic_write_text  # noqa: E402
from hfscale.formulas.precision import block_linears  # noqa: E402
from hfscale.models.resolve import resolve_shape  # noqa: E402

DEFAULT_MODELS = "gpt2-350m,llama-3.2-1b,gpt2-1.3b,llama-3.2-3b,llama-3.1-8b"


def time_layer(k: int, n: int, tokens: int, fp8: bool, emulate: bool, device: str, iters: int) -> float:
    """Seconds per forward + backward of one compiled layer (mean of `iters` after warm-up)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch._dynamo.reset()  # each layer its own compile: one lambda recompiled per shape hits dynamo's limit (8)
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).to(device, torch.bfloat16)
    if fp8:
        convert_to_float8_training(layer, config=Float8LinearConfig(emulate=emulate))
    step = torch.compile(lambda x, g: layer(x).backward(g))
    x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(tokens, n, device=device, dtype=torch.bfloat16)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        step(x, g)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        step(x, g)
    sync()
    return (time.perf_counter() - t0) / iters


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma list of presets (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=16384, help="rows per layer: micro-batch x sequence")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--emulate", action="store_true", help="torchao's emulated float8 (no Hopper GPU: the code path)")
    p.add_argument("--budget_s", type=float, default=float("inf"), help="stop starting layers after this long")
    p.add_argument("--out", help="write the rows here as JSON (rewritten after each model)")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    t0, rows = time.monotonic(), []
    print(f"{'model':>14} {'in':>6} {'out':>6} {'x':>2} {'bf16 ms':>8} {'fp8 ms':>8} {'speedup':>7}", flush=True)
    for name in a.models.split(","):
        for k, n, count in block_linears(resolve_shape(name)):
            if time.monotonic() - t0 > a.budget_s:
                break
            row = {"model": name, "in": k, "out": n, "count": count, "tokens": a.tokens}
            try:
                row["bf16_s"] = time_layer(k, n, a.tokens, False, a.emulate, a.device, a.iters)
                row["fp8_s"] = time_layer(k, n, a.tokens, True, a.emulate, a.device, a.iters)
                row["speedup"] = row["bf16_s"] / row["fp8_s"]
                print(f"{name:>14} {k:>6} {n:>6} {count:>2} {row['bf16_s'] * 1e3:8.3f} {row['fp8_s'] * 1e3:8.3f}"
                      f" {row['speedup']:7.2f}", flush=True)
            except Exception as e:  # noqa: BLE001 - one shape that breaks is recorded, the rest go on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"{name:>14} {k:>6} {n:>6} failed: {row['error']}", flush=True)
            rows.append(row)
        done = [r for r in rows if r["model"] == name and "speedup" in r]
        if done:
            bf16 = sum(r["bf16_s"] * r["count"] for r in done)
            fp8 = sum(r["fp8_s"] * r["count"] for r in done)
            print(f"{name:>14} block's linears: {bf16 / fp8:.2f}x", flush=True)
        if a.out:
            atomic_write_text(a.out, json.dumps({"device": torch.cuda.get_device_name() if a.device == "cuda"
                                                 else a.device, "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
