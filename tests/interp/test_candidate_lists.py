"""The candidate lists the H200 runner tunes over (codegen/tuning/candidates/) stay valid: each one
parses and every config passes the tuner's own candidate check for the tables it names, as
`tune.py --candidates @FILE` checks them before it touches a database."""
import pathlib

import pytest

import tune

LISTS = pathlib.Path(__file__).resolve().parents[2] / "codegen" / "tuning" / "candidates"
# File -> the tune.py arguments that select its tables (scripts/h200.sh passes the same).
KERNEL_ARGS = {
    "h200_decode.json": ["--kernels", "decode"],
    "h200_prefill_tiles.json": ["--kernels", "prefill"],
    "h200_prefill_per_token.json": ["--kernels", "prefill", "--prefill-paths", "per_token"],
    "h200_prefill_incumbents.json": ["--kernels", "prefill", "--prefill-paths", "tiled"],
    "h200_prefill_incumbents_per_token.json": ["--kernels", "prefill", "--prefill-paths", "per_token"],
    "h200_prefill_ws.json": ["--kernels", "prefill", "--prefill-paths", "tiled", "--modes",
                             "scalar:fp8,per_token_head:fp8"],
    "h200_prefill_ws_per_token.json": ["--kernels", "prefill", "--prefill-paths", "per_token", "--modes",
                                       "scalar:fp8,per_token_head:fp8"],
}


def test_every_list_is_named_here():
    assert sorted(p.name for p in LISTS.glob("*.json")) == sorted(KERNEL_ARGS)


@pytest.mark.parametrize("name", sorted(KERNEL_ARGS))
def test_the_tuner_accepts_the_list(name, capsys):
    argv = ["--arch", "sm90", *KERNEL_ARGS[name], "--candidates", f"@{LISTS / name}", "--list"]
    assert tune.main(argv) == 0, capsys.readouterr().err
