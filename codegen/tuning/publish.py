"""Where finished buckets go: the run's tuned-config JSON, with the provenance of the run; what that
file already holds for neighbouring buckets (the seeds of a new study); and the unmeasured
defaults file of `msa-tune --write-defaults`."""
from __future__ import annotations

import dataclasses
import datetime
import pathlib

from .. import tuned_store
from ..configs import LaunchConfig
from ..loader import buckets_by_distance, current_inputs_sha256, prefill_parts
from .space import default_for


def per_token_survives(arch: str, kernel: str, scale_mode: str):
    """update_table's `unchanged_paths` for a table of this kernel: a prefill table keeps its per-token
    entries when the inputs of its Triton-language module (the only one the per-token walk launches) are
    those it was measured with and only the other modules' moved (update_table checks the GPU and
    Triton); a decode table keeps nothing."""
    if kernel != "prefill":
        return None
    index = prefill_parts(arch, scale_mode).index("prefill")

    def unchanged(old_inputs: str, new_inputs: str) -> tuple[str, ...]:
        old_parts, new_parts = old_inputs.split("+"), new_inputs.split("+")
        same = len(old_parts) == len(new_parts) and old_parts[index] == new_parts[index]
        return (tuned_store.PER_TOKEN,) if same else ()

    return unchanged


def provenance(*, measured: bool, gpu_name: str, arch: str, inputs: str, versions: dict, argv, **extra) -> dict:
    """A table's provenance (docs/tuned-configs.md): where, with what and by which command."""
    return dict(measured=measured, gpu_name=gpu_name, arch=arch, inputs_sha256=inputs,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command="msa-tune " + " ".join(argv), **versions, **extra)


@dataclasses.dataclass
class Publisher:
    """Writes the finished buckets of one run into `out_path` (atomic, merged under a lock)."""

    out_path: pathlib.Path
    arch: str
    device_name: str
    versions: dict  # triton, torch, cuda, hip
    argv: list
    interpret: bool
    workload: dict  # decode_context, prefill_prefix, pattern, head_dim, topk

    def write(self, result, *, inputs: str, log=print) -> dict:
        """Writes a finished bucket into the JSON; returns what was written, which the study keeps
        as its result (`msa-tune export` rebuilds the JSON from those)."""
        prov = provenance(measured=True, gpu_name=self.device_name, arch=self.arch, inputs=inputs,
                          versions=self.versions, argv=self.argv,
                          timing=("Triton interpreter wall clock: meaningless as a speed" if self.interpret else
                                  "CUDA graph of up to 20 calls on rotating inputs, replay time / calls, median"),
                          workload=dict(self.workload))
        bucket = result.bucket
        entry = dict(config=result.config.to_dict(), is_default=result.is_default, default_us=result.default_us,
                     tuned_us=result.tuned_us, trials=result.trials, failures=result.failures,
                     failure_kinds=result.failure_kinds, note=result.note, study=result.study_name)
        if bucket.per_token:  # its selections and prefix differ from the table's workload: recorded with it
            entry["workload"] = dict(pattern=bucket.pattern, prefill_prefix=bucket.context)
        tuned_store.update_table(self.out_path, self.arch, self.device_name, bucket.table_key, prov,
                                 {str(bucket.tokens): tuned_store.path_entry(bucket.path, entry)},
                                 unchanged_paths=per_token_survives(self.arch, bucket.kernel, bucket.scale_mode))
        log(f"msa-tune: wrote {bucket.label} to {self.out_path}")
        return dict(arch=self.arch, device_name=self.device_name, table_key=bucket.table_key, tokens=bucket.tokens,
                    path=bucket.path, entry=entry, provenance=prov)

    def neighbours(self, bucket, count: int = 2) -> list:
        """Configs chosen (not the default) for the `count` buckets of this table and path nearest to
        `bucket` in log2 tokens, from the file this run writes; none when it does not exist or cannot
        be read. A per-token bucket first takes its own bucket's tiled config (the study makes it its
        twin): the per-token config the loader served before this study."""
        try:
            table = tuned_store.read_document(self.out_path)["tables"].get(bucket.table_key)
        except (OSError, ValueError):
            return []
        if table is None:
            return []
        chosen = {tokens: entry for tokens, entry in tuned_store.path_entries(table, bucket.path).items()
                  if tokens != bucket.tokens and not entry.get("is_default")}
        nearest = [chosen[tokens] for tokens in buckets_by_distance(chosen, bucket.tokens)[:count]]
        tiled = tuned_store.path_entries(table, "tiled").get(bucket.tokens)
        if bucket.per_token and tiled and not tiled.get("is_default"):
            nearest.insert(0, tiled)
        configs = []
        for entry in nearest:
            try:
                configs.append(LaunchConfig.from_dict(entry["config"]))
            except (TypeError, ValueError):
                continue
        return configs


def published(tables: dict, bucket, *, device_name: str, triton_version: str, workload: dict) -> bool:
    """Whether `tables` (a tuned-config document's) hold `bucket` as a finished measurement this run would
    repeat: its table from the source this run's writes would merge with (tuned_store.same_source: this
    GPU, the kernels now loaded, this Triton and workload), and the bucket's entry for its path timed. An
    entry whose trials ran out of GPU memory is not finished (that said nothing about the configs), nor
    one published with the default because every trial failed (no timing)."""
    table = tables.get(bucket.table_key)
    inputs = current_inputs_sha256(bucket.arch, bucket.kernel, bucket.scale_mode)
    run = dict(measured=True, gpu_name=device_name, triton=triton_version, inputs_sha256=inputs, workload=workload)
    if table is None or not tuned_store.same_source(table["provenance"], run):
        return False
    entry = tuned_store.path_entries(table, bucket.path).get(bucket.tokens)
    if entry is None or entry.get("tuned_us") is None or entry.get("failure_kinds", {}).get("out_of_memory"):
        return False
    if bucket.per_token:  # its own selections and prefix (Publisher.write records them)
        return entry.get("workload") == dict(pattern=bucket.pattern, prefill_prefix=bucket.context)
    return True


def unpublished(grid: list, out_path: pathlib.Path, device_name: str, triton_version: str, workload: dict) -> list:
    """--skip-published: the buckets of `grid` the file at out_path does not hold finished (published),
    said in one line; an unreadable file is a ValueError naming the option."""
    try:
        tables = tuned_store.read_document(out_path)["tables"] if out_path.exists() else {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"--skip-published: cannot read {out_path} ({exc})") from None
    left = [b for b in grid if not published(tables, b, device_name=device_name, triton_version=triton_version,
                                               workload=workload)]
    print(f"msa-tune: --skip-published: {len(grid) - len(left)} of {len(grid)} buckets already in {out_path}, "
          f"measured on this GPU with these kernels; {len(left)} left")
    return left


def write_defaults(out_path: pathlib.Path, arch: str, device_name: str, grid, versions: dict, argv) -> None:
    """An unmeasured tuned-config file: every table and bucket of `grid` holds the arch default, and
    its provenance says so (the loader then reports is_tuned=False)."""
    doc = tuned_store.new_document(arch, device_name)
    for b in grid:
        table = doc["tables"].setdefault(b.table_key, {"provenance": provenance(
            measured=False, gpu_name=device_name, arch=arch,
            inputs=current_inputs_sha256(arch, b.kernel, b.scale_mode), versions=versions, argv=argv,
            note="not measured: no such GPU was available; every bucket holds the arch default"), "buckets": {}})
        entry = dict(config=default_for(b).to_dict(), is_default=True, default_us=None, tuned_us=None, trials=0,
                     failures=0)
        tokens = str(b.tokens)
        table["buckets"][tokens] = tuned_store.merge_bucket(table["buckets"].get(tokens),
                                                             tuned_store.path_entry(b.path, entry))
    tuned_store.write_document(out_path, doc)
