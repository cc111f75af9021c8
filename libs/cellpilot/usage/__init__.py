"""Usage signals: bucket schemes, window histograms and their aggregation (Autopilot §3.2.1).

* :mod:`cellpilot.usage.buckets`: the fixed CPU and memory bucket schemes (``BucketScheme``).
* :mod:`cellpilot.usage.histogram`: one window histogram, dense or sparse, and its bytes.
* :mod:`cellpilot.usage.windows`: batch builders from raw (task, time, value) samples,
  per-job sums and the merging of partial windows.

Pure numpy, no I/O; event time (ms) is always passed in.
"""

from cellpilot.usage.buckets import (
    CPU_SCHEME,
    KNOWN_SCHEMES,
    MEMORY_SCHEME,
    BucketScheme,
    Resource,
    default_scheme,
    geometric_scheme,
    lookup_scheme,
)
from cellpilot.usage.histogram import (
    DEFAULT_WINDOW_MS,
    Histogram,
    SparseHistogram,
    stack_counts,
    sum_histograms,
)
from cellpilot.usage.windows import (
    SignalKind,
    WindowBatch,
    build_job_windows,
    build_task_windows,
    concat_windows,
    merge_partial_windows,
    signal_kind,
    sum_by_group,
    window_starts,
)

__all__ = [
    "CPU_SCHEME",
    "DEFAULT_WINDOW_MS",
    "KNOWN_SCHEMES",
    "MEMORY_SCHEME",
    "BucketScheme",
    "Histogram",
    "Resource",
    "SignalKind",
    "SparseHistogram",
    "WindowBatch",
    "build_job_windows",
    "build_task_windows",
    "concat_windows",
    "default_scheme",
    "geometric_scheme",
    "lookup_scheme",
    "merge_partial_windows",
    "signal_kind",
    "stack_counts",
    "sum_by_group",
    "sum_histograms",
    "window_starts",
]
