"""The bootstrap report as text for people: the headline tokens and where they come from, the budget, the pools,
the measured or predicted headroom and the multimodal side (app.report builds the report itself)."""

from __future__ import annotations

from typing import Any

from app.report import BootstrapReport
from app.report_header import report_header
from kvcache.byte_units import GiB, MiB, format_bytes


def _multimodal_lines(m: dict[str, Any]) -> list[str]:
    """Whether the multimodal side is on and, when it is, how the fraction was cut and what the budget kept back."""
    if not m["multimodal_model"]:
        return []
    lines = [f"multimodal          {'on' if m['on'] else 'off'}: {m['why']}"]
    if not m["on"]:
        return lines
    if m["cut_by"] is not None:
        cut = (f"x {m['fraction_factor']:.6g} (0.95 x the ViT-size factor)" if m["cut_by"] == "factor"
               else f"- {m['post_capture_cut_mib']} MiB of the card (post-capture resize)")
        lines.append(f"                    mem_fraction_static {m['fraction_before_cut']} {cut} = {m['fraction']:.6g}: "
                     f"keeps {format_bytes(m['kept_by_fraction_bytes'])} more free for the multimodal encoder")
    elif m["fraction"] is not None:
        why = "as given" if m["fraction_before_cut"] is None else "(no vision_config to size the cut by)"
        lines.append(f"                    mem_fraction_static {m['fraction']} {why}: not cut")
    if m["reserve_bytes"]:
        lines.append(f"                    {format_bytes(m['reserve_bytes'])} of the budget kept for the multimodal "
                     "embedding cache (allocated after the KV cache)")
    if not m["prefill_cuda_graphs"]:
        lines.append("                    no prefill CUDA graphs: the engine captures them only for the multimodal "
                     "architectures it lists, so none of their reserve is kept")
    return lines


def _below_context_note(r: BootstrapReport) -> str:
    """Why fewer tokens than one full-length request can plan: the engine caps each request (a note says what
    would lift it), or every layer attends a window, and what that means for an engine that keeps every token."""
    if r.max_total_num_tokens >= r.context_length:
        return ""
    if r.request_token_cap is not None:
        return f"  (below the {r.context_length:,}-token context: one request holds at most {r.request_token_cap:,})"
    return (f"  (below the {r.context_length:,}-token context: every layer attends a window, so a request keeps "
            f"only its last window of tokens; an engine that keeps every token serves requests of at most "
            f"{r.max_total_num_tokens:,} tokens)")


def _measured_lines(m: dict[str, Any]) -> list[str]:
    """The measured headroom: the step's peak, what graphs took, the margin, tokens before and after, idle."""
    steps = ", ".join(f"{name} {format_bytes(s['peak_bytes'])}" for name, s in m["steps"].items()) or "none run"
    lines = [
        f"measured headroom   worst-case steps: {steps}; graphs {format_bytes(m['graph_bytes'])}",
        f"                    kept free: peak {format_bytes(m['peak_bytes'])} + margin {format_bytes(m['margin_bytes'])}"
        f" (0.5% of the card, at least 256 MiB)",
        f"                    tokens: static plan {m['static_tokens']:,} -> {m['tokens_after']:,} "
        f"(pools built for {m['tokens_built']:,}); idle at the step's peak {format_bytes(m['idle_bytes'])}",
    ]
    return lines + ([f"                    {m['note']}"] if m["note"] else [])


def _loading_adds(r: BootstrapReport) -> str:
    """On a card free memory falls by more than the weights while they load (the kernels their first use loads grow
    the CUDA context): the weights line says by how much, so the memory lines add up. A host's drop is noise."""
    drop = r.free_before_load_bytes - r.free_after_load_bytes
    if r.device == "cpu" or drop <= r.weights_bytes:
        return ""
    return f"  (free memory fell by {_gib(drop)}: loading adds {format_bytes(drop - r.weights_bytes)} of CUDA kernels)"


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _headline_label(r: BootstrapReport) -> str:
    """Where the headline comes from, on its line: a dry run's prediction says whether it is calibrated."""
    if r.max_total_num_tokens_source == "measured":
        return "  (this bootstrap's measured headroom: below)"
    p = r.measured_prediction
    if p is None:
        return ""
    what = "the static plan, which a measured bootstrap keeps" if p["at_static_floor"] else "a measured bootstrap"
    basis = {"calibrated": "from a recorded run on this card", "uncalibrated": "uncalibrated",
             "extrapolated": "extrapolated"}[p["basis"]]
    return f"  ({what}, --kv-headroom {p['kv_headroom']}: predicted, {basis}; leaves {_gib(p['kept_free_bytes'])} free)"


def _token_lines(r: BootstrapReport) -> list[str]:
    """Bytes per token and the tokens held; for a model without per-token KV, what it holds instead: state per
    request, and the token slots the engine indexes (they hold no bytes)."""
    if r.bytes_per_token is not None:
        return [f"bytes per token     {r.bytes_per_token:,}",
                f"max total tokens    {r.max_total_num_tokens:,}" + _headline_label(r) + _below_context_note(r)]
    return [f"state per request   {format_bytes(r.state_bytes_per_request or 0)}  (no per-token KV: every layer is "
            "recurrent state)",
            f"token slots         {r.max_total_num_tokens:,}  (indices the allocator hands out, no KV bytes: "
            f"{r.engine} {r.engine_version} sizes them as --max-total-tokens, else the context length)"]


def _total_source(r: BootstrapReport) -> str:
    """Which total the memory line is, where a card reports two: cudaMemGetInfo's, measured or stood in for."""
    if r.card_total_measured is False:
        return " by cudaMemGetInfo (not measured on this card: nvidia-smi's total stands in)"
    return " by cudaMemGetInfo" if r.device_capacity_bytes not in (None, r.total_memory_bytes) else ""


def render_text(report: BootstrapReport) -> str:
    """The report for a terminal: one fact per line, GiB beside exact bytes."""
    r = report
    lines = [
        *report_header(model=r.model, engine=r.engine, engine_version=r.engine_version, device=r.device,
                       card=r.card, model_dtype=r.model_dtype, kv_cache_dtype=r.kv_cache_dtype),
        f"context length      {r.context_length:,}   page size {r.page_size}"
        + (f"  ({r.page_size_note})" if r.page_size_note else ""),
        f"memory              total {format_bytes(r.total_memory_bytes)}" + _total_source(r),
        *([f"                    nvidia-smi's total {r.device_capacity_bytes // MiB:,} MiB: the card SGLang's "
           "default mem_fraction_static is derived for"]
          if r.device_capacity_bytes not in (None, r.total_memory_bytes) else []),
        f"                    free before load {format_bytes(r.free_before_load_bytes)}",
        f"                    free after load  {format_bytes(r.free_after_load_bytes)}",
        *([f"                    the ranks' smallest, which the budget reads: free before load "
           f"{format_bytes(r.ranks_smallest_memory['free_before_load_bytes'])}, free after load "
           f"{format_bytes(r.ranks_smallest_memory['free_after_load_bytes'])}"] if r.ranks_smallest_memory else []),
        f"weights             {format_bytes(r.weights_bytes)}" + _loading_adds(r)
        + ("  (vision tower not counted: its shapes are not in config.json)" if r.vision_weights == "not_counted" else
           "  (vision tower not loaded: the engine builds none with the multimodal side off)"
           if r.vision_weights == "not_loaded" else ""),
        "KV budget           " + format_bytes(r.budget_bytes)
        + (f"  (mem_fraction_static {r.mem_fraction_static})" if r.mem_fraction_static is not None else "  (--kv-cache-memory)"),
        *(_multimodal_lines(r.multimodal) if r.multimodal is not None else []),
        *_token_lines(r),
        *([f"                    static plan {r.static_plan_tokens:,}: SGLang's mem_fraction_static budget, what "
           "--kv-headroom fraction holds"] if r.static_plan_tokens != r.max_total_num_tokens else []),
        *([f"                    {r.engine} {r.engine_version} itself sizes {r.engine_own_tokens:,} for the static "
           "plan's budget: it allocates the request table and the allocator's lists outside it, which this plan charges"]
          if r.engine_own_tokens not in (None, r.static_plan_tokens) else []),
        f"max running reqs    {r.max_running_requests:,}"
        + (f"  (state slots cap requests at {r.state_request_cap})"
           if r.state_request_cap is not None and r.state_request_cap <= r.max_running_requests else ""),
        "buffers:" + ("  (the static plan's, as this dry run builds them; a measured bootstrap resizes them to the "
                      "headline)" if r.max_total_num_tokens != r.static_plan_tokens and r.measured_headroom is None
                      else ""),
    ]
    width = max(len(k) for k in r.buffers)
    lines += [f"  {name:<{width}}  {format_bytes(n)}" for name, n in r.buffers.items()]
    lines.append(f"  {'total planned':<{width}}  {format_bytes(r.planned_bytes)}")
    lines.append(f"  {'total allocated':<{width}}  {format_bytes(r.allocated_bytes)}")
    for pool in r.plan["kv_pools"]:
        layers = pool["num_layers"]
        lines.append(f"pool {pool['name']:<14} {pool['kind']:>4}: {layers} layer{'' if layers == 1 else 's'} x "
                     f"{pool['bytes_per_token'] // max(pool['num_layers'], 1):,} B/token, {pool['num_tokens']:,} tokens")
    if r.plan.get("state_pool"):
        s = r.plan["state_pool"]
        lines.append(f"pool state            : {s['num_layers']} layers, {s['bytes_per_slot']:,} B/slot, "
                     f"{s['usable_slots']:,} slots (+1 padding), {s['slots_per_request']} per request")
    if r.measured_headroom is not None:
        lines += _measured_lines(r.measured_headroom)
    if r.measured_prediction is not None:
        p = r.measured_prediction
        why = p["at_static_floor"] or (f"predicted to need {_gib(p['needed_free_bytes'])} free (graphs, worst-case "
                                       f"steps, margin, resize); {p['tokens']:,} tokens leave {_gib(p['kept_free_bytes'])}")
        lines.append(f"measured bootstrap  {why}; {p['basis']}: {p['source']}")
    elif r.measured_off is not None:
        lines.append(f"measured bootstrap  off on this card (the fraction keeps the headroom): {r.measured_off}")
    if r.draft is not None:
        d = r.draft
        lines.append(f"draft worker        {d.model} ({d.kv_cache_dtype}): pools {', '.join(d.pools)}, "
                     f"weights {format_bytes(d.weights_bytes)}, allocated {format_bytes(d.allocated_bytes)}")
    lines += [f"note: {n}" for n in r.engine_notes]
    lines += [f"note: {n.message}" for n in r.capacity_notes]
    lines.append("timings:  " + ", ".join(f"{k.removesuffix('_s')} {v * 1000:.1f} ms" for k, v in r.timings_s.items()))
    if r.draft is not None:
        lines.append("draft timings:  " + ", ".join(f"{k.removesuffix('_s')} {v * 1000:.1f} ms" for k, v in r.draft.timings_s.items()))
    return "\n".join(lines)
