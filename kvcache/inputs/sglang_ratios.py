"""SGLang 0.5.23's default ratios, as the flags' defaults: stated once, below every stage that reads them.

The two hybrid ratios are SGLang's fallbacks (srt/arg_groups/fields/schedule.py), kept as exact
fractions; ServerArgs' flag defaults, SizingSettings' and the planner's are these, nowhere written again.
"""

from __future__ import annotations

from fractions import Fraction

SGLANG_SWA_FULL_TOKENS_RATIO = Fraction(4, 5)  # --swa-full-tokens-ratio: sliding-window pool tokens per full-pool token
SGLANG_MAMBA_FULL_MEMORY_RATIO = Fraction(9, 10)  # --mamba-full-memory-ratio: state bytes per KV byte of the budget
SGLANG_MIN_RANK_MEMORY_RATIO = 0.9  # --min-rank-memory-ratio: SGLang 0.5.23's _check_tp_memory_balance threshold
