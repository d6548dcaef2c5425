import os
import signal
import sys


def run() -> int:
    """The command line, with Ctrl-C during the first imports (torch, dask: a second or more) said in one line too."""
    interrupted = []

    def on_interrupt(signum, frame):
        interrupted.append(signum)  # remembered: raised inside a weakref callback of importlib, Python drops it
        raise KeyboardInterrupt

    def unraisable(raised) -> None:
        if not isinstance(raised.exc_value, KeyboardInterrupt):  # that one is said below, in one line
            said_by_python(raised)

    previous, said_by_python = signal.signal(signal.SIGINT, on_interrupt), sys.unraisablehook
    sys.unraisablehook = unraisable  # Python prints what a callback raises, as a traceback, then goes on
    try:
        from pipeline.commands.cli import main
    except KeyboardInterrupt:
        interrupted.append(signal.SIGINT)
    except BaseException:  # an extension module's import interrupted says ImportError (numpy's C API does)
        if not interrupted:
            raise
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = said_by_python
    if interrupted:
        print("interrupted while starting: nothing was changed", file=sys.stderr, flush=True)
        os._exit(130)  # now: a half-imported library's shutdown may re-raise the signal (and exit -2)
    return main()


if __name__ == "__main__":  # the guard matters: distributed's spawned workers re-import this module
    sys.exit(run())
