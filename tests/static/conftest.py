# Static gates compile for real (ahead of time, no GPU): they cannot share a process with the
# interpreter suite, whose conftest sets TRITON_INTERPRET=1 before kernel modules are imported.
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

_HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    skip = pytest.mark.skip(reason="TRITON_INTERPRET=1 in this process: run tests/static in its own pytest process")
    for item in items:
        if str(item.fspath).startswith(_HERE):
            item.add_marker(skip)
