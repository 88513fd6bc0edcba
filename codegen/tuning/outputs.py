"""Where a msa-tune command writes or reads, checked before anything is touched: the --out folder
and an SQLite --storage's folder (checked first, created only once every check passed, and
said), and for the commands that only read, an SQLite study file that must exist. A path that
cannot be used is a bad argument (exit 2, one line naming it), found in a second, not after the
whole tune."""
from __future__ import annotations

import os
import pathlib
import tempfile


def sqlite_file(url: str) -> pathlib.Path | None:
    """The file of an SQLite URL; None for another database or an in-memory one."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return pathlib.Path(parsed.database)


def check_folder(name: str, folder: pathlib.Path) -> None:
    """`folder` takes a new file, or can be created: its nearest existing parent is a folder that
    takes one. Tried for real (a probe file, removed at once), as permission bits, a read-only
    mount and a full quota all show only then; nothing is created."""
    folder = folder.absolute()
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{name}: {existing} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".msa-tune-write-check.", dir=existing)
    except OSError as exc:
        what = "write into" if existing == folder else "create the folder"
        raise ValueError(f"{name}: cannot {what} {folder} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def create_folder(name: str, folder: pathlib.Path, say=print) -> None:
    """Creates `folder` if absent (checked before: check_folder), with a line through `say`."""
    if folder.is_dir():
        return
    try:
        folder.mkdir(parents=True)
    except OSError as exc:  # e.g. taken away since the check
        raise ValueError(f"{name}: cannot create the folder {folder} ({exc.strerror})") from None
    say(f"msa-tune: created the {name} folder {folder}")


def check_out(out_path: pathlib.Path) -> None:
    """The table this run writes: its folder must take a new file (written atomically: a temporary
    file beside it, then a rename), and an existing table must be readable for the merge."""
    check_folder("--out", out_path.parent)
    if out_path.exists() and not os.access(out_path, os.R_OK):
        raise ValueError(f"--out: cannot read {out_path}, which this run merges into")


def check_storage(url: str) -> None:
    """An SQLite study file: its folder must take the file and its journal. Other databases are
    reached (with retries) when the run opens them: unreachable is exit code 3, not a bad path."""
    path = sqlite_file(url)
    if path is None:
        return
    check_folder("--storage", path.parent)
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ValueError(f"--storage: cannot read and write the study file {path}")


def run_paths(args, arch: str, device_name: str | None) -> tuple[pathlib.Path, str]:
    """(the table a tuning run writes, its study database URL). Without --storage, an SQLite file
    named like the table: in the repository's tune_studies/ (found from any working directory), or
    under --interpret beside --out, outside the repository (a smoke study kept there would leave the
    next smoke run a finished bucket and nothing to do). device_name None (no GPU asked yet):
    <arch>__<DEVICE>, whose folders are the real ones."""
    from .. import tuned_store
    from .storage import default_url

    if device_name is None:
        stem = f"{arch if arch != 'auto' else '<arch>'}__<DEVICE>"
    else:
        stem = tuned_store.file_name(arch, device_name).removesuffix(".json")
    out_path = (args.out or tuned_store.REPO_CONFIG_DIR) / (stem + ".json")
    if args.storage:
        return out_path, args.storage
    if args.interpret:
        return out_path, f"sqlite:///{(args.out / (stem + '.db')).absolute()}"
    return out_path, default_url(stem)


def check_run_paths(args, arch: str, device_name: str | None) -> tuple[pathlib.Path, str]:
    """run_paths, checked (ValueError naming the argument); nothing is created yet."""
    out_path, storage = run_paths(args, arch, device_name)
    check_out(out_path)
    check_storage(storage)
    return out_path, storage


def create_folders(out_path: pathlib.Path, url: str, say=print) -> None:
    """The folders of the table and of an SQLite study file, once every check has passed."""
    create_folder("--out", out_path.parent, say)
    path = sqlite_file(url)
    if path is not None:
        create_folder("--storage", path.parent, say)


def check_existing_study(url: str) -> None:
    """For the commands that only read (status, export): an SQLite study file must exist. Opening
    a mistyped path would create an empty database there and report 0 studies."""
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        raise ValueError(f"--storage: no study database at {path} (status and export only read one: "
                         f"give the file msa-tune tuned into)")
