"""Errors a user can cause: reported as one line naming the problem, exit code 2, no traceback."""

import argparse
import difflib
import errno
import hashlib
import os
import socket
import sys
import time
from functools import wraps

EXIT_USAGE = 2
SAID_LINGER_S = 0.5  # how long the rank that said a refusal holds its claim for the ranks still on their way to it
_claims: list[socket.socket] = []  # held until the process ends


class HfscaleError(Exception):
    """A bad input or an impossible choice. The message is the whole report: say what is wrong and what is valid."""


def one_of(kind: str, value, valid) -> HfscaleError:
    """`unknown strategy 'zero4'; choose one of: ddp, ...` — the standard shape of a bad-name error."""
    return HfscaleError(f"unknown {kind} {value!r}; choose one of: {', '.join(valid)}")


def unknown_names(kind: str, names: list[str], known, listed_by: str) -> HfscaleError:
    """`unknown flag --stratgy (did you mean --strategy?); `hfscale train --help` lists every flag`: the names nothing
    reads, each with its closest known spellings (or the names it begins), and where the whole list is (too long to
    print for train's ~150)."""
    named = []
    for name in names:
        close = (difflib.get_close_matches(name, list(known), n=3, cutoff=0.8)
                 or sorted(k for k in known if k.startswith(name))[:3])
        named.append(name + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    return HfscaleError(f"unknown {kind}{'s' if len(names) > 1 else ''} {', '.join(named)}; {listed_by}")


def exit_on_user_error(fn):
    """Decorator for entry points: an HfscaleError becomes one line on stderr and exit code 2."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HfscaleError as err:
            if first_to_say(str(err)):
                print(f"hfscale: error: {err}", file=sys.stderr, flush=True)
                if _claims:
                    time.sleep(SAID_LINGER_S)  # the launcher ends this rank as soon as another one leaves
            sys.exit(EXIT_USAGE)

    return wrapper


def first_to_say(message: str, environ=os.environ) -> bool:
    """Whether this process is the first of its launch on this node to report `message`.

    Every rank of a launched job meets the same bad input at the same line, and eight identical lines per node say
    nothing the first did not. The first rank claims the message with a Linux abstract socket named after its launcher
    (the parent of every rank on the node; its restart count too) and the message: nothing is written, and the claim
    ends with the process. A rank that refuses something else, or alone, says it. Outside a multi-process launch (or
    where abstract sockets do not exist) every refusal is said."""
    if int(environ.get("LOCAL_WORLD_SIZE", "1")) < 2 or "TORCHELASTIC_RUN_ID" not in environ:
        return True
    key = f"{os.getppid()}\0{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}\0{message}"
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind("\0hfscale-refusal-" + hashlib.sha256(key.encode()).hexdigest()[:32])
    except OSError as err:
        claim.close()
        return err.errno != errno.EADDRINUSE  # said already; any other error: no abstract sockets here
    _claims.append(claim)
    return True


class ArgumentParser(argparse.ArgumentParser):
    """argparse for hfscale's subcommands: a usage error is one line and exit 2, like every other bad input."""

    def error(self, message):
        unrecognized = "unrecognized arguments: "
        flags = [word.split("=", 1)[0] for word in message[len(unrecognized):].split() if word.startswith("-")]
        if message.startswith(unrecognized) and flags:
            raise unknown_names("flag", flags, [o for o in self._option_string_actions if o.startswith("--")],
                                f"`{self.prog} --help` lists every flag")
        raise HfscaleError(message)
