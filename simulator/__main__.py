"""`python -m simulator [--admin] [--label NAME]`: serve a homelab until Ctrl-C, printing the
variables that point the server at it as KEY=value lines (for a .env file or `export`)."""
import argparse
import sys
import threading

from . import Simulator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulator", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("--admin", action="store_true", help="admin tokens (root@pam!admin) instead of read-only ones")
    parser.add_argument("--label", default="lab", help="the host label the variables use (default: lab)")
    args = parser.parse_args(argv)
    tokens = {"pve_token": "root@pam!admin", "pbs_token": "root@pam!admin"} if args.admin else {}
    with Simulator() as sim:
        for name, value in sim.env(label=args.label, **tokens).items():
            print(f"{name}={value}", flush=True)
        print(f"simulator running ({'admin' if args.admin else 'read-only'} tokens); Ctrl-C to stop", file=sys.stderr)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
