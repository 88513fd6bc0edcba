"""Static resource gates: compile a generated kernel ahead of time, on the CPU, and read its resources.

`compile_report` compiles one (arch, kernel, scale mode, KV dtype, head layout, config) for
sm90 (``GPUTarget("cuda", 90, 32)``) or gfx942 (``GPUTarget("hip", "gfx942", 64)``) and returns a
`ResourceReport`: registers, spills, scratch, shared memory / LDS, occupancy (gfx942), the matrix
instructions used, and the limit violations (`problems`). `check_launch` does the same for what
one runtime call launches (decode = split kernel, plus the merge kernel unless the merge is fused);
the tuner uses it to drop a candidate before spending GPU time on it. A prefill config with
warp_specialize=1 compiles the warp-specialized Gluon tile (kernel "prefill_ws", from a
GluonASTSource), as codegen.api runs it. `shipped_launches` and
`report` cover every shipped (module, config); `python -m codegen.static_cli` is the command line.

Figures come from the artifacts the GPU would load:
- sm90: registers, stack and local memory from ``cuobjdump --dump-resource-usage`` on the cubin
  (what ``CUfunction`` attributes report: triton's ``n_regs``; ``n_spills`` is local size / 4);
  spill bytes from triton's own ptxas log (``N bytes spill stores``); shared memory is
  ``metadata.shared`` (the dynamic shared memory triton launches with and checks against the
  device limit); wgmma vs mma.sync from the PTX.
- gfx942: the AMDGPU metadata in the amdgcn text (``.vgpr_count`` including AGPRs,
  ``.agpr_count``, ``.vgpr_spill_count``, ``; ScratchSize``, ``; Occupancy``); LDS is
  ``metadata.shared`` (the amdgcn text says 0 because triton allocates LDS dynamically).

Compiled figures are cached as JSON (never binaries) under ``$MSA_TUNE_CACHE_DIR`` or
``~/.cache/msa-tune/static``, keyed by the template-input hash and text of the generated module,
the arch, the kernel, the scale mode and fold_scales (False: the unfolded scalar baseline module,
``<variant>_unfolded``), the signature/specialization, constexprs, options, dtypes and the Triton
version. Limits are applied when a report is built, so changing a limit needs no recompile.

The package: `launch` (what is compiled: one launch, its limits and options), `compile`
(specialization, the ahead-of-time compile, figures), `cache` (the figures' cache), `shipped` (every shipped
(module, config)), `report` (reports, allowed exceptions, tables). Everything is re-exported here.
"""
from __future__ import annotations

import torch  # noqa: F401 - static.torch / static.triton name the versions in reports
import triton  # noqa: F401

from .launch import (  # noqa: F401
    CACHE_ENV,
    COMPILE_SECONDS_LIMIT,
    DECODE_TOKEN_COUNTS,
    EXCEPTIONS_PATH,
    FIGURES_VERSION,
    KV_DTYPES,
    LIMITS,
    Limits,
    Q_DTYPES,
    REPO_ROOT,
    SHIPPED_MODES,
    SHIPPED_UNFOLDED_MODES,
    StaticLaunch,
    TUNED_DIR,
    config_label,
    launches_for,
    runtime_use_pdl,
    target_of,
    validate_options,
)
from .compile import (  # noqa: F401
    CompileInputs,
    _jit_function,
    async_copies,
    compile_asm,
    compile_figures,
    compile_inputs,
)
from .cache import (  # noqa: F401
    cache_dir,
    cached_figures,
)
from .shipped import (  # noqa: F401
    shipped_launches,
    tuned_launches,
)
from .report import (  # noqa: F401
    ResourceReport,
    TABLE_HEADER,
    _exception_matches,
    check_launch,
    compile_report,
    load_exceptions,
    problems_of,
    report,
    report_launch,
    report_many,
    report_rows,
    split_problems,
    table_text,
    write_json,
)
