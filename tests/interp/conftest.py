# The interpreter decides at import time: set it before any kernel module is imported.
import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")
