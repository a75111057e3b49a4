"""The engine's reference decode step through the KV pools, its Triton kernel, and CUDA-graph capture."""

from app.forward.batch import ContextFullError, DecodeBatch, DecodeRequests, OutOfKVSlotsError, UnknownRequestError
from app.forward.decoder import Decoder, build_decoder
from app.forward.paged_attention import paged_decode_attention, paged_decode_attention_torch
from app.forward.pool_attention import AttentionBackend, PoolAttention

__all__ = [
    "AttentionBackend", "ContextFullError", "DecodeBatch", "DecodeRequests", "Decoder", "OutOfKVSlotsError", "PoolAttention",
    "UnknownRequestError",
    "build_decoder", "paged_decode_attention", "paged_decode_attention_torch",
]
