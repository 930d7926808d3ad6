"""NATS: the connection, JetStream streams and KV buckets, the service router, folds and reads of the log."""
