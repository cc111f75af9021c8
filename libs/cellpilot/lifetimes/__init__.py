"""VM lifetime prediction (LAVA §3): the VM table it reads, features, uptime-expanded training
examples, a LightGBM model of the remaining lifetime given the uptime, lifetime distributions,
the §4.3 lifetime classes, accuracy metrics and predictors.

Placement that uses the predictions is :mod:`cellpilot.schedule.lifetime_aware`, one layer up;
the study that replays both is :mod:`cellpilot.evaluate.lava_study`. Nothing here imports
either."""
