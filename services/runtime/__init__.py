"""Platform adapters every service composes: broker, object store, read model, settings, process runner."""
