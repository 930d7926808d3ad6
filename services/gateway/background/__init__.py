"""The gateway's loops beside its requests, each a cleanup context: sweepers, gauges, key usage."""
