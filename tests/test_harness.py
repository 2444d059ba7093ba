"""The harness the other tests stand on: a command that hangs fails its test and leaves nothing running behind; a
shared run is one run whichever test asks first; a static rendezvous port is one no other process is handed."""

import socket
import time
import uuid
from pathlib import Path

import pytest

from conftest import run, shared_run, static_rendezvous_port


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


def test_a_shared_run_asked_for_with_another_recipe_fails_whichever_asks_first():
    """Two callers of one key with different steps: the second fails, in either order, instead of reading a run made
    as the first asked (which check passes would then depend on the tests' scheduling)."""
    for first, second in ((3, 4), (4, 3)):
        key = f"harness-{uuid.uuid4().hex}"
        made = []
        assert shared_run(key, lambda folder: made.append(folder) or {"steps": first}, recipe={"steps": first}) == {
            "steps": first}
        assert shared_run(key, lambda folder: made.append(folder) or {}, recipe={"steps": first}) == {"steps": first}
        assert len(made) == 1  # made once, read twice
        with pytest.raises(AssertionError, match=f"shared run '{key}' was made as {{'steps': {first}}}"):
            shared_run(key, lambda folder: {"steps": second}, recipe={"steps": second})


def test_a_static_rendezvous_port_is_free_and_outside_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])  # the first ephemeral port
    for _ in range(20):
        port = static_rendezvous_port()
        assert 1024 <= port < low  # the kernel never hands it to a bind(0) or an outgoing connection
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # and free: the job's first agent can bind it
