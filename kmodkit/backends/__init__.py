"""The built-in backends, written against ``kmodkit.sdk`` alone, as a third party would."""
