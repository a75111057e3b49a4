"""Speculative-decoding defaults a launcher fills in before sizing, as SGLang 0.5.23 does.

Follows `arg_groups/speculative_hook.py` (`_handle_eagle_family`,
`_auto_choose_speculative_params`) of SGLang 0.5.23, for EAGLE, EAGLE3, STANDALONE and
NEXTN (an alias of EAGLE there):

- `--max-running-requests` defaults to 48 (the draft's tree and verify buffers grow with it),
  set after mem_fraction_static is derived (so it does not cap the reserve's graph batch);
- with none of steps / topk / draft tokens given: (steps, topk, draft tokens) = (5, 4, 8) for
  a Llama (LlamaForCausalLM) or Grok-1 target, else (3, 1, 4); STANDALONE always (3, 1, 4);
- with topk 1 the draft is a chain: draft tokens = steps + 1.

The runtime reserve has no draft term in 0.5.23 (earlier releases added 2 GiB, 6 GiB
for STANDALONE): the draft's weights are measured like the target's.
"""

from __future__ import annotations

from kvcache.inputs.server_args import ServerArgs

SPECULATIVE_MAX_RUNNING_REQUESTS = 48
WIDE_TREE_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})
WIDE_TREE = (5, 4, 8)
CHAIN = (3, 1, 4)


def default_draft_shape(algorithm: str, target_architecture: str) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens) when the user gave none of them."""
    if algorithm != "STANDALONE" and target_architecture in WIDE_TREE_ARCHITECTURES:
        return WIDE_TREE
    return CHAIN


def default_max_running_requests(max_running_requests: int | None, speculative_algorithm: str) -> int | None:
    """The user's cap, else 48 with speculative decoding, else None (the planner's rule).

    Applied where the planner's cap is read, not in ServerArgs: SGLang sets it after deriving
    mem_fraction_static, so the CUDA-graph batch in the reserve is not capped by it.
    """
    if max_running_requests is None and speculative_algorithm != "none":
        return SPECULATIVE_MAX_RUNNING_REQUESTS
    return max_running_requests


def with_speculative_defaults(args: ServerArgs, target_architecture: str) -> ServerArgs:
    """ServerArgs with the draft shape filled in when none of steps / topk / draft tokens was given."""
    if not args.speculative or (args.speculative_num_steps, args.speculative_eagle_topk,
                                args.speculative_num_draft_tokens) != (None, None, None):
        return args
    steps, topk, tokens = default_draft_shape(args.speculative_algorithm, target_architecture)
    return args.replace(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=tokens)
