"""fleetprof/collectives.py: NCCL kernels recognized by name, mangled or demangled, of every generation of names."""

from __future__ import annotations

import re

import pytest

from fleetprof.collectives import Collective, kernel_identifier, nccl_collective, nccl_label
from tests.nccl_kernel_names import NOT_NCCL, nccl_kernels


def test_reads_every_nccl_kernel_name():
    corpus = nccl_kernels()
    assert {name: nccl_collective(name) for name, _ in corpus} == {name: Collective(*e) for name, e in corpus}


def test_other_kernels_are_not_nccl():
    assert {name: nccl_collective(name) for name in NOT_NCCL} == dict.fromkeys(NOT_NCCL)
    assert [nccl_label(name) for name in NOT_NCCL] == NOT_NCCL


def test_the_corpus_covers_both_forms_and_every_generation():
    names = [name for name, _ in nccl_kernels()]
    assert len(names) == len(set(names))
    for prefix in ("ncclDevKernel_", "ncclKernel_", "ncclSymDevKernel_", "ncclSymkDevKernel_"):
        assert any(n.startswith(prefix) for n in names)
        assert any(re.match(f"_Z[0-9]+{prefix}", n) for n in names)


def test_labels_put_what_ran_before_the_kernel():
    mangled = "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"
    assert nccl_label(mangled) == "[nccl AllReduce float32] ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    assert nccl_label("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == \
        "[nccl AllGather] ncclDevKernel_AllGather_RING_LL"
    assert nccl_label("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)") == "[nccl] ncclDevKernel_Generic_4"
    assert nccl_label("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)") == \
        "[nccl SendRecv] ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"


def test_a_name_nccl_kernels_start_with_but_of_an_unknown_form_is_still_nccls():
    found = nccl_collective("ncclDevKernel_AllToAll_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    assert found == Collective("ncclDevKernel_AllToAll_Sum_f32_RING_LL", "", "", "", "", "")


@pytest.mark.parametrize(("name", "identifier"), [
    ("_Z3fooPKc", "foo"),
    ("_Z99ncclKernel_x", "ncclKernel_x"),  # a length past the end: the rest
    ("_Z12345678901ncclKernel_x", "ncclKernel_x"),
    ("void foo<int>(int)", "foo"),
    ("foo(int)", "foo"),
    ("(anonymous)", ""),
])
def test_kernel_identifier(name, identifier):
    assert kernel_identifier(name) == identifier
