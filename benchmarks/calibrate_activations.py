"""Measure what a training step of HF GPT-2/BLOOM/Llama/Qwen3/Gemma 3/OLMo 2/Phi-3 really holds, and fit the activation
constants of hfscale/formulas/activations.py (ACTIVATION_COEFFICIENTS) to it. Prints the measurements and the fitted
table.

What is measured, per shape, in a fresh process (one thread, glibc's mmap threshold fixed at 64 KiB so that freed
tensors go back to the kernel and RSS follows the tensors alive): `activations` = resident memory after the
forward minus before it (what autograd keeps for the backward; the weights are already resident), and `peak` = the
kernel's high-water mark over forward + backward + optimizer step (reset through /proc/self/clear_refs) minus the
level before the step. The fit is a least-squares over per-layer features (b·s·h, b·a·s²) and once-per-model
features (b·s·V logits, b·s·h, b·s² mask, weight matrices) - and for the Llama-shaped families per-layer b·s·f,
b·s·kv and b·s·q, their MLP, key/value and query widths varied apart from h (OLMo 2's and Phi-3's queries are always
h wide: no b·s·q term of their own) - in bytes per element, for each (family, attention, precision, checkpointing) mode.

    python benchmarks/calibrate_activations.py              # every mode, ~30 minutes on 2 cores
    python benchmarks/calibrate_activations.py --modes qwen3  # a family's modes
    python benchmarks/calibrate_activations.py --modes gpt2/eager/fp32/0 --json out.json
    python benchmarks/calibrate_activations.py --fit benchmarks/results/h*_*/cuda_activations.jsonl
    python benchmarks/calibrate_activations.py --forward fused --modes gpt2/sdpa/autocast_bf16/0   # the fused loss
                                                                      # against its estimate (no fit)
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# (n_layer, hidden, heads, vocab, seq, micro_batch): varied one or two at a time, so the features are not collinear.
SHAPES = [(4, 256, 4, 8192, 512, 4), (8, 256, 4, 8192, 512, 4), (4, 256, 4, 8192, 256, 8), (4, 256, 4, 16384, 512, 4),
          (4, 512, 8, 8192, 512, 4), (2, 384, 6, 4096, 384, 2), (4, 256, 8, 8192, 512, 4)]
# Llama's, with (key/value heads, MLP width) after them: those two varied too, apart from h and from each other
LLAMA_SHAPES = [(*shape, kv, f) for shape, kv, f in zip(SHAPES, (2, 2, 2, 2, 4, 2, 4),
                                                        (704, 704, 704, 704, 1408, 1024, 704))]
LLAMA_SHAPES += [(4, 256, 4, 8192, 512, 4, 4, 704), (4, 256, 4, 8192, 512, 4, 2, 1024),
                 (4, 256, 4, 8192, 512, 4, 1, 512)]
# Llama's and Qwen3's, with a head width after them: those shapes at hidden / heads, then heads x head_dim (the query
# width) and key/value heads x head_dim varied apart from h and from each other
HEAD_WIDTH_SHAPES = [(*shape, shape[1] // shape[2]) for shape in LLAMA_SHAPES]
HEAD_WIDTH_SHAPES += [(4, 256, 4, 8192, 512, 4, 2, 704, 128), (4, 256, 8, 8192, 512, 4, 2, 704, 64),
                      (4, 256, 2, 8192, 512, 4, 1, 512, 96)]
MODES = [f"{fam}/{attn}/{prec}/{ck}" for fam, attns in (("gpt2", ("eager", "sdpa")), ("bloom", ("eager",)),
                                                       ("llama", ("eager", "sdpa")), ("qwen3", ("eager", "sdpa")),
                                                       ("gemma3", ("eager", "sdpa")), ("olmo2", ("eager", "sdpa")),
                                                       ("phi3", ("eager", "sdpa")))
         for attn in attns for prec in ("fp32", "autocast_bf16", "bf16") for ck in (0, 1)]
SIZES = ("n_layer", "hidden", "heads", "vocab", "seq", "mbs", "kv_heads", "ffn", "head_dim")  # a shape tuple's


def shapes_of(family: str) -> list[tuple]:
    """A family's shapes: its head width varied where its configs set one; OLMo 2's and Phi-3's heads are hidden /
    heads wide."""
    return {"llama": HEAD_WIDTH_SHAPES, "qwen3": HEAD_WIDTH_SHAPES, "gemma3": HEAD_WIDTH_SHAPES,
            "olmo2": LLAMA_SHAPES, "phi3": LLAMA_SHAPES}.get(family, SHAPES)


def fold_query_width(X):
    """A mode's feature matrix without its query-width column where every row's queries are h wide (a GPU grid of
    Llama's, every OLMo 2 grid: the column equals the b·s·h one, and the fit's b·s·h term holds both - the row the
    estimate then takes for such shapes alone, activations.fitted_row)."""
    import numpy as np

    return X[:, :8] if X.shape[1] == 9 and np.array_equal(X[:, 8], X[:, 0]) else X


def row_shape(family: str, r: dict):
    """The ModelShape of a measured row (its key/value heads, MLP width and head width where the row has them)."""
    from hfscale.formulas.metrics import ModelShape

    return ModelShape(family, r["n_layer"], r["hidden"], r["heads"], r["vocab"], max(r["seq"], 256), r.get("ffn"),
                      r.get("kv_heads"), head_dim=r.get("head_dim"))


def shape_row(shape: tuple) -> dict:
    """A SHAPES / LLAMA_SHAPES / HEAD_WIDTH_SHAPES tuple as a row's sizes."""
    return dict(zip(SIZES, shape))

PROBE = r"""
import contextlib, json, sys, torch
sys.path.insert(0, sys.argv[1])
from hfscale.formulas.metrics import ModelShape
from hfscale.models import build_model
torch.set_num_threads(1)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
fam, attn, prec, ck = sys.argv[2].split("/")
l, h, a, v, s, b, kv, f, hd = (int(x) if x != "-" else None for x in sys.argv[3:12])
model = build_model(ModelShape(fam, l, h, a, v, max(s, 256), f, kv, head_dim=hd), 0, attn, float(sys.argv[13]))
if sys.argv[12] != "model":  # as hfscale trains it: no KV cache (and the fused loss if asked); "model": its own forward
    from hfscale.run.forward import use_training_forward
    use_training_forward(model, sys.argv[12] == "fused")
if ck == "1":
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
if prec == "bf16":
    model.to(torch.bfloat16)
model.train()
autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if prec == "autocast_bf16" else contextlib.nullcontext
opt = torch.optim.AdamW(model.parameters(), foreach=False)
ids = torch.randint(0, v, (b, s))
for step in range(2):  # the second step is reported: allocations settled
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    with autocast():
        loss = model(input_ids=ids, labels=ids).loss
    activations = status("VmRSS") - before
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    peak = status("VmHWM") - before
print(json.dumps({"activations": activations, "peak": peak}))
"""


FORWARDS = ("training", "fused", "model")  # hfscale's training forward, with the fused loss, the model's own (KV cache)


def measure(mode: str, shape: tuple, forward: str = "training", dropout: float = 0.0) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    sizes = [*map(str, shape), *["-"] * (len(SIZES) - len(shape))]  # GPT-2/BLOOM: no key/value heads, MLP or head width
    proc = subprocess.run([sys.executable, "-c", PROBE, str(REPO), mode, *sizes, forward, str(dropout)], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        sys.exit(f"{mode} {shape} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report_other_rows(rows: list[dict], device: str = "cuda") -> None:
    """Compiled rows and fused-loss rows are not fitted: the estimate scales the eager fit for compilation
    (COMPILED_ACTIVATION_FACTOR) and replaces the logits' terms for the fused loss (fused_loss_bytes). Print how each
    row compares with the estimate as it stands: the figures to set COMPILED_ACTIVATION_FACTOR from, and the check of
    fused_loss_bytes."""
    sys.path.insert(0, str(REPO))
    from hfscale.formulas.activations import activations

    for r in rows:
        family, _, _, checkpointing, *compiled = r["mode"].split("/")
        mode = "/".join(r["mode"].split("/")[:4])
        if "error" in r or checkpointing == "1":
            continue
        estimate = activations(row_shape(family, r), r["seq"], r["mbs"], mode, device,
                               fused_loss=bool(r.get("fused_loss")))
        kept, peak = estimate.kept, estimate.peak
        what = "fused loss" if r.get("fused_loss") else "compiled / eager estimate"
        print(f"{r['mode']:30s} {what}: measured / estimated kept {r['activations'] / kept:.2f}, "
              f"peak {r['peak'] / peak:.2f}")


def fit_compiled(rows: list[dict], device: str = "cuda") -> dict:
    """A compiled step in terms of the eager estimate, from the compiled rows (unfused, not checkpointed): per mode, the
    factor on what the eager estimate keeps (least squares through the origin over the mode's rows), and what the step's
    peak adds above what it keeps, in bytes per b·s·V logit element, by the bytes of the logits the model returns (its
    gradient is one of the tensors there) - from rows whose vocabulary is not a multiple of inductor's alignment
    ("ragged": the grid's rows; the aligned figure is one whole run's, activations.COMPILED_LOGITS_PEAK_BYTES). Prints each
    row against the fit. Rows measured on a step that returned its logits (every row before run/forward.py returned the
    loss alone: no "logits_output" key) are fitted apart from rows of hfscale's loss-only step."""
    import numpy as np

    sys.path.insert(0, str(REPO))
    from hfscale.formulas.activations import COMPILED_ALIGNMENT_ELEMENTS, activations, logits_bytes

    rows = [without_kv_cache(r) for r in rows if "error" not in r and not r.get("fused_loss")
            and r["mode"].split("/")[3:5] == ["0", "1"] and r["vocab"] % COMPILED_ALIGNMENT_ELEMENTS]
    factors, peaks = {}, {}
    for returned in (True, False):
        mine = [r for r in rows if r.get("logits_output", True) == returned]
        by_mode: dict[str, list] = {}
        for r in mine:
            mode = "/".join(r["mode"].split("/")[:4])
            eager = activations(row_shape(mode.split("/")[0], r), r["seq"], r["mbs"], mode, device, kv_cache=False).kept
            by_mode.setdefault(mode, []).append((r, eager))
        table, extra = {}, {}
        for mode, pairs in sorted(by_mode.items()):
            measured, eager = (np.array(column, float) for column in zip(*((r["activations"], e) for r, e in pairs)))
            table[mode] = round(float(measured @ eager / (eager @ eager)), 3)
            for r, e in pairs:
                bsv = r["mbs"] * r["seq"] * r["vocab"]
                extra.setdefault(logits_bytes(mode), []).append((r["peak"] - r["activations"]) / bsv)
                print(f"{r['mode']:30s} l{r['n_layer']} h{r['hidden']} s{r['seq']} b{r['mbs']} logits returned "
                      f"{returned}: kept / eager estimate {r['activations'] / e:.3f} (x {table[mode]}: "
                      f"{table[mode] * e / r['activations']:.3f}), peak above kept {(r['peak'] - r['activations']) / bsv:.2f}"
                      " bytes per logit")
        key = "returned" if returned else "loss_only"
        if table:
            factors[key], peaks[key] = table, {n: round(float(np.mean(v)), 1) for n, v in sorted(extra.items())}
    print(f"compiled factors: {factors}; peak above kept, bytes per logit element by the logits' bytes: {peaks}")
    return {"factors": factors, "ragged_logits_peak": peaks}


def without_kv_cache(row: dict) -> dict:
    """A row measured with transformers' KV cache (the H100 grid of 2026-11-23, from before run/forward.py: rows
    without a "kv_cache" key kept it) in the terms of hfscale's training step, which keeps none: the cache's bytes
    (activations.kv_cache_bytes) taken off what it kept and off its peak."""
    if not row.get("kv_cache", True) or "error" in row:
        return row
    from hfscale.formulas.activations import kv_cache_bytes

    shape = row_shape(row["mode"].split("/")[0], row)
    cache = kv_cache_bytes(shape, row["seq"], row["mbs"], "/".join(row["mode"].split("/")[:4]))
    return {**row, "activations": row["activations"] - cache, "peak": row["peak"] - cache, "kv_cache": False}


def fit_rows(rows: list[dict], device: str = "cuda") -> dict:
    """Least-squares coefficients per mode from measured rows ({"mode", n_layer, hidden, heads, vocab, seq, mbs,
    activations, peak}, with the KV cache taken off rows that kept it), a row that disagrees with the rest of its mode
    set aside and named (fit_mode), and each checkpointed mode's recompute terms: what a recomputed block's backward
    adds beyond its activations, per b·s·h and per b·a·s² element (recompute_term). Prints the worst error and the worst
    leave-one-out error of each mode (how far the fit would miss a shape it was not fitted on), and the table."""
    import numpy as np

    sys.path.insert(0, str(REPO))
    from hfscale.formulas.activations import activation_features, keeps_attention_scores

    rows = [without_kv_cache(r) for r in rows]  # every row in the terms of hfscale's training step

    def features(r):
        return activation_features(row_shape(r["mode"].split("/")[0], r), r["seq"], r["mbs"])

    others = [r for r in rows if r.get("fused_loss") or r["mode"].split("/")[4:] == ["1"]]
    report_other_rows(others)
    rows = [r for r in rows if r not in others]  # the coefficients are the eager, unfused step's
    table, quality, peaks, recompute, set_aside = {}, {}, {}, {}, []
    modes = sorted({"/".join(r["mode"].split("/")[:4]) for r in rows})
    for mode in modes:
        mine = [r for r in rows if r["mode"].startswith(mode + "/") or r["mode"] == mode]
        columns = fold_query_width(np.array([features(r) for r in mine], float)).shape[1] if mine else 6
        if len(mine) < columns:
            print(f"{mode:28s} {len(mine)} row(s): too few to fit {columns} coefficients, left to the estimate's "
                  "fallback")
            continue
        X = fold_query_width(np.array([features(r) for r in mine], float))
        y = np.array([r["activations"] for r in mine], float)
        # SDPA's kernels keep no b·a·s² matrix (0.005 in every unfolded fit) but where torch runs its math kernel: a
        # column left free only makes the fit unstable where heads vary in one shape alone
        X[:, 1] *= [keeps_attention_scores(row_shape(mode.split("/")[0], r), mode, device) for r in mine]
        coef, outlier, worst, loo = fit_mode(X, y)
        if outlier is not None:
            set_aside.append(mine[outlier])
            print(f"{mode:28s} set aside (its mode's other rows agree, it does not): {mine[outlier]}")
        table[mode] = [round(float(c), 3) for c in coef]
        quality[mode] = (worst, loo)
        print(f"{mode:28s} {table[mode]}  worst fit {worst:.1%}, leave-one-out {loo:.1%}")
    for mode in table:  # the recompute term of each checkpointed mode, against every peak of the mode
        if mode.endswith("/1") and mode[:-1] + "0" in table:
            mine = [r for r in rows if r["mode"].startswith(mode + "/") and r not in set_aside]
            recompute[mode], peaks[mode] = recompute_term(mine, table[mode], table[mode[:-1] + "0"], features,
                                                          scores=mode.split("/")[1] == "eager")
    print(f"recompute terms, bytes per b·s·h and per b·a·s²: {recompute}; their worst peak error: {peaks}")
    print_table("ACTIVATION_COEFFICIENTS[device]", table)
    return {"coefficients": table, "quality": quality, "recompute_bytes": recompute, "peak_error": peaks, "set_aside": set_aside}


def recompute_term(rows: list[dict], coef, full, features, scores: bool = True) -> tuple[tuple[float, float], float]:
    """What a checkpointed backward holds beyond one recomputed block's activations: bytes per b·s·h element and per
    b·a·s² element (eager attention's score gradients; `scores` False - SDPA, which keeps no score matrix - holds the
    second at 0). The pair (0-150 0.1 apart, 0-20 0.25 apart) whose estimated peaks - the fitted kept plus the larger
    of the logits' gradients and the block with those terms, as activations.activations computes them - miss the mode's
    measured peaks by the least at worst; among pairs that miss alike, the smallest score term, then the largest
    b·s·h term (where the logits set every peak, the largest that leaves them so). Returns it and its worst peak
    error."""
    import numpy as np

    from hfscale.formulas.activations import LOGITS_PEAK_COPIES

    kept = np.array([sum(c * x for c, x in zip(coef, features(r))) for r in rows])
    bsh = np.array([r["mbs"] * r["seq"] * r["hidden"] for r in rows], float)
    bas = np.array([r["mbs"] * r["heads"] * r["seq"] ** 2 for r in rows], float)
    widths = np.array([sum(c * x for c, x in zip(full[6:], features(r)[6:])) / r["n_layer"] for r in rows], float)
    logits = np.array([LOGITS_PEAK_COPIES * 4 * r["mbs"] * r["seq"] * r["vocab"] for r in rows], float)
    peak = np.array([r["peak"] for r in rows], float)
    per_bsh = np.arange(1501) / 10
    best = (float("inf"), (0.0, 0.0))
    for per_bas in (np.arange(81) / 4 if scores else [0.0]):
        block = (full[0] + per_bsh[:, None]) * bsh + (full[1] + per_bas) * bas + widths  # as recomputed_block_bytes
        worst = np.round((np.abs(kept + np.maximum(logits, block) - peak) / peak).max(axis=1), 4)
        if worst.min() < best[0]:
            best = (float(worst.min()), (float(per_bsh[worst == worst.min()].max()), float(per_bas)))
    return best[1], best[0]


def fit_mode(X, y, tolerance: float = 0.10, agreement: float = 0.05) -> tuple:
    """(coefficients, the row set aside or None, worst in-sample error, worst leave-one-out error over the rows the
    others determine) of one mode's rows. A row is set aside - at most one per mode, and named - when the fit of the mode's other rows misses it by more than
    `tolerance` while those rows predict each other within `agreement`: one measurement that disagrees with the rest of
    its mode, not a shape the model cannot describe (two H100 grids measured the same checkpointed shape 0.41 GB apart,
    one embedding matrix's size in the step's baseline; docs/estimate.md)."""
    import numpy as np

    def fit(X, y):
        coef = np.linalg.lstsq(X, y, rcond=None)[0]
        loo = [abs(X[i] @ np.linalg.lstsq(np.delete(X, i, 0), np.delete(y, i), rcond=None)[0] - y[i]) / y[i]
               for i in range(len(y)) if identifiable(np.delete(X, i, 0))] or [0.0]
        return coef, loo

    def identifiable(X):  # a row that alone varies a feature (the Llama grid's one MLP width apart from h) cannot be
        scaled = X / np.maximum(np.abs(X).max(axis=0), 1)  # left out: the others do not determine its coefficient
        s = np.linalg.svd(scaled[:, np.abs(X).max(axis=0) > 0], compute_uv=False)
        return s[-1] / s[0] > 5e-3

    coef, loo = fit(X, y)
    outlier = None
    if max(loo) > tolerance and len(y) > X.shape[1] + 1:
        rests = [(max(rest_loo), i, rest_coef) for i in range(len(y)) if identifiable(np.delete(X, i, 0))
                 for rest_coef, rest_loo in [fit(np.delete(X, i, 0), np.delete(y, i))]]
        agree, candidate, rest_coef = min(rests, key=lambda r: r[0], default=(float("inf"), None, None))
        if agree <= agreement and abs(X[candidate] @ rest_coef - y[candidate]) / y[candidate] > tolerance:
            outlier, coef = candidate, rest_coef
            X, y = np.delete(X, candidate, 0), np.delete(y, candidate)
            loo = fit(X, y)[1]
    return coef, outlier, float(max(abs(X @ coef - y) / y)), float(max(loo))


# What dropout adds lies in the per-layer b·s·h and b·a·s² features, the embeddings' b·s·h and Llama's and Qwen3's
# per-layer widths (masks of the tensors a layer drops, and what SDPA's math kernel keeps on CPU): the shapes that vary
# those apart - layers, sequence and micro-batch, heads; key/value heads and MLP width; Qwen3's query width.
DROPOUT_FEATURES = (0, 1, 3, 6, 7, 8)
DROPOUT_SHAPES = {"gpt2": [SHAPES[i] for i in (0, 1, 2, 6)],
                  "llama": [HEAD_WIDTH_SHAPES[i] for i in (0, 1, 2, 6, 7, 8, 9, 10, 12)]}
DROPOUT_SHAPES["qwen3"] = DROPOUT_SHAPES["gemma3"] = DROPOUT_SHAPES["llama"]
DROPOUT_SHAPES["olmo2"] = DROPOUT_SHAPES["phi3"] = [LLAMA_SHAPES[i] for i in (0, 1, 2, 6, 7, 8, 9)]  # queries h wide
# a checkpointed block keeps its input alone: only the embeddings' masks, which activations.counted_dropout counts
DROPOUT_MODES = [m for m in MODES if m.endswith("/0")]


def measure_dropout(modes: list[str], dropout: float, workers: int = 2) -> list[dict]:
    """Each mode's shapes (DROPOUT_SHAPES) measured without dropout and with `dropout` (every dropout of the family's
    config at that probability), side by side: a row per shape with what the masks add to what the step keeps and to
    its peak. `workers` probes at a time (each a process of one thread: its resident set is its own)."""
    from concurrent.futures import ThreadPoolExecutor

    rows = []
    with ThreadPoolExecutor(workers) as pool:
        for mode in modes:
            family = mode.split("/")[0]
            shapes = DROPOUT_SHAPES.get(family, DROPOUT_SHAPES["gpt2"])
            pairs = pool.map(lambda shape: (measure(mode, shape, dropout=0.0), measure(mode, shape, dropout=dropout)),
                             shapes)
            for shape, (without, with_) in zip(shapes, pairs):
                rows.append({"mode": mode, **shape_row(shape), "dropout": dropout, "activations": with_["activations"],
                             "peak": with_["peak"], "without": without})
                print(f"{mode:28s} {shape}  dropout {dropout}: kept "
                      f"+{(with_['activations'] - without['activations']) / 1e6:7.1f} MB, peak "
                      f"+{(with_['peak'] - without['peak']) / 1e6:7.1f} MB", flush=True)
    return rows


def fit_dropout(rows: list[dict]) -> dict[str, list[float]]:
    """Per mode, what dropout adds to the kept activations in bytes per element of each feature (the table
    activations.DROPOUT_COEFFICIENTS holds): a least-squares fit of the rows' differences with and without dropout
    (measure_dropout) over DROPOUT_FEATURES, the others 0. Prints each mode's worst error over the kept bytes with
    dropout."""
    import numpy as np

    sys.path.insert(0, str(REPO))
    from hfscale.formulas.activations import activation_features

    table = {}
    rows = [r for r in rows if r["mode"].split("/")[4:] in ([], ["0"])]  # eager steps (a GPU grid's compiled: not)
    for mode in sorted({"/".join(r["mode"].split("/")[:4]) for r in rows}):
        mine = [r for r in rows if "/".join(r["mode"].split("/")[:4]) == mode]
        X = fold_query_width(np.array([activation_features(row_shape(mode.split("/")[0], r), r["seq"], r["mbs"])
                                       for r in mine], float))
        delta = np.array([r["activations"] - r["without"]["activations"] for r in mine], float)
        columns = [i for i in DROPOUT_FEATURES if i < X.shape[1]]
        coef = np.zeros(X.shape[1])
        coef[columns] = np.linalg.lstsq(X[:, columns], delta, rcond=None)[0]
        worst = max(abs(x @ coef - d) / r["activations"] for x, d, r in zip(X, delta, mine))
        table[mode] = [round(float(c), 3) for c in coef]
        print(f"{mode:28s} dropout adds {table[mode]}  worst error {worst:.1%} of the kept bytes", flush=True)
    return table


ROW_SIZES = ("n_layer", "hidden", "heads", "vocab", "seq", "mbs", "activations", "peak")


def read_rows(paths: list[Path]) -> list[dict]:
    """The measured rows of JSON-lines files; a line that is not one (not JSON, a mode not family/attention/precision/
    checkpointing[/compiled], a size that is not a positive integer) is named with its file and line number."""
    rows = []
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"calibrate_activations: {path}: file not found")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"calibrate_activations: {path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise SystemExit(f"{where}: not JSON ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("mode"), str) or row["mode"].count("/") < 3:
                raise SystemExit(f"{where}: not a measured row (an object with a mode like gpt2/sdpa/bf16/0)")
            bad = next((k for k in ROW_SIZES if "error" not in row and not (
                isinstance(row.get(k), int) and not isinstance(row[k], bool) and row[k] > 0)), None)
            if bad:
                raise SystemExit(f"{where}: {bad} is {json.dumps(row.get(bad))}, not a positive integer")
            rows.append(row)
    return rows


def print_table(name: str, table: dict) -> None:
    """A fitted table as the Python of activations.py, to paste."""
    print(f"\n{name} = {{")
    for mode, coef in table.items():
        print(f"    {mode!r}: {tuple(coef)},")
    print("}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path, help="also write the measurements and the fit here")
    parser.add_argument("--forward", default="training", choices=FORWARDS,
                        help="training: hfscale's (fitted); fused: with --fused_linear_cross_entropy, measured against "
                             "the estimate, not fitted; model: the model's own forward (its KV cache included)")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="measure each shape without dropout and with this probability, and fit what the masks "
                             "add (activations.DROPOUT_COEFFICIENTS)")
    parser.add_argument("--fit", type=Path, nargs="+", help="only fit: the rows of JSON-lines files measured elsewhere "
                        "(a GPU: benchmarks/gpu_suite.py writes them), together, no measuring")
    opts = parser.parse_args()
    if opts.fit:
        rows = read_rows(opts.fit)
        dropped = [r for r in rows if r.get("dropout")]  # gpu_suite.py --grid_dropout: with and without, side by side
        rows = [r for r in rows if r not in dropped]
        fit_rows([r for r in rows if "error" not in r])  # a row that could not run says why instead
        fit_compiled(rows)
        if dropped:
            print_table("DROPOUT_COEFFICIENTS[device]", fit_dropout([r for r in dropped if "error" not in r]))
        return
    import numpy as np

    sys.path.insert(0, str(REPO))
    from hfscale.formulas.activations import activation_features

    table, measured = {}, []
    modes = [m for m in MODES if m.split("/")[0] in opts.modes.split(",")] or opts.modes.split(",")
    if opts.dropout:
        modes = [m for m in modes if m in DROPOUT_MODES or opts.modes != parser.get_default("modes")]
        if not 0 < opts.dropout < 1:
            raise SystemExit(f"calibrate_activations: --dropout must be in (0, 1), got {opts.dropout}")
        rows = measure_dropout(modes, opts.dropout)
        table = fit_dropout(rows)
        print_table("DROPOUT_COEFFICIENTS[device]", table)
        if opts.json:
            opts.json.write_text(json.dumps({"measured": rows, "dropout_coefficients": table}, indent=2))
        return
    from concurrent.futures import ThreadPoolExecutor

    # two probes at a time, each a process of one thread: its resident set is its own
    with ThreadPoolExecutor(2) as pool:
        for mode in modes:
            fam, attn, prec, ck = mode.split("/")
            rows, ys = [], []
            shapes = shapes_of(fam)
            for shape, m in zip(shapes, pool.map(lambda shape: measure(mode, shape, opts.forward), shapes)):
                sizes = shape_row(shape)
                measured.append({"mode": mode, "shape": shape, "forward": opts.forward, **m})
                if opts.forward == "fused":
                    report_other_rows([{"mode": mode, **sizes, "fused_loss": True, **m}], device="cpu")
                    continue
                rows.append(activation_features(row_shape(fam, sizes), sizes["seq"], sizes["mbs"]))
                ys.append(m["activations"])
                print(f"{mode:28s} {shape}  activations {m['activations'] / 1e6:8.1f} MB  "
                      f"peak {m['peak'] / 1e6:8.1f} MB", flush=True)
            if opts.forward == "fused":
                continue
            X = fold_query_width(np.array(rows, dtype=float))  # OLMo 2's queries are h wide: eight terms
            coef, *_ = np.linalg.lstsq(X, np.array(ys, dtype=float), rcond=None)
            fit = X @ coef
            worst = max(abs(f - y) / y for f, y in zip(fit, ys))
            table[mode] = [round(float(c), 3) for c in coef]
            print(f"{mode:28s} coefficients {table[mode]}  worst fit error {worst:.1%}", flush=True)
    if opts.forward != "fused":
        print_table("ACTIVATION_COEFFICIENTS", table)
    if opts.json:
        opts.json.write_text(json.dumps({"measured": measured, "coefficients": table}, indent=2))


if __name__ == "__main__":
    main()
