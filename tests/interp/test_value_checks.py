"""MSA_TUNE_CHECK_VALUES=1: index values checked on request, each failure a ValueError naming the
argument and the first offending index, before any launch; unset, values are never read."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from codegen import cases, sparse_attn_decode, sparse_attn_prefill, value_checks


@pytest.fixture
def checking(monkeypatch):
    """MSA_TUNE_CHECK_VALUES set to `value` and read again (it is read once per process); afterwards
    the next call reads the restored environment."""
    def set_to(value):
        if value is None:
            monkeypatch.delenv("MSA_TUNE_CHECK_VALUES", raising=False)
        else:
            monkeypatch.setenv("MSA_TUNE_CHECK_VALUES", value)
        return value_checks.read_environment()

    yield set_to
    value_checks._enabled = None


def test_the_switch_takes_on_off_spellings_and_names_itself_otherwise(checking):
    assert checking("yes") is True and checking(" On ") is True and checking("1") is True
    assert checking("off") is False and checking("0") is False and checking("") is False and checking(None) is False
    with pytest.raises(ValueError, match="^MSA_TUNE_CHECK_VALUES: expected one of 1, on, true, yes, 0, off"):
        checking("maybe")


def _prefill(**change):
    # Request 0: a 5-token prompt; request 1: 6 new tokens after a cached prefix of 600 (606 keys).
    case = cases.prefill_case(arch="sm90", q_lens=[5, 6], prefix_lens=[0, 600], num_q_heads=8, num_kv_heads=2,
                              head_dim=32, topk=4, scale_mode="scalar")
    case.poison()
    return dict(case.args, **change)


def _decode(**change):
    case = cases.decode_case(arch="sm90", seq_lens=[300, 700], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4,
                             scale_mode="scalar", **change)
    case.poison()
    return case.args


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


LAUNCHED: list = []  # this test's launches (conftest.py's spy on the generated modules' launch())


@pytest.fixture(autouse=True)
def _spied(launches):
    global LAUNCHED
    LAUNCHED = launches


def _refused(fn, args, message):
    poisoned = args["output"].isnan().clone()
    before = len(LAUNCHED)
    with pytest.raises(ValueError) as caught:
        fn(**args, arch="sm90")
    assert str(caught.value) == message
    assert LAUNCHED[before:] == [], "nothing may be launched before the error"
    assert torch.equal(args["output"].isnan(), poisoned), "nothing may be written before the error"


def _table_with(args, row, col, page):
    table = args["block_table"].clone()
    table[row, col] = page
    return table


PREFILL = [
    (dict(seq_lens=_i32([-5, 606])), "seq_lens[0]: expected >= 0, got -5"),
    (dict(prefix_lens=_i32([0, -10])), "prefix_lens[1]: expected >= 0, got -10"),
    # The case: a prefix of 600 and 6 new tokens, but seq_lens says 300.
    (dict(seq_lens=_i32([5, 300])), "seq_lens[1]: expected prefix_lens[1] + query length (cu_seqlens_q[2] - "
                                    "cu_seqlens_q[1]) = 600 + 6 = 606, got 300"),
    (dict(cu_seqlens_q=_i32([1, 5, 11])), "cu_seqlens_q[0]: expected 0, got 1"),
    (dict(cu_seqlens_q=_i32([0, 12, 11])), "cu_seqlens_q[2]: expected >= cu_seqlens_q[1] = 12 (offsets rise), got 11"),
    (dict(cu_seqlens_q=_i32([0, 5, 10])), "cu_seqlens_q[2]: expected 11 (the token count of q), got 10"),
    (dict(max_query_len=5), "max_query_len: expected >= every query length, got 5; request 1 has 6 "
                            "(cu_seqlens_q[2] - cu_seqlens_q[1])"),
]


@pytest.mark.parametrize("change, message", PREFILL, ids=[m.split(":")[0] for _, m in PREFILL])
def test_prefill_values_are_refused_when_asked(checking, change, message):
    checking("1")
    _refused(sparse_attn_prefill, _prefill(**change), message)


def test_prefill_block_table_ids_must_be_pages_of_the_cache(checking):
    checking("1")
    args = _prefill()
    pages = args["kv_cache"].shape[0]
    _refused(sparse_attn_prefill, dict(args, block_table=_table_with(args, 1, 4, pages)),
             f"block_table[1, 4]: expected a page of kv_cache in [0, {pages}), got {pages}")
    _refused(sparse_attn_prefill, dict(args, block_table=_table_with(args, 0, 0, -1)),
             f"block_table[0, 0]: expected a page of kv_cache in [0, {pages}), got -1")
    # A row too short for its request's blocks: the kernels would read past it.
    _refused(sparse_attn_prefill, dict(args, block_table=args["block_table"][:, :4].contiguous()),
             "block_table: expected at least 5 columns for request 1 (seq_lens[1] = 606 keys), got 4")


DECODE = [
    (dict(seq_lens=_i32([-5, 700])), "seq_lens[0]: expected >= 0, got -5"),
    (dict(seq_lens=_i32([300, -2 ** 31])), "seq_lens[1]: expected >= 0, got -2147483648"),
]


@pytest.mark.parametrize("change, message", DECODE, ids=["-5", "-2**31"])
def test_decode_values_are_refused_when_asked(checking, change, message):
    checking("1")
    _refused(sparse_attn_decode, dict(_decode(), **change), message)


def test_decode_block_ids_and_varlen_offsets_are_refused_when_asked(checking):
    checking("1")
    args = _decode()
    pages = args["kv_cache"].shape[0]
    _refused(sparse_attn_decode, dict(args, block_table=_table_with(args, 1, 5, pages + 7)),
             f"block_table[1, 5]: expected a page of kv_cache in [0, {pages}), got {pages + 7}")
    varlen = _decode(varlen_q_lens=[2, 1], padded_rows=2)
    _refused(sparse_attn_decode, dict(varlen, query_start_loc=_i32([0, 2, 6])),
             "query_start_loc[2]: expected <= 5 (the row count of q), got 6")
    _refused(sparse_attn_decode, dict(varlen, query_start_loc=_i32([0, 3, 2])),
             "query_start_loc[2]: expected >= query_start_loc[1] = 3 (offsets rise), got 2")
    _refused(sparse_attn_decode, dict(varlen, token_to_req_indices=_i32([0, 0, 2, 9, 9])),
             "token_to_req_indices[2]: expected a request in [0, 2), got 2")


def test_good_values_pass_the_check_and_unused_entries_may_hold_anything(checking):
    """With the check on, valid calls run (and agree with the reference): block-table entries past
    a request's blocks, padded decode rows and their token_to_req_indices are never read."""
    from codegen import reference_decode, reference_prefill

    checking("1")
    args = _prefill()
    args["block_table"] = _table_with(args, 0, 3, -7)  # request 0 has 1 block: entry 3 is unused
    out = sparse_attn_prefill(**args, arch="sm90")
    ref = reference_prefill(**dict(args, output=None))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)
    varlen = _decode(varlen_q_lens=[2, 0], padded_rows=1)
    out = sparse_attn_decode(**varlen, arch="sm90")
    ref = reference_decode(**dict(varlen, output=None))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)


def test_unset_means_values_are_never_read(checking, monkeypatch):
    """The default path reads no value (no device sync): the checks are not even entered, and the
    issue's bad values run (the kernels stay in bounds on them)."""
    checking(None)
    entered = []
    monkeypatch.setattr(value_checks, "_host", lambda x: entered.append(x) or x)
    sparse_attn_decode(**dict(_decode(), seq_lens=_i32([-5, 700])), arch="sm90")
    assert entered == []
    assert [checking(value) for value in ("0", "", "no", "1")] == [False, False, False, True]


def test_the_environment_is_read_at_the_first_call_of_a_process(tmp_path):
    """As in a vLLM worker: the variable comes with the process's environment."""
    code = ("import torch; from codegen import cases, sparse_attn_decode\n"
            "case = cases.decode_case(arch='sm90', seq_lens=[300], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4)\n"
            "case.args['seq_lens'][0] = -5\n"
            "try:\n    sparse_attn_decode(**case.args, arch='sm90')\nexcept ValueError as e:\n    print(e)\n")
    env = dict(os.environ, TRITON_INTERPRET="1", MSA_TUNE_CHECK_VALUES="1",
               PYTHONPATH=str(pathlib.Path(value_checks.__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout == "seq_lens[0]: expected >= 0, got -5\n", proc


def test_values_are_checked_on_every_call_also_when_a_call_plan_is_reused(checking):
    """A call plan is reused for every call of its shape; values change per call, so the check runs
    before the plan lookup: the same shapes with a bad value are refused on the second call too."""
    args = _decode()
    checking(None)
    sparse_attn_decode(**args, arch="sm90")  # builds this shape's plan, values unread
    checking("1")
    sparse_attn_decode(**args, arch="sm90")  # the plan again: good values pass
    args["seq_lens"][1] = -3  # in place, as a serving loop updates its metadata
    _refused(sparse_attn_decode, args, "seq_lens[1]: expected >= 0, got -3")
