import os
import sys


def run() -> int:
    """The command line, with Ctrl-C during the first imports (torch, dask: a second or more) said in one line too."""
    try:
        from pipeline.cli import main
    except KeyboardInterrupt:
        print("interrupted while starting: nothing was changed", file=sys.stderr, flush=True)
        os._exit(130)  # now: a half-imported library's shutdown may re-raise the signal (exit -2 seen once)
    return main()


if __name__ == "__main__":  # the guard matters: distributed's spawned workers re-import this module
    sys.exit(run())
