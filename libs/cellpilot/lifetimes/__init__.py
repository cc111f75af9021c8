"""VM lifetime prediction (LAVA §3): features, uptime-expanded training examples, a LightGBM
model of the remaining lifetime given the uptime, its accuracy metrics, and predictors."""
