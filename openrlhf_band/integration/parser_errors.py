"""Refusals of flags as one line: argparse's `parser.error` prints the whole usage first (about 170 lines for
train_ppo_ray), so the line that says what is wrong scrolls away. The band's and the objectives' validators, and
`openrlhf-band check-args` for every parser error, print the error and where the flags are described instead,
with argparse's exit status 2."""

from __future__ import annotations

import argparse
import sys


def refuse(prog: str, message: str) -> None:
    """Print `PROG: error: MESSAGE` and a pointer to --help on stderr, and exit with status 2 (argparse's)."""
    sys.stderr.write(f"{prog}: error: {message}\n{prog}: the flags and their values: {prog} --help\n")
    raise SystemExit(2)


class OneLineErrors:
    """A parser whose `error` is `refuse`: what the validators receive in place of train_ppo_ray's parser. A
    parser whose class has its own `error` keeps it (the named methods' parser raises ValueError for Python
    callers: integration/methods.py), as does check-args', whose class error is already one line."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.prog = parser.prog
        own = isinstance(parser, OneLineErrors) or type(parser).error is not argparse.ArgumentParser.error
        self._error = parser.error if own else None

    def error(self, message: str) -> None:
        if self._error is not None:
            self._error(message)
        refuse(self.prog, message)


def one_line_error(self: argparse.ArgumentParser, message: str) -> None:
    """`argparse.ArgumentParser.error` without the usage dump (check-args patches it in while it parses)."""
    refuse(self.prog, message)
