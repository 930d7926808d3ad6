"""What the gateway holds of the world outside HTTP: the shared limits bucket, the object store's uploads, caches."""
