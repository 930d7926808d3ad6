"""Authorization of executors' NATS connections: the auth callout that turns a worker key into permissions."""
