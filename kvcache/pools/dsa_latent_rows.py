"""The fp8 DSA latent's rows as tensors: pack a token's latent into the byte row kvcache.sizing.dsa_latent lays
out ([nope fp8 | nope scales float32 | rope bfloat16]) and read it back, and the pool buffer that holds them."""

from __future__ import annotations

import torch

from kvcache.sizing.dsa_latent import DSA_FP8_TILE, DSAFp8Latent

_SCALE, _ROPE, _FP8 = torch.float32, torch.bfloat16, torch.float8_e4m3fn


def pack_latent(layout: DSAFp8Latent, latent: torch.Tensor) -> torch.Tensor:
    """[n, 1, kv_lora_rank + rope] values -> [n, 1, row_bytes] uint8 rows (per-tile fp8, scale amax / 448)."""
    n = latent.shape[0]
    nope = latent[..., : layout.kv_lora_rank].float().reshape(n, -1, DSA_FP8_TILE)
    scale = nope.abs().amax(dim=-1, keepdim=True) / torch.finfo(_FP8).max
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    quantized = (nope / safe).to(_FP8).reshape(n, 1, -1).view(torch.uint8)
    scales = scale.reshape(n, 1, -1).contiguous().view(torch.uint8)
    rope = latent[..., layout.kv_lora_rank:].to(_ROPE).contiguous().view(torch.uint8)
    return torch.cat((quantized, scales, rope), dim=-1)


def unpack_latent(layout: DSAFp8Latent, rows: torch.Tensor) -> torch.Tensor:
    """[..., row_bytes] uint8 rows -> [..., kv_lora_rank + rope] float32 values (the inverse of pack_latent)."""
    lead = rows.shape[:-1]
    nope = rows[..., : layout.nope_bytes].contiguous().view(_FP8).float()
    cut = layout.nope_bytes + layout.scale_bytes
    scales = rows[..., layout.nope_bytes: cut].contiguous().view(_SCALE)
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
        self.data[loc] = pack_latent(self.layout, values)

    def read(self) -> torch.Tensor:
        """The packed rows, as SGLang 0.5.23 hands them to its fp8 DSA kernels."""
        return self.data
