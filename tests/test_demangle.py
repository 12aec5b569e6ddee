"""Demangling: C++, Rust legacy and v0, suffixes, and names that are not mangled."""

import pytest

from processors.demangle import demangle


@pytest.mark.parametrize("mangled, readable", [
    ("_ZN2at6native3addERKNS_6TensorES3_RKN3c106ScalarE",
     "at::native::add(at::Tensor const&, at::Tensor const&, c10::Scalar const&)"),
    ("_Z6kernelPf", "kernel(float*)"),
    ("_ZN3foo3barEv.cold", "foo::bar() (.cold)"),
    ("_ZN3foo3barEv@@GLIBCXX_3.4", "foo::bar()@@GLIBCXX_3.4"),
    ("_ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::write"),
    ("_RNvCs15kBYyAo9fc_7mycrate4main", "mycrate::main"),
])
def test_mangled_names_become_readable(mangled, readable):
    assert demangle(mangled) == readable


@pytest.mark.parametrize("name", ["_PyEval_EvalFrameDefault", "__libc_start_main", "ampere_sgemm_128x64_tn",
                                  "void cutlass::Kernel<x>", "_Zgarbage", "", "[unknown] libc.so.6+0x10"])
def test_other_names_stay_as_they_are(name):
    assert demangle(name) == name
