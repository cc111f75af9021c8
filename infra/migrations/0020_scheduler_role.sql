-- The scheduler process (Borg §3.4) follows the checkpoint log into its cached copy of the cell:
-- it reads the log and the snapshots and writes nothing (its placements go to the elected
-- master, which appends them). Least privilege, as 0013_service_roles.sql for the others.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cellpilot_scheduler') THEN
        BEGIN
            CREATE ROLE cellpilot_scheduler NOLOGIN;
        EXCEPTION WHEN duplicate_object THEN
            NULL;  -- another database's migration created it meanwhile
        END;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO cellpilot_scheduler', current_database());
END $$;

GRANT SELECT ON schema_migrations TO cellpilot_scheduler;
GRANT SELECT ON checkpoint_log, checkpoint_snapshot TO cellpilot_scheduler;
