"""Running Sheshnag: the `sheshnag` command, the embedded broker and object store, the supervisor."""
