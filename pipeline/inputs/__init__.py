"""The input: finding the checkpoint a command names (`snapshot.py`: a folder, a file, an object-store prefix, the
Hugging Face cache or the hub), and reading once what its folder says about itself (`folder.py`, one record put
together from `tensors.py`: the version its keys are, their dtypes and shapes, tied tables; and
`trainer_files.py`: which files are the weights, the trained embodiments and the trainer's own tag map). The
embodiment selection in the user's words (`embodiments.py`), and the synthetic stand-ins and fine-tune forms the
tests and the demo convert (`synth.py`). Each trainer's rules live in `trainer_files.py` and nowhere else."""
