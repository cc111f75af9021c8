-- Least privilege: one role per service that uses PostgreSQL, holding only what its code does
-- (cellpilot.platform.store_accounts). Roles are created here without LOGIN; the administrator
-- gives them LOGIN and a password (`cellpilot stack up`, compose's postgres-setup). Every later
-- migration that adds a table grants it here too, or no service can use it
-- (tests/integration/security/test_store_access.py checks every table has a grant).
--
--   cellpilot_borgmaster  the checkpoint (Borg §3.1): appends to the log and snapshots, never
--                         rewrites them (no UPDATE or DELETE); the lease and the event cursor.
--   cellpilot_aggregator  the usage history (Autopilot §3.2.1) and its partition checkpoints.
--   cellpilot_fauxmaster  `cellpilot borgmaster replay`: reads the checkpoint, writes nothing.
-- No role may create objects: PostgreSQL 15+ gives PUBLIC no CREATE on schema public, and the
-- database's CONNECT and TEMPORARY are taken from PUBLIC below.

DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['cellpilot_borgmaster', 'cellpilot_aggregator', 'cellpilot_fauxmaster'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role_name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
            EXCEPTION WHEN duplicate_object THEN
                NULL;  -- another database's migration created it meanwhile
            END;
        END IF;
    END LOOP;
    EXECUTE format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format(
        'GRANT CONNECT ON DATABASE %I TO cellpilot_borgmaster, cellpilot_aggregator, cellpilot_fauxmaster',
        current_database()
    );
END $$;

REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- Services check for pending migrations at start (cellpilot.platform.postgres.apply_migrations).
GRANT SELECT ON schema_migrations TO cellpilot_borgmaster, cellpilot_aggregator;

GRANT SELECT, INSERT, UPDATE ON leader_lease TO cellpilot_borgmaster;
GRANT SELECT, INSERT ON checkpoint_log TO cellpilot_borgmaster;
GRANT SELECT, INSERT ON checkpoint_snapshot TO cellpilot_borgmaster;
GRANT SELECT, INSERT, UPDATE ON borg_event_cursor TO cellpilot_borgmaster;

GRANT SELECT, INSERT ON usage_task_windows TO cellpilot_aggregator;
GRANT SELECT, INSERT, UPDATE ON usage_job_histograms TO cellpilot_aggregator;
GRANT SELECT, INSERT, UPDATE ON aggregator_partitions TO cellpilot_aggregator;
GRANT SELECT, INSERT, UPDATE ON aggregator_progress TO cellpilot_aggregator;

GRANT SELECT ON checkpoint_log, checkpoint_snapshot TO cellpilot_fauxmaster;
