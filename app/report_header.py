"""The first lines of every plan report, SGLang's or vLLM's: which model, engine, device and dtypes."""

from __future__ import annotations


def report_header(*, model: str, engine: str, engine_version: str, device: str, card: str | None,
                  model_dtype: str, kv_cache_dtype: str) -> list[str]:
    """Model, the engine whose rules the plan follows, the device (or the card a dry run plans for), dtypes."""
    return [
        f"model               {model}",
        f"engine              {engine} {engine_version}  (whose rules the plan follows: --engine)",
        f"device              {device}" + (f"  (plan for {card}, nothing allocated)" if card else ""),
        f"dtype / KV dtype    {model_dtype} / {kv_cache_dtype}",
    ]
