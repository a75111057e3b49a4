"""The reference decode step through the pools equals dense attention over the same tensors.

Each case decodes staggered requests (one leaves part-way and a new one reuses its slots)
through the real pools and allocators, and the same model with a dense K/V history per
request (MLA expanded to per-head K and V, not absorbed); logits agree at every step.
FP8 KV is checked against a history rounded through the same FP8 format.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from app.forward import ContextFullError, UnknownRequestError, DecodeRequests, PoolAttention, build_decoder, paged_decode_attention_torch
from app.weights import parameter_specs
from kvcache.inputs.dtypes import KV_CACHE_DTYPES
from kvcache.memory.torch_dtypes import torch_dtype
from kvcache.errors import UnsupportedModelError
from kvcache.models.model_config import ModelConfig
from kvcache.pools import ReqToTokenPool
from kvcache.sizing.layer_specs import FullAttentionSpec, MLASpec
from kvcache.sizing.pool_config import request_table_slot
from kvcache.testing.pool_plans import standalone_kv_pool
from kvcache.models.presets import load_model_config
from kvcache.testing import tiny_model_config
from kvcache.models.hf_config import model_config_from_hf
from kvcache.testing.allocator_plans import paged_allocator, token_allocator

CPU = torch.device("cpu")
POOL_TOKENS = 256

TINY_MLA = {  # DeepSeek-V2-Lite's fields at toy sizes: 1 dense layer, then 4 routed experts (top 2) + 1 shared
    **load_model_config("DeepSeek-V2-Lite").hf_config, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32,
    "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "moe_intermediate_size": 32,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "vocab_size": 256,
    "max_position_embeddings": 256,
}
MODELS = {
    "llama": lambda: tiny_model_config(),
    "qwen2": lambda: tiny_model_config(architectures=["Qwen2ForCausalLM"], model_type="qwen2"),
    "qwen3": lambda: tiny_model_config(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=16),
    "mistral": lambda: tiny_model_config(architectures=["MistralForCausalLM"], model_type="mistral"),
    "deepseek": lambda: model_config_from_hf(TINY_MLA, name="tiny-mla"),
}


def random_weights(model: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights with real spread (the loader's +-1e-3 noise would make every attention uniform)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for spec in parameter_specs(model.hf_config):
        if len(spec.shape) == 1:
            out[spec.name] = 1 + 0.1 * torch.randn(spec.shape, generator=g)
        else:
            out[spec.name] = torch.randn(spec.shape, generator=g) / math.sqrt(spec.shape[-1])
    return out


class DenseHistory:
    """An AttentionBackend with each request's K/V kept densely, in order (no pool, no req_to_token)."""

    def __init__(self, kv_dtype: torch.dtype | None) -> None:
        self.kv_dtype = kv_dtype
        self.history: dict[tuple[int, int], torch.Tensor] = {}

    def _stored(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.kv_dtype is None else t.to(self.kv_dtype).to(t.dtype)

    def _append(self, layer: int, row: int, value: torch.Tensor, fresh: bool) -> torch.Tensor:
        key = (layer, row)
        old = None if fresh else self.history.get(key)
        self.history[key] = value if old is None else torch.cat((old, value))
        return self.history[key]

    def gqa(self, layer, q, k, v, batch, scale):  # type: ignore[no-untyped-def]
        outs = []
        kv = torch.cat((self._stored(k), self._stored(v)), dim=-1)
        for i, row in enumerate(batch.req_pool_indices.tolist()):
            hist = self._append(layer, row, kv[i:i + 1], int(batch.seq_lens[i]) == 1)
            keys, values = hist[..., :k.shape[-1]], hist[..., k.shape[-1]:]
            group = q.shape[1] // k.shape[1]
            keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)  # [L, H, d]
            p = (torch.einsum("hd,lhd->hl", q[i], keys) * scale).softmax(-1)
            outs.append(torch.einsum("hl,lhd->hd", p, values))
        return torch.stack(outs)

    def mla(self, layer, q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, batch, scale):  # type: ignore[no-untyped-def]
        outs = []
        latent = self._stored(torch.cat((c_kv, k_pe[:, 0]), dim=-1))
        rank = c_kv.shape[-1]
        for i, row in enumerate(batch.req_pool_indices.tolist()):
            hist = self._append(layer, row, latent[i:i + 1], int(batch.seq_lens[i]) == 1)
            c, pe = hist[:, :rank], hist[:, rank:]
            keys = torch.cat((torch.einsum("lr,hnr->lhn", c, w_uk), pe[:, None].expand(-1, w_uk.shape[0], -1)), -1)
            values = torch.einsum("lr,hvr->lhv", c, w_uv)
            q = torch.cat((q_nope[i], q_pe[i]), -1)
            p = (torch.einsum("hd,lhd->hl", q, keys) * scale).softmax(-1)
            outs.append(torch.einsum("hl,lhv->hv", p, values))
        return torch.stack(outs)


def pools_for(model: ModelConfig, page: int, kv: str) -> tuple[ReqToTokenPool, Any, Any]:
    dtype = KV_CACHE_DTYPES[kv]
    layers = range(model.num_hidden_layers)
    spec = (MLASpec(model.kv_lora_rank, model.qk_rope_head_dim, dtype) if model.kv_lora_rank else
            FullAttentionSpec(model.num_key_value_heads, model.head_dim, model.v_head_dim, dtype))
    pool: Any = standalone_kv_pool(spec, tokens=POOL_TOKENS, page_size=page, layer_ids=layers)
    allocator: Any = (token_allocator(size=POOL_TOKENS, device=CPU, check_frees=True) if page == 1 else
                      paged_allocator(size=POOL_TOKENS, page_size=page, device=CPU, check_frees=True))
    return ReqToTokenPool(slot=request_table_slot(8, 64), device=CPU), pool, allocator


def paged_and_dense(model: ModelConfig, page: int, kv: str, dense_attention: Any) -> tuple[Any, Any, DecodeRequests]:
    """One model twice on the same random weights: through the pools, and with `dense_attention` (a class given
    the FP8 dtype K/V are stored in, or None), plus the requests that drive the pools."""
    weights = random_weights(model)
    req_pool, kv_pool, allocator = pools_for(model, page, kv)
    paged = build_decoder(model_config=model, weights=weights,
                          attention=PoolAttention(token_to_kv_pool=kv_pool, req_to_token=req_pool.req_to_token))
    fp8 = torch_dtype(KV_CACHE_DTYPES[kv].element_dtype) if KV_CACHE_DTYPES[kv].stored_as_bytes else None
    dense = build_decoder(model_config=model, weights=weights, attention=dense_attention(fp8))
    return paged, dense, DecodeRequests(req_to_token_pool=req_pool, allocator=allocator, device=CPU)


def decode_and_compare(model: ModelConfig, page: int, kv: str, steps: int = 12) -> int:
    """Decode staggered requests through the pools and densely; returns how many logits rows were compared."""
    paged, dense, requests = paged_and_dense(model, page, kv, DenseHistory)
    g = torch.Generator().manual_seed(1)
    running: list[int] = []
    compared = 0
    for step in range(steps):
        if step % 3 == 0 and len(running) < 4:
            running += requests.add(1)
        if step == 10:  # the oldest request leaves; a new one reuses its slots
            requests.release(running[:1])
            running = running[1:] + requests.add(1)
        ids = torch.randint(0, model.vocab_size, (len(running),), generator=g)
        batch = requests.step(running, ids)
        got, want = paged.forward(batch), dense.forward(batch)
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
        compared += got.shape[0]
    return compared


@pytest.mark.parametrize(("family", "page"), [(f, 1) for f in sorted(MODELS)] + [("qwen2", 16), ("deepseek", 16)])
def test_decode_through_the_pools_equals_dense_attention(family, page):
    assert decode_and_compare(MODELS[family](), page, "float32", steps=20 if page > 1 else 12) > 20


@pytest.mark.parametrize("family", ["llama", "deepseek"])
def test_fp8_kv_decode_equals_dense_attention_over_fp8_rounded_history(family):
    assert decode_and_compare(MODELS[family](), 16, "fp8_e4m3", steps=20) > 20  # crosses a page


def test_the_kernel_masks_positions_past_each_request_and_reads_through_req_to_token():
    # two requests over a 6-row pool: request 1 holds rows [5, 2], request 2 holds row [4] only
    k = torch.arange(6, dtype=torch.float32).view(6, 1, 1).expand(6, 1, 2).contiguous()
    v = torch.arange(6, dtype=torch.float32).view(6, 1, 1) * 10
    table = torch.tensor([[0, 0], [5, 2], [4, 3]], dtype=torch.int32)
    q = torch.zeros(2, 1, 2)  # equal scores: the output is the mean of the visible values
    out = paged_decode_attention_torch(q, k, v, table, torch.tensor([1, 2]), torch.tensor([2, 1]), 1.0)
    assert out.flatten().tolist() == [35.0, 40.0]


def test_a_step_past_the_context_length_is_a_typed_error_and_takes_no_slot():
    allocator = token_allocator(size=POOL_TOKENS, device=CPU, check_frees=True)
    requests = DecodeRequests(req_to_token_pool=ReqToTokenPool(slot=request_table_slot(2, 2), device=CPU),
                              allocator=allocator, device=CPU)
    (row,) = requests.add(1)
    for _ in range(2):
        requests.step([row], torch.zeros(1, dtype=torch.int64))
    free = allocator.available_size()
    with pytest.raises(ContextFullError, match="reach 3 tokens, past its request-table row of 2"):
        requests.step([row], torch.zeros(1, dtype=torch.int64))
    assert allocator.available_size() == free and requests.seq_lens[row] == 2


def test_a_row_that_no_running_request_holds_is_a_typed_error_that_names_it_and_takes_no_slot():
    allocator = token_allocator(size=POOL_TOKENS, device=CPU, check_frees=True)
    requests = DecodeRequests(req_to_token_pool=ReqToTokenPool(slot=request_table_slot(4, 8), device=CPU),
                              allocator=allocator, device=CPU)
    rows = requests.add(2)
    free = allocator.available_size()
    unknown = max(rows) + 1
    with pytest.raises(UnknownRequestError, match=rf"request row {unknown} is not running; running rows: {rows[0]}, {rows[1]}"):
        requests.step([rows[0], unknown], torch.zeros(2, dtype=torch.int64))
    with pytest.raises(UnknownRequestError, match=rf"request row {unknown} is not running"):
        requests.release([rows[0], unknown])
    assert allocator.available_size() == free and sorted(requests.seq_lens) == sorted(rows)  # nothing taken or freed


def test_a_row_named_twice_is_a_typed_error_that_takes_and_frees_nothing():
    """A step naming a row twice took two slots for one token position (one never freed); a release
    naming it twice freed its slots, then failed on a bare KeyError."""
    allocator = token_allocator(size=POOL_TOKENS, device=CPU, check_frees=True)
    requests = DecodeRequests(req_to_token_pool=ReqToTokenPool(slot=request_table_slot(4, 8), device=CPU),
                              allocator=allocator, device=CPU)
    rows = requests.add(2)
    requests.step(rows, torch.zeros(2, dtype=torch.int64))
    free = allocator.available_size()
    with pytest.raises(UnknownRequestError, match=rf"request row {rows[0]} is named twice"):
        requests.step([rows[0], rows[1], rows[0]], torch.zeros(3, dtype=torch.int64))
    with pytest.raises(UnknownRequestError, match=rf"request row {rows[1]} is named twice"):
        requests.release([rows[1], rows[1]])
    assert allocator.available_size() == free and requests.seq_lens == {rows[0]: 1, rows[1]: 1}


def test_families_without_a_reference_decode_are_refused():
    with pytest.raises(UnsupportedModelError, match="supported: deepseek_v2"):
        build_decoder(model_config=load_model_config("gemma-2-9b-it"), weights={}, attention=None)


def test_the_runner_decodes_through_its_own_pools(make_engine):
    runner = make_engine(model=MODELS["llama"](), kv_cache_memory=16 << 20, max_running_requests=4).engine().target
    runner.initialize()
    requests = runner.decode_requests()
    rows = requests.add(2)
    batch = requests.step(rows, torch.tensor([3, 7]))
    logits = runner.forward_decode(batch)
    assert logits.shape == (2, 256) and logits.dtype == torch.float32 and bool(logits.isfinite().all())
    keys = runner.token_to_kv_pool.get_key_buffer(0).float()
    written = keys.abs().sum(dim=(1, 2)) > 0
    assert written.nonzero().flatten().tolist() == sorted(batch.out_cache_loc.tolist())
    assert runner.req_to_token_pool.req_to_token[rows, 0].tolist() == batch.out_cache_loc.tolist()


def test_rope_rotates_each_pair_by_position_times_its_frequency():
    from app.forward.layers import RotaryAngles, rope_inv_freq, rotary

    inv_freq = rope_inv_freq(4, 10000.0, CPU)
    torch.testing.assert_close(inv_freq, torch.tensor([1.0, 0.01]))  # 10000^(-0/4), 10000^(-2/4)
    x = torch.tensor([[[1.0, 0.0, 0.0, 2.0]]] * 2)  # pairs (x0, x2) and (x1, x3): (1, 0) and (0, 2)
    out = rotary(x, RotaryAngles.at(torch.tensor([0, 3]), inv_freq))
    assert torch.equal(out[0], x[0])  # position 0 turns nothing
    want = [math.cos(3), -2 * math.sin(0.03), math.sin(3), 2 * math.cos(0.03)]
    torch.testing.assert_close(out[1, 0], torch.tensor(want))


def test_the_decoder_computes_rope_frequencies_once_not_per_layer_per_step(mocker):
    import app.forward.decoder as decoder_module

    spy = mocker.spy(decoder_module, "rope_inv_freq")
    for family in ("llama", "deepseek"):
        assert decode_and_compare(MODELS[family](), page=1, kv="float32", steps=3) > 0  # 2 layers x 3 steps, 2 decoders
    assert spy.call_count == 4  # one per decoder built
