"""hfscale/files.py: atomic writes keep the mode a plain open() gives, so a team shares results on a cluster."""

import os
import stat

from hfscale.files import atomic_write_text, current_umask


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_atomic_write_gives_the_umasks_mode_and_keeps_an_existing_files(tmp_path):
    before = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        new = tmp_path / "results.json"
        atomic_write_text(new, "{}")
        assert _mode(new) == 0o640 and new.read_text() == "{}"  # not mkstemp's 0600
        os.umask(0o002)
        atomic_write_text(tmp_path / "report.md", "x")
        assert _mode(tmp_path / "report.md") == 0o664
        new.chmod(0o600)  # a user's choice survives a rewrite
        atomic_write_text(new, '{"status": "ok"}')
        assert _mode(new) == 0o600 and new.read_text() == '{"status": "ok"}'
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    finally:
        os.umask(before)
