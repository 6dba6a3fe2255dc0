"""The ``routeaudit`` command line; the product lives in ``collectors``, ``audit``,
``dashboards`` and ``testbed``."""

__all__: list[str] = []
