"""ttnn's side: what the device takes.

- `ttnn_edge.py`: ttnn itself, imported lazily: its environment, host tensors, numerics, upload to a device.
- `tensorbin.py`: ttnn's `.tensorbin` made in numpy, byte for byte `dump_tensor`'s.
- `host_tensors.py`: the convert stage: check a target's values and build its host tensor in the device dtype.
"""
