"""The validator's adapters: the model's own tokenizer."""
