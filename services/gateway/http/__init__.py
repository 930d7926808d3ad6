"""HTTP plumbing of the gateway: middlewares, request parsing and rendering shared by the views, the route table."""
