-- The Borgmaster's Paxos-like checkpoint (Borg §3.1): an ordered, fenced change log plus
-- periodic snapshots. A record is appended only by the holder of the current epoch.

CREATE TABLE leader_lease (
    name        text PRIMARY KEY,             -- what is being led, e.g. 'borgmaster'
    epoch       bigint NOT NULL,              -- fencing token: grows by one per election
    holder      text NOT NULL,                -- replica id of the leader
    address     text NOT NULL DEFAULT '',     -- where the leader serves gRPC (host:port)
    expires_at  timestamptz NOT NULL          -- the lease ends unless renewed before this
);

CREATE TABLE checkpoint_log (
    seq         bigint PRIMARY KEY,           -- position in the log, dense from 1
    epoch       bigint NOT NULL,              -- epoch of the leader that appended the record
    kind        text NOT NULL,                -- which mutation (the record's oneof case)
    record      bytea NOT NULL,               -- serialised cellpilot.api.v1.CheckpointRecord
    appended_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE checkpoint_snapshot (
    seq         bigint PRIMARY KEY,           -- the log position the snapshot includes
    epoch       bigint NOT NULL,
    state       bytea NOT NULL,               -- serialised cellpilot.api.v1.Snapshot
    taken_at    timestamptz NOT NULL DEFAULT now()
);
