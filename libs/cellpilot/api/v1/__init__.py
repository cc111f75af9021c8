# Generated from proto/ by infra/proto/generate.py; do not edit.
"""Generated code of the protobuf package ``cellpilot.api.v1``."""
