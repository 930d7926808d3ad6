"""The five services of a stack, in the order `sheshnag up` starts them; a module of its own so that the `sheshnag`
command can name them without loading the supervisor."""

SERVICES = ("ledger", "validator", "scheduler", "executor", "gateway")
