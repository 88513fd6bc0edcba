"""`msa-tune status` and `msa-tune export`: read the study database; never tune.

  msa-tune status --storage URL [--watch S]  # per bucket: trials done / running / failed / lost /
                                             # waiting, best so far, who is finishing it; workers alive
  msa-tune export --storage URL [--out DIR]  # tuned_configs/*.json rebuilt from the finished studies

The database is the source of truth of a run shared by several hosts: the worker that finishes a
bucket writes it into its own host's JSON and records it in the study, so `export` can write the
complete file on any host.
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import time

import optuna

from .argparsing import Parser
from .buckets import PATHS, parse_label
from .claims import CLAIM
from .heartbeats import OptunaIncompatible
from .records import RESULT, evaluated, failure_reason, is_final
from .storage import STUDY_DIR, StorageUnavailable, display_url, open_storage, startup_failure

_STATES = optuna.trial.TrialState


def _parser() -> Parser:
    p = Parser(prog="msa-tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("status", "per-bucket progress and the workers alive"),
                       ("export", "rebuild the tuned-config JSON from the finished studies")):
        s = sub.add_parser(name, help=text, description=text)
        s.add_argument("--storage", default=None,
                       help="the study database URL the workers use (default: the one tune_studies/*.db of "
                            "the repo, if there is exactly one)")
        s.add_argument("--db-retries", type=int, default=2, help="retries when the database is unreachable (default %(default)s)")
        s.add_argument("--db-retry-seconds", type=float, default=5.0, help="at most this long waiting for it, in seconds (default %(default)s)")
        if name == "status":
            s.add_argument("--recent", type=float, default=120,
                           help="list workers that recorded a trial within this many seconds as recently active "
                                "(default %(default)s)")
            s.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                           help="print again every SECONDS until interrupted (default: once)")
        else:
            s.add_argument("--out", type=pathlib.Path, default=None,
                           help="config folder, created (and said) if missing (default: the repo's tuned_configs/; "
                                "an --interpret run's studies: a folder outside the repository)")
            s.add_argument("--any-sources", action="store_true",
                           help="also export studies of other kernel sources than this checkout's (stale)")
    return p


def _default_storage() -> str:
    """The repo's one SQLite study file (where `msa-tune` keeps its studies by default)."""
    found = sorted(STUDY_DIR.glob("*.db"))
    if len(found) != 1:
        names = ", ".join(f.name for f in found) or "none"
        raise ValueError(f"--storage: needed unless {STUDY_DIR} holds exactly one *.db (it holds: {names})")
    return f"sqlite:///{found[0].resolve()}"


def _check(args) -> None:
    """The arguments' values (ValueError naming the argument), before the database is opened."""
    from .argparsing import above, at_least, database_url

    at_least("--db-retries", args.db_retries, 0, what="an integer")
    at_least("--db-retry-seconds", args.db_retry_seconds, 0)
    if args.command == "status":
        at_least("--recent", args.recent, 0)
        above("--watch", args.watch, 0)
    database_url("--storage", args.storage)


def _check_paths(args, url: str) -> None:
    """What exists and what can be written, before the database is opened: these commands only read
    the study database, so a missing SQLite file is a mistyped path; export's --out must take files."""
    from .outputs import check_existing_study, check_folder

    check_existing_study(url)
    if args.command == "export" and args.out is not None:
        check_folder("--out", args.out)


def main(argv: list[str]) -> int:
    """`msa-tune status|export`: arguments, then paths, then the database (exit codes: tune.py's)."""
    args, code = _parser().parse_or_exit_code(argv)
    if args is None:
        return code
    from .storage import DbRetry

    try:
        _check(args)
        url = args.storage or _default_storage()
        _check_paths(args, url)
        storage = open_storage(url, retry=DbRetry(url, args.db_retries, args.db_retry_seconds))
    except (StorageUnavailable, OptunaIncompatible, ValueError) as exc:
        return startup_failure(exc)
    try:
        if args.command == "export":
            return 0 if export(storage, args.out, any_sources=args.any_sources) else 1
        while True:
            print(render(summarize(storage, recent_s=args.recent), url), flush=True)
            if not args.watch:
                return 0
            time.sleep(args.watch)
            print()
    except ValueError as exc:  # export: a finished study that may not go where --out points
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 2
    except StorageUnavailable as exc:
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:  # export: e.g. --out filled up mid-write (each file is written atomically)
        if isinstance(exc, BrokenPipeError):
            raise  # the reader left: tune.main ends quietly
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def parse_study_name(name: str) -> dict:
    """Bucket.study_name() back into its parts (label = table key @ tokens, with ":per_token" for
    the per-token path: the label is everything between the device and ctx<prefix>)."""
    parts = name.split(":")
    if len(parts) >= 7 and parts[-1].startswith("triton"):
        return dict(arch=parts[0], device=parts[1], label=":".join(parts[2:-4]), inputs=parts[-2],
                    triton=parts[-1].removeprefix("triton"))
    return dict(arch="?", device="?", label=name, inputs="?", triton="?")


def _heartbeat_ages(storage) -> dict[int, float]:
    """Seconds since each trial's last heartbeat, on the database's clock (as Optuna judges them)."""
    import sqlalchemy as sa

    t = sa.table("trial_heartbeats", sa.column("trial_id"), sa.column("heartbeat", sa.DateTime))

    def read():
        with storage.engine.connect() as conn:
            now = conn.execute(sa.select(sa.func.now())).scalar()
            rows = conn.execute(sa.select(t.c.trial_id, t.c.heartbeat)).all()
        if isinstance(now, str):  # SQLite without a type hint on now()
            now = datetime.datetime.fromisoformat(now)
        now = now.replace(tzinfo=None)
        return {tid: (now - beat.replace(tzinfo=None)).total_seconds() for tid, beat in rows if beat is not None}

    return storage.db_retry.call(read)


def _order(study_name: str) -> tuple:
    """Sort key of a study: its run (arch, device, Triton, sources), table, tokens as a number, then
    path (a bucket's per-token study right after its tiled one)."""
    info = parse_study_name(study_name)
    table, tokens, path = parse_label(info["label"])
    order = PATHS.index(path) if path in PATHS else len(PATHS)
    return (info["arch"], info["device"], info["triton"], info["inputs"], table, tokens, order, study_name)


def _failures(failed, limit: int = 3) -> list[str]:
    """The distinct reasons of a bucket's failed trials, most frequent first: "N x kind: message"."""
    counts: dict[str, int] = {}
    for t in failed:
        reason = failure_reason(t)
        counts[reason] = counts.get(reason, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"{n} x {reason}" for reason, n in ranked[:limit]]
    if len(ranked) > limit:
        lines.append(f"... and {len(ranked) - limit} other reasons")
    return lines


def summarize(storage, recent_s: float = 120) -> dict:
    """Everything `status` shows, as data: {"studies": [...], "alive": {tuner: what}, "stale": {...}}."""
    ages = _heartbeat_ages(storage)
    now = datetime.datetime.now()
    studies, alive, stale, recent = [], {}, {}, {}
    for frozen in sorted(storage.get_all_studies(), key=lambda s: _order(s.study_name)):
        attrs = frozen.user_attrs
        grace = 3 * int(attrs.get("heartbeat_s", 10))
        trials = storage.get_all_trials(frozen._study_id, deepcopy=False)
        info = parse_study_name(frozen.study_name)
        done = evaluated(trials)
        ok = [t for t in done if t.state == _STATES.COMPLETE]
        best = min(ok, key=lambda t: t.value, default=None)
        running = [t for t in trials if t.state == _STATES.RUNNING and not t.user_attrs.get("duplicate")]
        row = dict(info, study=frozen.study_name, done=len(done), failed=len(done) - len(ok),
                   running=len(running), waiting=sum(t.state == _STATES.WAITING for t in trials),
                   lost=sum(t.state == _STATES.FAIL and "failure" not in t.user_attrs
                            and not t.user_attrs.get("duplicate") for t in trials),
                   best_us=best.value if best else None, best_config=best.user_attrs.get("config") if best else None,
                   failures=_failures([t for t in done if t.state == _STATES.FAIL]),
                   result=attrs.get(RESULT), claim=attrs.get(CLAIM))
        studies.append(row)
        for t in running:
            tuner = t.user_attrs.get("tuner", "?")
            age = ages.get(t._trial_id)
            if age is not None and age > grace:
                stale[tuner] = f"{info['label']} trial #{t.number}: no heartbeat for {age:.0f} s"
            else:
                alive[tuner] = f"running {info['label']} trial #{t.number}"
        claim = row["claim"]
        if isinstance(claim, dict) and not claim.get("done") and not is_final(row["result"], 0):
            alive.setdefault(claim.get("tuner", "?"), f"finishing {info['label']}")
        for t in done:  # datetime_complete is the recording host's clock: a hint, not a verdict
            if t.datetime_complete and (now - t.datetime_complete).total_seconds() <= recent_s:
                recent[t.user_attrs.get("tuner", "?")] = info["label"]
    for tuner in alive:
        stale.pop(tuner, None)
    recent = {t: b for t, b in recent.items() if t not in alive and t not in stale}
    return dict(studies=studies, alive=alive, stale=stale, recent=recent, recent_s=recent_s)


def _short(config: dict | None) -> str:
    if not config:
        return "-"
    from ..configs import non_default_fields

    return ",".join(f"{k}={v}" for k, v in non_default_fields(config).items()) or "(base values)"


def _state(row) -> str:
    result, claim = row["result"], row["claim"]
    if result:
        what = "default" if result.get("is_default") else (
            f"tuned {result['default_us'] / result['tuned_us']:.2f}x" if result.get("tuned_us") else "tuned")
        return f"finished: {what}" + ("" if result.get("complete") else " (cut short)")
    if isinstance(claim, dict) and not claim.get("done"):
        return f"confirming ({claim.get('tuner', '?')})"
    return "searching" if row["running"] or row["waiting"] or not row["done"] else "searched"


def render(summary: dict, url: str) -> str:
    studies = summary["studies"]
    lines = [f"msa-tune status: {display_url(url)}: {len(studies)} bucket studies, "
             f"{sum(r['result'] is not None for r in studies)} finished"]
    group = None
    width = max([34] + [len(r["label"]) for r in studies])  # per-token labels run longer
    header = (f"  {'bucket':{width}s} {'done':>5s} {'run':>4s} {'fail':>5s} {'lost':>5s} {'wait':>5s} {'best us':>9s}  "
              f"{'state':32s} config (chosen, or best so far)")
    for row in studies:
        key = (row["arch"], row["device"], row["triton"], row["inputs"])
        if key != group:
            group = key
            lines.append(f"{row['arch']} {row['device']}, triton {row['triton']}, kernel sources {row['inputs']}")
            lines.append(header)
        best = f"{row['best_us']:.2f}" if row["best_us"] is not None else "-"
        result = row["result"] or {}
        config = ("default" if result.get("is_default") else _short(result.get("config"))) if result else \
            _short(row["best_config"])
        lines.append(f"  {row['label']:{width}s} {row['done']:5d} {row['running']:4d} {row['failed']:5d} {row['lost']:5d} "
                     f"{row['waiting']:5d} {best:>9s}  {_state(row):32s} {config}")
        lines += [f"      failed: {reason}" for reason in row.get("failures", ())]
    lines.append("(done: configs measured, failed: of those, the ones that failed; lost: trials whose worker died "
                 "or that ran out of GPU memory, retried; wait: queued)")
    alive = summary["alive"]
    lines.append(f"workers alive ({len(alive)}; a trial with a fresh heartbeat, or finishing a bucket): "
                 + ("; ".join(f"{t} ({w})" for t, w in sorted(alive.items())) or "none"))
    if summary["recent"]:
        lines.append(f"recently active, no trial now ({len(summary['recent'])}): "
                     + "; ".join(f"{t} (last recorded {b})" for t, b in sorted(summary["recent"].items()))
                     + f"  [recorded a trial in the last {summary['recent_s']:.0f} s]")
    if summary["stale"]:
        lines.append(f"presumed dead ({len(summary['stale'])}): "
                     + "; ".join(f"{t} ({w}; failed and retried when a worker next visits the bucket)"
                                 for t, w in sorted(summary["stale"].items())))
    return "\n".join(lines)


def export(storage, out_dir: pathlib.Path | None = None, any_sources: bool = False, log=print) -> list[pathlib.Path]:
    """Writes every finished bucket recorded in the database into <out>/<arch>__<DEVICE>.json.
    Where several studies cover one bucket (other Triton, a rerun), the latest finished wins; studies
    of other kernel sources than this checkout's are skipped unless `any_sources`."""
    from .. import tuned_store
    from ..loader import current_inputs_sha256

    out_dir = out_dir or tuned_store.REPO_CONFIG_DIR
    chosen: dict[tuple, dict] = {}
    skipped = 0
    current: dict[tuple, str] = {}
    for frozen in storage.get_all_studies():
        result = frozen.user_attrs.get(RESULT)
        if not isinstance(result, dict) or "entry" not in result or "provenance" not in result:
            continue
        kernel, mode, *_ = tuned_store.parse_table_key(result["table_key"])
        key = (result["arch"], kernel, mode)
        if key not in current:
            try:
                current[key] = current_inputs_sha256(*key)
            except Exception:  # noqa: BLE001 - an arch this checkout does not generate
                current[key] = None
        if not any_sources and result["provenance"].get("inputs_sha256") != current[key]:
            skipped += 1
            continue
        path = result.get("path", "tiled")  # results recorded before the per-token studies: tiled
        slot = (tuned_store.file_name(result["arch"], result["device_name"]), result["table_key"],
                str(result["tokens"]), path)
        if slot not in chosen or result.get("finished_at", "") >= chosen[slot].get("finished_at", ""):
            chosen[slot] = result
    _check_interpreter_out(chosen.values(), out_dir)
    if chosen:
        from .outputs import create_folder

        create_folder("--out", out_dir, log)
    written: dict[pathlib.Path, int] = {}
    for (name, table, tokens, bucket_path), result in sorted(chosen.items(),
                                                             key=lambda kv: kv[1].get("finished_at", "")):
        path = out_dir / name
        tuned_store.update_table(path, result["arch"], result["device_name"], table, result["provenance"],
                                 {tokens: tuned_store.path_entry(bucket_path, result["entry"])})
        written[path] = written.get(path, 0) + 1
    for path, n in written.items():
        tuned_store.read_document(path)  # validates
        log(f"msa-tune: exported {n} buckets to {path}")
    if skipped:
        log(f"msa-tune: skipped {skipped} finished studies of other kernel sources (--any-sources exports them)")
    if not written:
        log("msa-tune: no finished bucket in the database (a study finished before results were recorded in it "
            "needs one more `msa-tune` run with the same arguments)")
    return list(written)


def _check_interpreter_out(results, out_dir: pathlib.Path) -> None:
    """Studies of an --interpret run export outside the repository, as that run writes: a CPU table in
    tuned_configs/ is what the runtime would load for the CPU (ValueError naming --out)."""
    from .. import tuned_store
    from .smoke import DEVICE, inside

    repo = tuned_store.REPO_CONFIG_DIR.parent
    cpu = sum(r["device_name"] == DEVICE for r in results)
    if cpu and inside(out_dir, repo):
        raise ValueError(f"--out: {cpu} finished studies ran under the Triton interpreter ({DEVICE}); their table "
                         f"goes to a folder outside the repository {repo}, got {out_dir} (export --out DIR)")
