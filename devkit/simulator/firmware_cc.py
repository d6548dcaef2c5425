"""Stand-in for `riscv-tt-elf-g++` in the simulator's runtime root: firmware only, never a kernel.

tt-metal insists on its RISC-V compiler before it opens a device, and on the simulator it rebuilds the firmware
(its build key matches none of the wheel's pre-compiled sets). Tenstorrent's SFPI toolchain cannot be had here,
so this answers for the firmware build alone:
- `--version` prints the toolchain string the wheel was built with;
- `-x c++-header` (precompiled headers) is refused, and tt-metal goes on without them;
- a firmware compile (`-DFW_BUILD`) writes a small record of the flags that pick the firmware instead of code;
- a link of such records (with the wheel's start-up objects) copies the wheel's pre-compiled ELF for that
  architecture (`-mcpu=tt-wh` or `tt-bh`), core and L1 bank count to `-o`.
Anything else, that is any real kernel, exits 1 naming the missing toolchain: tt-metal must never believe it
compiled a kernel.
"""

import json
import os
import shutil
import sys
from pathlib import Path

TOOLCHAIN = "riscv-tt-elf-g++ (tenstorrent/sfpi:7.89.0[1050]) 15.1.0"
RECORD = "gr00t-tt firmware stand-in record\n"


def refuse(why: str) -> None:
    sys.stderr.write(f"riscv-tt-elf-g++ stand-in: {why}: Tenstorrent's SFPI toolchain (sfpi 7.89.0) is not "
                     "installed, so no device kernel can be compiled here; install it under runtime/sfpi or "
                     "/opt/tenstorrent/sfpi to run kernels on the simulator\n")
    sys.exit(1)


def main(args: list[str]) -> None:
    if "--version" in args:
        print(TOOLCHAIN)
        return
    if "-x" in args:
        refuse("precompiled headers are not built")
    if "-o" not in args:
        refuse(f"nothing to do for {' '.join(args)[:200]}")
    out = Path(args[args.index("-o") + 1])
    if "-c" in args:
        if "-DFW_BUILD" not in args:
            sources = [a for a in args if a.endswith((".cc", ".cpp", ".c", ".S"))]
            refuse(f"cannot compile kernel {sources[0] if sources else '?'}")
        banks = next((a.split("=", 1)[1] for a in args if a.startswith("-DNUM_L1_BANKS=")), None)
        mcpu = next((a.split("=", 1)[1] for a in args if a.startswith("-mcpu=")), None)
        out.write_text(RECORD + json.dumps({"num_l1_banks": banks, "mcpu": mcpu}))
        if "-MF" in args:  # tt-metal reads the dependency file it asked for
            Path(args[args.index("-MF") + 1]).write_text(f"{out}:\n")
        return
    inputs = [Path(a) for a in args if a.endswith(".o")]
    records = []
    for path in inputs:
        text = path.read_text(errors="replace") if path.is_file() else ""
        if text.startswith(RECORD):
            records.append(json.loads(text[len(RECORD):]))
        elif "/runtime/hw/lib/" not in str(path):  # the wheel's start-up objects are linked into firmware too
            refuse(f"cannot link {path} (not firmware)")
    if not records:
        refuse(f"cannot link {out.name} (no firmware objects)")
    core = out.parent.name  # tt-metal builds each core's firmware in a folder named for the core
    table = json.loads(Path(os.environ["GR00T_FIRMWARE_SETS"]).read_text())
    banks, mcpu = records[0]["num_l1_banks"], str(records[0].get("mcpu"))
    arch = next((a for a in table["sets"] if mcpu.startswith(a)), mcpu)  # tt-wh-tensix (a trisc) is tt-wh firmware
    chosen = table["sets"].get(arch, {}).get(str(banks))
    elf = Path(table["precompiled"]) / str(chosen) / core / f"{core}.elf"
    if chosen is None or not elf.is_file():
        refuse(f"no pre-compiled {core} firmware for -mcpu={mcpu} and {banks} L1 banks in the ttnn wheel")
    shutil.copyfile(elf, out)


if __name__ == "__main__":
    main(sys.argv[1:])
