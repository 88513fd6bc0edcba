"""The tuner behind tune.py: buckets, search spaces, isolated trial workers, Optuna studies.

Only tune.py imports this package (it needs optuna); the runtime path (codegen.api) never does,
and neither does the static gate (codegen.static), which the tuner calls to drop candidates.
Its modules, one job each, from the run down to the database (tests/interp/test_structure.py
keeps the imports free of cycles):

  schedule   the grid, round robin over the buckets not yet finished (tune_grid)
  study      one bucket's study: ask, skip what is claimed, prepare, run, tell (tune_bucket)
  transfer   leaders transfer: a table's later buckets take the fastest configs of its full searches
  confirm    pick, confirm against the default, publish under the finish claim
  seeding    a bucket's space, sampler and first trials; publish: the JSON and its neighbours
  preparer   static check + compile in a process pool, as a stream; trial: what runs in the trial worker
  gpu_lock   the run's GPU in turn: a whole trial, or a preparer building inputs
  worker     the isolated trial process; records: what a study's trials say
  state      what a worker carries across buckets; claims: the per-bucket finish claim
  storage    the study database and its retries; heartbeats: beats from a trial's start, orphans
  settings   TuneSettings, BucketResult, this worker's id; buckets, space: what is searched
  status     `msa-tune status` / `export`; table: `msa-tune table`; warmup_cli: `msa-tune warmup`
  argparsing options, one-line errors; every subcommand checks arguments, then paths, then hardware
  outputs    --out and --storage writable (or, to read, existing), checked before anything is created
  smoke      what --interpret may run: a smoke-sized grid, outside the repository
"""
