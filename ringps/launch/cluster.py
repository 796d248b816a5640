"""The emulated cluster: every host its own network namespace behind a rate-shaped link.

    ringps-ID-sw      a "switch" namespace holding the bridge `br0`
    ringps-ID-hI      host I: interface `eth0` = one end of a veth pair, 10.77.0.(I+1)/24;
                      the other end (`pI`) is a port of br0 in the switch namespace

Each link is shaped like a full-duplex NIC with tc's token bucket filter (tbf): on eth0's egress
for what the host sends, on pI's egress for what it receives. Only rate can be shaped: this
kernel has no netem, so there is no delay or loss emulation. Nothing lives in the root namespace,
so the addresses exist only inside the cluster and no packet leaves this machine; deleting the
namespaces deletes every interface with them. Two clusters never collide: names carry the id,
and each has its own switch. A record in STATE_DIR notes the owner's pid, so clusters whose
owner died (SIGKILL) are reaped by the next `--net` run or by `ringps cluster down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

from ringps.cost import EMULATED_QUEUE_S
from ringps.errors import RingpsError
from ringps.launch.local import Placement

PREFIX = "ringps-"
SUBNET = "10.77.0"
STATE_DIR = Path(os.environ.get("RINGPS_CLUSTER_DIR", "/tmp/ringps-clusters"))


class ClusterError(RingpsError):
    exit_code = 2


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {r.stderr.strip() or r.stdout.strip()}")
    return r


def requirements_missing() -> Optional[str]:
    """Why network emulation cannot run here, or None."""
    if os.geteuid() != 0:
        return "--net needs root (network namespaces and tc); run as root or drop --net"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"--net needs `{tool}` from iproute2: apt-get install iproute2"
    return None


def tbf_args(rate_bps: float) -> list[str]:
    """Token bucket sized for the rate: a few ms of traffic, never below 64 KB (one GSO segment)."""
    burst = max(64 * 1024, int(rate_bps / 8 * 0.004))
    return ["rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", f"{EMULATED_QUEUE_S * 1000:.0f}ms"]


@dataclass
class Cluster:
    id: str
    rates: list[float]  # bits per second, one per host
    owner_pid: int

    @property
    def hosts(self) -> int:
        return len(self.rates)

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.id}-sw"

    def ns(self, host: int) -> str:
        return f"{PREFIX}{self.id}-h{host}"

    def addr(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    # -- life cycle ------------------------------------------------------------------------
    @classmethod
    def create(cls, rates: list[float], keep: bool = False) -> "Cluster":
        """Build the namespaces and links. keep=True: no owner process (`ringps cluster up`)."""
        why = requirements_missing()
        if why:
            raise ClusterError(why)
        if len(rates) > 250:
            raise ClusterError(f"{len(rates)} hosts: at most 250 fit the cluster's /24")
        reap_orphans()
        c = cls(uuid.uuid4().hex[:6], list(rates), -1 if keep else os.getpid())
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        c._record().write_text(json.dumps(asdict(c)))
        try:
            c._build()
        except BaseException:
            c.destroy()
            raise
        return c

    def _record(self) -> Path:
        return STATE_DIR / f"{self.id}.json"

    def _build(self) -> None:
        sw = self.switch
        _run("ip", "netns", "add", sw)
        _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        for h, rate in enumerate(self.rates):
            ns, port = self.ns(h), f"p{h}"
            _run("ip", "netns", "add", ns)
            # create the pair inside the host namespace, then move one end to the switch
            _run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port)
            _run("ip", "-n", ns, "link", "set", port, "netns", sw)
            _run("ip", "-n", sw, "link", "set", port, "master", "br0")
            _run("ip", "-n", sw, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addr(h)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf", *tbf_args(rate))  # host sends
            _run("tc", "-n", sw, "qdisc", "add", "dev", port, "root", "tbf", *tbf_args(rate))  # host receives

    def destroy(self) -> None:
        """Kill whatever still runs inside, delete the namespaces (and with them every link)."""
        names = [self.ns(h) for h in range(self.hosts)] + [self.switch]
        existing = set(list_namespaces())
        for ns in names:
            if ns in existing:
                for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
        for ns in names:
            if ns in existing:
                _run("ip", "netns", "del", ns, check=False)
        self._record().unlink(missing_ok=True)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    # -- use -------------------------------------------------------------------------------
    def exec_prefix(self, host: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host)]

    def counters(self) -> list[dict[str, int]]:
        """Bytes each host's eth0 really sent and received (kernel interface statistics)."""
        out = []
        for h in range(self.hosts):
            stats = {}
            for key in ("tx_bytes", "rx_bytes"):
                r = _run("ip", "netns", "exec", self.ns(h), "cat", f"/sys/class/net/eth0/statistics/{key}", check=False)
                stats[key] = int(r.stdout.strip() or 0)
            out.append(stats)
        return out

    def describe(self) -> str:
        rates = sorted(set(self.rates))
        what = format_rate(rates[0]) if len(rates) == 1 else ",".join(format_rate(r) for r in self.rates)
        return f"emulated cluster {self.id}: {self.hosts} hosts, links {what} each way (tc tbf, no delay/loss)"


def format_rate(bps: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def list_namespaces() -> list[str]:
    if shutil.which("ip") is None:
        return []
    r = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def known_clusters() -> dict[str, list[str]]:
    """Cluster id -> its namespaces, for every ringps namespace that exists."""
    found: dict[str, list[str]] = {}
    for ns in list_namespaces():
        if ns.startswith(PREFIX):
            cid = ns[len(PREFIX):].rsplit("-", 1)[0]
            found.setdefault(cid, []).append(ns)
    return found


def load(cluster_id: str) -> Cluster:
    rec = STATE_DIR / f"{cluster_id}.json"
    if rec.is_file():
        return Cluster(**json.loads(rec.read_text()))
    hosts = [n for n in known_clusters().get(cluster_id, []) if not n.endswith("-sw")]
    return Cluster(cluster_id, [0.0] * len(hosts), -1)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def reap_orphans() -> list[str]:
    """Remove clusters whose owner process is gone (a launcher that was SIGKILLed)."""
    reaped = []
    for cid in known_clusters():
        c = load(cid)
        if c.owner_pid != -1 and not _alive(c.owner_pid):
            c.destroy()
            reaped.append(cid)
    return reaped


@contextlib.contextmanager
def cluster_placement(cfg, run_id: str) -> Iterator[Placement]:
    """One emulated host per rank (workers, then servers), torn down whatever happens."""
    from ringps.strategies import STRATEGIES

    world = cfg.run.workers + (cfg.run.servers if STRATEGIES.get(cfg.strategy.strategy).needs_servers else 0)
    rates = cfg.run.net_rates(world)
    if len(rates) != world:
        raise ClusterError(f"--net {cfg.run.net}: {len(rates)} rates for {world} hosts (workers, then servers); "
                           "give one rate, or one per host")
    with Cluster.create(rates) as c:
        yield placement(c)


def placement(c: Cluster) -> Placement:
    """Rank r on host r, talking over eth0."""
    return Placement(
        master_addr=c.addr(0),
        prefixes={r: c.exec_prefix(r) for r in range(c.hosts)},
        envs={r: {"GLOO_SOCKET_IFNAME": "eth0"} for r in range(c.hosts)},
        description=c.describe(),
        counters=c.counters,
    )
