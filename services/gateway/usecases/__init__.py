"""The gateway's use cases, called alike by its HTTP views and by the `sheshnag` CLI (so no aiohttp here)."""
