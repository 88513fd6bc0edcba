"""The `auto` decision kernel (codegen.selection_kernel) compiled ahead of time for both archs."""
import pytest
import triton
from triton.compiler import ASTSource

from codegen.selection_kernel import _inflation_decision_kernel
from codegen.static.launch import target_of


@pytest.mark.parametrize("arch", ["sm90", "gfx942"])
@pytest.mark.parametrize("block_t", [2, 4, 8])
def test_decision_kernel_compiles(arch, block_t):
    ptrs = {"topk_ptr": "*i32", "cu_ptr": "*i32", "prefix_ptr": "*i32", "counters_ptr": "*i32",
            "tiled_cu_ptr": "*i32", "per_token_cu_ptr": "*i32", "inflation_ptr": "*fp32"}
    scalars = {"num_reqs": "i32", "num_tiles": "i32", "samples": "i32", "topk": "i32", "threshold": "fp32",
               "search_steps": "i32", "stride_tk_h": "i32", "stride_tk_t": "i32", "stride_tk_k": "i32"}
    constexprs = {"BLOCK_T": block_t, "TOPK_P2": 16, "PAGE": 128, "PER_PROGRAM": 8, "CU_BLOCK": 256}
    signature = {**ptrs, **scalars, **{name: "constexpr" for name in constexprs}}
    src = ASTSource(fn=_inflation_decision_kernel, signature=signature,
                    constexprs={(list(signature).index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(src, target=target_of(arch), options={"num_warps": 4})
    asm = compiled.asm["ptx" if arch == "sm90" else "amdgcn"]
    assert "atom" in asm or "global_atomic" in asm  # the arrival counter survived to the machine code
