"""CRDs generated from the models, and the same checks offline."""
