"""Borg's core types on the v1 wire: the conversions every shell shares (docs/architecture.md rule 2).

``specs`` (enums, resources, job and machine specs), ``statuses`` (statuses, events and
reports out), ``borglet_polls`` (the Borglet's poll messages), ``lifetimes`` (LAVA's
predictions and drains) and ``checkpoint`` (the checkpoint's log records and snapshots as
stored bytes; ``snapshot_v1`` reads the first snapshot format). The Borgmaster, the scheduler,
the CLI and the client's job-spec file call these, so a message means the same thing wherever
it is read.
"""
