"""Which Tenstorrent device a command uses (`--device none|auto|<id>`): opened, said on stderr, and closed on every
exit path. The choosing is here; ttnn itself is tasks/device/ttnn_edge.py."""

from __future__ import annotations

import contextlib
import sys

from tasks.device import ttnn_edge as tt
from tasks.entries.names import is_whole_number
from tasks.errors import PipelineError


@contextlib.contextmanager
def opened_device(choice: str):
    """`none`: host only; `auto`: every device present (a mesh; silicon or a simulator), else host only, saying
    which on stderr; an id: that device or an error. The device is closed on every exit path."""
    if choice == "auto":
        print(f"--device auto: {tt.describe_devices() if tt.device_present() else 'no device: host only'}",
              file=sys.stderr)
    if choice == "none" or (choice == "auto" and not tt.device_present()):
        yield None
        return
    if not tt.device_present():
        raise PipelineError(f"--device {choice}: no Tenstorrent device on this machine (/dev/tenstorrent is absent "
                            f"and {tt.SIMULATOR_ENV} is not set); use --device none or auto")
    if choice != "auto" and not is_whole_number(choice):
        raise PipelineError(f"--device {choice!r} is not none, auto or a device id (0, 1, ...)")
    try:
        dev = tt.open_device(None if choice == "auto" else int(choice))
    except RuntimeError as e:  # tt-metal's TT_THROW: the first line after "info:" is its reason
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        reason = lines[lines.index("info:") + 1] if "info:" in lines[:-1] else lines[0] if lines else "unknown error"
        raise PipelineError(f"--device {choice}: the Tenstorrent device could not be opened ({reason[:200]}); check "
                            "the driver (tt-smi) or the simulator set-up, or use --device none") from None
    try:
        print(f"--device {choice}: opened {tt.describe_opened(dev)}", file=sys.stderr)
        yield dev
    finally:
        tt.close_device(dev)
