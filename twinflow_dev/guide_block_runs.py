"""The deployment guide's blocks run on the guide lab's hosts (mixed into
:class:`~.guide_lab.GuideLab`): a block's text filled in for each of its hosts (a peer's
names, the placeholders the lab answers), then written (``file``, ``append``), copied from its
first host to the others with owner and mode (``copy``), started as servers (``serve``), or
run by ``sh -e`` with the host's own directories mounted over the real paths
(:meth:`GuideBlockRuns.on_host`; ``run`` inside the host's network namespace, ``install``
through this machine's network to fetch packages), its ``systemctl`` lines done by the lab
between the shell's parts, a variable a line exports seen by the lines after. After the
guide's certificates are made on host-c, the files it says to copy to each peer's machine are
copied with the owner and modes it names (:meth:`GuideBlockRuns._copy_secrets`).

The lab gives ``directory``, ``dist``, ``host()``, ``blocks()``, ``answers_for()``,
``systemctl()``, and the starting of servers and the waiting for them (``_server_launch()``,
``_start()``, ``_wait_servers()``).

Under failure: a block that exits non-zero raises :class:`~.lab.LabError` with the guide's
line, the host, the script and the tail of its output; a block that outlasts its time-out
(by kind: ``install`` 20 minutes, ``run`` 10) raises ``subprocess.TimeoutExpired``; a section
with no lab block raises :class:`~.guide_blocks.GuideError`. Nothing is undone here: the
caller takes the lab down (``up``) or leaves it to the drill's ``down``.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from .guide_blocks import ROOTED, GuideBlock, GuideError, GuideHost
from .guide_hosts import BLOCK_TIMEOUT_S, FIRST_PEERS, PEER_HOSTS, ROOT_PATH, SERVER_DEADLINE_S, USER
from .lab import LabError
from .lab_network import netns_exec


class GuideBlockRuns:
    """The guide's blocks run on its hosts (see module)."""

    def run_block(self, block: GuideBlock, hosts: list[str] | None = None,
                  say: Callable[[str], None] = lambda text: None) -> list[str]:
        """Run ``block`` on each of its hosts (those of ``hosts`` only, when given); the output of
        each host's run."""
        outputs, servers = [], []
        for name in [h for h in block.hosts if hosts is None or h in hosts]:
            host = self.host(name)
            text, path = block.text, block.path
            if "as-peer" in block.flags:
                text, path = host.as_peer(text), host.as_peer(path) if path else None
            text = host.fill(text, self.answers_for(text))
            t0 = time.monotonic()
            if block.kind in ("file", "append"):
                target = host.path(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "a" if block.kind == "append" else "w") as f:
                    f.write(text)
                out = ""
            elif block.kind == "copy":  # from the block's first host to each other
                if name == block.hosts[0]:
                    continue
                out = self._copy(self.host(block.hosts[0]), host, _lines(text))
            elif block.kind == "serve":  # every host's first, then the wait (an ensemble needs its quorum)
                started = [self._start(self._server_launch(name, line)) for line in _lines(text)]
                servers += started
                out = " ".join(p.name for p in started)
            else:
                out = self._run_commands(block, host, text)
                servers += self._started if self._wait_started else []
                self._started = []
            outputs.append(out)
            say(f"  deploy.md line {block.line} ({block.section}, {block.kind}) on {name}: "
                f"{time.monotonic() - t0:.1f} s")
        if servers:
            t0 = time.monotonic()
            self._wait_servers(servers, t0 + SERVER_DEADLINE_S)
            say(f"  deploy.md line {block.line}: {len(servers)} servers answering ({time.monotonic() - t0:.1f} s)")
        if block.section == "Certificates and tokens" and block.kind == "run" and "host-c" in block.hosts:
            self._copy_secrets()
        return outputs

    def _run_commands(self, block: GuideBlock, host: GuideHost, text: str) -> str:
        """A shell block, its ``systemctl`` lines done by the lab, the rest run by ``sh -e`` in one
        go between them, each part starting with the environment the one before ended with (a
        variable a line exports is seen by the lines after a ``systemctl``)."""
        out, chunk = [], []
        env = {"PATH": ROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
        for line in _lines(text) + [None]:
            words = shlex.split(line) if line else []
            if line is not None and words[0] not in ("systemctl", "journalctl"):
                chunk.append(line)
                continue
            if chunk:
                text_out, env = self._shell(block, host, "\n".join(chunk), env)
                out.append(text_out)
                chunk = []
            if words and words[0] == "systemctl":
                self.systemctl(host.name, words[1:])
        return "".join(out)

    def on_host(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` with ``host``'s own directories (:data:`ROOTED`) mounted over the real ones, in a
        mount namespace of its own (``unshare`` and ``sh`` exec() it: the PID is the program's)."""
        root = self.host(host).root
        binds = " && ".join(f"mount --bind {shlex.quote(root + d)} {shlex.quote(d)}" for d in ROOTED)
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", binds + ' && exec "$@"', "sh", *argv]

    def _shell(self, block: GuideBlock, host: GuideHost, script: str, env: dict[str, str]) -> tuple[str, dict]:
        """``script`` run by ``sh -e`` with ``env``; its output and the environment it ended with."""
        ended = self.directory / "hosts" / host.name / "block.env"
        ended.parent.mkdir(parents=True, exist_ok=True)
        ended.unlink(missing_ok=True)
        argv = self.on_host(host.name, ["sh", "-e", "-c", f"{script}\nenv -0 > {shlex.quote(str(ended))}"])
        if block.kind == "run":  # inside the host; `install` fetches packages through this machine's network
            argv = netns_exec(self.state.host(host.name).ns, argv)
        done = subprocess.run(argv, cwd=self.dist, env=env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S[block.kind], stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise LabError(f"deploy.md line {block.line} ({block.section}) failed on {host.name} with exit "
                           f"{done.returncode}:\n{script}\n--- output ---\n{(done.stdout + done.stderr)[-4000:]}")
        pairs = [item.split("=", 1) for item in ended.read_text().split("\0") if "=" in item]
        return done.stdout, {k: v for k, v in pairs if k not in ("PWD", "OLDPWD", "SHLVL", "_")}

    def _copy(self, source: GuideHost, target: GuideHost, paths: list[str]) -> str:
        """Each of ``paths`` from ``source`` to ``target``, its owner and mode kept."""
        for path in paths:
            a, b = source.path(path), target.path(path)
            b.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(a, b)
            st = a.stat()
            os.chown(b, st.st_uid, st.st_gid)
        return f"copied {len(paths)} files from {source.name} to {target.name}"

    def blocks_of(self, section: str, subsection: str | None = None) -> list[GuideBlock]:
        """The blocks of ``section`` (and ``subsection``, when given), in the guide's order."""
        found = [b for b in self.blocks() if b.section == section and subsection in (None, b.subsection)]
        if not found:
            raise GuideError(f"the guide has no lab block under {section!r}" + (f" / {subsection!r}" if subsection else ""))
        return found

    def run_blocks(self, section: str, subsection: str | None = None, hosts: list[str] | None = None,
                   say: Callable[[str], None] = lambda text: None) -> list[str]:
        """Run the blocks of ``section`` (``subsection``) in order; their outputs."""
        return [out for b in self.blocks_of(section, subsection) for out in self.run_block(b, hosts, say)]

    def _copy_secrets(self, peers: tuple[str, ...] = FIRST_PEERS) -> None:
        """What the guide says to copy from host-c: the CA, each peer's certificate and key, the
        tokens; owned by root, group twinflow, the keys and tokens mode 0640, the rest 0644."""
        made = Path(self.host("host-c").root) / "etc/twinflow/tls"
        group = pwd.getpwnam(USER).pw_gid
        for peer in peers:
            root = Path(self.host(PEER_HOSTS[peer]).root)
            copies = [(made / f, root / "etc/twinflow/tls" / f) for f in ("ca.pem", f"{peer}.pem", f"{peer}-key.pem")]
            copies += [(made / f"{s}.token", root / "etc/twinflow/tokens" / f"{s}.token")
                       for s in ("ingest", "escalation", "admin")]
            for source, target in copies:
                shutil.copyfile(source, target)
                os.chown(target, 0, group)
                target.chmod(0o644 if target.name in ("ca.pem", f"{peer}.pem") else 0o640)


def _lines(text: str) -> list[str]:
    return [s for s in (raw.strip() for raw in text.splitlines()) if s and not s.startswith("#")]
