"""The worker's web endpoint: JSON stats, Prometheus metrics, the dashboard, pending
lookups, all behind the web token (`auth`). Above the agents: it reads what they
hand it; nothing below imports it."""
