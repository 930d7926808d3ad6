"""Events: past-tense facts in the EVENTS stream, one module per aggregate."""
