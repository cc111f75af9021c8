"""Lifetime-aware VM placement (LAVA paper): LA-Binary, LAS, LAVA and LARS over a numpy host pool,
plus adapters that plug LAS and LAVA into the Borg scheduler's lexicographic scoring."""
