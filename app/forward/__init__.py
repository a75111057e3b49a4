"""The engine's reference decode and prefill (extend) steps through the KV pools, their kernels, and CUDA-graph capture."""

from app.forward.batch import ContextFullError, DecodeBatch, DecodeRequests, ExtendBatch, OutOfKVSlotsError, UnknownRequestError
from app.forward.decoder import Decoder, build_decoder
from app.forward.paged_attention import paged_decode_attention, paged_decode_attention_torch
from app.forward.pool_attention import AttentionBackend, ForwardBatch, PoolAttention

__all__ = [
    "AttentionBackend", "ContextFullError", "DecodeBatch", "DecodeRequests", "Decoder", "ExtendBatch", "ForwardBatch", "OutOfKVSlotsError", "PoolAttention",
    "UnknownRequestError",
    "build_decoder", "paged_decode_attention", "paged_decode_attention_torch",
]
