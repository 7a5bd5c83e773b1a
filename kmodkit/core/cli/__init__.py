"""The ``kmodkit`` command and the ``kubectl kmodkit`` plugin."""
