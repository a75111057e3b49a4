"""Memory: what a device has (probes, host limits), the KV budget, the one place device bytes come from, and where
planning meets torch (devices, dtypes, the ranks' collectives)."""
