"""The input: finding the checkpoint a command names (`snapshot.py`: a folder, a file, an object-store prefix, the
Hugging Face cache or the hub), reading once what its folder says about itself (`folder.py`: which files are the
weights, the version, the trained embodiments and the trainer's own tag map, tied tables), the embodiment selection
in the user's words (`embodiments.py`), and the synthetic stand-ins and fine-tune forms the tests and the demo
convert (`synth.py`). Each trainer's rules live in `folder.py` and nowhere else."""
