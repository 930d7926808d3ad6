"""Sheshnag's five services and the platform adapters they share."""
