"""Files a crash cannot spoil, and reading the YAML/JSON a user hands us with errors that name the file.

One mechanism for every atomic write: produce the new content under a temporary name in the same folder, then
rename it over the target, so a reader sees the old version or the new one, never half of either.
"""

import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

import yaml

from .errors import HfscaleError


def check_writable_dir(path, flag: str, _named=None) -> None:
    """A folder hfscale will create (parents too) or write into, checked before any work: refused in one line when a
    file stands in the way or the nearest existing folder cannot be written. Leaves nothing behind."""
    named = path if _named is None else _named
    if not str(path).strip():  # Path("") is ".", where os.makedirs("") raises
        raise HfscaleError(f"{flag} is empty: give a folder")
    existing = Path(path).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise HfscaleError(f"{flag} {named}: {existing} is a file, not a folder")
    try:  # os.access says yes to root everywhere; only creating something proves it (removed at once)
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".hfscale-write-check-"))
    except OSError as err:
        raise HfscaleError(f"{flag} {named} is not writable ({err.strerror})") from None


def is_run_file(args: list[str]) -> bool:
    """The training flags are one run file (`hfscale train run.yaml`: each key a flag)."""
    return len(args) == 1 and args[0].endswith((".json", ".yaml", ".yml"))


def read_run_file(path: Path):
    """A run file's contents (JSON or YAML by its suffix); a missing file is one line."""
    if not path.is_file():
        raise HfscaleError(f"{path}: file not found")
    return load_json(path) if path.suffix == ".json" else load_yaml(path)


LOCK = "_hfscale.lock"  # `_*`: the Trainer's push_to_hub leaves it out


@contextmanager
def exclusive_dir(path, flag: str, what: str = "run"):
    """Hold `path/_hfscale.lock` for the block: while it is held, a second run (or sweep, tune, parity check: `what`)
    into the same folder is refused in one line naming the holder. The kernel drops the lock of a process that dies
    however it dies, so a crashed run never keeps its folder from the run that resumes it. The lock file goes with the
    block, and the folder too (with the parents it had to make) when the block created it and left nothing in it (a
    run refused before it wrote anything). flock: NFSv4 and Lustre carry it across nodes; on a file system without
    locks nothing is refused."""
    import fcntl
    import socket
    import time

    path = Path(path)
    created = [p for p in (path, *path.parents) if not p.exists()]  # this folder, and its parents it has to make
    path.mkdir(parents=True, exist_ok=True)
    lock = path / LOCK
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 512).decode(errors="replace").strip() or "process"
            os.close(fd)
            raise HfscaleError(f"{flag} {path} is in use by a running {holder}; wait for it to end, or choose another "
                               "folder") from None
        except OSError:  # no locks on this file system (ENOLCK, EINVAL)
            pass
        try:  # the file we locked is still the one at `lock` (the holder before us removes it as it lets go)
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{what} (pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')})".encode())
        yield
    finally:
        lock.unlink(missing_ok=True)  # before the lock is let go: whoever takes it next creates a new file
        os.close(fd)
        for folder in created:  # innermost first; one still holding something stops it
            if any(folder.iterdir()):
                break
            folder.rmdir()


def check_writable_file(path, flag: str) -> None:
    """A file hfscale will write (atomically, its folder created): as check_writable_dir, for its folder."""
    if not str(path).strip():
        raise HfscaleError(f"{flag} is empty: name a file")
    if Path(path).is_dir():
        raise HfscaleError(f"{flag} {path} is a folder; name a file")
    check_writable_dir(Path(path).expanduser().absolute().parent, flag, _named=path)


def current_umask() -> int:
    """The process's file-creation mask, read without changing it (Linux's /proc), else by setting it back at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path):
    """Yield a temporary path beside `path`; write it inside the block; it replaces `path` when the block succeeds
    and is removed when it fails. The file gets the mode a plain open() would give it: the one it had, else 0666 less
    the umask (mkstemp's 0600 would hide results, reports and markers from the rest of a team on a shared cluster)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~current_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write text through atomic_path, fsynced before the rename (a power cut leaves the old file, not an empty one)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_dir(out_dir: Path, save) -> None:
    """`save(tmp_dir)` writes a whole folder, which is renamed into place. When another process got there first
    (the rename finds a non-empty folder), its copy is kept: callers use this for caches whose content is the same."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save(str(tmp))
        os.replace(tmp, out_dir)
    except OSError:
        if not out_dir.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_yaml(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise HfscaleError(f"{path}: file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise HfscaleError(f"{path}: malformed YAML: {' '.join(str(err).split())}") from None
    except UnicodeDecodeError as err:
        raise HfscaleError(f"{path}: malformed YAML: not UTF-8 text ({err.reason})") from None
    if not isinstance(data, dict):
        raise HfscaleError(f"{path}: malformed YAML: expected a mapping at the top level")
    return data


def load_json(path: Path, what: str = "JSON") -> dict:
    path = Path(path)
    if not path.is_file():
        raise HfscaleError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HfscaleError(f"{path}: malformed {what}: {err}") from None
    except UnicodeDecodeError as err:
        raise HfscaleError(f"{path}: malformed {what}: not UTF-8 text ({err.reason})") from None
    if not isinstance(data, dict):
        raise HfscaleError(f"{path}: malformed {what}: expected an object at the top level")
    return data
