"""The cluster tier's own tests; the ``real_cluster`` fixture is in ``plugin.py`` (see ``tests/conftest.py``)."""
