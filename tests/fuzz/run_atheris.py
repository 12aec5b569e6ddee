"""Coverage-guided fuzzing campaigns with atheris (libFuzzer for Python), for running by hand:

    .venv/bin/python tests/fuzz/run_atheris.py TARGET [WORK_DIR] [libFuzzer flags, e.g. -max_total_time=300]

TARGET is one of tests/fuzz/targets.py's TARGETS (avro, decode_message, columnar, elf, unwind, perf_map,
kallsyms, demangle, stage_symbolize, stage_correlate, stage_alerts). The checked-in seeds of
tests/fuzz/corpus/<target>/ are read, never written: inputs found to reach new code go to WORK_DIR (default: a
temporary directory), and a crash is saved by libFuzzer as crash-<sha1> in the current directory; replay one with
`TARGET crash-<sha1>`. Copy small, interesting finds into the corpus folder to keep them as regression seeds.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports(include=["schemas", "processors", "producers", "elftools", "fastavro"]):
    # every module a target reaches, imported here so that it is instrumented (targets import some lazily)
    import processors.alerts_stage  # noqa: F401
    import processors.correlate_stage  # noqa: F401
    import processors.demangle  # noqa: F401
    import processors.runner  # noqa: F401
    import processors.symbolize_stage  # noqa: F401
    import producers.elf_symbols  # noqa: F401
    import producers.kallsyms  # noqa: F401
    import producers.perf_map  # noqa: F401
    import producers.unwind_tables  # noqa: F401
    from tests.fuzz import targets


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in targets.TARGETS:
        raise SystemExit(f"usage: run_atheris.py TARGET [WORK_DIR] [libFuzzer flags]; targets: "
                         f"{', '.join(targets.TARGETS)}")
    name, rest = sys.argv[1], sys.argv[2:]
    check = targets.TARGETS[name]
    seeds = targets.CORPUS / name
    replay = [a for a in rest if not a.startswith("-") and Path(a).is_file()]
    if replay:  # replay crash files: libFuzzer runs each once
        args = [sys.argv[0], *rest]
    else:
        dirs = [a for a in rest if not a.startswith("-")]
        work = dirs[0] if dirs else tempfile.mkdtemp(prefix=f"fuzz-{name}-")
        flags = [a for a in rest if a.startswith("-")]
        if not any(f.startswith("-max_len=") for f in flags):
            flags.append("-max_len=65536" if name in ("elf", "unwind", "stage_symbolize") else "-max_len=8192")
        args = [sys.argv[0], *flags, work, *([str(seeds)] if seeds.is_dir() else [])]
        print(f"fuzzing {name}: new inputs in {work}", file=sys.stderr)

    def one_input(data: bytes) -> None:
        check(data)

    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
