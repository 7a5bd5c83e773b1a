"""The node agent in the loader and builder pods; it imports nothing of the operator."""
