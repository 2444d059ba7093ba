"""Errors a user can cause: reported as one line naming the problem, exit code 2, no traceback."""

import argparse
import difflib
import sys
from functools import wraps

EXIT_USAGE = 2


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
            print(f"hfscale: error: {err}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USAGE)

    return wrapper


class ArgumentParser(argparse.ArgumentParser):
    """argparse for hfscale's subcommands: a usage error is one line and exit 2, like every other bad input."""

    def error(self, message):
        unrecognized = "unrecognized arguments: "
        flags = [word.split("=", 1)[0] for word in message[len(unrecognized):].split() if word.startswith("-")]
        if message.startswith(unrecognized) and flags:
            raise unknown_names("flag", flags, [o for o in self._option_string_actions if o.startswith("--")],
                                f"`{self.prog} --help` lists every flag")
        raise HfscaleError(message)
