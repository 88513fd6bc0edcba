"""Where a tuning run writes, checked before its first trial: the --out folder (created here, and
said) and an SQLite --storage's folder. A path that cannot be written is a bad argument (exit 2,
one line naming it), found in a second, not after the whole tune."""
from __future__ import annotations

import os
import pathlib
import tempfile


def _writable_folder(name: str, folder: pathlib.Path, say) -> None:
    """`folder` exists (created if absent, with a line through `say`) and takes a new file there
    (tried for real: permission bits, a read-only mount and a full quota all show)."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{name}: {folder} is not a folder")
    if not folder.exists():
        try:
            folder.mkdir(parents=True)
        except OSError as exc:
            raise ValueError(f"{name}: cannot create the folder {folder} ({exc.strerror})") from None
        say(f"msa-tune: created the {name} folder {folder}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".msa-tune-write-check.", dir=folder)
    except OSError as exc:
        raise ValueError(f"{name}: cannot write into {folder} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def check_out(out_path: pathlib.Path, say=print) -> None:
    """The table this run writes: its folder must take a new file (written atomically: a temporary
    file beside it, then a rename), and an existing table must be readable for the merge."""
    _writable_folder("--out", out_path.parent, say)
    if out_path.exists() and not os.access(out_path, os.R_OK):
        raise ValueError(f"--out: cannot read {out_path}, which this run merges into")


def check_storage(url: str, say=print) -> None:
    """An SQLite study file: its folder must take the file and its journal. Other databases are
    reached (with retries) when the run opens them: unreachable is exit code 3, not a bad path."""
    if not url.startswith("sqlite:///"):
        return
    path = pathlib.Path(url.removeprefix("sqlite:///"))
    if str(path) == ":memory:":
        return
    _writable_folder("--storage", path.parent, say)
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ValueError(f"--storage: cannot read and write the study file {path}")
