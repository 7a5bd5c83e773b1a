"""The vendor-neutral operator: it knows no backend, the SDK or the dev harness."""
