"""`python -m simulator`: serve a homelab until Ctrl-C, printing the variables that
point the server at it."""
import json
import sys
import threading

from . import Simulator

if __name__ == "__main__":
    with Simulator() as sim:
        print(json.dumps(sim.env(), indent=2), file=sys.stderr)
        print("simulator running; Ctrl-C to stop", file=sys.stderr)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
