"""Which layers each pipeline stage holds, split as SGLang 0.5.23 splits them (distributed/utils.py get_pp_indices).

Contiguous and as even as possible, the remainder going to the LAST stages: DeepSeek-V3's 61 layers over 8
stages are 7,7,7,8,8,8,8,8 and Llama-3.1-8B's 32 over 3 are 10,11,11. SGLang takes a split by hand from its
SGLANG_PP_LAYER_PARTITION environment variable; here it is `--pp-layer-partition` (ServerArgs.pp_layer_partition),
refused unless it has one count a stage and they sum to the model's layers, as SGLang refuses it.
"""

from __future__ import annotations

from kvcache.errors import ConfigError


def even_stage_layer_counts(num_layers: int, pp_size: int) -> tuple[int, ...]:
    """SGLang's default split: `num_layers // pp_size` a stage, one more on each of the last `remainder` stages."""
    if num_layers < pp_size:
        raise ConfigError(f"{num_layers} layers cannot be split over --pp-size {pp_size}; use at most {num_layers}")
    base, remainder = divmod(num_layers, pp_size)
    return tuple(base + (1 if stage >= pp_size - remainder else 0) for stage in range(pp_size))


def stage_layer_counts(num_layers: int, pp_size: int, partition: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Layers a stage: the given partition once checked against the model (with one stage too, where SGLang
    ignores it: here a partition given is never dropped unread), else SGLang's even split."""
    if partition is None:
        return even_stage_layer_counts(num_layers, pp_size)
    given = f"--pp-layer-partition {','.join(map(str, partition))}"
    if len(partition) != pp_size or sum(partition) != num_layers or min(partition) < 1:
        why = (f"has {len(partition)} entries for --pp-size {pp_size}" if len(partition) != pp_size else
               f"sums to {sum(partition)} layers but the model has {num_layers}" if sum(partition) != num_layers else
               "gives a stage no layers")
        fix = (f"; give {pp_size} counts of at least 1 summing to {num_layers}, e.g. --pp-layer-partition "
               f"{','.join(map(str, even_stage_layer_counts(num_layers, pp_size)))} (SGLang's own split)"
               if num_layers >= pp_size else f"; use --pp-size {num_layers} or fewer")
        raise ConfigError(f"{given} {why}{fix}")
    return partition


def stage_layers(num_layers: int, pp_size: int, pp_rank: int, partition: tuple[int, ...] | None = None) -> range:
    """Stage `pp_rank`'s layers: [start, end) after the stages before it (SGLang's (start_layer, end_layer))."""
    counts = stage_layer_counts(num_layers, pp_size, partition)
    start = sum(counts[:pp_rank])
    return range(start, start + counts[pp_rank])
