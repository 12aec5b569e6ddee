"""The web UI: GPU metric charts, CPU and GPU-time flame graphs of a selected time range, diffs and exports.

`fleetprof up` serves it at its API address; `fleetprof ui` serves it against any store. The page is plain JS
modules under static/ (no build step); routes.py holds its JSON endpoints, model.py the shapes they return.
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
