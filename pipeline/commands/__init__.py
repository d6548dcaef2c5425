"""What a person sees: the command line (`cli.py`, run as `python -m pipeline`), the text reports of each command
(`printing.py`), `inspect`'s report (`inspection.py`), the `--device` choice (`devices.py`), `make demo` (`demo.py`)
and the graph drawn as a picture (`render.py`). Each turns what a job returns into words, and a bad input into one
sentence and an exit code."""
