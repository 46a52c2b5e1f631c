"""`python -m piper_sim ...` runs the CLI (for machines where the package is on PYTHONPATH, not installed).

Under `-m`, CPython exits by SIGINT (status -2) after a KeyboardInterrupt crossed code it ran from a string (a
dataclass's generated methods, a namedtuple's), even one the CLI caught and answered with its one line
(Modules/main.c pymain_run_module and Python/pythonrun.c run_eval_code_obj set _Py_UnhandledKeyboardInterrupt, which
Py_RunMain reads at exit); so a command stopped by a signal exits here at once with its status (stopping.exit_now).
"""

import sys

from piper_sim.stopping import EXIT_CODES, exit_now

try:
    from piper_sim.cli import main
except SystemExit as stop:  # a signal while the command line's modules loaded (stopping.while_loading)
    exit_now(stop.code)

if __name__ == "__main__":
    code = main()
    if code in EXIT_CODES.values():
        exit_now(code)
    sys.exit(code)
