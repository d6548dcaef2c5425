"""The model: what each GR00T version is (configs/<version>.toml read into a `VersionConfig`: `versions.py`), the
state dict it has, key by key with shapes and dimensions (`state_dict.py`), and the plan that turns its tensors into
device targets for a layout and dtype profile (`recipe.py`, configs/recipes.toml). Nothing here reads a checkpoint or
writes a file: given a version and the shapes a checkpoint holds, it answers what the targets are."""
