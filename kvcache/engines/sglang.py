"""SGLang 0.5.23's rules (sglang 0.5.23 on PyPI; each rule cites the function it follows)."""

from __future__ import annotations

from kvcache.arithmetic import align_down
from kvcache.engines.model_classes import no_model_class_note
from kvcache.engines.sglang_config_forms import sglang_config_form_refusal
from kvcache.engines.sglang_draft_charge import draft_charge_notes, sglang_draft_charge
from kvcache.engines.sglang_hybrid_swa import architectures, is_hybrid_swa_model, one_full_pool_override
from kvcache.engines.sglang_minimums import SGLANG_MINIMUMS, chunk_page_refusal, draft_step_refusal
from kvcache.engines.sglang_multimodal import sglang_multimodal_memory, sglang_served_model
from kvcache.engines.sglang_request_table import sglang_request_table_width
from kvcache.inputs.server_arg_types import HybridSwaMemory
from kvcache.inputs.sizing_settings import SizingSettings
from kvcache.models.model_config import ModelConfig
from kvcache.sizing.engine_rules import EngineRules, MultimodalMemory, WindowPools
from kvcache.sizing.pool_config import MemoryPoolConfig


# KDA models SGLang 0.5.23 still captures prefill graphs for (arg_groups/cuda_graph_hook.py: "BCG-validated")
KDA_PREFILL_GRAPH_ARCHITECTURES = frozenset({"Glm5NextForConditionalGeneration"})


class SGLangRules(EngineRules):
    """SGLang 0.5.23."""

    name = "sglang"
    title = "SGLang"
    version = "0.5.23"
    # A pool shorter than one full-context request runs: TpModelWorker.get_worker_info (srt/managers/tp_worker.py)
    # warns and caps each request at the pool less one token; only a pool of one token is refused there.
    below_one_request = "cap"
    minimums = SGLANG_MINIMUMS  # kvcache.engines.sglang_minimums, each citing SGLang's source

    def draft_charged_bytes_per_token(self, *, target: tuple[int, int], draft: tuple[int, int],
                                      kinds: tuple[str, ...]) -> int | None:
        """The target's bytes a layer times the draft's layers, where more than the draft's pool holds
        (kvcache.engines.sglang_draft_charge)."""
        return sglang_draft_charge(target=target, draft=draft, kinds=kinds)

    def plan_notes(self, plan: MemoryPoolConfig) -> tuple[str, ...]:
        """A draft pool charged more than it holds, and the budget that leaves unused."""
        return draft_charge_notes(plan, self.label)

    def startup_refusal(self, context_length: int, settings: SizingSettings,
                        default_chunk: int | None = None) -> str | None:
        """The minimums' refusal, then a draft step too long for one request, then a chunk the page does not divide
        (kvcache.engines.sglang_minimums); `default_chunk`: the card's default prefill chunk (None off a card)."""
        return (super().startup_refusal(context_length, settings) or draft_step_refusal(context_length, settings)
                or chunk_page_refusal(settings, default_chunk))

    def window_pools(self, model: ModelConfig, switch: HybridSwaMemory) -> WindowPools:
        """Separate sliding-window pools only for is_hybrid_swa_model's architectures, not overridden
        (kvcache.engines.sglang_hybrid_swa); --enable-hybrid-swa-memory asks for them anyway (a what-if)."""
        if switch == "enable":
            return WindowPools(separate=True, why="--enable-hybrid-swa-memory (SGLang 0.5.23 has no such flag)")
        if switch == "disable":
            return WindowPools(separate=False, why="--disable-hybrid-swa-memory")
        arch = architectures(model)[0]
        if (override := one_full_pool_override(model)) is not None:
            return WindowPools(separate=False, why=f"{self.label}'s model override ({override}) keeps {arch} in "
                                                   "one full pool; --enable-hybrid-swa-memory sizes window pools")
        if not is_hybrid_swa_model(model):
            return WindowPools(separate=False, why=f"{self.label} builds window pools only for the architectures "
                                                   f"is_hybrid_swa_model lists, not {arch}")
        return WindowPools(separate=True, why=f"{self.label} lists {arch} in is_hybrid_swa_model")

    def multimodal(self, model: ModelConfig, *, enable_multimodal: bool | None,
                   language_model_only: bool) -> MultimodalMemory:
        """A smaller derived fraction, a 100 MiB reserve and maybe no prefill graphs for a multimodal model whose
        multimodal side is on (kvcache.engines.sglang_multimodal)."""
        return sglang_multimodal_memory(model, enable_multimodal=enable_multimodal,
                                        language_model_only=language_model_only, label=self.label)

    def own_token_count(self, plan: MemoryPoolConfig, settings: SizingSettings) -> int | None:
        """What SGLang 0.5.23 would size (its MHA/MLA pool configurator's `calculate_pool_sizes`): the budget over the
        bytes a token takes, in whole pages, at most --max-total-tokens. It allocates the request table and the
        allocator's lists outside the budget, from the headroom; this plan charges them. Only for one pool of full
        attention or MLA latents (no DSA indexer, window, state, draft or multimodal reserve), where its rule is
        that one line (SGLang computes the budget in float GB: it may land a token away)."""
        if len(plan.kv_pools) != 1:
            return None
        pool = plan.kv_pools[0]
        simple = (True and pool.kind in ("full", "mla") and plan.state_pool is None
                  and not pool.of_draft_worker and plan.budget.reserved_bytes == 0
                  and not any(t.name == "index_k" for t in pool.row))
        # a budget SGLang never computes: a resized plan's (measured or post-capture), or --kv-cache-memory's
        resized_or_given = plan.request_table_requests is not None or settings.kv_cache_memory is not None
        if not simple or resized_or_given:
            return None
        tokens = align_down(plan.budget.budget_bytes // plan.bytes_per_token, plan.page_size)
        if settings.max_total_tokens is not None:
            tokens = min(tokens, align_down(settings.max_total_tokens, plan.page_size))
        return tokens

    def no_prefill_graphs_reason(self, model: ModelConfig) -> str:
        """KDA layers: SGLang 0.5.23's `disable_breakable_cudagraph_if_incompatible` turns prefill graphs off for
        them (`uses_kda_attention`), but for the architectures it has validated."""
        archs = architectures(model)
        if "kda" in model.layer_kinds and not KDA_PREFILL_GRAPH_ARCHITECTURES.intersection(archs):
            return (f"{self.label} captures no prefill CUDA graphs for KDA linear attention ({archs[0]}), so its "
                    "mem_fraction_static keeps no reserve for them")
        return ""

    def served_model(self, model: ModelConfig, *, enable_multimodal: bool | None,
                     language_model_only: bool) -> ModelConfig:
        """Without the vision tower where SGLang's model class builds none (kvcache.engines.sglang_multimodal)."""
        return sglang_served_model(model, enable_multimodal=enable_multimodal, language_model_only=language_model_only)

    def config_notes(self, model: ModelConfig) -> tuple[str, ...]:
        """A config form SGLang 0.5.23 refuses to load (kvcache.engines.sglang_config_forms); an architecture it has
        no model class for (kvcache.engines.model_classes)."""
        no_class = no_model_class_note(model.hf_config, engine=self.name, version=self.version, label=self.label)
        return tuple(filter(None, (sglang_config_form_refusal(model, self.label), no_class)))

    def request_table_width(self, context_length: int, settings: SizingSettings) -> int:
        """The context plus SGLang's row headroom for decode over-allocation (kvcache.engines.sglang_request_table)."""
        return sglang_request_table_width(context_length, settings)


SGLANG = SGLangRules()
