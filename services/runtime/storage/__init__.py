"""Storage outside NATS: the S3 object store, local volumes' free space, model artifacts."""
