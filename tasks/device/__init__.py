"""ttnn's side: what the device takes.

- `ttnn_edge.py`: ttnn itself, imported lazily: its environment, host tensors, numerics, upload to a device.
- `tensorbin.py`: ttnn's `.tensorbin` made in numpy, byte for byte `dump_tensor`'s.
- `one_file.py`: cache format 7's tiled chunk, one file that is a target's `.tensorbin` and its Zarr chunk at once.
- `host_tensors.py`: the convert stage: check a target's values and build its host tensor in the device dtype.
"""

from tasks.old_paths import names_moved

# 0.2.0's module `tasks.device` is this room now: its names, from where they live (deprecated, CHANGELOG.md)
_TTNN_EDGE = (
    "MOCK_DESCRIPTOR", "MOCK_ENV", "SIMULATOR_ENV", "QUIET_ENV", "TILE", "hardware_present",
    "simulator_present", "device_present", "describe_devices", "describe_opened", "configure_ttnn_env",
    "ttnn_module", "to_host_tensor", "packed_bytes", "load_packed", "mapped_files", "padded_shape", "Numerics",
    "PCC_BLOCK", "pcc", "pcc_from_sums", "host_numerics", "open_device", "mesh_size", "upload_array",
    "close_device", "Uploaded", "upload_staged",
)
__getattr__ = names_moved("tasks.device", dict.fromkeys(_TTNN_EDGE, "tasks.device.ttnn_edge"))
