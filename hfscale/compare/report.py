"""`hfscale report RUN_OR_SWEEP_DIR...`: one table in the BigScience format (markdown and CSV), plots, optional HTML.

Every results.json under the given directories is a row — failed runs included (OOM shown as OOM) — whether it
came from `hfscale train`, `hfscale sweep` or `hfscale import-logs`; the repeats of one configuration (`hfscale sweep
--repeats`) are one row, at their median speed, with their spread. Columns and conventions: docs/compare.md.
"""

import base64
import csv
import io
import re
from dataclasses import replace
from html import escape
from pathlib import Path

from ..errors import ArgumentParser, HfscaleError
from ..files import atomic_write_text, check_writable_dir
from ..flags import first_given
from ..formulas.metrics import days_to_train, size_label, tflops_label
from ..plan.options import check_whole_nodes
from ..plan.links import LINK_FLAGS, add_link_flags, links_from
from ..plan.project import tokens_per_s_at
from ..run.results import RESULTS_FILE, Results, read_results
from .convergence import compare_runs
from .convergence import markdown as convergence_markdown
from .plots import plots
from .rows import Row

BUDGET = 100e9  # the days/100B column
COLUMNS = ["GPUs", "Size", "Strategy", "Optim", "DP", "MBS", "GAS", "GBS", "Speed (s/it)", "TFLOPs/GPU", "MFU",
           "Mem (GB)", "tokens/s", "days/100B", "Notes"]


def find_results(paths: list[Path]) -> list[Path]:
    found = []
    for path in map(Path, paths):
        if not path.exists():
            raise HfscaleError(f"{path}: no such run or sweep directory")
        if path.is_file():
            found.append(path)
        elif (path / RESULTS_FILE).is_file():
            found.append(path / RESULTS_FILE)
        else:
            found.extend(sorted(path.rglob(RESULTS_FILE)))
    if not found:
        raise HfscaleError(f"no {RESULTS_FILE} under {', '.join(map(str, paths))}; run `hfscale train` or `hfscale sweep` first")
    return list(dict.fromkeys(p.resolve() for p in found))


def _notes(results: Results) -> str:
    cfg, env = results.config, results.environment
    notes = []
    if results.source == "megatron-log":  # the file first, as the BigScience one-liner printed it - failures too
        notes.append(f"{Path(results.log_file or '?').name}: " + ("Megatron-DeepSpeed" if str(results.strategy).startswith(
            "megatron-deepspeed") else "Megatron") + " log")
    if not results.ok:
        error = (results.error or "").replace("|", "/")
        return ", ".join([*notes, f"{results.status}: {error}"[:160] if error else results.status])
    if results.source == "megatron-log":
        ramp = ", at the final GBS after ramp-up" if cfg.extra.get("rampup_batch_size") else ""
        launches = results.perf.extra.get("launches") or 1
        cp, vp = cfg.extra.get("context_parallel") or 1, cfg.extra.get("virtual_pipeline") or 1
        layout = (f"TP {cfg.tp or 1} PP {cfg.pp or 1}" + (f" VP {vp}" if vp > 1 else "")
                  + (f" CP {cp}" if cp > 1 else "") + f" DP {cfg.dp or '?'}")
        notes[-1] += (f", {layout}, "
                      f"{results.perf.extra.get('iterations_averaged')} iterations{ramp}"
                      + (f" of {launches} launches" if launches > 1 else ""))
        reported = results.perf.extra.get("tflops_per_gpu_reported")
        if reported:  # the log's own formula beside the BigScience one of the TFLOPs column
            notes.append(f"the log says {reported:.1f} TFLOPs/GPU")
    elif (cfg.tp or 1) > 1:  # hfscale's own TP runs, in the Megatron logs' terms, so the two read side by side
        notes.append(f"TP {cfg.tp} PP {cfg.pp or 1} DP {cfg.dp or '?'}")
    if cfg.activation_checkpointing:
        notes.append("act. ckpt")
    if cfg.float8:  # its precision is bf16, what it computes in outside the float8 matmuls
        notes.append(f"fp8 {cfg.float8}")
    elif cfg.precision:
        notes.append(cfg.precision)
    if env.device_type == "cpu":
        notes.append("CPU")
    if (env.nodes or 1) > 1:
        notes.append(f"{env.nodes} nodes x {env.processes_per_node}")
    saves = [c for c in results.checkpoints if c.get("save_s") is not None]
    if saves:
        notes.append(f"ckpt save {max(c['save_s'] for c in saves):.1f} s, {saves[-1].get('size_gb', 0):.2g} GB")
    return ", ".join(notes)


def to_row(path: Path) -> Row:
    results = read_results(path)
    perf, cfg, mem, model = results.perf, results.config, results.memory, results.model
    ok = results.ok
    tokens_per_s = perf.tokens_per_s if ok else None
    return Row(
        run=results.run_name or path.parent.name, status=results.status, gpus=cfg.world_size,
        params=model.params_model, strategy=results.strategy or "?", optim=results.optim or "?",
        dp=cfg.dp if cfg.dp is not None else cfg.world_size, mbs=cfg.per_device_train_batch_size, gas=cfg.gradient_accumulation_steps,
        gbs=cfg.global_batch_size, s_per_iter=perf.s_per_iter if ok else None,
        tflops=perf.tflops_per_gpu_bigscience if ok else None, mfu=perf.mfu if ok else None,
        mem_gb=mem.peak_gb, mem_kind="device" if mem.peak_allocated_gb is not None else "RSS",
        tokens_per_s=tokens_per_s, days=days_to_train(BUDGET, tokens_per_s, 1)[0] if tokens_per_s else None,
        notes=_notes(results), loss_history=results.loss_history, eval_history=results.eval_history,
        path=str(path.parent), group=f"{model.name or '?'} · {cfg.dataset or '?'} · seq {cfg.seq_len or '?'}",
        repeat=int((results.sweep or {}).get("repeat") or 0))


REPEAT_SUFFIX = re.compile(r"-r\d+$")


def merge_repeats(rows: list[Row]) -> list[Row]:
    """One row per configuration a sweep repeated (its runs share a sweep folder and a name but for -rK): the run at the
    median speed (of an even count, the slower middle one), with every repeat's spread in its notes. A repeat that
    failed stays counted: `2 of 3 ok`."""
    merged, repeats = [], {}
    for row in rows:
        if row.repeat:
            repeats.setdefault((str(Path(row.path).parent), REPEAT_SUFFIX.sub("", row.run)), []).append(row)
        else:
            merged.append(row)
    for (_, name), runs in repeats.items():
        ok = sorted((r for r in runs if r.ok and r.s_per_iter is not None), key=lambda r: r.s_per_iter)
        statuses = ", ".join(sorted({r.status for r in runs if not r.ok}))
        if not ok:
            merged.append(replace(runs[0], run=name, runs=len(runs),
                                  notes="; ".join(filter(None, [f"{len(runs)} repeats, none ok ({statuses})",
                                                                runs[0].notes]))))
            continue
        median, fastest, slowest = ok[len(ok) // 2], ok[0].s_per_iter, ok[-1].s_per_iter
        counted = f"{len(ok)} of {len(runs)} ok ({statuses})" if len(ok) < len(runs) else f"{len(runs)} repeats"
        spread = f"{counted}: s/it {fastest:.4g}–{slowest:.4g} (±{(slowest - fastest) / 2 / median.s_per_iter:.0%})"
        merged.append(replace(median, run=name, runs=len(runs), s_per_iter_range=(fastest, slowest),
                              notes=", ".join(filter(None, [spread, median.notes]))))
    return merged


def collect(paths: list[Path]) -> list[Row]:
    rows = merge_repeats([to_row(p) for p in find_results(paths)])
    return sorted(rows, key=lambda r: (r.params or 0, r.gpus or 0, r.strategy, r.optim, r.mbs or 0, r.gas or 0, r.run))


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def cells(row: Row) -> list[str]:
    speed = _fmt(row.s_per_iter, ".4g") if row.ok else row.status if row.status != "running" else "running"
    return [_fmt(row.gpus, "d"), size_label(row.params), row.strategy, row.optim, _fmt(row.dp, "d"), _fmt(row.mbs, "d"),
            _fmt(row.gas, "d"), _fmt(row.gbs, "d"), speed, tflops_label(row.tflops),
            _fmt(row.mfu, ".1%") if row.mfu is not None else "", _fmt(row.mem_gb, ".2f"), _fmt(row.tokens_per_s, ",.0f"),
            _fmt(row.days, ",.1f"), row.notes]


def markdown_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[Row]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["run", "status", "gpus", "params", "strategy", "optim", "dp", "mbs", "gas", "gbs", "s_per_iter",
                     "tflops_per_gpu_bigscience", "mfu", "mem_gb", "mem_kind", "tokens_per_s", "days_to_100B", "notes", "path",
                     "runs", "s_per_iter_fastest", "s_per_iter_slowest"])
    for r in rows:
        fastest, slowest = r.s_per_iter_range or (None, None)
        writer.writerow([r.run, r.status, r.gpus, r.params, r.strategy, r.optim, r.dp, r.mbs, r.gas, r.gbs, r.s_per_iter,
                         tflops_label(r.tflops), r.mfu, r.mem_gb, r.mem_kind, r.tokens_per_s, r.days, r.notes, r.path,
                         r.runs, fastest, slowest])
    return buf.getvalue()


def html_page(table_md: str, rows: list[Row], images: list[Path]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells(r)) + "</tr>" for r in rows)
    figures = "".join(
        f'<figure><img alt="{escape(p.stem)}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"></figure>'
        for p in images)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>hfscale report</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:last-child{text-align:left}"
            "img{max-width:900px}</style></head><body><h1>hfscale report</h1>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{figures}</body></html>\n")


def add_projected_days(rows: list[Row], gpus: int, gpus_per_node: int, links) -> list[str]:
    """Give every loss and eval point of each finished run `projected_days`: tokens / the run's projected tokens/s at
    `gpus` GPUs (hfscale project, same global batch). Returns one note per run that cannot be projected, or whose
    configuration the memory estimate says cannot fit there."""
    notes = []
    for r in rows:
        if not r.ok:
            continue
        try:
            point = tokens_per_s_at(Path(r.path) / RESULTS_FILE, gpus, gpus_per_node, links)
        except HfscaleError as err:
            notes.append(f"- {r.run}: not projected to {gpus} GPUs ({str(err).split(': ', 1)[-1]})")
            continue
        if point.fits is False:
            notes.append(f"- {r.run}: does not fit at {gpus} GPUs ({point.fit_reason}); its projected days are shown "
                         "for comparison only")
        for p in (*r.loss_history, *r.eval_history):
            if p.get("tokens") is not None:
                p["projected_days"] = days_to_train(p["tokens"], point.tokens_per_s, gpus)[0]
    return notes


def write_report(paths: list[Path], out: Path, with_plots: bool = True, html: bool = False,
                 smooth_weight: float = 0.0, target_loss: float | None = None,
                 days_at: tuple | None = None) -> tuple[list[Row], list[Path]]:
    """days_at: (GPUs, GPUs per node, links) to put the loss curves on projected days too."""
    rows = collect(paths)
    notes = add_projected_days(rows, *days_at) if days_at else []
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows)
    atomic_write_text(out / "report.md", table)
    atomic_write_text(out / "report.csv", csv_text(rows))
    converged = compare_runs([(r.group, r.run, r.loss_history, r.eval_history) for r in rows if r.ok], smooth_weight,
                             target_loss)
    atomic_write_text(out / "convergence.md", convergence_markdown(converged, days_at[0] if days_at else None)
                      + ("\n" + "\n".join(notes) + "\n" if notes else ""))
    written = [out / "report.md", out / "report.csv", out / "convergence.md"]
    images = plots(rows, out, smooth_weight, days_at[0] if days_at else None) if with_plots else []
    written += images
    if html:
        atomic_write_text(out / "report.html", html_page(table, rows, images))
        written.append(out / "report.html")
    return rows, written


def main(argv: list[str]) -> None:
    parser = ArgumentParser(prog="hfscale report", allow_abbrev=False,
                            description="Table (markdown, CSV), plots and optional HTML from run, sweep and "
                                        "imported-log directories.")
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep directories (searched for results.json)")
    parser.add_argument("--out", type=Path, help="where report.md/.csv/.html and the PNGs go (default: <first path>/report)")
    parser.add_argument("--html", action="store_true", help="also write a self-contained report.html")
    parser.add_argument("--no_plots", action="store_true", help="tables only")
    parser.add_argument("--smooth", type=float, default=0.0, help="TensorBoard-style smoothing of the loss curves, 0 to <1")
    parser.add_argument("--target_loss", type=float, help="convergence.md: tokens to this loss (default: the group's "
                        "highest final loss, which every run reaches)")
    parser.add_argument("--days_at_gpus", type=int, help="also plot loss against the days each run's configuration "
                        "would take at this many GPUs (hfscale project, same global batch); the link flags as there")
    add_link_flags(parser)
    opts = parser.parse_args(argv)
    if not 0 <= opts.smooth < 1:
        raise HfscaleError(f"--smooth must be in [0, 1), got {opts.smooth}")
    if opts.target_loss is not None and not 0 < opts.target_loss < float("inf"):
        raise HfscaleError(f"--target_loss must be a positive, finite loss, got {opts.target_loss}")
    days_at = None
    if opts.days_at_gpus is not None:
        if opts.days_at_gpus <= 0 or opts.gpus_per_node <= 0:
            raise HfscaleError(f"--days_at_gpus and --gpus_per_node must be positive, got {opts.days_at_gpus} and "
                               f"{opts.gpus_per_node}")
        check_whole_nodes([opts.days_at_gpus], opts.gpus_per_node, "--days_at_gpus")
        days_at = (opts.days_at_gpus, opts.gpus_per_node, links_from(opts))
    elif unread := first_given(argv, LINK_FLAGS):  # a silently ignored bandwidth file is a wrong answer trusted
        raise HfscaleError(f"{unread} is read only with --days_at_gpus (the days each run's configuration would "
                           f"take at that many GPUs); add --days_at_gpus N or drop {unread}")
    out = opts.out or (opts.paths[0] if opts.paths[0].is_dir() else opts.paths[0].parent) / "report"
    check_writable_dir(out, "--out")
    rows, written = write_report(opts.paths, out, not opts.no_plots, opts.html, opts.smooth, opts.target_loss, days_at)
    print(markdown_table(rows))
    print("wrote " + ", ".join(str(p) for p in written))
