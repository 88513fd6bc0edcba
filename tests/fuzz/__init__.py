"""A randomized differential tester of the kernels (issue 35): seeded cases over the space the API
documents, each checked against an fp64 reference written here from docs/contract.md alone
(oracle.py, not codegen.reference). draw.py draws and builds the cases, check.py runs one, run.py is
the command: `python -m tests.fuzz.run --seconds 150` (GPU), `--seed N` re-runs one case alone."""
