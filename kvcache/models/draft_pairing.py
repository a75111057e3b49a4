"""Whether a draft model can speculate for a target: refuse pairs whose shapes or tokens cannot meet.

What must agree, as SGLang 0.5.23's draft models use the target (`models/llama_eagle.py`,
`models/llama_eagle3.py`, the STANDALONE worker):

- EAGLE / EAGLE-3 heads (an `...Eagle3` architecture for EAGLE3, another draft head for
  EAGLE) read the target's hidden states and share its token embedding:
  the head's input hidden size (EAGLE-3: `target_hidden_size` when given, else its
  `hidden_size`) must be the target's `hidden_size`, and its `vocab_size` the target's.
  An EAGLE-3 head may predict over a smaller `draft_vocab_size`, mapped into the target's
  vocabulary (`d2t`), so that may not exceed the target's `vocab_size`.
- STANDALONE drafts are whole models proposing token ids the target verifies: they must
  share the tokenizer. A config does not name its tokenizer, so the family is judged from
  what it does give: the same `bos_token_id` when both give one, and vocabularies that
  differ by at most the padding a checkpoint adds (`VOCAB_PADDING_SLACK` entries; Qwen2.5's
  0.5B and 7B give 151,936 and 152,064 for one tokenizer).
- NEXTN drafts are the target's own layers and always pair.
"""

from __future__ import annotations

from kvcache.errors import ConfigError
from kvcache.models.model_config import ModelConfig
from kvcache.models.presets import load_model_config

VOCAB_PADDING_SLACK = 1024
EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3"})


def _int_field(model: ModelConfig, key: str) -> int | None:
    value = model.hf_config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _refuse(target: ModelConfig, draft: ModelConfig, what: str, target_value: object, draft_value: object,
            fix: str) -> ConfigError:
    return ConfigError(
        f"draft {draft.name} cannot pair with target {target.name}: {what} is {draft_value} in the draft "
        f"but {target_value} in the target; {fix}"
    )


def _eagle_problems(target: ModelConfig, draft: ModelConfig, algorithm: str) -> ConfigError | None:
    if not draft.is_draft_head:
        return ConfigError(
            f"--speculative-algorithm {algorithm} needs an EAGLE head as --speculative-draft-model, but {draft.name} "
            f"is a whole model ({draft.architecture}); use --speculative-algorithm STANDALONE for it"
        )
    is_eagle3_head = "Eagle3" in draft.architecture
    if is_eagle3_head != (algorithm == "EAGLE3"):
        right = "EAGLE3" if is_eagle3_head else "EAGLE"
        return ConfigError(
            f"{draft.name} ({draft.architecture}) is an {right} head, not an {algorithm} one; "
            f"use --speculative-algorithm {right}"
        )
    hidden_in = (_int_field(draft, "target_hidden_size") or draft.hidden_size) if algorithm == "EAGLE3" else draft.hidden_size
    fix = "use a head trained for this target"
    if hidden_in != target.hidden_size:
        what = "the hidden size the head reads (target_hidden_size)" if algorithm == "EAGLE3" else "hidden_size"
        return _refuse(target, draft, what, target.hidden_size, hidden_in, fix)
    if draft.vocab_size != target.vocab_size:
        return _refuse(target, draft, "vocab_size (the shared embedding)", target.vocab_size, draft.vocab_size, fix)
    draft_vocab = _int_field(draft, "draft_vocab_size")
    if algorithm == "EAGLE3" and draft_vocab is not None and draft_vocab > target.vocab_size:
        return _refuse(target, draft, "draft_vocab_size (mapped into the target's vocabulary)",
                       f"vocab_size {target.vocab_size}", draft_vocab, fix)
    return None


def _standalone_problems(target: ModelConfig, draft: ModelConfig) -> ConfigError | None:
    fix = "use a draft that shares the target's tokenizer (a smaller model of the same family)"
    bos_target, bos_draft = _int_field(target, "bos_token_id"), _int_field(draft, "bos_token_id")
    if bos_target is not None and bos_draft is not None and bos_target != bos_draft:
        return _refuse(target, draft, "bos_token_id (so the tokenizer differs)", bos_target, bos_draft, fix)
    if abs(draft.vocab_size - target.vocab_size) > VOCAB_PADDING_SLACK:
        return _refuse(target, draft, "vocab_size (more apart than padding, so the tokenizer differs)",
                       target.vocab_size, draft.vocab_size, fix)
    return None


def check_draft_pairing(*, algorithm: str, target: ModelConfig, draft: ModelConfig) -> None:
    """Raise ConfigError naming both values when `draft` cannot speculate for `target` under `algorithm`."""
    if algorithm in EAGLE_ALGORITHMS:
        problem = _eagle_problems(target, draft, algorithm)
    elif algorithm == "STANDALONE":
        problem = _standalone_problems(target, draft)
    else:
        problem = None
    if problem is not None:
        raise problem


def paired_draft(draft: ModelConfig, *, target: ModelConfig, algorithm: str) -> ModelConfig:
    """The draft model, once checked against the target (for the container's draft provider)."""
    check_draft_pairing(algorithm=algorithm, target=target, draft=draft)
    return draft


def draft_model_for(algorithm: str, draft_model: str | None, target: ModelConfig) -> ModelConfig | None:
    """The draft worker's model for --speculative-algorithm: none without one, the target's own NEXTN layer, or
    the --speculative-draft-model checkpoint checked against the target (EAGLE, EAGLE3, STANDALONE)."""
    if algorithm == "none":
        return None
    if algorithm == "NEXTN":
        return target.nextn_draft()
    return paired_draft(load_model_config(draft_model), target=target, algorithm=algorithm)
