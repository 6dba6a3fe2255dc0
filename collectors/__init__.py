"""Capture and receive telemetry: the OTLP receiver, router/client/replica instrumentation and
the metrics sampler. Depends on ``audit`` (for the attribute convention and the store); never on
``dashboards``."""
