"""Memory: what a device has (probes, host limits), the KV budget, and the one place device bytes come from."""
