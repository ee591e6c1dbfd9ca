"""The bottom layer: floating-point formats, the attention semantics, the environment record,
result logs and progress bars."""
