"""The reference prefill (extend) step through the pools equals dense causal attention over the same tensors.

Requests prefill a prompt, decode a few tokens, then extend again on top of what they hold
(a prefix in the pools, as a chunked prefill or a radix-cache hit leaves it); every logit
is compared with the same model over dense per-request K/V histories in order (MLA expanded
per head). Pages of 1 and 16 tokens, FP8 KV against a history rounded through FP8.
"""

from __future__ import annotations

import pytest
import torch

from app.forward import DecodeRequests, ExtendBatch
from app.forward.extend_attention import causal_extend_attention_torch
from app.forward.layers import dense_moe, routed_moe
from test_forward_decode import MODELS, paged_and_dense, pools_for

CPU = torch.device("cpu")


class DenseCausal:
    """An AttentionBackend keeping each request's K/V densely, in order: new tokens attend to all earlier ones."""

    def __init__(self, kv_dtype: torch.dtype | None) -> None:
        self.kv_dtype = kv_dtype
        self.history: dict[tuple[int, int], torch.Tensor] = {}

    def _requests(self, batch):  # type: ignore[no-untyped-def]
        if isinstance(batch, ExtendBatch):
            return batch.requests()
        lens = batch.seq_lens.tolist()
        return [(row, lens[i] - 1, i, 1) for i, row in enumerate(batch.req_pool_indices.tolist())]

    def _history(self, layer, row, prefix, new):  # type: ignore[no-untyped-def]
        stored = new if self.kv_dtype is None else new.to(self.kv_dtype).to(new.dtype)
        old = self.history.get((layer, row)) if prefix else None
        assert prefix == (0 if old is None else old.shape[0])  # the pools hold exactly the prefix
        self.history[(layer, row)] = stored if old is None else torch.cat((old, stored))
        return self.history[(layer, row)]

    def gqa(self, layer, q, k, v, batch, scale):  # type: ignore[no-untyped-def]
        out = []
        for row, prefix, start, n in self._requests(batch):
            hist = self._history(layer, row, prefix, torch.cat((k, v), -1)[start:start + n])
            keys, values = hist[..., :k.shape[-1]], hist[..., k.shape[-1]:]
            group = q.shape[1] // k.shape[1]
            keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
            scores = torch.einsum("nhd,lhd->hnl", q[start:start + n], keys) * scale
            causal = torch.ones(n, prefix + n, dtype=torch.bool).tril(prefix)
            out.append(torch.einsum("hnl,lhd->nhd", scores.masked_fill(~causal, float("-inf")).softmax(-1), values))
        return torch.cat(out)

    def mla(self, layer, q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, batch, scale):  # type: ignore[no-untyped-def]
        out, rank = [], c_kv.shape[-1]
        for row, prefix, start, n in self._requests(batch):
            hist = self._history(layer, row, prefix, torch.cat((c_kv, k_pe[:, 0]), -1)[start:start + n])
            c, pe = hist[:, :rank], hist[:, rank:]
            keys = torch.cat((torch.einsum("lr,hnr->lhn", c, w_uk), pe[:, None].expand(-1, w_uk.shape[0], -1)), -1)
            values = torch.einsum("lr,hvr->lhv", c, w_uv)
            q = torch.cat((q_nope, q_pe), -1)[start:start + n]
            scores = torch.einsum("nhd,lhd->hnl", q, keys) * scale
            causal = torch.ones(n, prefix + n, dtype=torch.bool).tril(prefix)
            out.append(torch.einsum("hnl,lhv->nhv", scores.masked_fill(~causal, float("-inf")).softmax(-1), values))
        return torch.cat(out)


def prefill_decode_extend(family: str, page: int, kv: str) -> int:
    """Prompt, decode, extend on the prefix, checked against dense at every step; returns logits rows compared."""
    model = MODELS[family]()
    paged, dense, requests = paged_and_dense(model, page, kv, DenseCausal)
    g = torch.Generator().manual_seed(2)
    rows = requests.add(3)
    compared = 0

    def check(batch) -> None:  # type: ignore[no-untyped-def]
        nonlocal compared
        got, want = paged.forward(batch), dense.forward(batch)
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
        compared += got.shape[0]

    def ids(n: int) -> torch.Tensor:
        return torch.randint(0, model.vocab_size, (n,), generator=g)

    check(requests.extend(rows, [ids(5), ids(17), ids(1)], all_logits=True))  # prompts, no prefix; every token
    for _ in range(2):
        check(requests.step(rows, ids(3)))
    check(requests.extend(rows[1:], [ids(20), ids(9)]))  # on a prefix: the last token of each
    check(requests.extend(rows, [ids(2), ids(1), ids(11)], all_logits=True))
    check(requests.extend(rows, [ids(6), ids(1), ids(1)]))  # a mixed chunk: two requests ride, one token each
    return compared


@pytest.mark.parametrize(("family", "page"), [("llama", 1), ("qwen3", 1), ("deepseek", 1), ("qwen2", 16), ("deepseek", 16)])
def test_extend_through_the_pools_equals_dense_causal_attention(family, page):
    assert prefill_decode_extend(family, page, "float32") == 23 + 6 + 2 + 14 + 3


@pytest.mark.parametrize("family", ["llama", "deepseek"])
def test_fp8_kv_extend_equals_dense_attention_over_fp8_rounded_history(family):
    assert prefill_decode_extend(family, 16, "fp8_e4m3") == 48


def test_an_extend_step_records_each_new_token_in_its_row_and_asks_for_the_last_logits():
    model = MODELS["llama"]()
    req_pool, _, allocator = pools_for(model, 16, "float32")
    requests = DecodeRequests(req_to_token_pool=req_pool, allocator=allocator, device=CPU)
    rows = requests.add(2)
    requests.extend(rows, [torch.zeros(3, dtype=torch.int64), torch.zeros(18, dtype=torch.int64)])
    batch = requests.extend(rows, [torch.zeros(14, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)])
    assert batch.prefix_lens_cpu == (3, 18) and batch.seq_lens.tolist() == [17, 20]
    assert batch.positions.tolist() == [*range(3, 17), 18, 19]
    assert batch.logit_rows.tolist() == [13, 15]
    table = req_pool.req_to_token
    assert table[rows[0], 3:17].tolist() == batch.out_cache_loc[:14].tolist()
    # paged: a request's 17 tokens fill its first page and start a second; the prefix's page is continued
    assert table[rows[0], 3] == table[rows[0], 2] + 1 and table[rows[0], 16] % 16 == 0


def test_causal_extend_attention_over_a_prefix_masks_only_later_tokens():
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(4, 4, 8, generator=g), torch.randn(10, 2, 8, generator=g), torch.randn(10, 2, 8, generator=g)
    out = causal_extend_attention_torch(q, k, v, 6, 0.5)
    for i in range(4):  # token i sees keys 0..6+i, as a decode step at that length would
        keys, values = k[:7 + i].repeat_interleave(2, 1), v[:7 + i].repeat_interleave(2, 1)
        p = (torch.einsum("hd,lhd->hl", q[i], keys) * 0.5).softmax(-1)
        torch.testing.assert_close(out[i], torch.einsum("hl,lhd->hd", p, values))


def test_routed_experts_equal_dense_experts():
    g = torch.Generator().manual_seed(4)
    w = {"m.gate.weight": torch.randn(6, 16, generator=g), "m.experts.gate_up_proj": torch.randn(6, 24, 16, generator=g),
         "m.experts.down_proj": torch.randn(6, 16, 12, generator=g)}
    x = torch.randn(37, 16, generator=g)
    kw = dict(top_k=2, renormalize=True, scaling=1.5)
    torch.testing.assert_close(routed_moe(x, w, "m.", **kw), dense_moe(x, w, "m.", **kw), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("prefix", [0, 37])
def test_cuda_extend_attention_equals_the_torch_reference(prefix):
    from app.forward.extend_attention import causal_extend_attention_cuda

    g = torch.Generator(device="cuda").manual_seed(5)
    for heads, kv_heads, dk, dv in ((32, 8, 128, 128), (16, 16, 192, 128)):
        q = torch.randn(300, heads, dk, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(prefix + 300, kv_heads, dk, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn(prefix + 300, kv_heads, dv, device="cuda", generator=g, dtype=torch.bfloat16)
        got = causal_extend_attention_cuda(q, k, v, prefix, dk ** -0.5).float()
        want = causal_extend_attention_torch(q, k, v, prefix, dk ** -0.5).float()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
