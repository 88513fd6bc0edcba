"""README.md's examples run, and its links stay inside the repository.

A ```python block right after the line `<!-- tested -->` is executed as written, in a fresh
namespace, under the Triton interpreter (conftest.py sets TRITON_INTERPRET=1). Each example builds
its own inputs and asserts against the float64 reference itself, so running it is the test."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARK = "<!-- tested -->"


def readme_examples(text: str) -> list[tuple[int, str]]:
    """(line number, source) of each ```python block that follows a MARK line."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        start = i + 1
        if start >= len(lines) or lines[start].strip() != "```python":
            raise AssertionError(f"README.md:{i + 1}: {MARK} must be followed by a ```python block")
        end = next((j for j in range(start + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise AssertionError(f"README.md:{start + 1}: unclosed ```python block")
        blocks.append((start + 2, "\n".join(lines[start + 1:end]) + "\n"))
    return blocks


BLOCKS = readme_examples(README.read_text())


def test_the_decode_and_prefill_examples_are_marked():
    sources = [src for _, src in BLOCKS]
    assert any("sparse_attn_decode(" in s and "reference_decode(" in s for s in sources), "no tested decode example"
    assert any("sparse_attn_prefill(" in s and "reference_prefill(" in s for s in sources), "no tested prefill example"


@pytest.mark.parametrize("line,source", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_example_runs(line, source):
    code = compile(source, f"README.md:{line}", "exec")
    exec(code, {"__name__": "__readme__"})  # noqa: S102 - the README's own example, asserting itself


def test_links_stay_in_the_repository():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|#|mailto:", target):
            continue
        path = (ROOT / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"README.md links outside the repository: {target}"
        assert path.exists(), f"README.md links to a missing file: {target}"
