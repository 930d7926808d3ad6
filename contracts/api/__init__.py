"""OpenAI-shaped API objects: what the gateway returns and the SDK parses."""
