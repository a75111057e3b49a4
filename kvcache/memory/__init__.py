"""Memory: what a device has (probes), the one place device bytes come from, and where planning meets torch
(devices, dtypes, the ranks' collectives). The KV budget and the reserves it keeps out are pure arithmetic, in
kvcache.sizing."""
