"""The README's main command runs (shortened) as written, so it cannot rot."""

import json
import re
import shlex

from conftest import REPO, run
from hfscale.parallel.distributed import free_port


def readme_command(marker: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(rf"<!-- {marker} -->\s*```(?:bash)?\n(.*?)```", text, re.S).group(1).strip()
    return shlex.split(block.split("&&")[-1])


def test_readme_main_command_runs(tmp_path):
    cmd = readme_command("main-command")
    assert cmd[:2] == [".venv/bin/accelerate", "launch"] and "--strategy" in cmd
    cmd = [str(REPO / cmd[0]), *cmd[1:2], "--main_process_port", str(free_port()), *cmd[2:],
           "--max_steps", "3", "--logging_steps", "1", "--output_dir", str(tmp_path / "run")]
    proc = run(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "ok" and results["config"]["world_size"] == 2
    assert "tokens/s" in proc.stdout and "days on 2 GPU(s)" in proc.stdout


def test_ci_runs_the_readme_test_command():
    test_cmd = re.search(r"<!-- test-command -->\s*```(?:bash)?\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1).strip()
    assert test_cmd in (REPO / ".ci" / "run").read_text()
