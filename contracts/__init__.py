"""Sheshnag's contracts: every event, command and API object, defined once and imported by all services."""
