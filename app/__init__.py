"""The engine application: CLI, model runner, weight loader and report."""
