"""The gateway: the OpenAI-compatible HTTP API. It publishes facts and reads the ledger's read model."""
