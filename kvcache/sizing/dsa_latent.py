"""The fp8 MLA latent of DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5), as SGLang 0.5.23 stores it.

With an fp8_e4m3 KV cache, SGLang 0.5.23's DSA pool keeps each token's latent, per layer, as one
byte row (FlashMLA's fp8 layout), where a plain fp8 latent would be kv_lora_rank + rope bytes:

    row bytes = kv_lora_rank x 1            (the compressed KV ("nope") in fp8 e4m3)
              + kv_lora_rank / 128 x 4      (one float32 scale per tile of 128 nope values: amax / 448)
              + qk_rope_head_dim x 2        (the RoPE key, kept in bfloat16)

For kv_lora_rank 512 and rope 64: 512 + 16 + 128 = 656 B (576 B unpacked). SGLang's TRT-LLM and
TileLang DSA backends read the unpacked 576 B row instead; this engine follows the default layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.errors import ConfigError
from kvcache.inputs.dtypes import BFLOAT16, FLOAT8_E4M3FN, FLOAT32

DSA_FP8_TILE = 128  # nope values per float32 scale
_SCALE, _ROPE, _FP8 = FLOAT32, BFLOAT16, FLOAT8_E4M3FN


@dataclass(frozen=True, slots=True)
class DSAFp8Latent:
    """Byte layout of one token's packed latent: [nope fp8 | nope scales float32 | rope bfloat16]
    (packed and unpacked by kvcache.pools.dsa_latent_rows)."""

    kv_lora_rank: int
    qk_rope_head_dim: int

    def __post_init__(self) -> None:
        if self.kv_lora_rank % DSA_FP8_TILE:
            raise ConfigError(
                f"kv_lora_rank {self.kv_lora_rank} is not a multiple of {DSA_FP8_TILE}, the fp8 DSA latent's scale "
                "tile; use --kv-cache-dtype bfloat16 for this model"
            )

    @property
    def nope_bytes(self) -> int:
        return self.kv_lora_rank * _FP8.itemsize

    @property
    def scale_bytes(self) -> int:
        return self.kv_lora_rank // DSA_FP8_TILE * _SCALE.itemsize

    @property
    def rope_bytes(self) -> int:
        return self.qk_rope_head_dim * _ROPE.itemsize

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's latent in one layer (the formula in the module docstring)."""
        return self.nope_bytes + self.scale_bytes + self.rope_bytes
