"""Instructions per append, server and client, counted by callgrind: load-independent A/B of the store.

    python benchmarks/pg_callgrind.py [--trees DIR ...] [--n 100] [--warm 20] [--client]

Wall and CPU time on a shared 2-core machine swing 2x between rounds; instruction counts
do not. This starts a private PostgreSQL cluster (`initdb` in a temporary folder, as user
`postgres` when run as root) with its postmaster under `valgrind --tool=callgrind`: every
backend it forks is counted and writes its total when it exits. For each tree (its
`store/` first on `sys.path`), a child process opens the three contenders of
`pg_probe.py` (`store`: `store.append` of one event; `raw`: psycopg INSERT+COMMIT into
the store's own table; `raw_bare`: the same into a table with only the PRIMARY KEY and
two UNIQUEs), runs `warm` appends on each, and exits; a second child runs `warm + n`.
The difference of each contender's backend totals / n is its server instructions per
append (connection set-up, schema creation and warm-up cancel out). With `--client`,
the same two children per contender run under callgrind too: client instructions per
append (Python, psycopg, libpq). Needs valgrind and PostgreSQL's server binaries
(`pg_config --bindir`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONTENDERS = ("store", "raw", "raw_bare")


def _total(path: Path, timeout: float = 120) -> int:
    """The instruction total a callgrind output file ends with (written when its process exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            match = re.search(r"^(?:summary|totals):\s*(\d+)", path.read_text(errors="replace"), re.M)
            if match:
                return int(match.group(1))
        time.sleep(0.2)
    raise RuntimeError(f"no callgrind total in {path}")


class Cluster:
    """A throw-away PostgreSQL cluster whose postmaster (and so every backend) runs under callgrind."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
        bindir = Path(found.stdout.strip())
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if as_user:
            shutil.chown(folder, "postgres")
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(folder / "data"), "-A", "trust", "-U", "postgres"],
                       check=True, capture_output=True)  # fmt: skip
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [*as_user, "valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.%p", "--dump-instr=no",
             str(bindir / "postgres"), "-D", str(folder / "data"), "-p", str(self.port), "-k", str(folder),
             "-c", "listen_addresses=127.0.0.1", "-c", "autovacuum=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        deadline = time.monotonic() + 180
        while subprocess.run([str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                             capture_output=True, check=False).returncode != 0:  # fmt: skip
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the callgrind'ed postmaster did not start")
            time.sleep(1)

    def backend_total(self, pid: int) -> int:
        return _total(self.folder / f"cg.{pid}")

    def stop(self) -> None:
        self.proc.terminate()  # SIGTERM reaches valgrind's child: a smart shutdown
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _child(tree: Path, cluster: Cluster, appends: int, only: str | None, client_out: Path | None) -> dict[str, int]:
    """Run `appends` on each contender (or `only` one) in a fresh process; their backend pids."""
    env = {**os.environ, "PG_PROBE_TREE": str(tree), "LIFECYCLE_BENCH_PG": cluster.url}
    argv = [sys.executable, str(HERE / "pg_callgrind.py"), "--child", str(appends)] + (["--only", only] if only else [])
    if client_out is not None:
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={client_out}", "--dump-instr=no", *argv]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=tree)
    pids: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return pids


def child(appends: int, only: str | None) -> None:
    sys.path[:0] = [str(HERE), os.environ["PG_PROBE_TREE"]]
    import pg_probe

    c = pg_probe._Contenders("on")
    runs = {"store": c.store_round, "raw": lambda k: c.raw_round("raw", k),
            "raw_bare": lambda k: c.raw_round("raw_bare", k)}  # fmt: skip
    conns = {"store": c.store.session.conn, "raw": c.raws["raw"].conn, "raw_bare": c.raws["raw_bare"].conn}
    pids = {name: conns[name].info.backend_pid for name in CONTENDERS}
    for name in CONTENDERS if only is None else (only,):
        runs[name](appends)
    c.close()
    print(json.dumps(pids))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs="*", default=[str(HERE.parent)])
    ap.add_argument("--n", type=int, default=100, help="appends counted per contender")
    ap.add_argument("--warm", type=int, default=20, help="appends before them (in both children)")
    ap.add_argument("--client", action="store_true", help="also count the client process's instructions")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--only", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.only)
        return
    with tempfile.TemporaryDirectory(prefix="pg-callgrind-") as tmp:
        folder = Path(tmp)
        cluster = Cluster(folder)
        try:
            print(f"instructions per append ({args.n} after {args.warm}), server backend", end="")
            print(" | client process" if args.client else "")
            for tree in (Path(t).resolve() for t in args.trees):
                short, long = _child(tree, cluster, args.warm, None, None), _child(tree, cluster, args.warm + args.n,
                                                                                    None, None)  # fmt: skip
                for name in CONTENDERS:
                    server = (cluster.backend_total(long[name]) - cluster.backend_total(short[name])) / args.n
                    line = f"  {tree.name:12s} {name:9s} server {server:12,.0f}"
                    if args.client:
                        a, b = folder / f"client-{name}-a", folder / f"client-{name}-b"
                        _child(tree, cluster, args.warm, name, a)
                        _child(tree, cluster, args.warm + args.n, name, b)
                        line += f"   client {(_total(b) - _total(a)) / args.n:12,.0f}"
                    print(line, flush=True)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
