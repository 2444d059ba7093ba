"""Errors a user can cause: reported as one line naming the problem, exit code 2, no traceback."""

import argparse
import sys
from functools import wraps

EXIT_USAGE = 2


class HfscaleError(Exception):
    """A bad input or an impossible choice. The message is the whole report: say what is wrong and what is valid."""


def one_of(kind: str, value, valid) -> HfscaleError:
    """`unknown strategy 'zero4'; choose one of: ddp, ...` — the standard shape of a bad-name error."""
    return HfscaleError(f"unknown {kind} {value!r}; choose one of: {', '.join(valid)}")


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
        raise HfscaleError(message)
