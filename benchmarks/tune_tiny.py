"""How long `hfscale tune` takes over every strategy x optimizer for the tiny model with 2 processes, and how many
trials the memory estimate and the strategy table saved. Prints the figures (target: under 5 minutes on 2 cores).

    python benchmarks/tune_tiny.py                 # micro-batches 4 and 512 (512 is pruned at 0.2 GB per process)
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="hfscale-tune-") as tmp:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "hfscale", "tune", "--model", "tiny", "--seq_len", "64",
                               "--num_processes", "2", "--per_device_train_batch_size", "4,512",
                               "--activation_checkpointing", "false", "--device_memory_gb", "0.2",
                               "--out", tmp, "--", "--max_steps", "5", "--save_strategy", "no", "--logging_steps", "1"],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
        report = json.loads((Path(tmp) / "tune.json").read_text())
        candidates = len(report["candidates"])
        print((Path(tmp) / "tune.md").read_text())
        print(f"{candidates} configurations: {report['tried']} trials run, {report['pruned_by_estimate']} pruned by the "
              f"memory estimate, {report['refused']} refused by the strategy table; winner {report.get('winner')}")
        print(f"hfscale tune wall time: {seconds:.0f} s ({seconds / 60:.1f} min; target < 5 min), "
              f"{seconds / max(report['tried'], 1):.1f} s per trial")


if __name__ == "__main__":
    main()
