"""The world model (docs/architecture.md rule 12): what tasks demand and what their machines let
them use — usage models, a job's demand shared among its ready tasks by a load balancer, the
machine's CPU sharing and limit enforcement (Borg §6.2), and the step that runs them together.

One model drives the Borglet's simulated runtime and the studies; it sits below the Borg
logic, which validates specs against it, and below the workload generators, which draw from it.
"""
