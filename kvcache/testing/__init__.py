"""Fakes for tests: small real classes with fixed numbers, strict about their interface.

Not MagicMock: a fake that invents attributes hides a missing field (the missing
`model_dtype` bug in SGLang's refactor lived behind one).
"""

from kvcache.testing.fakes import FailingAllocatorFactory, FixedActivationStep, RecordingAllocator, RecordingStream, fixed_card_probe, tiny_model_config, TINY_MODEL_HF_CONFIG
from kvcache.memory.fixed_probe import FixedMemoryProbe
from kvcache.testing.fake_cuda import FakeCudaReadings

__all__ = ["FailingAllocatorFactory", "FakeCudaReadings", "FixedActivationStep", "FixedMemoryProbe", "RecordingAllocator", "RecordingStream", "fixed_card_probe", "tiny_model_config", "TINY_MODEL_HF_CONFIG"]
