"""Sizing: pure integer planning, layer specs and layout in, the plan (MemoryPoolConfig) out. No device."""
