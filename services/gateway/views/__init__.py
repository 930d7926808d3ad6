"""Route handlers, one module per resource."""
