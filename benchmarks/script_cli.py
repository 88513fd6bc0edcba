"""What the benchmark scripts share on the command line: one-line errors and their exit codes, as
msa-tune gives them (2 a bad argument, an unreadable input file included; 1 no GPU or a missing
package), so that a run without a GPU or with a typo ends in one line, not a traceback."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

BAD_ARGUMENT, NO_GPU = 2, 1


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors ("report.py: MESSAGE (--help: usage)", exit 2); --help as usual."""

    def error(self, message):
        self.refuse(f"{message} (--help: usage)")

    def refuse(self, message: str):
        """A bad argument the script found itself (a file it cannot read): one line, exit 2."""
        self.exit(BAD_ARGUMENT, f"{self.prog}: {message}\n")


def gpu_missing(prog: str) -> bool:
    """True, after one line saying so, when torch sees no GPU (the interpreter's timings mean nothing)."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"{prog}: needs a GPU (torch sees none; the interpreter's timings mean nothing)", file=sys.stderr)
    return True


def read_json(parser: Parser, path, *, keys=()) -> dict:
    """A JSON file the script was given, holding `keys`; anything else is a bad argument, said in one line."""
    try:
        doc = json.loads(pathlib.Path(path).read_text())
    except OSError as exc:
        parser.refuse(f"{path}: cannot read it ({exc.strerror or exc})")
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        parser.refuse(f"{path}: not a JSON file ({exc})")
    missing = [key for key in keys if not isinstance(doc, dict) or key not in doc]
    if missing:
        parser.refuse(f"{path}: expected a JSON object with {', '.join(repr(k) for k in keys)}, "
                      f"missing {', '.join(repr(k) for k in missing)}")
    return doc
