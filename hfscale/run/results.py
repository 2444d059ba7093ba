"""The per-run results file (results.json): written atomically, so a crash never leaves half a file.

Schema (version 1) — documented in docs/results.md:
  schema_version, status ("running" | "ok" | "fail" | "refused"), error, run_name, strategy, optim,
  started_at, finished_at, model{...}, config{...}, environment{...}, strategy_check{...},
  perf{...}, memory{...}, loss_history[{step, loss, grad_norm, lr, tokens, elapsed_s}],
  eval_history[{step, loss, perplexity, tokens, elapsed_s}]
"""

import json
from pathlib import Path

from ..files import atomic_write_text

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"


def write_results(output_dir: Path, results: dict) -> Path:
    path = Path(output_dir) / RESULTS_FILE
    atomic_write_text(path, json.dumps({"schema_version": SCHEMA_VERSION, **results}, indent=2, default=str) + "\n")
    return path


def read_results(path: Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    return json.loads(path.read_text())


class RunRecord:
    """The results of one run, kept in memory and flushed atomically (main process only) at each milestone."""

    def __init__(self, output_dir: Path, base: dict, is_main: bool):
        self.output_dir, self.is_main = Path(output_dir), is_main
        self.data = {"status": "running", "error": None, "loss_history": [], "eval_history": [], "checkpoints": [],
                     **base}

    def add_loss(self, step: int, logs: dict) -> None:
        self.data["loss_history"].append(
            {"step": step, "loss": logs.get("loss"), "grad_norm": logs.get("grad_norm"), "lr": logs.get("learning_rate"),
             "tokens": logs.get("tokens"), "elapsed_s": logs.get("elapsed_s"),
             **({"tokens_counted": logs["num_input_tokens_seen"]} if "num_input_tokens_seen" in logs else {})}
        )

    def add_eval(self, step: int, logs: dict) -> None:
        self.data["eval_history"].append(
            {"step": step, "loss": logs["eval_loss"], "perplexity": logs.get("eval_perplexity"),
             "tokens": logs.get("tokens"), "elapsed_s": logs.get("elapsed_s")})

    def note_checkpoint(self, step: int, save_s: float | None = None, size_gb: float | None = None) -> None:
        self.data["checkpoints"].append({"step": step, "save_s": save_s, "size_gb": size_gb})
        self.flush()

    def update(self, **fields) -> None:
        self.data.update(fields)

    def flush(self) -> None:
        if self.is_main:
            write_results(self.output_dir, self.data)
