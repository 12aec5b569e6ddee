"""A sink killed inside an insert into its embedded store can leave the table's deduplication record without the
part (chDB writes the record, then renames the part into place). The batch's own token would then be dropped as a
duplicate of nothing; the sink finds the lost record and writes the rows once under a token of their own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from fleetprof.dedup_records import newest_record

ROOT = Path(__file__).resolve().parent.parent


def _step(step: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.dedup_scenario", step, str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_record_without_its_part_is_found_and_the_batch_is_stored_once(tmp_path: Path) -> None:
    first = _step("insert", tmp_path / "chdb")
    assert first["stored"] == 3 and first["lost"] is None and len(first["parts"]) == 1
    (part,) = first["parts"]
    table_dir = Path(first["data_path"])
    assert newest_record(table_dir / "deduplication_logs") == ("1", part)
    # what a process killed between the record and the rename leaves: the record, and no part
    shutil.rmtree(table_dir / part)
    after = _step("resume", tmp_path / "chdb")
    assert after["lost"] == part
    assert after["stored_with_own_token"] == 0  # the hazard: the batch's own token is dropped, the rows are gone
    assert after["token"] == f"cpu.samples:0:10-11:cpu_samples:after:{part}"
    assert after["stored_after_retry"] == 3
    assert after["lost_after_retry"] is None
    assert after["token_again"] == "cpu.samples:0:10-11:cpu_samples"
    assert after["stored_after_second_retry"] == 3  # the lost record drops the batch's own token: never twice


def test_the_newest_record_is_read_from_the_newest_log_file(tmp_path: Path) -> None:
    (tmp_path / "deduplication_log_2.txt").write_text("1\tall_1_1_0\tall_1_2\n1\tall_2_2_0\tall_3_4\n")
    (tmp_path / "deduplication_log_10.txt").write_text("1\tall_3_3_0\tall_5_6\n2\tall_3_3_0\tall_5_6\n")
    (tmp_path / "deduplication_log_11.txt").write_text("")  # just rotated
    assert newest_record(tmp_path) == ("2", "all_3_3_0")
    assert newest_record(tmp_path / "none") is None
