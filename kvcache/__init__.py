"""kvcache: size an LLM engine's KV cache from a model config and a memory budget, then build it.

The domain package: plain Python, torch and msgspec. It never imports
dependency_injector, app or containers (see DESIGN.md).
"""
