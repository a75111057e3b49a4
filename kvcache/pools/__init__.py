"""Pools: the tensors that hold request tables, per-token KV and per-request state."""

from kvcache.pools.mha import MHATokenToKVPool
from kvcache.pools.mla import MLATokenToKVPool
from kvcache.pools.req_to_token import ReqToTokenPool
from kvcache.pools.state import RecurrentStatePool
from kvcache.pools.swa import HybridSWAKVPool

__all__ = ["MHATokenToKVPool", "MLATokenToKVPool", "ReqToTokenPool", "RecurrentStatePool", "HybridSWAKVPool"]
