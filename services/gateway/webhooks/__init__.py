"""Webhooks: endpoints, signed deliveries from the event log, retries with backoff (see deliverer.py)."""
