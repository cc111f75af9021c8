-- How far the Borgmaster has published its checkpoint log's events on Kafka borg.events, so a
-- newly elected master resumes publishing there (events are in log order; consumers may see an
-- event twice across a failover and can de-duplicate by log_sequence).

CREATE TABLE borg_event_cursor (
    name            text PRIMARY KEY,         -- the topic, e.g. 'borg.events'
    published_seq   bigint NOT NULL,          -- every record up to this log position is published
    updated_at      timestamptz NOT NULL DEFAULT now()
);
