"""A sink killed inside an insert into its embedded store can leave the table's deduplication record without the
part (chDB writes the record, then renames the part into place). The batch's own token would then be dropped as a
duplicate of nothing; the sink finds the lost record and writes the rows once under a token of their own."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert after["repaired"] == [f"cpu_samples (part {part})"]  # under a token of its own, its views detached
    assert after["stored_after_retry"] == 3
    assert after["lost_after_retry"] is None
    assert after["repaired_again"] == []
    assert after["stored_after_second_retry"] == 3  # the lost record drops the batch's own token: never twice
    assert after["rollup"] == 3  # its view's part was there: the repair did not reach it


def test_the_newest_record_is_read_from_the_newest_log_file(tmp_path: Path) -> None:
    (tmp_path / "deduplication_log_2.txt").write_text("1\tall_1_1_0\tall_1_2\n1\tall_2_2_0\tall_3_4\n")
    (tmp_path / "deduplication_log_10.txt").write_text("1\tall_3_3_0\tall_5_6\n2\tall_3_3_0\tall_5_6\n")
    (tmp_path / "deduplication_log_11.txt").write_text("")  # just rotated
    assert newest_record(tmp_path) == ("2", "all_3_3_0")
    assert newest_record(tmp_path / "none") is None


def test_a_views_record_without_its_part_is_repaired_through_that_view_alone(tmp_path: Path) -> None:
    """Cut between a view target's record and its part (the source's part is there: it is written first), the
    batch's own token stores nothing anywhere; the sink's retry pushes the rows through that view alone, once, for
    a plain view (the hourly rollup) and an aggregating one (the 10 s NVML tier)."""
    first = _step("views", tmp_path / "chdb")
    whole = {"cpu_samples": 3, "cpu_samples_1h": 3, "gpu_device_metrics": 1, "gpu_device_metrics_10s": 1}
    assert {t: first["counts"][t] for t in whole} == whole
    for target in ("cpu_samples_1h", "gpu_device_metrics_10s"):
        (part,) = first[target]["parts"]
        shutil.rmtree(Path(first[target]["data_path"]) / part)  # the record stays
    after = _step("resume_views", tmp_path / "chdb")
    rollup, tier = first["cpu_samples_1h"]["parts"][0], first["gpu_device_metrics_10s"]["parts"][0]
    assert after["cut"] == {"cpu_samples": [["cpu_samples_1h_mv", "cpu_samples_1h", rollup]],
                            "gpu_device_metrics": [["gpu_device_metrics_10s_mv", "gpu_device_metrics_10s", tier]]}
    hazard = {"cpu_samples": 3, "cpu_samples_1h": 0, "gpu_device_metrics": 1, "gpu_device_metrics_10s": 0}
    assert {t: after["own_tokens"][t] for t in hazard} == hazard
    for attempt in ("retry", "retry_again"):
        assert {t: after[attempt][t] for t in whole} == whole, attempt
        assert after[attempt]["tables"] == first["counts"]["tables"]  # no replay table or view left behind
    assert after["cut_after"] == {"cpu_samples": [], "gpu_device_metrics": []}


def _killed_at_rename(n: int, path: Path) -> None:
    """The `views` step killed (SIGKILL, strace's fault injection) as it enters its n-th rename: the part that rename
    would have put in place stays a temporary directory, its deduplication record written. The step's renames are
    its four parts' in order: cpu_samples, cpu_samples_1h, gpu_device_metrics, gpu_device_metrics_10s."""
    renames = "rename,renameat,renameat2"
    done = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={renames}",
                           "-e", f"inject={renames}:error=EIO:signal=KILL:when={n}",
                           sys.executable, "-m", "tests.dedup_scenario", "views", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]


@pytest.mark.parametrize(("rename", "cut", "hazard"), [
    (1, {}, {"cpu_samples": 0, "cpu_samples_1h": 3, "gpu_device_metrics": 1, "gpu_device_metrics_10s": 1}),
    (2, {"cpu_samples": "cpu_samples_1h"},
     {"cpu_samples": 3, "cpu_samples_1h": 0, "gpu_device_metrics": 1, "gpu_device_metrics_10s": 1}),
    (4, {"gpu_device_metrics": "gpu_device_metrics_10s"},
     {"cpu_samples": 3, "cpu_samples_1h": 3, "gpu_device_metrics": 1, "gpu_device_metrics_10s": 0}),
], ids=["source", "rollup", "nvml-tier"])
def test_a_sink_killed_at_a_parts_rename_stores_the_batch_once_everywhere(
        tmp_path: Path, rename: int, cut: dict[str, str], hazard: dict[str, int]) -> None:
    """A real death at each kind of rename: the source's (its views never ran), a plain view's target's and an
    aggregating one's. The batch's own tokens alone (what the sink wrote before) leave a hole; the sink's attempt
    fills it, and a further attempt adds nothing."""
    _step("migrate", tmp_path / "chdb")
    _killed_at_rename(rename, tmp_path / "chdb")
    after = _step("resume_views", tmp_path / "chdb")
    assert {t: [target for _, target, _ in views] for t, views in after["cut"].items() if views} == \
        {t: [target] for t, target in cut.items()}
    assert {t: after["own_tokens"][t] for t in hazard} == hazard
    whole = {"cpu_samples": 3, "cpu_samples_1h": 3, "gpu_device_metrics": 1, "gpu_device_metrics_10s": 1}
    for attempt in ("retry", "retry_again"):
        assert {t: after[attempt][t] for t in whole} == whole, attempt
    assert not any(name.endswith("_replay") for name in after["retry"]["tables"])
