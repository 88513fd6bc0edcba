"""The msa-tune commands' argument parser and checks: a bad argument is one line naming it on
stderr and exit code 2, found before any study, database or file is touched."""
from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block): `msa-tune: argument --x: ...`."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def at_least(name: str, value, low, *, what: str = "a number") -> None:
    """Raises ValueError("--name: expected <what> >= low, got value") unless value >= low."""
    if value is not None and value < low:
        raise ValueError(f"{name}: expected {what} >= {low}, got {value}")


def count_or_all(name: str, text: str) -> int | None:
    """'all' -> None; else an integer >= 1 (ValueError naming the argument otherwise)."""
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an integer >= 1 or 'all', got {text!r}") from None
    at_least(name, value, 1, what="an integer or 'all'")
    return value


def above(name: str, value, low, *, what: str = "a number") -> None:
    if value is not None and not value > low:
        raise ValueError(f"{name}: expected {what} > {low}, got {value}")


def database_url(name: str, url: str | None) -> None:
    """A URL SQLAlchemy can parse (whether the database answers is found out later, with retries)."""
    if url is None:
        return
    import sqlalchemy.exc as sx
    from sqlalchemy.engine import make_url

    try:
        make_url(url)
    except sx.ArgumentError:
        # Not echoed: a URL that does not parse may still hold a password.
        raise ValueError(f"{name}: not a database URL SQLAlchemy understands "
                         f"(e.g. sqlite:////abs/path.db, postgresql+psycopg://user@host/db)") from None
