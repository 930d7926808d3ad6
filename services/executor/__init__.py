"""The executor: runs the lines of assigned batches through an engine and commits their results."""
