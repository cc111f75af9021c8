-- Snapshots get a message of their own (Borg §3.1 checkpoint): each row names the message its
-- bytes are, and readers decode by it (cellpilot.borg_wire.checkpoint.snapshot_in).
--
--   cellpilot.api.v1.CellSnapshot  what the state is restored from, and nothing else; written now
--   cellpilot.api.v1.Snapshot      the first format, built from the API's statuses; still read
--
-- Every row written before this migration is the first format: the default says so, and it
-- stays the default so that a replica of the previous version, still running while the others
-- are upgraded, writes rows that are read right. Adding a column with a constant default
-- rewrites no row. The table privileges of 0013_service_roles.sql cover a column added later:
-- cellpilot_borgmaster inserts and selects it, cellpilot_fauxmaster selects it.

ALTER TABLE checkpoint_snapshot ADD COLUMN format text NOT NULL DEFAULT 'cellpilot.api.v1.Snapshot';

COMMENT ON COLUMN checkpoint_snapshot.format IS
    'full name of the checkpoint.proto message in state: cellpilot.api.v1.CellSnapshot (written now) or cellpilot.api.v1.Snapshot (the first format)';
COMMENT ON COLUMN checkpoint_snapshot.state IS 'the serialised snapshot, a message of the format column';
