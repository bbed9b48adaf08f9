"""How the tests and benchmarks say what went wrong: a failed check, a
benchmark that cannot go on, and lines on stderr that name the program."""

import sys


class Failure(AssertionError):
    """A check failed; the message says why."""


def fail(why):
    raise Failure(why)


def say(prog, text):
    print(f"{prog}: {text}", file=sys.stderr, flush=True)


class Failed(Exception):
    """The benchmark cannot go on; the message says why."""


def sayer(prog):
    """A function that prints "PROG: message" on stderr."""
    return lambda message: say(prog, message)
