"""Values, in memory only: no files, no ttnn.

- `precision.py`: what each safetensors dtype becomes in the cache (the port's `.to(torch.bfloat16)`, bit for bit).
- `transforms.py`: source tensors -> target tensors (transposes, concatenations, head padding, slots).
- `kernels.py` (`kernels.c`): the tiling, packing, transpose and rounding loops in C, with numpy giving the same bits.
- `state_action.py`: a fine-tune's state normalization and action decoding, its trainer's arithmetic.
"""
