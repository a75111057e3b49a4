"""ModelRunner: one worker's start-up. Load (dummy) weights, then configure the KV cache.

It keeps what SGLang's runner keeps (max_total_num_tokens, max_running_requests,
req_to_token_pool, token_to_kv_pool, token_to_kv_pool_allocator, memory_pool_config)
and the whole KVCacheConfigResult. The two phases are separate so that an engine
with a draft loads both workers' weights before the target profiles.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from app.weights import DummyWeightLoader, LoadedWeights, WeightsDoNotFitError as LoaderOutOfMemory
from app.weights import rank_parameter_specs
from app.forward import DecodeBatch, DecodeRequests, Decoder, ExtendBatch, PoolAttention, build_decoder
from app.forward.graphs import DecodeGraphs, GraphCapture, decode_graph_batch_sizes
from app.forward.measured_sizing import size_from_worst_case
from app.forward.post_capture import apply_post_capture_resize
from app.forward.worst_case import ReferenceWorstCaseStep
from app.worker_refusals import KV_CACHE_REFUSALS, WorkerRefusals
from kvcache.runtime.measured_headroom import MeasuredSizing, WorstCaseStep
from kvcache.runtime.resize import PostCaptureKVResize
from kvcache.memory.vmm_storage import VmmBacking
from kvcache.inputs.dtypes import DType
from kvcache.configurator import KVCacheConfigResult, KVCacheConfigurator, SharedTargetCache
from kvcache.errors import KVCacheError
from kvcache.sizing.worker_sizing import WorkerSizing
from kvcache.sizing.runtime_reserve import RuntimeShape, decode_cuda_graph_max_bs
from kvcache.memory.memory_probe import MemoryProbe
from kvcache.models.model_config import ModelConfig
from kvcache.inputs.parallel import ParallelState


class ModelRunner:
    """A target or draft worker: its weights, its KV cache, and how long each took."""

    def __init__(
        self, *, role: str, model_config: ModelConfig, parallel_state: ParallelState, device: torch.device,
        model_dtype: DType, memory_probe: MemoryProbe, configurator_factory: Callable[[], KVCacheConfigurator],
        forward_stream: Any, worst_case_step_factory: Callable[..., WorstCaseStep] = ReferenceWorstCaseStep,
        target_cache_factory: Callable[[], SharedTargetCache | None] = lambda: None,  # a draft's: its target's cache
        target_refusals_factory: Callable[[], WorkerRefusals | None] = lambda: None,  # a draft's: its target's
    ) -> None:
        self.role = role
        self.model_config = model_config
        self.parallel_state = parallel_state
        self.device = device
        self.model_dtype = model_dtype
        self.memory_probe = memory_probe
        self.forward_stream = forward_stream
        self._configurator_factory = configurator_factory
        self._target_cache_factory = target_cache_factory  # asked for only once the target's pools exist
        self._target_refusals_factory = target_refusals_factory  # asked for only when this draft is refused
        self.draft_refusals: Callable[[], WorkerRefusals | None] = lambda: None  # a target's: its draft's (app.engine)
        self.timings: dict[str, float] = {}
        self.pre_model_load_memory: int | None = None
        self.weights: LoadedWeights | None = None
        self._kv_cache: KVCacheConfigResult | None = None
        self._decoder: Decoder | None = None  # app.forward, built on first decode
        self._vmm_backing: VmmBacking | None = None  # resizable pools (post-capture resize)
        self.decode_graphs: DecodeGraphs | None = None
        self.graph_capture: GraphCapture | None = None
        self.post_capture_kv_resize: PostCaptureKVResize | None = None
        self.post_capture_released_bytes = 0
        self._worst_case_step_factory = worst_case_step_factory  # the engine's largest steps (measured headroom)
        self.measured_sizing: MeasuredSizing | None = None

    # ---- phases ---------------------------------------------------------
    def load_weights(self) -> LoadedWeights:
        """Record free memory, then allocate real-size dummy weights (nothing on meta)."""
        start = time.perf_counter()
        self.pre_model_load_memory = self.memory_probe.free_bytes()
        self.timings["profile_before_load_s"] = time.perf_counter() - start
        start = time.perf_counter()
        specs = self.weight_specs()
        loader = self._weight_loader()
        needed = loader.bytes_needed(specs)
        if needed > self.pre_model_load_memory:
            raise self.refusals().weights_do_not_fit(needed)
        if self.device.type == "cpu" and self.role == "target":
            self.refusals().refuse_a_kv_cache_that_cannot_plan(needed)
        try:
            self.weights = loader.load(specs)
        except LoaderOutOfMemory as exc:
            raise self.refusals().weights_do_not_fit(needed, refused=True) from exc
        self.memory_probe.note_allocation(self.weights.total_bytes)
        self._synchronize()
        self.timings["load_weights_s"] = time.perf_counter() - start
        return self.weights

    def init_memory_pool(self) -> KVCacheConfigResult:
        """Ask the configurator for the KV cache (a target profiles; a draft shares the target's)."""
        if self.pre_model_load_memory is None:
            raise KVCacheError(f"{self.role} worker: load_weights() must run before init_memory_pool()")
        start = time.perf_counter()
        configurator = self._configurator_factory()
        try:
            self._kv_cache = self._configure_kv_cache(configurator, self.pre_model_load_memory)
        except KV_CACHE_REFUSALS as exc:
            raise self.refusals().with_tp_advice(exc) from None
        self._synchronize()
        self.timings["configure_kv_cache_s"] = time.perf_counter() - start
        return self._kv_cache

    def initialize(self) -> KVCacheConfigResult:
        """Both phases, for a worker with no draft beside it."""
        self.load_weights()
        return self.init_memory_pool()

    def weight_specs(self, parallel_state: ParallelState | None = None) -> tuple[Any, ...]:
        """This rank's parameter tensors (or a rank's of `parallel_state`): its pipeline layers, its tensor-parallel shards."""
        return rank_parameter_specs(self.model_config, parallel_state or self.parallel_state)

    def _weight_loader(self) -> DummyWeightLoader:
        return DummyWeightLoader(device=self.device, dtype=self.model_dtype,
                                 quantization=self.model_config.weights.quantization)

    # ---- what the engine reads -------------------------------------------
    @property
    def kv_cache(self) -> KVCacheConfigResult:
        if self._kv_cache is None:
            raise KVCacheError(f"the {self.role} worker's KV cache is not configured yet: call init_memory_pool() first")
        return self._kv_cache

    @property
    def sizing(self) -> WorkerSizing:
        """This worker's pure sizing questions (kvcache.sizing.worker_sizing)."""
        return self._configurator_factory().sizing

    @property
    def is_configured(self) -> bool:
        return self._kv_cache is not None

    @property
    def memory_pool_config(self) -> Any:
        return self.kv_cache.memory_pool_config

    @property
    def max_total_num_tokens(self) -> int:
        return self.kv_cache.max_total_num_tokens

    @property
    def max_running_requests(self) -> int:
        return self.kv_cache.max_running_requests

    @property
    def req_to_token_pool(self) -> Any:
        return self.kv_cache.req_to_token_pool

    @property
    def token_to_kv_pool(self) -> Any:
        return self.kv_cache.token_to_kv_pool

    @property
    def token_to_kv_pool_allocator(self) -> Any:
        return self.kv_cache.token_to_kv_pool_allocator

    # ---- decode (app.forward) --------------------------------------------
    def decoder(self) -> Decoder:
        """The reference decoder over this worker's weights and KV pools (built once)."""
        if self._decoder is None:
            if self.weights is None:
                raise KVCacheError(f"the {self.role} worker has no weights: call load_weights() first")
            attention = PoolAttention(token_to_kv_pool=self.token_to_kv_pool,
                                      req_to_token=self.req_to_token_pool.req_to_token)
            self._decoder = build_decoder(model_config=self.model_config, weights=self.weights.tensors,
                                          attention=attention, layer_ids=self.parallel_state.layer_range(
                                              self.model_config.num_hidden_layers))
        return self._decoder

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        """One decode step: K/V written at batch.out_cache_loc, read through req_to_token; float32 logits [bs, vocab]."""
        return self.decoder().forward(batch)

    def forward_extend(self, batch: ExtendBatch) -> torch.Tensor:
        """One prefill (extend) step: new tokens' K/V written at batch.out_cache_loc, attention over each
        request's prefix and new tokens through req_to_token; float32 logits [requests (or tokens), vocab]."""
        return self.decoder().forward(batch)

    def decode_requests(self) -> DecodeRequests:
        """A minimal scheduler over this worker's request table and allocator (tests, benchmarks)."""
        return DecodeRequests(req_to_token_pool=self.req_to_token_pool, allocator=self.token_to_kv_pool_allocator,
                              device=self.device)

    # ---- CUDA graphs and the post-capture resize (app.forward) ------------
    def decode_graph_max_bs(self, max_bs: int | None = None) -> int:
        """The largest decode batch to capture: max_bs, else --cuda-graph-max-bs, else the card's default, by
        the runtime reserve's own rule (0 with --disable-cuda-graph or a cap of 0); at most max_running_requests."""
        s = self._configurator_factory().settings
        if max_bs is None:
            max_bs = decode_cuda_graph_max_bs(self.memory_probe.device_capacity_bytes(), RuntimeShape(
                cuda_graphs=not s.disable_cuda_graph, decode_cuda_graphs=not s.disable_decode_cuda_graph,
                cuda_graph_max_bs=s.cuda_graph_max_bs,
                tp_size=self.parallel_state.tp_size, max_running_requests=self.max_running_requests))
        return min(max_bs, self.max_running_requests)

    def capture_decode_graphs(self, max_bs: int | None = None) -> GraphCapture:
        """Capture forward_decode for SGLang's batch sizes up to decode_graph_max_bs(max_bs) on one graph pool;
        returns what capture took (free memory before/after). A cap of 0 captures nothing: decode runs eagerly."""
        limit = self.decode_graph_max_bs(max_bs)
        start = time.perf_counter()
        if limit == 0:
            free = self.memory_probe.free_bytes()
            self.decode_graphs = None
            self.graph_capture = GraphCapture(batch_sizes=(), free_before_bytes=free, free_after_bytes=free, seconds=0.0)
            return self.graph_capture
        if self.device.type != "cuda":
            raise KVCacheError(f"CUDA graphs need a CUDA device; the {self.role} worker runs on {self.device}")
        graphs = DecodeGraphs(forward=self.forward_decode, device=self.device, max_bs=limit)
        self.graph_capture = graphs.capture(decode_graph_batch_sizes(limit), self.memory_probe.free_bytes)
        self.timings["capture_decode_graphs_s"] = time.perf_counter() - start
        self.decode_graphs = graphs
        return self.graph_capture

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        """One decode step: the smallest captured graph that holds the batch, else eagerly (no graphs, or a
        batch above the largest captured one)."""
        if self.decode_graphs is not None and self.decode_graphs.holds(batch.batch_size):
            return self.decode_graphs.replay(batch)
        return self.forward_decode(batch)

    def post_capture_resize_kv_pool(self) -> PostCaptureKVResize:
        """After capture: shrink the pools to what is free less the fraction's headroom (never grow),
        release each buffer's tail, rebuild the allocator; the new plan replaces the old."""
        configurator = self._configurator_factory()
        eligibility = configurator.sizing.post_capture_resize()
        if not eligibility.active or self._vmm_backing is None:
            raise KVCacheError(f"the {self.role} worker's KV pools are not resizable: {eligibility.reason}")
        start = time.perf_counter()
        resize, allocator, released = apply_post_capture_resize(
            kv_cache=self.kv_cache, backing=self._vmm_backing, settings=configurator.settings,
            parallel_state=self.parallel_state, memory_probe=self.memory_probe,
            pre_model_load_memory=self.pre_model_load_memory or 0,
            captured_max_bs=self.graph_capture.max_bs if self.graph_capture else 0,
            allocator_factory=configurator.allocator_factory,
        )
        if resize.changed:
            self.replace_kv_plan(resize.after, allocator)
        self.post_capture_kv_resize, self.post_capture_released_bytes = resize, released
        self.timings["post_capture_resize_s"] = time.perf_counter() - start
        return resize

    def start_decode_runtime(self) -> PostCaptureKVResize | MeasuredSizing | None:
        """When this worker's pools are resizable (CUDA): capture the decode graphs and size the pools from the
        measured worst-case step (--kv-headroom), or resize them to the fraction's headroom
        (--enable-post-capture-kv-resize with a fraction). Otherwise nothing: the plan stands as built."""
        if self._vmm_backing is None:
            return None
        configurator = self._configurator_factory()
        if configurator.sizing.post_capture_resize().measured:
            start = time.perf_counter()
            self.measured_sizing = size_from_worst_case(self, configurator, self._worst_case_step_factory)
            self.timings["measured_sizing_s"] = time.perf_counter() - start
            return self.measured_sizing
        self.capture_decode_graphs()
        return self.post_capture_resize_kv_pool()

    def configurator_sizing(self) -> Any:
        """This worker's pure sizing questions (kvcache.sizing.worker_sizing.WorkerSizing)."""
        return self._configurator_factory().sizing

    def replace_kv_plan(self, plan: Any, allocator: Any) -> None:
        """After the pools were resized in place: the plan and allocator the engine uses from now on
        (KVCacheConfigResult.resized)."""
        self._kv_cache = self.kv_cache.resized(plan, allocator)
        self._decoder = None

    def _configure_kv_cache(self, configurator: KVCacheConfigurator, pre_model_load_memory: int) -> KVCacheConfigResult:
        """Configure (a draft from its target's cache); pools the post-capture resize will trim are on VMM storage."""
        shared = self._target_cache_factory()
        if not configurator.sizing.post_capture_resize().active:
            return configurator.configure(pre_model_load_memory=pre_model_load_memory, shared=shared)
        backing = VmmBacking()
        result = dataclasses.replace(configurator, arena_backing=backing).configure(
            pre_model_load_memory=pre_model_load_memory, shared=shared)
        self._vmm_backing = backing  # only once the pools exist: a failed build leaves nothing to resize
        return result

    # ---- internals -----------------------------------------------------
    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def refusals(self, *, alone: bool = False) -> WorkerRefusals:
        """Why this worker cannot start, with what would work (app.worker_refusals), from its readings now; linked
        to its partner's (a draft's target, a target's draft) unless `alone`."""
        return WorkerRefusals(
            role=self.role, model_config=self.model_config, sizing=self.sizing, device=str(self.device),
            device_type=self.device.type, free_before_load=self.pre_model_load_memory or 0,
            total_bytes=self.memory_probe.total_bytes(), device_capacity_bytes=self.memory_probe.device_capacity_bytes(),
            weights_for=lambda state: self._weight_loader().bytes_needed(self.weight_specs(state)),
            loaded_before=None if alone else self._target_refusals_factory(),
            then_draft=None if alone else self.draft_refusals())
