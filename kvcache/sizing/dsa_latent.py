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

import torch

from kvcache.errors import ConfigError

DSA_FP8_TILE = 128  # nope values per float32 scale
_SCALE = torch.float32
_ROPE = torch.bfloat16
_FP8 = torch.float8_e4m3fn


@dataclass(frozen=True, slots=True)
class DSAFp8Latent:
    """Byte layout of one token's packed latent: [nope fp8 | nope scales float32 | rope bfloat16]."""

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

    def pack(self, latent: torch.Tensor) -> torch.Tensor:
        """[n, 1, kv_lora_rank + rope] values -> [n, 1, row_bytes] uint8 rows (per-tile fp8, scale amax / 448)."""
        n = latent.shape[0]
        nope = latent[..., : self.kv_lora_rank].float().reshape(n, -1, DSA_FP8_TILE)
        scale = nope.abs().amax(dim=-1, keepdim=True) / torch.finfo(_FP8).max
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        quantized = (nope / safe).to(_FP8).reshape(n, 1, -1).view(torch.uint8)
        scales = scale.reshape(n, 1, -1).contiguous().view(torch.uint8)
        rope = latent[..., self.kv_lora_rank:].to(_ROPE).contiguous().view(torch.uint8)
        return torch.cat((quantized, scales, rope), dim=-1)

    def unpack(self, rows: torch.Tensor) -> torch.Tensor:
        """[..., row_bytes] uint8 rows -> [..., kv_lora_rank + rope] float32 values (the inverse of pack)."""
        lead = rows.shape[:-1]
        nope = rows[..., : self.nope_bytes].contiguous().view(_FP8).float()
        cut = self.nope_bytes + self.scale_bytes
        scales = rows[..., self.nope_bytes: cut].contiguous().view(_SCALE)
        rope = rows[..., cut:].contiguous().view(_ROPE).float()
        nope = (nope.reshape(*lead, -1, DSA_FP8_TILE) * scales.unsqueeze(-1)).reshape(*lead, -1)
        return torch.cat((nope, rope), dim=-1)


class PackedLatentTensor:
    """One layer's packed latent buffer, [rows, 1, row_bytes] uint8, with CacheTensor's interface."""

    __slots__ = ("data", "layout")
    scales = None  # the scales live inside each row

    def __init__(self, data: torch.Tensor, layout: DSAFp8Latent) -> None:
        self.data = data
        self.layout = layout

    def write(self, loc: torch.Tensor, values: torch.Tensor) -> None:
        """Store whole latents ([n, 1, kv_lora_rank + rope], model dtype) at rows `loc`, packed."""
        self.data[loc] = self.layout.pack(values)

    def read(self) -> torch.Tensor:
        """The packed rows, as SGLang 0.5.23 hands them to its fp8 DSA kernels."""
        return self.data

