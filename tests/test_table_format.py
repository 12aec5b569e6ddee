"""Result tables for people (fleetprof/table_format.py): cells by column name, whole at their natural width in a
pipe, cut with an ellipsis (never folded mid-word) at a terminal's width."""

from __future__ import annotations

import pytest

from fleetprof.table_format import column_formatter, duration_ns, percent, print_table, render_table, table_cells

LONG = "std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*>)"
HEADERS = ["time (UTC)", "function", "binary", "self", "self %"]
CELLS = [["2025-01-02 03:04:05.250", LONG, "/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "12345", "12.3%"],
         ["2025-01-02 03:04:05.250", "main", "app", "5", "0.0%"]]
RIGHT = [False, False, False, True, True]
WHOLE = [True, False, False, False, False]


@pytest.mark.parametrize("ns, text", [
    (0, "0 ns"), (850, "850 ns"), (12_500, "12.5 µs"), (1_234_000, "1.234 ms"), (999_000_000, "999 ms"),
    (2_500_000_000, "2.5 s"), (750 * 10**9, "12.5 min"), (int(3.2 * 3600 * 10**9), "3.2 h"),
    (12_345 * 3600 * 10**9, "12,345 h"), (1.5e6, "1.5 ms"),
])
def test_durations(ns, text):
    assert duration_ns(ns) == text


def test_percentages():
    assert [percent(x) for x in (0, 0.123, 0.0005, 1, 1.5)] == ["0.0%", "12.3%", "0.1%", "100.0%", "150.0%"]


@pytest.mark.parametrize("name", ["ns", "duration_ns", "gpu_ns", "kernel_ns", "all_ns"])
def test_nanosecond_columns_by_name(name):
    show = column_formatter(name)
    assert [show(v) for v in (1_234_000, None, "n/a", True)] == ["1.234 ms", "", "n/a", "True"]


@pytest.mark.parametrize("name", ["share", "ratio", "cpu_share", "hit_ratio"])
def test_share_columns_by_name(name):
    show = column_formatter(name)
    assert [show(v) for v in (0.123, 0, None, "x")] == ["12.3%", "0.0%", "", "x"]


@pytest.mark.parametrize("name", ["nsamples", "ns_total", "shares", "snapshot", "ratios", "samples", "self"])
def test_other_columns_stay_raw(name):
    show = column_formatter(name)
    assert [show(v) for v in (1_234_000, 0.5, None, [1, 2], {"a": "é"})] == ["1234000", "0.5", "", "[1, 2]",
                                                                            '{"a": "é"}']


def test_cells_and_alignment_of_a_raw_result():
    cells, right = table_cells(["kernel", "gpu_ns", "share", "launches"],
                               [["gemm", 2_500_000_000, 0.75, 3], ["copy", None, 0.25, 1]])
    assert cells == [["gemm", "2.5 s", "75.0%", "3"], ["copy", "", "25.0%", "1"]]
    assert right == [False, True, True, True]


def test_natural_width_keeps_every_value_whole():
    w = len(LONG)
    assert render_table(HEADERS, CELLS, RIGHT, WHOLE) == (
        f"time (UTC)               {'function'.ljust(w)}  binary                                     self  self %\n"
        f"{'─' * (w + 82)}\n"
        f"2025-01-02 03:04:05.250  {LONG}  /usr/lib/x86_64-linux-gnu/libstdc++.so.6  12345   12.3%\n"
        f"2025-01-02 03:04:05.250  {'main'.ljust(w)}  app                                           5    0.0%\n")


def test_a_narrow_terminal_cuts_text_with_an_ellipsis_one_line_a_row():
    text = render_table(HEADERS, CELLS, RIGHT, WHOLE, width=80)
    assert text == (
        "time (UTC)               function             binary                self  self %\n"
        "────────────────────────────────────────────────────────────────────────────────\n"
        "2025-01-02 03:04:05.250  std::vector<int, s…  /usr/lib/x86_64-li…  12345   12.3%\n"
        "2025-01-02 03:04:05.250  main                 app                      5    0.0%\n")
    # no word is folded onto a second line: every row is one line, and a cut is marked
    assert len(text.splitlines()) == 4 and all(len(line) <= 80 for line in text.splitlines())


def test_a_pipe_gets_the_natural_width_whatever_columns_says(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    print_table(HEADERS, CELLS, RIGHT, WHOLE)
    assert capsys.readouterr().out == render_table(HEADERS, CELLS, RIGHT, WHOLE)


def test_markup_like_text_is_kept_and_no_columns_print_nothing(capsys):
    print_table(["function", "binary"], [["[unknown] 0x10", "[kernel.kallsyms]"]], [False, False])
    assert capsys.readouterr().out == ("function        binary\n"
                                       "─────────────────────────────────\n"
                                       "[unknown] 0x10  [kernel.kallsyms]\n")
    print_table([], [], [])
    assert capsys.readouterr().out == ""
