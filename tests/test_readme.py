"""The README's main command runs (shortened) as written, so it cannot rot; the docs name only what exists and
document every key a run writes."""

import json
import re
import shlex
import sys

import pytest

from conftest import REPO, env, run


def readme_command(marker: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(rf"<!-- {marker} -->\s*```(?:bash)?\n(.*?)```", text, re.S).group(1).strip()
    return shlex.split(block.split("&&")[-1])


def test_readme_main_command_runs(tmp_path):
    cmd = readme_command("main-command")
    assert cmd[:2] == [".venv/bin/accelerate", "launch"] and "--strategy" in cmd
    cmd = [str(REPO / cmd[0]), *cmd[1:2], "--main_process_port", "0", *cmd[2:],  # 0: accelerate picks a free one
           "--max_steps", "3", "--logging_steps", "1", "--output_dir", str(tmp_path / "run")]
    proc = run(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "ok" and results["config"]["world_size"] == 2
    assert results["environment"]["cpu_threads_per_process"] == int(env()["OMP_NUM_THREADS"])  # the threads it had
    # a CPU run's ranks are processes, and the summary says so; and where the Trainer's final checkpoint went
    assert "tokens/s" in proc.stdout and "days on 2 process(es)" in proc.stdout and "GPU" not in proc.stdout.split(
        "hfscale run ")[-1].split("\n", 2)[2]
    last = results["checkpoints"][-1]
    assert f"checkpoint-{last['step']} ({last['size_gb']:.3g} GB" in proc.stdout and last["step"] == results["steps"]
    assert_collector_paused_then_scheduled(results["perf"]["gc"])
    assert_documented(results)


def assert_collector_paused_then_scheduled(facts: dict) -> None:
    """The default --gc_freq: start-up made no more young collections than a bare interpreter's own start-up (hundreds
    unpaused), and training none at all (automatic collection off; the first scheduled one is at step 50)."""
    bare = json.loads(run([sys.executable, "-c", "import gc, json; print(json.dumps([g['collections'] for g in "
                                               "gc.get_stats()]))"]).stdout)
    assert facts["gc_freq"] == 50 and facts["scheduled"] == 0
    assert facts["start_up"][0] <= bare[0] + 10 and facts["start_up"][1] <= bare[1] + 2, (facts, bare)
    assert facts["training"] == [0, 0, 0], facts


def assert_documented(results: dict) -> None:
    """Every key of a real results.json, top level and one level down, is named in docs/results.md."""
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", (REPO / "docs" / "results.md").read_text()))
    missing = [k for k in results if k not in named]
    missing += [f"{section}.{k}" for section, value in results.items() if isinstance(value, dict)
                and section not in ("final_weights", "trainer_metrics") for k in value if k not in named]
    assert not missing, f"docs/results.md does not document: {missing}"


# Paths the docs name, in backticks or as relative links: every one must exist.
_PATH = re.compile(r"`((?:hfscale|docs|benchmarks|tests|accelerate_configs|ds_configs|strategies)/[\w./-]*\w)`"
                   r"|\]\(((?!https?:)[\w./-]+\.(?:md|png|json|csv|py|yaml))\)")


def test_every_file_the_docs_name_exists():
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for code, link in _PATH.findall(doc.read_text()):
            target = REPO / code if code else doc.parent / link
            template = re.search(r"/[A-Z]+(\.|/|$)", code or "") or "*" in (code or "")  # strategies/NAME.yaml
            if code and not target.exists() and not template:
                missing.append(f"{doc.name}: {code}")
            elif link and not target.exists():
                missing.append(f"{doc.name}: ({link})")
    for module in sorted((REPO / "hfscale").rglob("*.py")):  # docstrings and messages that send the reader elsewhere
        for ref in re.findall(r"\b((?:docs|benchmarks|hfscale)/[\w/-]+\.(?:md|py))\b", module.read_text()):
            if not (REPO / ref).exists():
                missing.append(f"{module.relative_to(REPO)}: {ref}")
    assert not missing, missing


def test_ci_runs_the_readme_test_command():
    test_cmd = re.search(r"<!-- test-command -->\s*```(?:bash)?\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1).strip()
    assert test_cmd in (REPO / ".ci" / "run").read_text()


# The documented commands that plan or check without training or measuring, and how each is checked: the ones that
# would launch runs with --dry_run (every check made, nothing launched or written), the planners as written. The
# others read what an earlier command wrote (project's results file, report, import-logs, export), train, or measure
# this machine (peak, bandwidth).
CHECKED = {"launch": ["--dry_run"], "sweep": ["--dry_run"], "tune": ["--dry_run"], "parity": ["--dry_run"],
           "estimate": [], "strategies": [], "slurm": []}
# a command reading a file the user brings (my_cluster.yaml, a run file) is left out
USERS_OWN_FILES = ("--config_file", "--spec")


def reads_a_users_file(words: list[str]) -> bool:
    return any(flag in words for flag in USERS_OWN_FILES) or any(
        word.endswith((".json", ".yaml", ".yml")) and not words[i - 1].startswith("-") for i, word in enumerate(words))


def documented_commands() -> list[tuple[str, list[str]]]:
    """(doc, argv) of every `hfscale <checked command>` in the README's and docs' shell blocks, as a shell reads it
    (continued lines joined, comments and redirections dropped); `...` stands for flags left out, so it is left out."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", doc.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if not re.match(r"\s*(?:\.venv/bin/)?(?:python -m )?hfscale ", line):
                    continue
                words = shlex.split(line, comments=True)
                words = words[words.index("hfscale") + 1 if "hfscale" in words else 1:]
                words = words[:next((i for i, w in enumerate(words) if w in (">", "|", "&&", ";")), len(words))]
                if words[:1] and words[0] in CHECKED and "..." not in words and not reads_a_users_file(words):
                    found.append((doc.name, words))
    return found


def test_the_docs_show_every_checked_command():
    """The collection below is not empty by accident: each checked command is documented at least once."""
    assert {argv[0] for _, argv in documented_commands()} == set(CHECKED)


@pytest.mark.parametrize("doc,argv", documented_commands(), ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_every_documented_command_passes_its_own_checks(doc, argv, hfscale_cli, monkeypatch, tmp_path):
    """Each as a user would paste it, on a machine without a GPU (a GPU host's own count would change the default
    processes): it exits 0 and writes nothing (a dry run, or a planner printing to the terminal)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    command, *args = argv
    proc = hfscale_cli([command, *CHECKED[command], *args], cwd=tmp_path)  # before any `-- TRAINING FLAGS`
    assert proc.returncode == 0, f"{doc}: hfscale {shlex.join(argv)}\n{proc.stderr[-1500:]}"
    assert proc.stdout.strip() and not list(tmp_path.iterdir())
