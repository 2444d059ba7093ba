"""The harness the other tests stand on: a command that hangs fails its test and leaves nothing running behind."""

import time

import pytest

from conftest import run


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie waiting for its new parent to reap it
    except FileNotFoundError:
        return True


def test_a_command_past_its_timeout_is_killed_with_everything_it_started(tmp_path):
    # a launcher and its rank: killed alone, the launcher would leave the rank holding the output pipes
    pid_file = tmp_path / "rank.pid"
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="timed out after 1 s"):
        run(["bash", "-c", f"sleep 600 & echo $! > {pid_file}; wait"], timeout=1)
    assert time.monotonic() - started < 30
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid)
