"""What a GPU profile shows besides node, process and collectives: kernels or memory copies and sets (`what`), and
the NVTX ranges they were launched under (`nvtx_range`), for `fleetprof query --kind gpu`, the API and the UI.

The SQL of the GPU queries (sql/queries/gpu_kernel_samples_by_stack.sql and those that share its filters) applies
both; this module holds the choices and the range rule in Python, the one the tests hold the SQL to."""

from __future__ import annotations

from schemas.wire import COPY_LABEL_PREFIXES

WHAT_CHOICES = ("all", "kernels", "copies")
RANGE_SEPARATOR = " > "  # between the ranges of a path, the outermost first, as the shim writes it


def is_copy(kernel_name: str) -> bool:
    """A memory copy's or set's label, not a kernel's name."""
    return kernel_name.startswith(COPY_LABEL_PREFIXES)


def nvtx_range_matches(path: str, wanted: str) -> bool:
    """Whether GPU time launched under the range path `path` passes the filter `wanted` ('' passes everything):
    without ' > ', `wanted` names one range and matches a path that holds it anywhere ('forward' matches 'step 3 >
    forward' and 'forward > attention'); with ' > ', it matches a path that starts with those whole ranges ('step 3 >
    forward' matches 'step 3 > forward > attention', not 'step 3 > forward2'). Names compare whole and exactly."""
    if not wanted:
        return True
    if RANGE_SEPARATOR not in wanted:
        return wanted in path.split(RANGE_SEPARATOR)
    return path == wanted or path.startswith(wanted + RANGE_SEPARATOR)


def nvtx_frames(path: str) -> list[str]:
    """The flame graph frames of a range path at the NVTX level: '[nvtx] <range>' each, the outermost first."""
    return [f"[nvtx] {name}" for name in path.split(RANGE_SEPARATOR)] if path else []
