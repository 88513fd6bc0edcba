"""The tuner behind tune.py: buckets, search spaces, isolated trial workers, Optuna studies.

Only tune.py imports this package (it needs optuna); the runtime path (codegen.api) never does.
"""
