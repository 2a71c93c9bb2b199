"""planrun."""
