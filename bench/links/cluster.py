"""A cluster of P "hosts" on one machine: network namespaces joined by a bridge, links shaped by tc.

Each host is a network namespace with one veth interface (`veth0`, address 10.77.0.<i+1>/24) whose
peer sits on a bridge in a namespace of its own; a `tbf` qdisc on each host's interface limits that
host's egress to the link rate (both directions of a pair are shaped: each by its sender). Nothing
is added to the machine's own namespace. Open MPI reaches the hosts through an rsh agent that runs
`ip netns exec <host> sh -c "$*"`; `mpirun` itself runs inside host 0. `run_distributed` starts
one process per host instead, as the processes of a jax.distributed job. Every command in a host
also gets its own UTS namespace named after the host: Open MPI keys its session directories in
the shared /tmp by host name, and with one name for all hosts 4-host jobs failed to start 1 time
in 5.

Names start with `jaxhc-links-<pid>-`, pid the process that made them, so `remove_leftovers()` can
find and delete what a killed run left behind (and leaves a live run's cluster alone): the
namespaces themselves are `netns`'s, the processes started in them `procs`'s.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from .netns import (
    IFACE,
    PREFIX,
    SUBNET,
    ClusterError,
    check_available,
    delete_namespace,
    ip,
    namespaces,
    remove_leftovers,
    sh,
)
from .procs import environ, how, kill_group, watch
from .rates import parse_rate, rate_label

__all__ = [
    "COORDINATOR_PORT",
    "IFACE",
    "PREFIX",
    "SUBNET",
    "Cluster",
    "ClusterError",
    "Interrupted",
    "check_available",
    "namespaces",
    "remove_leftovers",
]

COORDINATOR_PORT = 47000  # jax.distributed's coordinator, in host 0 (each host has its own ports)
_TBF = ("burst", "256kb", "latency", "50ms")
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The rsh agent: Open MPI calls it as `agent [options] <host address> <command ...>`.
_AGENT = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
case "$host" in
{cases}
*) echo "links agent: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns; $*"
"""


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived while a cluster was up (`signum` says which)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Cluster:
    """P hosts on one machine, each host's egress limited to `rate` (None/"unshaped": no limit).

        with Cluster(hosts=2, rate="1gbit") as c:
            c.run([".venv/bin/python", "bench/collectives.py", "--transport", "mpi"])
            c.set_rate("100mbit")              # the live cluster's links change
            c.run(["jaxhc", "train", "--transport", "mpi", ...], timeout=3600)
            c.run_distributed(["jaxhc", "train", "--transport", "xla", ...])  # no mpirun

    Leaving the `with` block (normally, on an exception, on SIGINT, SIGTERM or SIGHUP) ends the
    processes started in the hosts and deletes every namespace the cluster made. One cluster per
    process at a time (its names carry the process id).
    """

    def __init__(self, hosts: int, rate: str | None = None):
        if not isinstance(hosts, int) or hosts < 2 or hosts > 250:
            raise ValueError(f"hosts={hosts!r}: expected a whole number from 2 to 250")
        parse_rate(rate)
        self.hosts, self.rate = hosts, rate_label(rate)
        tag = f"{PREFIX}{os.getpid()}-"
        self.bridge = tag + "br"
        self.names = [f"{tag}h{i}" for i in range(hosts)]
        self.addresses = [f"10.77.0.{i + 1}" for i in range(hosts)]
        self.subnet = SUBNET
        self._made: list[str] = []
        self._tmp: str | None = None
        self._agent: str | None = None
        self._old_handlers: dict = {}
        self._procs: list[subprocess.Popen] = []

    # --- life cycle --------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        self._trap_signals()
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Make the namespaces, the bridge, the veth pairs, the addresses and the shaping."""
        check_available()
        remove_leftovers()
        if any(n in namespaces() for n in (self.bridge, *self.names)):
            raise ClusterError(f"this process already has a cluster ({self.bridge} exists)")
        atexit.register(self.close)
        bridge = self.bridge
        self._add_namespace(bridge)
        ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", bridge, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(self.names, self.addresses, strict=True)):
            self._add_namespace(ns)
            peer = f"h{i}"
            ip("link", "add", IFACE, "netns", ns, "type", "veth", "peer", peer, "netns", bridge)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            ip("-n", ns, "link", "set", IFACE, "up")
            ip("-n", bridge, "link", "set", peer, "master", "br0")
            ip("-n", bridge, "link", "set", peer, "up")
        self._tmp = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
        self._agent = os.path.join(self._tmp, "agent.sh")
        hosts = zip(self.addresses, self.names, strict=True)
        cases = "\n".join(f"{a}) ns={n} ;;" for a, n in hosts)
        with open(self._agent, "w") as f:
            f.write(_AGENT.format(cases=cases))
        os.chmod(self._agent, 0o755)
        self.set_rate(self.rate)

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name, what="cannot create network namespaces")
        self._made.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def close(self) -> None:
        """End what runs in the hosts and delete the namespaces (idempotent).

        SIGINT/SIGTERM/SIGHUP wait until it is done (a second Ctrl-C cannot cut it short).
        """
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            self._teardown()
        finally:
            self._restore_signals()
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _teardown(self) -> None:
        for p in self._procs:
            kill_group(p)
        self._procs.clear()
        for name in reversed(self._made):
            delete_namespace(name)
        self._made.clear()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        atexit.unregister(self.close)

    def _trap_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there; atexit still tears down

        def stop(signum, _frame):
            raise Interrupted(signum)

        for sig in _STOP_SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, stop)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    # --- links -------------------------------------------------------------------------------

    def set_rate(self, rate: str | None) -> None:
        """Shape every host's egress to `rate` ("100mbit", "1gbit"; None/"unshaped": remove tbf)."""
        bits = parse_rate(rate)
        for ns in self.names:
            if bits is None:
                if "tbf" in self.qdisc(ns):
                    sh(["tc", "-n", ns, "qdisc", "del", "dev", IFACE, "root"])
            else:
                tbf = ["tbf", "rate", f"{bits:.0f}bit", *_TBF]
                sh(["tc", "-n", ns, "qdisc", "replace", "dev", IFACE, "root", *tbf])
        self.rate = rate_label(rate)

    def qdisc(self, host: int | str) -> str:
        """`tc qdisc show` of a host's interface (host index or namespace name)."""
        ns = self.names[host] if isinstance(host, int) else host
        return sh(["tc", "-n", ns, "qdisc", "show", "dev", IFACE]).stdout.strip()

    @property
    def rate_bits(self) -> float | None:
        """The link rate in bit/s (None: unshaped)."""
        return parse_rate(self.rate)

    # --- running things ----------------------------------------------------------------------

    def host_argv(self, host: int, command: list[str]) -> list[str]:
        """argv that runs `command` inside host `host`'s namespace."""
        ns = self.names[host]
        name = ["sh", "-c", 'hostname "$0" && exec "$@"', ns]  # its own host name, as a host has
        return ["ip", "netns", "exec", ns, "unshare", "--uts", *name, *command]

    def mpirun_argv(self, command: list[str], *, ranks_per_host: int = 1, mca=None) -> list[str]:
        """argv of an mpirun (started in host 0) with `ranks_per_host` ranks on each host.

        Open MPI moves everything over TCP on the cluster's subnet; ranks waiting in MPI yield
        their core; `mca` adds or overrides MCA parameters ({"name": "value"}).
        """
        if self._agent is None:
            raise ClusterError("the cluster is not started")
        params = {
            "plm_rsh_agent": self._agent,
            "btl": "tcp,self",
            "btl_tcp_if_include": self.subnet,
            "oob_tcp_if_include": self.subnet,
            "mpi_yield_when_idle": "1",
            **(mca or {}),
        }
        hosts = ",".join(f"{a}:{ranks_per_host}" for a in self.addresses)
        argv = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--host", hosts]
        argv += ["-np", str(self.hosts * ranks_per_host)]
        for k, v in params.items():
            argv += ["--mca", k, str(v)]
        return self.host_argv(0, [*argv, *command])

    def run(
        self,
        command: list[str],
        *,
        ranks_per_host: int = 1,
        timeout: float | None = None,
        env: dict | None = None,
        mca: dict | None = None,
        capture: bool = False,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run `command` on every host under mpirun; wait (at most `timeout` s) and return.

        The job gets its own process group, ended as a whole on timeout or interruption.
        `capture`: collect stdout/stderr (text) instead of passing them through.
        """
        argv = self.mpirun_argv(command, ranks_per_host=ranks_per_host, mca=mca)
        return self._wait(argv, command[0], timeout, env, capture, check)

    def run_on(
        self,
        host: int,
        command: list[str],
        *,
        timeout: float | None = None,
        env: dict | None = None,
        capture: bool = False,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run a plain command (no mpirun) inside host `host`, as `run` does."""
        return self._wait(self.host_argv(host, command), command[0], timeout, env, capture, check)

    def _wait(self, argv, label, timeout=None, env=None, capture=False, check=True):
        out = subprocess.PIPE if capture else None
        p = subprocess.Popen(
            argv, env={**os.environ, **(env or {})}, stdout=out, stderr=out, text=True,
            start_new_session=True,
        )  # fmt: skip
        self._procs.append(p)
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(p)
            raise ClusterError(f"{label} timed out after {timeout:g} s in the cluster") from None
        finally:
            kill_group(p)
            self._procs.remove(p)
        if check and p.returncode:
            tail = (stderr or "").strip().splitlines()[-1:] or [f"exit status {p.returncode}"]
            raise ClusterError(f"{label} failed in the cluster: {tail[0]}")
        return subprocess.CompletedProcess(argv, p.returncode, stdout, stderr)

    # --- jax.distributed across the hosts ------------------------------------------------------

    def distributed_env(self, host: int, port: int = COORDINATOR_PORT) -> dict:
        """The variables that make a process in host `host` process `host` of a jax.distributed
        job across the cluster: coordinator on host 0's address, gloo on the host's own address."""
        return {
            "JAXHC_PROCESS_ID": str(host),
            "JAXHC_NUM_PROCESSES": str(self.hosts),
            "JAXHC_COORDINATOR": f"{self.addresses[0]}:{port}",
            "JAXHC_GLOO_HOSTNAME": self.addresses[host],
        }

    def run_distributed(
        self,
        command: list[str],
        *,
        timeout: float | None = None,
        env: dict | None = None,
        capture: bool = False,
        check: bool = True,
        grace: float = 60.0,
        port: int = COORDINATOR_PORT,
        on_start=None,
    ) -> list[subprocess.CompletedProcess]:
        """Run `command` once in every host as one process of a jax.distributed job (no mpirun):
        process i in host i, the coordinator in host 0 (`distributed_env`); wait for all.

        When a process fails (non-zero exit, or killed), the others get `grace` seconds to end by
        themselves (jax's coordination service ends them once it misses the failed process's
        heartbeats), then they are ended. With `check`, a ClusterError names the host that failed
        first. `env` adds to this process's environment (a value None removes the variable).
        `capture`: each host's stdout+stderr (text) in its CompletedProcess's stdout.
        `on_start(procs)` is called once every process has started (tests use it to kill one).
        """
        if self._tmp is None:
            raise ClusterError("the cluster is not started")
        label, procs, logs = os.path.basename(command[0]), [], []
        try:
            for host in range(self.hosts):
                log = None
                if capture:
                    log = open(os.path.join(self._tmp, f"host{host}.{len(self._procs)}.log"), "w+")
                    logs.append(log)
                p = subprocess.Popen(
                    self.host_argv(host, command),
                    env=environ(env, self.distributed_env(host, port)),
                    stdout=log, stderr=subprocess.STDOUT if capture else None, text=True,
                    start_new_session=True,
                )  # fmt: skip
                procs.append(p)
                self._procs.append(p)
            if on_start is not None:
                on_start(procs)
            failed, later, ended = watch(procs, timeout, grace)
            if failed == "timeout":
                raise ClusterError(f"{label} timed out after {timeout:g} s in the cluster")
        finally:
            for p in procs:
                kill_group(p)
                self._procs.remove(p)
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
        done = [
            subprocess.CompletedProcess(p.args, p.returncode, outputs[i] if capture else None, None)
            for i, p in enumerate(procs)
        ]
        if check and failed is not None:
            raise ClusterError(self._failure(label, procs, failed, later, ended, grace))
        return done

    def _failure(self, label, procs, first, later, ended, grace) -> str:
        host = first[0]
        parts = [
            f"{label} failed in the cluster: host {host} ({self.names[host]}, "
            f"{self.addresses[host]}) {how(procs[host].returncode)} first"
        ]
        for i, p in enumerate(procs):
            if i in ended:
                parts.append(f"host {i} was still running {grace:g} s later and was ended")
            elif i in later:
                parts.append(f"host {i} {how(p.returncode)} {later[i]:.1f} s later")
            elif i != host:
                parts.append(f"host {i} {how(p.returncode)} before it")
        return "; ".join(parts)

    def throughput(self, src: int = 0, dst: int = 1, nbytes: int = 32 << 20) -> float:
        """TCP bit/s from host `src` to `dst`: one stream of `nbytes`, on the receiver's clock."""
        server = self.host_argv(dst, [sys.executable, "-c", _RECV, self.addresses[dst]])
        srv = subprocess.Popen(server, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self._procs.append(srv)
        try:
            port = srv.stdout.readline().strip()
            if not port:
                raise ClusterError(f"the receiver in {self.names[dst]} did not start")
            client = [sys.executable, "-c", _SEND, self.addresses[dst], port, str(nbytes)]
            self.run_on(src, client, timeout=600, capture=True)
            got, timed, seconds = srv.communicate(timeout=60)[0].split()
        finally:
            kill_group(srv)
            self._procs.remove(srv)
        if int(got) != nbytes:
            raise ClusterError(f"throughput probe: received {got} of {nbytes} bytes")
        return int(timed) * 8 / float(seconds)


_RECV = """
import socket, sys, time
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
first = len(c.recv(1 << 20))  # the clock starts when data flows: this chunk is not timed
t0, n = time.perf_counter(), 0
while b := c.recv(1 << 20):
    n += len(b)
print(first + n, n, time.perf_counter() - t0)
"""
_SEND = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
left, block = int(sys.argv[3]), bytes(1 << 20)
while left > 0:
    left -= s.send(block[: min(left, len(block))])
s.close()
"""
