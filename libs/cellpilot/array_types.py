"""The numpy array types the core's signatures name: one alias per element type."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]
Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
Int8Array = npt.NDArray[np.int8]
IntpArray = npt.NDArray[np.intp]
BoolArray = npt.NDArray[np.bool_]
