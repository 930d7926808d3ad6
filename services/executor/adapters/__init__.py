"""The executor's adapters: engines and the result store."""
