"""The Borgmaster's checkpoint store: one small interface (:mod:`.store`), PostgreSQL its
implementation (:mod:`.postgres`). A shell package: the core never imports it."""

from cellpilot.checkpoint_store.postgres import PostgresCheckpointStore
from cellpilot.checkpoint_store.store import CheckpointStore, FencedOut, StoredSnapshot, batches_after

__all__ = ["CheckpointStore", "FencedOut", "PostgresCheckpointStore", "StoredSnapshot", "batches_after"]
