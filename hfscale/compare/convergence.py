"""Convergence side by side: loss against tokens seen (and wall-clock), loss at equal tokens, tokens to a target loss.

Runs are compared only with runs that share the model, the data and the sequence length (a group); within a group
the loss is read at the largest token count every run reached, and each run's tokens (and measured seconds) to reach
the target loss - by default the highest final loss of the group, so every run reaches it. Curves may be smoothed
first (`--smooth W`: TensorBoard's exponential moving average, debiased). With `hfscale report --days_at_gpus N` each
point also carries `projected_days`: the days the run's configuration would take at N GPUs to reach that point
(hfscale project, same global batch, so the loss per token is unchanged), and runs are compared per projected day.
"""

from dataclasses import dataclass

X_AXES = {"step": "optimizer step", "tokens": "tokens seen", "elapsed_s": "wall-clock seconds (measured)",
          "projected_days": "projected days"}


def smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average with weight in [0, 1), debiased at the start."""
    if not weight:
        return list(values)
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = last * weight + (1 - weight) * v
        norm = norm * weight + (1 - weight)
        out.append(last / norm)
    return out


def curve(history: list[dict], x: str, weight: float = 0.0) -> tuple[list[float], list[float]]:
    """(x values, smoothed losses) of the points that have both, in x order."""
    points = sorted((p[x], p["loss"]) for p in history if p.get(x) is not None and p.get("loss") is not None)
    return [a for a, _ in points], smooth([b for _, b in points], weight)


def value_at(xs: list[float], ys: list[float], x: float) -> float | None:
    """Linear interpolation of the curve at x (None outside it)."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def first_reach(xs: list[float], ys: list[float], target: float) -> float | None:
    """The first x where the curve comes down to `target`, interpolated between the points around it."""
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = xs[i - 1], ys[i - 1]
            return x0 + (x - x0) * (y0 - target) / (y0 - y)
    return None


@dataclass
class Convergence:
    group: str
    run: str
    tokens_common: float
    loss_at_common: float | None
    target_loss: float
    tokens_to_target: float | None
    seconds_to_target: float | None
    final_loss: float | None
    final_eval_loss: float | None = None
    projected_days_to_target: float | None = None


def compare_runs(runs: list[tuple], weight: float = 0.0, target_loss: float | None = None) -> list[Convergence]:
    """runs: (group, run name, loss history with tokens[, eval history]). Groups of one run are compared with nothing
    and left out."""
    groups: dict[str, list] = {}
    for group, name, history, *rest in runs:
        xs, ys = curve(history, "tokens", weight)
        evals = [p["loss"] for p in (rest[0] if rest else []) if p.get("loss") is not None]
        if xs:
            groups.setdefault(group, []).append((name, xs, ys, curve(history, "elapsed_s", weight),
                                                 curve(history, "projected_days", weight), evals[-1] if evals else None))
    out = []
    for group, members in groups.items():
        if len(members) < 2:
            continue
        common = min(m[1][-1] for m in members)
        target = target_loss if target_loss is not None else max(m[2][-1] for m in members)
        for name, xs, ys, (ts, tys), (ds, dys), final_eval in members:
            out.append(Convergence(group, name, common, value_at(xs, ys, common), target, first_reach(xs, ys, target),
                                   first_reach(ts, tys, target) if ts else None, ys[-1], final_eval,
                                   first_reach(ds, dys, target) if ds else None))
    return out


def markdown(rows: list[Convergence], days_at_gpus: int | None = None) -> str:
    if not rows:
        return "No group of two or more runs with the same model, data and sequence length logged tokens.\n"
    days = f"projected days to target at {days_at_gpus} GPUs" if days_at_gpus else "projected days to target"
    lines = ["| group | run | loss at equal tokens | at tokens | tokens to target | seconds to target | "
             f"{days} | target loss | final loss | final eval loss |", "|---|---|---|---|---|---|---|---|---|---|"]

    def f(x, spec):
        return "" if x is None else format(x, spec)

    ranked = sorted(rows, key=lambda r: (r.group, r.loss_at_common if r.loss_at_common is not None else 1e9))
    for r in ranked:
        lines.append(f"| {r.group} | {r.run} | {f(r.loss_at_common, '.4f')} | {r.tokens_common:,.0f} | "
                     f"{f(r.tokens_to_target, ',.0f') or 'not reached'} | {f(r.seconds_to_target, '.1f')} | "
                     f"{f(r.projected_days_to_target, ',.3g')} | {r.target_loss:.4f} | {f(r.final_loss, '.4f')} | "
                     f"{f(r.final_eval_loss, '.4f')} |")
    return "\n".join(lines) + "\n"
