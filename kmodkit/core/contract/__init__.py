"""What a backend declares (``backend``) and what a rollout asks of it (``hooks``, ``policy``)."""
