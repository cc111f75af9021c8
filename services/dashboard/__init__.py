"""The dashboard: Autopilot's job page (§5.2, Figure 9), the cell, pending jobs, evaluation reports."""
