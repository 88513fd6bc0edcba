"""Leaders transfer (--full-search N, --leaders K): within one table and launch path, the first N
buckets of the grid's order search the whole space; every later bucket measures only the default
and the K fastest distinct configs of each of those N studies.

Why: a table's buckets differ only in token count, and across a table's token counts the winners
come from a handful of configs (the candidate-list re-tunes of 2026-12-01 measured 4-12 a table).
A full search per bucket re-discovers them at ~40 trials a bucket; the leaders cost K x N + 1.
The first N buckets are the ends of the token range (the grid is ordered coarse to fine), so the
leaders span both regimes.
"""
from __future__ import annotations

import optuna

from ..configs import LaunchConfig
from .records import RESULT, is_final

_COMPLETE = optuna.trial.TrialState.COMPLETE


def anchors_by_bucket(grid, full_search: int | None) -> dict:
    """{bucket: the buckets whose studies it takes its leaders from}; absent for the first
    `full_search` buckets of each (table, path) in grid order, and for every bucket when
    `full_search` is None (every bucket searches the whole space)."""
    if full_search is None:
        return {}
    seen: dict[tuple, list] = {}
    anchors = {}
    for bucket in grid:
        earlier = seen.setdefault((bucket.table_key, bucket.path), [])
        if len(earlier) >= full_search:
            anchors[bucket] = tuple(earlier[:full_search])
        earlier.append(bucket)
    return anchors


def study_leaders(trials, count: int) -> list[LaunchConfig]:
    """The `count` fastest distinct configs that passed in one study's trials."""
    ranked = sorted((t for t in trials if t.state == _COMPLETE and t.user_attrs.get("config")),
                    key=lambda t: t.value)
    leaders: dict[str, LaunchConfig] = {}
    for t in ranked:
        key = t.user_attrs.get("config_key")
        if key not in leaders:
            leaders[key] = LaunchConfig.from_dict(t.user_attrs["config"])
        if len(leaders) == count:
            break
    return list(leaders.values())


def table_leaders(anchor_names, count: int, state) -> list[LaunchConfig] | None:
    """The leaders of the anchor studies `anchor_names` (nearest first as given), or None while one
    of them is not finished (created, searching or cut short by a time budget): the bucket waits,
    so that every worker derives the same space from the same finished studies."""
    configs: dict[str, LaunchConfig] = {}
    for name in anchor_names:
        try:
            study = state.db(optuna.load_study, study_name=name, storage=state.storage)
        except KeyError:
            return None
        result = study.user_attrs.get(RESULT)
        if not is_final(result, int((result or {}).get("target", 0))):
            return None
        for config in study_leaders(state.db(study.get_trials, deepcopy=False), count):
            configs.setdefault(repr(sorted(config.to_dict().items())), config)
    return list(configs.values())
