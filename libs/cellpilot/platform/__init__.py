"""Platform glue shared by every service: settings, logging, telemetry, gRPC, Kafka, PostgreSQL, Redis.

This layer does I/O; the algorithmic core never imports it (enforced by import-linter).
"""
