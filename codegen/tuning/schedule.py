"""The run over a grid of buckets: each worker visits every bucket not yet finished, round robin,
so that several workers on one study database spread over the grid instead of queueing on one
bucket; a bucket whose rest is in other workers' hands is visited again later."""
from __future__ import annotations

import functools
import time

from ..loader import current_inputs_sha256
from .settings import BUSY, BucketResult
from .study import tune_bucket
from .transfer import anchors_by_bucket, table_leaders


def tune_grid(grid, settings, state, worker, preparer, publisher, log=print, results=None) -> list[BucketResult]:
    """Works the buckets of `grid` until each is finished (here or elsewhere) or the time budget is
    spent; returns the BucketResults of the buckets this worker finished. `results`: the list to
    append them to (the caller's, so it keeps them when StorageUnavailable stops the run)."""
    results = [] if results is None else results
    pending = list(enumerate(grid, 1))
    announced: set[int] = set()
    anchors = anchors_by_bucket(grid, settings.full_search)
    while pending:
        progressed = False
        for item in list(pending):
            i, bucket = item
            if settings.deadline and time.monotonic() > settings.deadline:
                break
            inputs = current_inputs_sha256(bucket.arch, bucket.kernel, bucket.scale_mode)  # of the loaded modules
            if i not in announced:
                announced.add(i)
                log(f"[{i}/{len(grid)}] {bucket.label}")
            triton_version = publisher.versions["triton"]
            leaders = None
            if bucket in anchors:  # anchors share the bucket's table, so its template inputs
                leaders = functools.partial(table_leaders, [a.study_name(inputs, triton_version) for a in anchors[bucket]],
                                            settings.leaders, state)
            outcome = tune_bucket(bucket, bucket.study_name(inputs, triton_version), settings, worker,
                                  preparer, log=log, state=state,
                                  publish=functools.partial(publisher.write, inputs=inputs, log=log),
                                  neighbours=functools.partial(publisher.neighbours, bucket), leaders=leaders)
            if outcome == BUSY:
                continue
            pending.remove(item)
            progressed = True
            if isinstance(outcome, BucketResult):
                results.append(outcome)
            else:
                log(f"  {bucket.label}: already finished (by another worker or an earlier run)")
        if pending and settings.deadline and time.monotonic() > settings.deadline:
            log(f"msa-tune: time budget spent with {len(pending)}/{len(grid)} buckets left; "
                f"re-run the same command to resume")
            break
        if pending and not progressed:  # every bucket left is in other workers' hands: look again soon
            time.sleep(min(1.0, settings.heartbeat_s))
    return results


def results_table(results, elapsed_s: float) -> str:
    """The buckets this worker finished: default and tuned time, speedup, trials, the wall seconds
    this worker spent on it, the config chosen."""
    lines = [f"{'bucket':40s} {'default us':>11s} {'tuned us':>10s} {'speedup':>8s} {'trials':>6s} {'failed':>6s} "
             f"{'seconds':>7s}  config"]
    for r in results:
        fmt = lambda x: f"{x:.2f}" if x is not None else "-"  # noqa: E731
        speed = f"{r.speedup:.2f}x" if r.speedup else "-"
        conf = "default" if r.is_default else ",".join(f"{k}={v}" for k, v in r.config.non_default().items())
        seconds = f"{r.elapsed_s:.1f}" if r.elapsed_s is not None else "-"
        lines.append(f"{r.bucket.label:40s} {fmt(r.default_us):>11s} {fmt(r.tuned_us):>10s} {speed:>8s} "
                     f"{r.trials:6d} {r.failures:6d} {seconds:>7s}  {conf}")
    lines.append(f"{len(results)} buckets in {elapsed_s:.0f} s")
    # Buckets that kept the default without a measurement (none passed, every trial ran out of
    # memory, the confirmation failed): each with its reason, so a run's last lines show them.
    lines += [f"unmeasured {r.bucket.label}: {r.note}" for r in results if r.tuned_us is None]
    return "\n".join(lines)
