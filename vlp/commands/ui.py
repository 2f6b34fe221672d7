"""`vlp ui`: serve the MLflow UI for a runs folder (or a store) on 127.0.0.1."""

from __future__ import annotations

import argparse

HEALTH_TIMEOUT_S = 60.0


def register(sub) -> None:
    from vlp.commands.leaderboard import add_store_arguments

    p = sub.add_parser("ui", help="serve the MLflow UI on 127.0.0.1",
                       description="Serve the MLflow UI for the SQLite store of a runs folder "
                                   "(default runs/demo) on 127.0.0.1 and print its URL; Ctrl-C "
                                   "stops it. For an http(s) tracking URI, print where it is.")
    add_store_arguments(p)
    p.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.set_defaults(func=run)


def ui_hint(tracking_uri: str) -> str:
    """How to open the UI for a store, as one line."""
    if tracking_uri.startswith(("http://", "https://")):
        url = _leaderboard(tracking_uri, tracking_uri)
        return f"MLflow UI: {tracking_uri}" + (f"   leaderboard: {url}" if url else "")
    if tracking_uri.startswith("sqlite:///"):
        from pathlib import Path

        folder = Path(tracking_uri[len("sqlite:///"):]).parent
        return f"open the MLflow UI: vlp ui --run-dir {folder}   (serves http://127.0.0.1:5000)"
    return f"open the MLflow UI: vlp ui --tracking-uri {tracking_uri}"


def _leaderboard(server: str, tracking_uri: str) -> str | None:
    """The leaderboard view's URL (the latest sweep's experiment), None when there is none
    or the store cannot be read."""
    from vlp.platform.tracking.leaderboard_view import leaderboard_url

    try:
        return leaderboard_url(server, tracking_uri)
    except Exception:           # a hint: never the reason a command fails
        return None


def server_command(tracking_uri: str, host: str, port: int) -> list[str]:
    import sys
    from pathlib import Path

    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri,
           "--host", host, "--port", str(port), "--workers", "1"]
    if tracking_uri.startswith("sqlite:///"):
        # runs log to their experiments' own artifact folders; this only keeps MLflow from
        # creating ./mlruns in whatever folder the command runs in
        folder = Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts"
        cmd += ["--default-artifact-root", folder.as_uri()]
    return cmd


def run(args: argparse.Namespace) -> int:
    import os
    import signal
    import subprocess
    import time
    import urllib.request

    from vlp.commands.leaderboard import tracking_uri

    uri = tracking_uri(args)
    if uri.startswith(("http://", "https://")):
        print(ui_hint(uri))
        return 0
    def stop(signum, frame):        # SIGTERM stops it like Ctrl-C: the server goes too
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    from vlp.platform.tracking.server_env import server_env

    proc = subprocess.Popen(server_command(uri, args.host, args.port),
                            env=server_env(dict(os.environ)), start_new_session=True)
    url = f"http://{args.host}:{args.port}"
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                print(f"vlp ui: the MLflow server exited with status {proc.returncode} "
                      f"(port {args.port} in use? try --port)")
                return 1
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        print(f"MLflow UI: {url}   (store {uri}; Ctrl-C stops it)", flush=True)
        board = _leaderboard(url, uri)
        if board:
            print(f"leaderboard (the latest sweep's trials by Meta-Sum): {board}", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
