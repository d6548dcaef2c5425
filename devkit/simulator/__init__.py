"""A simulated Wormhole and Blackhole for the device tests: Tenstorrent's open-source ttsim, built from its source
tarball (`wh`: an N150, `wh_x2`: an N300, `bh`: a P150, the N1.6 port's own board).

tt-metal talks to `libttsim.so` instead of a PCIe card when `TT_METAL_SIMULATOR` names it. What it needs besides
(../shared/reference/simulated-device.md): a `soc_descriptor.yaml` beside the library, slow dispatch, no mock
cluster descriptor, and a runtime root laid out like the ttnn wheel's package data plus a RISC-V compiler at
`runtime/sfpi/compiler/bin/riscv-tt-elf-g++`. No SFPI toolchain can be had here, so that compiler is our
firmware stand-in (`firmware_cc.py`): it hands tt-metal the wheel's pre-compiled firmware and refuses every
real kernel, so uploads and readbacks run and anything that needs a kernel fails loudly.

`python -m devkit.simulator build` (run by `make test`) builds what is missing into `build/ttsim/` and says what it
did. `TT_METAL_SIMULATOR` set by the user wins over the built one.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "ttsim"
SOURCE_TARBALL = Path(os.environ.get("GR00T_TTSIM_SOURCE", ROOT.parent / "shared" / "vendor" / "ttsim-1.10.0-src.tar.gz"))
CONFIGS = ("wh", "wh_x2", "bh")      # a Wormhole N150, the two-chip N300, a Blackhole P150
SOC_DESCRIPTORS = {"wh": "wormhole_b0_80_arch.yaml", "wh_x2": "wormhole_b0_80_arch.yaml", "bh": "blackhole_140_arch.yaml"}
# The firmware each architecture's pre-compiled sets hold, and the `-mcpu` tt-metal compiles them for.
FIRMWARE_CORES = {"tt-wh": ("brisc", "ncrisc", "trisc0", "trisc1", "trisc2", "erisc", "idle_erisc"),
                  "tt-bh": ("brisc", "ncrisc", "trisc0", "trisc1", "trisc2", "drisc", "active_erisc", "idle_erisc",
                            "subordinate_active_erisc", "subordinate_idle_erisc")}


def _ttnn_package() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("ttnn")
    if spec is None or spec.origin is None:
        raise RuntimeError("ttnn is not installed in this Python")
    return Path(spec.origin).parent


def library(config: str = "wh") -> Path:
    return BUILD / config / "libttsim.so"


def build(config: str = "wh", log=print) -> Path | None:
    """Build `libttsim.so` for `config` from the source tarball unless it is there; None without the tarball."""
    lib = library(config)
    if lib.is_file():
        return lib
    if not SOURCE_TARBALL.is_file():
        return None
    src = BUILD / "src"
    if not (src / "make.py").is_file():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        with tarfile.open(SOURCE_TARBALL) as tar:
            top = tar.getmembers()[0].name.split("/")[0]
            tar.extractall(src.parent / "extract", filter="data")
        (src.parent / "extract" / top).rename(src)
        shutil.rmtree(src.parent / "extract", ignore_errors=True)
    target = f"src/_out/release_{config}/libttsim.so"
    log(f"simulator: building {config} libttsim.so from {SOURCE_TARBALL.name} (about 30 s)")
    done = subprocess.run([sys.executable, "make.py", f"-j{os.cpu_count() or 2}", target], cwd=src,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building {target} in {src} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    lib.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / target, lib)
    shutil.copyfile(_ttnn_package() / "tt_metal" / "soc_descriptors" / SOC_DESCRIPTORS[config],
                    lib.parent / "soc_descriptor.yaml")
    log(f"simulator: built {lib}")
    return lib


def _symbol_size(elf: bytes, name: bytes) -> int | None:
    """st_size of a symbol in a 32-bit little-endian ELF (the RISC-V firmware), read from its symbol table."""
    shoff, = struct.unpack_from("<I", elf, 0x20)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x2E)
    sections = [struct.unpack_from("<10I", elf, shoff + i * shentsize) for i in range(shnum)]
    for sh in sections:
        if sh[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4], sh[4] + sh[5], 16):
            st_name, _, st_size = struct.unpack_from("<III", elf, off)
            start = strtab[4] + st_name
            if elf[start:elf.index(b"\0", start)] == name:
                return st_size
    return None


def firmware_sets(precompiled: Path) -> dict[str, dict[str, str]]:
    """-mcpu (tt-wh, tt-bh) -> NUM_L1_BANKS -> one pre-compiled firmware set built for it. Sets of one architecture
    and bank count differ only in build paths (their code and data are byte-identical), so any one serves."""
    sets: dict[str, dict[str, str]] = {mcpu: {} for mcpu in FIRMWARE_CORES}
    for folder in sorted(precompiled.iterdir()):
        brisc = folder / "brisc" / "brisc.elf"
        if not brisc.is_file():
            continue
        elf = brisc.read_bytes()
        mcpu = next((m for m in FIRMWARE_CORES if f"-mcpu={m}".encode() in elf), None)
        if mcpu is None or not all((folder / c / f"{c}.elf").is_file() for c in FIRMWARE_CORES[mcpu]):
            continue
        size = _symbol_size(elf, b"bank_to_l1_offset")
        if size:
            sets[mcpu].setdefault(str(size // 4), folder.name)  # the table holds one 32-bit offset per L1 bank
    return sets


def runtime_root() -> Path:
    """The TT_METAL_RUNTIME_ROOT tt-metal starts from: the wheel's package data by symlink (the venv is never
    modified) and the firmware stand-in where tt-metal looks for its compiler."""
    package = _ttnn_package()
    root = BUILD / "runtime"
    for name, target in (("tt_metal", package / "tt_metal"), ("ttnn", package / "ttnn"),
                         ("runtime/hw", package / "runtime" / "hw")):
        link = root / name
        if not (link.is_symlink() and Path(os.readlink(link)) == target):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    bin_dir = root / "runtime" / "sfpi" / "compiler" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    table = bin_dir / "firmware-sets.json"
    wanted = json.dumps({"precompiled": str(package / "tt_metal" / "pre-compiled"),
                         "sets": firmware_sets(package / "tt_metal" / "pre-compiled")})
    if not table.is_file() or table.read_text() != wanted:  # another wheel, or a table of an older layout
        table.write_text(wanted)
    compiler = bin_dir / "riscv-tt-elf-g++"
    script = (f'#!/bin/sh\nGR00T_FIRMWARE_SETS="{table}" exec "{sys.executable}" '
              f'"{Path(__file__).parent / "firmware_cc.py"}" "$@"\n')
    if not compiler.is_file() or compiler.read_text() != script:
        compiler.write_text(script)
        compiler.chmod(0o755)
    return root


def unavailable_reason(config: str = "wh") -> str | None:
    """Why no simulated `config` can be had here, or None when one can."""
    if config == "wh" and os.environ.get("TT_METAL_SIMULATOR"):
        return None if Path(os.environ["TT_METAL_SIMULATOR"]).is_file() else \
            f"TT_METAL_SIMULATOR={os.environ['TT_METAL_SIMULATOR']} is not a file"
    if library(config).is_file() or SOURCE_TARBALL.is_file():
        return None
    return (f"no simulator: neither TT_METAL_SIMULATOR nor the ttsim source ({SOURCE_TARBALL}) is present; "
            f"download libttsim_{config}.so from github.com/tenstorrent/ttsim/releases and point TT_METAL_SIMULATOR "
            "at it")


def environment(config: str = "wh", log=print) -> dict[str, str] | None:
    """The variables that make tt-metal open the simulated `config` (None when it cannot be had). A user's
    TT_METAL_SIMULATOR stands for the Wormhole: the other configurations are always the ones built here."""
    if unavailable_reason(config) is not None:
        return None
    user = os.environ.get("TT_METAL_SIMULATOR") if config == "wh" else None
    lib = Path(user) if user else build(config, log)
    if lib is None:
        return None
    return {"TT_METAL_SIMULATOR": str(lib), "TT_METAL_SLOW_DISPATCH_MODE": "1",
            "TT_METAL_RUNTIME_ROOT": f"{runtime_root()}/", "TT_METAL_CACHE": str(BUILD / "jit-cache" / config),
            "TT_METAL_LOGS_PATH": str(BUILD / "logs")}  # else tt-metal writes generated/ into the working folder


def use(environ: dict | os._Environ, config: str = "wh") -> bool:
    """Point this process's ttnn at the simulated `config` (before ttnn is imported). False when none can be had,
    or when GR00T_TEST_SIMULATOR=0 asks for the mock cluster only."""
    if environ.get("GR00T_TEST_SIMULATOR") == "0":
        return False
    env = environment(config)
    if env is None:
        return False
    environ.pop("TT_METAL_MOCK_CLUSTER_DESC_PATH", None)  # a mock cluster would hide the simulator
    environ.update(env)
    return True
