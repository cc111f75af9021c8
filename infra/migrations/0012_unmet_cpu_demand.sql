-- Unmet CPU demand (Borg §6.2: throttled CPU), carried by every usage sample and kept with the
-- windows: per task window the sum of its samples' unmet demand (millicores; a one-second
-- sample's value is also its throttled CPU-seconds x 1000), per job histogram the mean over the
-- window of the summed unmet demand of its tasks (millicores; CPU rows, 0 for memory).
-- Windows written before this migration read as 0: nothing was measured then.
ALTER TABLE usage_task_windows ADD COLUMN cpu_unmet_sum_millicores double precision NOT NULL DEFAULT 0;
ALTER TABLE usage_job_histograms ADD COLUMN mean_total_unmet double precision NOT NULL DEFAULT 0;
