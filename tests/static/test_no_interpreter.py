"""The static gates compile ahead of time: in this process the Triton interpreter is off, even when
the shell exported TRITON_INTERPRET=1 (tests/static/conftest.py unsets it; it once turned every
test here into a skip that reported success)."""
import os


def test_the_interpreter_is_off_in_this_process():
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    assert "TRITON_INTERPRET" not in os.environ
    assert not isinstance(tl.standard.max, InterpretedFunction), "Triton's own functions were defined interpreted"
