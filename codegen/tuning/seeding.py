"""A bucket's Optuna study: its search space, its sampler, and the configs it starts from."""
from __future__ import annotations

import zlib

import optuna

from .. import tuned_store
from ..configs import LaunchConfig
from ..loader import buckets_by_distance
from .buckets import Bucket
from .space import bucket_space, bucket_ws_gqa, config_key, default_for, for_path, normalize, params_of


def seed(study, bucket: Bucket, space_keys: set[str], neighbours=None, seeds=()) -> None:
    """The default is always the first trial of a study (the baseline every candidate must beat);
    then `seeds` (--seed-from: another file's configs for this table, nearest bucket first), then
    the configs chosen for the nearest finished buckets of the same table; each only when in this
    study's space: a winner elsewhere is the likeliest good point, and costs one trial. A per-token
    study takes each as its twin (block_t 1).
    `neighbours` returns those configs; it is called only when the study is seeded."""
    if study.user_attrs.get("seeded"):
        return
    study.set_user_attr("seeded", True)
    queued = set()
    for config in [default_for(bucket), *seeds, *(neighbours() if neighbours else ())]:
        config = normalize(for_path(config, bucket.path, bucket.arch))
        key = config_key(config)
        if key in queued or key not in space_keys:
            continue
        queued.add(key)
        study.enqueue_trial(params_of(config, bucket.arch, bucket.kernel, bucket.topk, bucket.kv_dtype, bucket.path,
                                      bucket_ws_gqa(bucket)),
                            skip_if_exists=True)


def open_study(bucket: Bucket, study_name: str, settings, state, neighbours=None, leaders=None) -> tuple | None:
    """(study, space, exhaustive) of a bucket, created or loaded once per worker and seeded once
    per study. exhaustive: the space is no larger than the trial budget, so every point is queued
    rather than sampled. A per-token study searches the twins (block_t 1) of --candidates.
    `leaders` (transfer.py): a function returning the configs this bucket's space is limited to
    (plus the default), or None while the studies they come from are unfinished; open_study then
    returns None (the bucket waits)."""
    if study_name in state.studies:
        return state.studies[study_name]
    seeds = dict((settings.seed_configs or {}).get((bucket.table_key, bucket.path), []))  # tokens -> config
    seeds = [seeds[tokens] for tokens in buckets_by_distance(seeds, bucket.tokens)]  # nearest first, as the loader
    if bucket_ws_gqa(bucket) is None:  # e.g. a GPU's Gluon tile seeding an interpreter run: it cannot run there
        seeds = [c for c in seeds if not c.warp_specialize]
    transferred = None
    if settings.candidates is None and leaders is not None:
        transferred = leaders()
        if transferred is None:
            return None
    if transferred is not None:  # the default, the leaders and the --seed-from config nearest this bucket
        space = list({config_key(c): c for c in [default_for(bucket)]
                      + [normalize(for_path(c, bucket.path, bucket.arch)) for c in transferred + seeds[:1]]}.values())
    elif settings.candidates is not None:
        listed = settings.candidates
        if isinstance(listed, dict):  # lists by table (e.g. each table's winners before a kernel change)
            listed = listed.get(bucket.table_key, [])
        listed = [normalize(for_path(c, bucket.path, bucket.arch)) for c in listed]
        space = list({config_key(c): c for c in [default_for(bucket)] + listed}.values())
    else:
        space = bucket_space(bucket)
    exhaustive = len(space) <= settings.trials
    # One seed per table: the buckets of a table propose the same points, so their kernels (which do
    # not depend on the token count) compile once for the whole table; different tables (other
    # kernels anyway) explore different points - with one global seed, every table of the H200 run
    # sampled the same first configs.
    sampler_seed = (settings.seed + zlib.crc32(bucket.table_key.encode())) % 2**31
    sampler = (optuna.samplers.BruteForceSampler(seed=sampler_seed) if exhaustive else
               optuna.samplers.TPESampler(seed=sampler_seed, multivariate=True, group=True,
                                          n_startup_trials=max(5, settings.trials // 4)))
    study = optuna.create_study(study_name=study_name, storage=state.storage, direction="minimize", sampler=sampler,
                                load_if_exists=True)
    seed(study, bucket, {config_key(c) for c in space}, neighbours, seeds)
    if study.user_attrs.get("heartbeat_s") != settings.heartbeat_s:  # for `msa-tune status`: when a beat is stale
        study.set_user_attr("heartbeat_s", settings.heartbeat_s)
    state.studies[study_name] = (study, space, exhaustive)
    return state.studies[study_name]


def seed_configs_from(path, what: str) -> dict:
    """{(table key, path): [(bucket tokens, LaunchConfig), ...]} of a tuned-config file (--seed-from;
    `what` names it in errors).
    The per-token path takes the file's per-token sub-entries where its table has any, else its
    tiled configs (the study runs their twins), as the loader would."""
    try:
        doc = tuned_store.read_document(path)
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {path} ({exc.strerror})") from None
    except ValueError as exc:
        raise ValueError(f"{what}: {path} is not a tuned-config file ({exc})") from None
    seeds = {}
    for table, body in doc["tables"].items():
        tiled = tuned_store.path_entries(body, "tiled")
        per_token = tuned_store.path_entries(body, tuned_store.PER_TOKEN) or tiled
        for launch_path, entries in (("tiled", tiled), ("per_token", per_token)):
            seeds[(table, launch_path)] = [(tokens, LaunchConfig.from_dict(entry["config"],
                                                                    what=f"{what} {table}@{tokens}"))
                                    for tokens, entry in entries.items()]
    return seeds
