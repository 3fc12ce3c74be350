"""The deployment guide's command blocks, as the guide lab runs them.

``docs/operations/deploy.md`` marks each block the lab runs with an HTML comment just above
it (the rendered page does not show it)::

    <!-- lab: KIND HOST... [as-peer] [one-at-a-time] [PATH] -->

- ``install HOSTS``: a shell block run as root once per host, in this machine's own network
  (it fetches packages from the registries);
- ``run HOSTS``: a shell block run as root on each host, inside the host's network namespace;
- ``file HOSTS PATH`` / ``append HOSTS PATH``: the block's text written to (appended to) ``PATH``
  on each host;
- ``serve HOSTS``: each line a server the host runs in the foreground (the guide starts its
  servers with ``systemctl`` now; kept for a page that does not);
- ``copy FROM TO...``: each line a file copied from host ``FROM`` to the others, its owner and
  mode kept (what an operator does with ``scp``).

``as-peer`` marks a block written for ``peer-a`` on ``host-a.example``: on another peer's host
the lab reads it with that peer's names (as the guide tells the reader to). ``one-at-a-time``
marks a block a drill runs host by host (a rolling change). A block that is only an include
(``--8<-- "PATH"``) stands for that repository file.

The lab's hosts share one disk, so each keeps the directories the guide's machines keep apart
(:data:`ROOTED`) under a root directory of its own, mounted over the real paths for what runs
on the host (:meth:`GuideHost.path` is where one is seen from outside); the placeholders the
guide asks the reader to fill in (``<this machine's address>``, ``<password>`` ...) are filled
in from the host (:meth:`GuideHost.fill`). The commands themselves run as written.

Under failure: a malformed or unknown annotation, an include that does not exist, or a file
outside the host's own directories raises :class:`GuideError` naming it; nothing is run.

>>> blocks = parse_guide('''## Redis
... <!-- lab: file host-a host-b /etc/redis/redis.conf -->
... ```text
... bind <this machine's address>
... dir /var/lib/redis
... ```
... ''')
>>> b = blocks[0]
>>> (b.kind, b.hosts, b.path, b.section, b.line)
('file', ['host-a', 'host-b'], '/etc/redis/redis.conf', 'Redis', 2)
>>> host = GuideHost("host-b", "10.213.48.12", 2, "peer-b", "/lab/hosts/host-b")
>>> print(host.fill(b.text, {}))
bind 10.213.48.12
dir /var/lib/redis
<BLANKLINE>
>>> host.path(b.path)
PosixPath('/lab/hosts/host-b/etc/redis/redis.conf')
>>> print(host.as_peer("systemctl start twinflow-peer@peer-a  # on host-a.example"))
systemctl start twinflow-peer@peer-b  # on host-b.example
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "operations" / "deploy.md"
KINDS = ("install", "run", "file", "append", "serve", "copy")
FLAGS = ("as-peer", "one-at-a-time")
DOMAIN = "example"
# What each of the guide's machines keeps for itself: the lab gives each host its own copy.
ROOTED = ("/etc/twinflow", "/etc/redis", "/etc/zookeeper", "/etc/prometheus", "/etc/systemd/system",
          "/opt/twinflow", "/var/lib/twinflow", "/var/lib/redis", "/var/lib/zookeeper", "/var/lib/prometheus",
          "/var/cache/twinflow", "/var/backups/twinflow")
# Of those, what Debian's packages (redis-server, redis-sentinel, zookeeper, prometheus) make: a
# lab host starts with their owner and mode, and their files, as a machine they were installed on.
FROM_PACKAGES = ("/etc/redis", "/etc/zookeeper", "/etc/prometheus", "/var/lib/redis", "/var/lib/zookeeper",
                 "/var/lib/prometheus")
_ANNOTATION = re.compile(r"^<!-- lab: (?P<body>.*?) -->\s*$")
_INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"\s*$')


class GuideError(ValueError):
    """The guide's annotations cannot be run as they are; the message names the line."""


@dataclass
class GuideBlock:
    """One annotated block: what to do with it, on which hosts, and its text."""

    kind: str
    hosts: list[str]
    text: str
    section: str
    line: int                      # the guide's line of the annotation
    subsection: str = ""           # the ``###`` heading it is under, if any
    path: str | None = None        # file / append: where the text goes
    flags: set[str] = field(default_factory=set)

    def lines(self) -> list[str]:
        """The block's commands: its non-blank lines that are not comments."""
        return [s for s in (raw.strip() for raw in self.text.splitlines()) if s and not s.startswith("#")]


@dataclass
class GuideHost:
    """A lab host as the guide names it: ``host-a`` is ``host-a.example``, runs ``peer-a`` (or no
    peer), is machine number 1, and keeps its files under ``root``."""

    name: str
    address: str
    number: int
    peer: str | None
    root: str

    @property
    def fqdn(self) -> str:
        return f"{self.name}.{DOMAIN}"

    def as_peer(self, text: str) -> str:
        """``text`` written for peer-a on host-a.example, read as this host's (see module)."""
        if self.peer is None:
            raise GuideError(f"{self.name} runs no peer: an as-peer block cannot run there")
        return text.replace("peer-a", self.peer).replace("host-a.example", self.fqdn)

    def fill(self, text: str, secrets: dict[str, str]) -> str:
        """``text`` with this host's values for the guide's placeholders."""
        values = {"<this machine's address>": self.address, "<this machine's number>": str(self.number),
                  **{f"<{k}>": v for k, v in secrets.items()}}
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        left = re.findall(r"<[a-z][a-z' ]+>", text)
        if left:
            raise GuideError(f"no value for the placeholder {left[0]} on {self.name}")
        return text

    def path(self, path: str) -> Path:
        """Where ``path`` of this host is on this machine (under :attr:`root`)."""
        if not any(path == d or path.startswith(d + "/") for d in ROOTED):
            raise GuideError(f"{path} on {self.name}: the lab keeps a host's own files under {', '.join(ROOTED)}")
        return Path(self.root) / path.lstrip("/")


def read_guide(path: str | Path = GUIDE) -> list[GuideBlock]:
    return parse_guide(Path(path).read_text())


def parse_guide(text: str) -> list[GuideBlock]:
    """Every annotated block of the guide's ``text``, in order (see module)."""
    lines = text.splitlines()
    blocks, section, subsection, i = [], "", "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section, subsection = line[3:].strip(), ""
        elif line.startswith("### "):
            subsection = line[4:].strip()
        m = _ANNOTATION.match(line)
        i += 1
        if not m:
            continue
        where = i
        words = m["body"].split()
        if not words or words[0] not in KINDS:
            raise GuideError(f"deploy.md line {where}: a lab annotation starts with one of {', '.join(KINDS)}")
        kind, rest = words[0], words[1:]
        flags = {w for w in rest if w in FLAGS}
        rest = [w for w in rest if w not in FLAGS]
        path = None
        if kind in ("file", "append"):
            if not rest or not rest[-1].startswith("/"):
                raise GuideError(f"deploy.md line {where}: {kind} needs the file's absolute path last")
            path = rest.pop()
        hosts = rest
        if not hosts or not all(re.fullmatch(r"host-[a-z]", h) for h in hosts):
            raise GuideError(f"deploy.md line {where}: name the hosts (host-a, host-b, ...), got {rest}")
        if i >= len(lines) or not lines[i].startswith("```"):
            raise GuideError(f"deploy.md line {where}: the annotation must stand just above a ``` block")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise GuideError(f"deploy.md line {where}: the block below it never ends")
        body = lines[i + 1:end]
        include = _INCLUDE.match(body[0]) if len(body) == 1 else None
        if include:
            source = REPO / include["path"]
            if not source.exists():
                raise GuideError(f"deploy.md line {where}: the include {include['path']} does not exist")
            block_text = source.read_text()
        else:
            block_text = "\n".join(body) + "\n"
        blocks.append(GuideBlock(kind, hosts, block_text, section, where, subsection, path, flags))
        i = end + 1
    return blocks
