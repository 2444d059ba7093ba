"""The host time of one logging step's TensorBoard writes, side by side in one run: one event per tag (torch's
add_scalar, as hfscale wrote until 2026-11-26) against hfscale's one event per x value with one flush
(run/measure.TensorBoardWriter.scalars, MeasureCallback.on_log). A logging step's host time is a gap in a GPU's queue:
the Trainer's loss read before it has drained the queue.

    python benchmarks/log_cost.py            # ms per log, each way, three rounds
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hfscale.run.measure import TRAIN_SCALARS, TensorBoardWriter, curve_scalars  # noqa: E402

# a logging step's logs as a run's callbacks fill them: the Trainer's, the 14 perf/* and 2 memory/* figures, the x values
LOGS = {"loss": 3.2, "grad_norm": 1.1, "learning_rate": 3e-4, "tokens": 40960, "elapsed_s": 1.7,
        **{f"perf/figure_{i}": float(i) for i in range(14)}, "memory/step_peak_gb": 1.0, "memory/step_delta_gb": 0.5}


VALUES = {TRAIN_SCALARS[k]: v for k, v in LOGS.items() if k in TRAIN_SCALARS}
VALUES.update({k: v for k, v in LOGS.items() if k.startswith(("perf/", "memory/"))})
CURVES = [("train", {"loss": LOGS["loss"], "tokens": LOGS["tokens"], "elapsed_s": LOGS["elapsed_s"]})]


def per_tag(tb: TensorBoardWriter, step: int) -> None:
    """As hfscale wrote a log before: an event per tag, a flush per x value."""
    for name, value in VALUES.items():
        tb.writer.add_scalar(name, value, step)
    tb.writer.flush()
    for split, point in CURVES:
        for tag, value, x in curve_scalars(split, point):
            tb.writer.add_scalar(tag, value, x)
            tb.writer.flush()


def merged(tb: TensorBoardWriter, step: int) -> None:
    """As MeasureCallback.on_log writes it now."""
    tb.points(VALUES, step, CURVES)
    tb.writer.flush()


def main() -> None:
    logs = 300
    with tempfile.TemporaryDirectory() as folder:
        writers = {name: TensorBoardWriter(f"{folder}/{name}", {}) for name in ("per_tag", "merged")}
        for round_ in range(3):
            for name, write in (("per_tag", per_tag), ("merged", merged)):
                start = time.perf_counter()
                for i in range(logs):
                    write(writers[name], round_ * logs + i)
                print(f"round {round_}: {name:8s} {(time.perf_counter() - start) / logs * 1e3:.3f} ms per log "
                      f"({len(VALUES) + 2} tags)", flush=True)
        for tb in writers.values():
            tb.close()


if __name__ == "__main__":
    main()
