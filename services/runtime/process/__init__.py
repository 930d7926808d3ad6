"""One service as a process: settings, logging, metrics, tracing, background tasks."""
