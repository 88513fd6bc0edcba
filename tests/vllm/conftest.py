# The interpreter decides when Triton is imported: set it before anything here imports Triton.
# test_witness.py runs vLLM's own Triton kernels in this process, beside msa-tune's; the other
# modules run their kernels in child processes (scenarios.py) or none at all.
import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")
