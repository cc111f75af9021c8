-- The monitoring system's usage history (Autopilot §3.1, §3.2.1), written by the aggregator
-- replicas and read by its Monitoring API: closed per-task windows s_i[t], per-job window
-- histograms s[t] with their publication state (an outbox for Kafka usage.histograms), and
-- each usage.samples partition's checkpoint, fenced by an owner epoch.

-- One row per task, 5-minute window and source partition (a task that moved machine within
-- a window may have rows from two partitions; readers combine them).
CREATE TABLE usage_task_windows (
    job_id              text NOT NULL,
    task_index          integer NOT NULL,
    window_start_ms     bigint NOT NULL,          -- event time, inclusive
    window_end_ms       bigint NOT NULL,          -- event time, exclusive
    source_partition    integer NOT NULL,         -- usage.samples partition of the samples
    cpu_histogram       bytea NOT NULL,           -- cellpilot.usage SparseHistogram bytes (CPU scheme)
    memory_bucket       integer NOT NULL,         -- bucket of the window's memory peak (memory scheme)
    sample_count        bigint NOT NULL,
    throttled_count     bigint NOT NULL,
    cpu_sum_millicores  double precision NOT NULL,
    cpu_max_millicores  double precision NOT NULL,
    memory_sum_bytes    double precision NOT NULL,
    memory_max_bytes    double precision NOT NULL,
    PRIMARY KEY (job_id, task_index, window_start_ms, source_partition)
);
CREATE INDEX usage_task_windows_by_end ON usage_task_windows (window_end_ms);

-- One row per job, resource and window: the sum over the job's tasks.
CREATE TABLE usage_job_histograms (
    job_id              text NOT NULL,
    resource            smallint NOT NULL,        -- cellpilot.api.v1.Resource: 1 CPU, 2 MEMORY
    window_start_ms     bigint NOT NULL,
    window_end_ms       bigint NOT NULL,
    histogram           bytea NOT NULL,           -- SparseHistogram bytes
    peak                double precision NOT NULL,          -- millicores or bytes
    mean_total_usage    double precision NOT NULL,          -- millicores or bytes
    sample_count        bigint NOT NULL,
    task_count          integer NOT NULL,
    throttled_count     bigint NOT NULL,
    published           boolean NOT NULL DEFAULT false,     -- sent on Kafka usage.histograms
    PRIMARY KEY (job_id, resource, window_start_ms)
);
CREATE INDEX usage_job_histograms_unpublished ON usage_job_histograms (window_end_ms) WHERE NOT published;

-- Each usage.samples partition: who owns it (the epoch fences a deposed owner's writes), its
-- open windows and the next offset to apply (written in the same transaction as the closed
-- windows), and how far its windows are closed.
CREATE TABLE aggregator_partitions (
    topic               text NOT NULL,
    partition           integer NOT NULL,
    owner               text NOT NULL DEFAULT '',
    owner_epoch         bigint NOT NULL DEFAULT 0,
    checkpoint          bytea,                    -- cellpilot.autopilot.event_windows state
    next_offset         bigint NOT NULL DEFAULT 0,
    closed_through_ms   bigint,                   -- every window ending at or before is closed
    watermark_ms        bigint,
    idle                boolean NOT NULL DEFAULT false,     -- no input for a while: not waited for
    accepted_samples    bigint NOT NULL DEFAULT 0,
    late_samples        bigint NOT NULL DEFAULT 0,
    duplicate_batches   bigint NOT NULL DEFAULT 0,
    late_task_windows   bigint NOT NULL DEFAULT 0,          -- closed after their job window was summed
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition)
);

-- How far per-job windows are summed (every partition closed them, or is idle).
CREATE TABLE aggregator_progress (
    name                text PRIMARY KEY,         -- 'jobs'
    closed_through_ms   bigint,
    updated_at          timestamptz NOT NULL DEFAULT now()
);
