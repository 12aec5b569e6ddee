"""Structured logs: one JSON object per line, exceptions included."""

import json
import logging

from fleetprof import logs


def test_json_lines_to_a_file(tmp_path):
    path = tmp_path / "logs" / "x.log"
    logs.configure("INFO", path)
    log = logging.getLogger("fleetprof.test")
    log.info("batch %d committed", 7)
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("failed")
    log.debug("not shown")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["level"], r["logger"], r["msg"]) for r in lines] == [
        ("info", "fleetprof.test", "batch 7 committed"), ("error", "fleetprof.test", "failed")]
    assert "ValueError: bad" in lines[1]["exc"]
    assert lines[0]["ts"].endswith("Z")
    logging.getLogger().handlers.clear()
