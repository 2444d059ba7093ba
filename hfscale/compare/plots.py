"""`hfscale report`'s plots: days against GPUs, the loss curves against steps, tokens, time and projected days (eval
beside training), memory and throughput by run. matplotlib (Agg) is imported only here, only when plotting; each PNG
is written atomically."""

from pathlib import Path

from ..files import atomic_path
from .convergence import X_AXES, curve
from .rows import Row


def _label(row: Row) -> str:
    return f"{row.strategy}/{row.optim}"


def plots(rows: list[Row], out: Path, smooth_weight: float = 0.0, days_at_gpus: int | None = None) -> list[Path]:
    """Days against GPUs, the loss curves (against steps, tokens, time and projected days), memory and throughput by
    run: each PNG written atomically, those with nothing to draw left out."""
    import matplotlib  # heavy, and only for the plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def finish(fig, name):
        path = out / name
        with atomic_path(path) as tmp:  # a reader never sees half a PNG
            fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
        plt.close(fig)
        written.append(path)

    ok = [r for r in rows if r.ok and r.tokens_per_s and r.gpus]  # a file without its world size has no x here
    if ok:
        finish(_days_vs_gpus(plt, ok), "days_vs_gpus.png")
    # One loss plot per x-axis: steps hold different numbers of tokens when GAS or GPUs differ, so runs are
    # compared by tokens seen, by wall-clock and by projected days too. Eval loss (dashed, dots) beside training loss.
    for x, name in (("step", "loss_curves.png"), ("tokens", "loss_vs_tokens.png"), ("elapsed_s", "loss_vs_time.png"),
                    ("projected_days", "loss_vs_projected_days.png")):
        curves = [(r, curve(r.loss_history, x, smooth_weight), curve(r.eval_history, x)) for r in rows]
        curves = [c for c in curves if c[1][0] or c[2][0]]
        if curves:
            finish(_loss_figure(plt, curves, x, smooth_weight, days_at_gpus), name)
    for name, attr, xlabel, title in (
        ("memory.png", "mem_gb", "peak memory per device (GB)", "Peak memory per device by run"),
        ("throughput.png", "tokens_per_s", "tokens/s per GPU", "Throughput per GPU by run"),
    ):
        bars = [r for r in rows if r.ok and getattr(r, attr) is not None]
        if bars:
            finish(_bars(plt, bars, attr, xlabel, title), name)
    return written


def _days_vs_gpus(plt, ok: list[Row]):
    """The best (fewest days) configuration per strategy/optimizer at each GPU count."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    best: dict[str, dict[int, float]] = {}
    for r in ok:
        by_gpus = best.setdefault(_label(r), {})
        by_gpus[r.gpus] = min(by_gpus.get(r.gpus, float("inf")), r.days)
    for label, by_gpus in sorted(best.items()):
        xs = sorted(by_gpus)
        ax.plot(xs, [by_gpus[x] for x in xs], marker="o", label=label)
    ax.set(xlabel="GPUs (processes)", ylabel="days (wall clock)", yscale="log",
           title="Days to train 100B tokens vs GPU count (best configuration per strategy)")
    ax.set_xticks(sorted({r.gpus for r in ok}))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="strategy/optimizer", fontsize=8)
    return fig


def _loss_figure(plt, curves: list, x: str, smooth_weight: float, days_at_gpus: int | None):
    """Every run's training loss (solid) and eval loss (dashed, dots) against one x-axis."""
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for r, (xs, ys), (exs, eys) in curves:
        line = ax.plot(xs, ys, label=r.run, linewidth=1)
        if exs:
            ax.plot(exs, eys, linestyle="--", marker=".", linewidth=1, color=line[0].get_color(),
                    label=f"{r.run} (eval)")
    if wide_range([v for _, (xs, _), (exs, _) in curves for v in (*xs, *exs)]):
        ax.set_xscale("log")
    smoothing = f", smoothed {smooth_weight:g}" if smooth_weight else ""
    axis = X_AXES[x] + (f" at {days_at_gpus} GPUs" if x == "projected_days" and days_at_gpus else "")
    evals = any(c[2][0] for c in curves)
    ax.set(xlabel=axis, ylabel="loss" + (" (train solid, eval dashed)" if evals else " (train)"),
           title=f"Loss against {axis}{smoothing}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, ncol=1 + (len(curves) * (2 if evals else 1)) // 16, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    return fig


def _bars(plt, bars: list[Row], attr: str, xlabel: str, title: str):
    """One bar per run: its peak memory, or its tokens/s per GPU."""
    values = [getattr(r, attr) / (r.gpus if attr == "tokens_per_s" and r.gpus else 1) for r in bars]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(bars) + 1.5))
    ax.barh([r.run for r in bars], values, color="tab:blue")
    kinds = {r.mem_kind for r in bars}
    ax.set(xlabel=xlabel + (" (host RSS)" if attr == "mem_gb" and kinds == {"RSS"} else ""), title=title)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def wide_range(values: list[float]) -> bool:
    """A loss plot's x axis is logarithmic when its positive values span more than two decades: runs of very different
    sizes (an imported 100B-token log beside a tiny run) each keep their own shape."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) > 100 * min(positive)
