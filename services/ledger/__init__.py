"""The ledger: folds the EVENTS stream into aggregates and materialises the read model the gateway serves."""
