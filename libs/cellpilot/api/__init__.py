# Generated from proto/ by infra/proto/generate.py; do not edit.
"""Generated protobuf and gRPC code of the Cellpilot API.

Generated code lives here: every module under this package is produced by
``infra/proto/generate.py`` (``make proto``) from the ``.proto`` files in ``proto/`` and is
never edited by hand; ``make proto-check`` fails when it is stale. Versions are
sub-packages (``cellpilot.api.v1``). The core libraries never import this package: services
convert wire types to plain data at their edge.
"""
