"""`fleetprof symbolize --elf PATH ADDR...`: the function containing each ELF virtual address, one per line.

It goes through the same path as the processors (SymbolChunk records -> processors.symbol_tables.SymbolTable ->
vectorized lookup), so it is the symbolizer's own test surface against eu-addr2line and nm. A stripped file (no
.symtab) is named from its debuginfo when DEBUGINFOD_URLS names a server that has it, as the symbolizer does.
"""

from __future__ import annotations

import click
import numpy as np

from processors.debuginfod import DebuginfodClient
from processors.symbol_tables import SymbolTable, table_from_chunks
from producers.elf_symbols import ElfError, ElfSymbols, read_elf_symbols, symbol_chunks
from schemas.wire import U64_MAX


def parse_address(text: str) -> int:
    """A hex address, with or without 0x; ValueError with the reason otherwise."""
    digits = text.strip().lower()
    digits = digits[2:] if digits.startswith("0x") else digits
    if not digits or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"not a hex address: {text!r}")
    value = int(digits, 16)
    if value > U64_MAX:
        raise ValueError(f"address does not fit in 64 bits: {text!r}")
    return value


def describe(table: SymbolTable, addrs: list[int], offsets: bool = False) -> list[str]:
    """For each virtual address the containing function (`name` or `name+0x<off>`), or `??`."""
    vaddrs = np.array(addrs, dtype=np.uint64)
    found = table.lookup(vaddrs).tolist()
    out = []
    for addr, i in zip(addrs, found, strict=True):
        if i < 0:
            out.append("??")
        elif offsets:
            out.append(f"{table.names[i]}+0x{addr - int(table.starts[i]):x}")
        else:
            out.append(table.names[i])
    return out


def from_debuginfod(syms: ElfSymbols) -> SymbolTable | None:
    """The table of syms' debuginfo from DEBUGINFOD_URLS, or None; one line on stderr says which, or why not."""
    try:
        client = DebuginfodClient.from_env()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if client is None:
        return None
    own = f"its own {syms.section}" if syms.section else "no symbols"
    if syms.fallback_id:
        click.echo(f"debuginfod: {syms.path} has no GNU build id to ask for; using {own}", err=True)
        return None
    try:
        # the file's own segments: a debuginfo file's program headers carry no file offsets
        got = client.fetch(syms.build_id, syms.binary, (syms.seg_offsets, syms.seg_vaddrs, syms.seg_memsz))
    finally:
        client.close()
    if got.table is None:
        click.echo(f"debuginfod: no debuginfo for build id {syms.build_id} ({got.reason}); using {own}", err=True)
    else:
        click.echo(f"debuginfod: using the debuginfo of build id {syms.build_id} from {got.url} "
                   f"({len(got.table)} functions)", err=True)
    return got.table


# unknown "options" are addresses gone wrong (-1, --0x10): they get the one-line hex error, not a usage screen
@click.command("symbolize", context_settings={"ignore_unknown_options": True})
@click.option("--elf", "elf_path", required=True, type=click.Path(dir_okay=False),
              help="ELF file whose .symtab (else .dynsym) names the addresses.")
@click.option("--offsets", is_flag=True, help="Append +0x<offset> into the function.")
@click.option("--no-debuginfod", is_flag=True,
              help="Use only the file itself, even when it has no .symtab and DEBUGINFOD_URLS is set.")
@click.argument("addrs", nargs=-1, required=True)
def symbolize(elf_path: str, offsets: bool, no_debuginfod: bool, addrs: tuple[str, ...]) -> None:
    """Print the function containing each ELF virtual ADDR (hex), one per line; `??` when none does. A stripped
    file's debuginfo is fetched by build id from the servers in DEBUGINFOD_URLS (space separated) when set."""
    try:
        values = [parse_address(a) for a in addrs]
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        syms = read_elf_symbols(elf_path)
    except ElfError as exc:
        raise click.ClickException(str(exc)) from None
    table = from_debuginfod(syms) if syms.section != ".symtab" and not no_debuginfod else None
    if table is None:
        table = table_from_chunks(symbol_chunks(syms))
    click.echo("\n".join(describe(table, values, offsets)))
