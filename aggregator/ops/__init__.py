"""What operators see of the process: the Prometheus metrics (metrics), the HTTP server for
/metrics, /healthz, /readyz and /status (server), how late the event loop runs (looplag), and
the collector kept off the heap that lives as long as the process (heap).

May import: core, model.
"""
