-- Beside each stored Kafka position, the fingerprint of the last record applied (or published)
-- there: "<timestamp ms>/<digest of key and value>" of the record at the position minus one.
-- A consumer compares it with the broker's record at that offset, so a log that was lost and
-- began again (a memory-only broker restarted) is noticed even once it has grown past the
-- position (cellpilot.platform.kafka.LogPositions).

ALTER TABLE aggregator_partitions ADD COLUMN last_applied text;   -- NULL: nothing applied / unknown

-- The Borgmaster's event publisher: per borg.events partition, the position after the last
-- record it published and that record's fingerprint (AppliedOffsets.to_mapping as JSON).
ALTER TABLE borg_event_cursor ADD COLUMN published_positions text;
