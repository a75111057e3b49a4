"""SGLang 0.5.23's request table row width: the context plus headroom for what a decode step allocates past it.

SGLang sizes `req_to_token` rows `context_len + get_req_to_token_extra_context_len()`
(srt/mem_cache/allocation_sizing.py): 4 slots, plus the draft tokens a verify step writes; with speculative
decoding at a page size above 1, at least twice one decode step's allocation (its overlap double buffer) plus
page - 1 (an allocation rounded up to whole pages). A scheduler of that version writes up to that width, so a
narrower table would be indexed past its end at a request's last tokens.
"""

from __future__ import annotations

from kvcache.arithmetic import ceil_div
from kvcache.inputs.sizing_settings import SizingSettings

ROW_HEADROOM = 4  # SGLang 0.5.23's fixed extra columns ("temporary fix for the context length issue")


def decode_allocation_per_request(settings: SizingSettings) -> int:
    """KV slots one request may allocate in one decode step (get_alloc_len_per_decode): 1 without a draft;
    steps x branches or the verified tokens, whichever is more; for a tree (branches > 1) at a page size above 1,
    each branch's page-rounded chain."""
    if not settings.speculative:
        return 1
    steps, topk, tokens, page = (settings.speculative_num_steps, settings.speculative_eagle_topk,
                                 settings.speculative_num_draft_tokens, settings.page_size)
    if page == 1 or topk == 1:
        return max(steps * topk, tokens)
    pages_per_branch = ceil_div(page - 1 + steps, page)
    return max(pages_per_branch * page * topk, tokens)


def sglang_request_table_width(context_length: int, settings: SizingSettings) -> int:
    """Token slots per request-table row as SGLang 0.5.23 allocates them."""
    extra = ROW_HEADROOM + settings.speculative_num_draft_tokens
    if settings.speculative and settings.page_size > 1:
        extra = max(extra, 2 * decode_allocation_per_request(settings) + settings.page_size - 1)
    return context_length + extra
