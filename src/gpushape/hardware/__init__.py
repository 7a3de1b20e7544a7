"""What the chip is: datasheet numbers, driver facts and calibrated measurements."""

from .alignment import align
from .catalog import CATALOG
from .lookup import current_gpu, get_gpu, known_names, normalize_name
from .profile import apply_profile, bundled_profile_path, calibrated, load_profile, read_profile
from .spec import DTYPES, Achievable, GPUSpec, SMLimits, dtype_key

__all__ = [
    "CATALOG",
    "DTYPES",
    "Achievable",
    "GPUSpec",
    "SMLimits",
    "align",
    "apply_profile",
    "bundled_profile_path",
    "calibrated",
    "current_gpu",
    "dtype_key",
    "get_gpu",
    "known_names",
    "load_profile",
    "normalize_name",
    "read_profile",
]
