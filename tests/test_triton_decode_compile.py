"""The reference decode's Triton attention kernel compiles for an H200 (sm_90) on any machine with Triton
(it ships ptxas; torch's CUDA build brings Triton): GQA in bf16, GQA over an fp8 KV pool, and DeepSeek's
MLA latent (576 = 512 + 64 rope). The GPU run checks its numbers; this catches a kernel that no longer
compiles without one."""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles, not interprets")


def ptx_for_hopper(kv: str, group: int, dk: int, dv: int) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from app.forward import triton_decode as td

    kernel = td._paged_decode_kernel
    main, rest = td._split_head_dim(dk)
    pointers = {"Q": "*bf16", "K": f"*{kv}", "V": f"*{kv}", "ReqToToken": "*i32", "ReqPoolIndices": "*i64",
                "SeqLens": "*i64", "Out": "*bf16"}
    constants = {"GROUP": group, "BLOCK_H": max(td.MIN_DOT, triton.next_power_of_2(group)), "BLOCK_N": td.BLOCK_N,
                 "DK": main, "DPE": rest, "BLOCK_DPE": triton.next_power_of_2(rest) if rest else 0, "DV": dv,
                 "BLOCK_DV": max(td.MIN_DOT, triton.next_power_of_2(dv))}
    signature = {name: pointers.get(name, "constexpr" if name in constants else "i32") for name in kernel.arg_names}
    signature["scale"] = "fp32"
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(kernel.arg_names.index(k),): v for k, v in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


@pytest.mark.parametrize(("kv", "group", "dk", "dv"), [
    ("bf16", 4, 128, 128),  # Llama-3.1-8B: 32 query heads over 8 KV heads
    ("fp8e4nv", 4, 128, 128),  # the same over an fp8_e4m3 KV pool
    ("bf16", 16, 576, 512),  # DeepSeek MLA: one latent head, absorbed queries
])
def test_the_decode_attention_kernel_compiles_for_an_h200(kv: str, group: int, dk: int, dv: int) -> None:
    assert ".entry _paged_decode_kernel" in ptx_for_hopper(kv, group, dk, dv)
