"""The scheduler: matches validated batches to executors by model and free memory."""
